"""The index a token store entry keeps of its conversations, which a later build reads instead of them.

A build whose store gives every conversation packs from it in its workers
(``fixed_sft.parallel``), and first needs each conversation's tokens, supervised runs, id,
``source`` value and invalid reason: the index pass reads them all (every stored byte)
for that. A build that has the index of every source row (its fill encoded them, or its
index pass read them) keeps it in the entry, as one Arrow IPC file (``index-KEY.arrow``);
a later build reads it in place of the index pass.

The file is named by ``key``: the XXH3-128 of ``VERSION`` and of the record digest of
each source row's copy, as the store holds them (each covers that copy's bytes). A store
that holds another copy of a row (encoded again, or checked since) has another key, and
does not read the file. The file ends with the XXH3-128 of its bytes: one that does not
match, or whose tokens are not the records', is not read. The write pass then reads each
conversation and checks its digest: one that does not match gives way to packing in this
process, which finds it and encodes it again (``parallel.Unheld``), as after the index
pass. The store is an optimisation only, and so is this file: rows are the same without it.
"""

from __future__ import annotations

import os
from contextlib import suppress

import numpy as np
import pyarrow as pa
import xxhash

from .arrow import numbers, strings, to_numpy
from .parallel import Indexed, Indexes
from .store import TokenStore, draft_path

VERSION = b"fixed-sft kept index 1"
PREFIX, SUFFIX = "index-", ".arrow"
CHECKSUM_BYTES = 16
STRINGS_AT_ONCE = 1 << 16  # ids made into Arrow strings at a time (their bytes objects are held meanwhile)


def key(store: TokenStore) -> str | None:
    """The name of the index of what ``store`` holds now; ``None`` where it does not hold every source row."""
    if not len(store.segment) or store.segment.min() < 0:
        return None
    return xxhash.xxh3_128(VERSION + store.digest.tobytes()).hexdigest()


def keep(store: TokenStore, indexed: Indexed) -> None:
    """Write ``indexed`` (every source row's, in source order) as the index of what
    ``store`` holds now, in place of any other; nothing where the store cannot be written."""
    name = key(store)
    if name is None or not store.writable or len(indexed.tokens) != len(store.tokens):
        return
    path, draft = store.folder / f"{PREFIX}{name}{SUFFIX}", draft_path(store.folder)
    try:
        data = _encode(indexed)
        with open(draft, "xb") as f:
            f.write(data)
            f.write(xxhash.xxh3_128(data).digest())
        os.replace(draft, path)
    except (OSError, pa.ArrowException, ValueError):  # (no room, say, or ids of over 2 GiB)
        with suppress(OSError):
            draft.unlink(missing_ok=True)
        return
    for other in store.folder.glob(f"{PREFIX}*{SUFFIX}"):
        if other.name != path.name:
            with suppress(OSError):
                other.unlink(missing_ok=True)


def forget(store: TokenStore) -> None:
    """Remove the index of what ``store`` holds now (a conversation is not as it says)."""
    name = key(store)
    if name is not None:
        with suppress(OSError):
            (store.folder / f"{PREFIX}{name}{SUFFIX}").unlink(missing_ok=True)


def read(store: TokenStore, order: np.ndarray) -> Indexes | None:
    """The index of what ``store`` holds now, in packing ``order``, where the entry keeps
    it whole (its checksum matches, and its tokens are the records'); else ``None``."""
    name = key(store)
    if name is None:
        return None
    try:
        data = (store.folder / f"{PREFIX}{name}{SUFFIX}").read_bytes()
    except OSError:
        return None
    body, checksum = data[:-CHECKSUM_BYTES], data[-CHECKSUM_BYTES:]
    if len(data) < CHECKSUM_BYTES or xxhash.xxh3_128(body).digest() != checksum:
        return None
    indexed = _decode(body, store.tokens)
    if indexed is None:
        return None
    indexes = Indexes(order)
    indexes.add(np.arange(len(order)), indexed)
    return indexes


def _encode(indexed: Indexed) -> pa.Buffer:
    """``indexed`` as an Arrow IPC file: one batch of a row per conversation (its ``source``
    value a number into the values, which are few)."""
    n = len(indexed.tokens)
    number: dict[str | None, int] = {None: -1}
    for value in dict.fromkeys(indexed.values):
        number.setdefault(value, len(number) - 1)
    codes = np.fromiter(map(number.__getitem__, indexed.values), np.int32, n)
    names = strings([name for name in number if name is not None])
    offsets = numbers(np.concatenate([[0], np.cumsum(indexed.counts)]), pa.int64())
    ids = [strings(indexed.ids[start : start + STRINGS_AT_ONCE]) for start in range(0, n, STRINGS_AT_ONCE)]
    invalid = pa.nulls(n, pa.string()) if indexed.invalid.count(None) == n else strings(indexed.invalid)
    batch = pa.record_batch(
        [
            numbers(indexed.tokens, pa.int64()),
            pa.concat_arrays(ids) if ids else strings([]),
            pa.DictionaryArray.from_arrays(numbers(codes, pa.int32(), valid=codes >= 0), names),
            invalid,
            pa.LargeListArray.from_arrays(offsets, numbers(indexed.begins, pa.int32())),
            pa.LargeListArray.from_arrays(offsets, numbers(indexed.ends, pa.int32())),
        ],
        names=["tokens", "id", "source", "invalid", "begins", "ends"],
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, batch.schema, options=pa.ipc.IpcWriteOptions(compression="lz4")) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def _decode(body: bytes, tokens: np.ndarray) -> Indexed | None:
    """The index an IPC file ``body`` holds (``_encode``), where it is one of conversations
    of ``tokens`` (the records'): the same tokens, an invalid reason where one has none,
    and supervised runs within each (and its [EOS]); else ``None``."""
    try:
        reader = pa.ipc.open_file(pa.py_buffer(body))
        if reader.num_record_batches != 1:
            return None
        batch = reader.get_batch(0)
        stored, ids, values, invalid, begins, ends = batch.columns
        if batch.num_rows != len(tokens) or not np.array_equal(to_numpy(stored), tokens):
            return None
        if not np.array_equal(to_numpy(invalid.is_valid()), tokens < 0):
            return None
        counts = np.diff(to_numpy(begins.offsets))
        first, last = to_numpy(begins.values).astype(np.int32), to_numpy(ends.values).astype(np.int32)
        within = np.repeat(np.maximum(tokens, 0) + 1, counts)
        if counts[tokens < 0].any() or not len(first) == len(last) == len(within):
            return None
        if not ((0 <= first) & (first < last) & (last <= within)).all():
            return None
        names = values.dictionary.to_pylist()
        return Indexed(
            tokens.copy(),
            ids.to_pylist(),
            [None if code is None else names[code] for code in values.indices.to_pylist()],
            [None] * len(invalid) if invalid.null_count == len(invalid) else invalid.to_pylist(),
            counts,
            first,
            last,
        )
    except (pa.ArrowException, ValueError, TypeError, AttributeError, IndexError):
        return None

"""The index a token store entry keeps of its conversations, which a later build reads instead of them.

A build whose store gives every conversation packs from it in its workers
(``fixed_sft.parallel``), and first needs each conversation's tokens, supervised runs, id,
``source`` value and invalid reason: the index pass reads them all (every stored byte)
for that. A build that has the index of every source row (its fill encoded them, or its
index pass read them) keeps it in the entry, as one Arrow IPC file (``index-KEY.arrow``);
a later build of all rows, or of rows that need a good part of the source, reads it in
place of the index pass.

The file is named by ``key``: the XXH3-128 of the code that writes and reads an index
(``CODE_MODULES``) and of the record digest of each source row's copy, as the store holds
them (each covers that copy's bytes). A store that holds another copy of a row (encoded
again, or checked since), or other code, has another key, and does not read the file.
The file ends with the XXH3-128 of its bytes. It is read only where it is a regular file
of at most the size its conversations allow, and it matches its checksum and ``SCHEMA``,
Arrow's full validation, and the records: the same tokens; an invalid reason just where
the record has no tokens (is invalid), and each invalid row's id and reason as its record
holds them; each conversation's supervised runs in order, apart and within its tokens
(as ``cuts.runs`` finds them: its [EOS] is never supervised). The write pass then reads
each conversation it writes, checks its digest, and that its id, ``source`` value and
each row's supervised tokens are the index's: one that does not match gives way to
packing in this process, which finds a damaged one and encodes it again
(``parallel.Unheld``). Like the segments' checksums, the file proves nothing against
someone who writes both it and its checksum. The store is an optimisation only, and so is
this file: rows are the same without it.
"""

from __future__ import annotations

import os
from contextlib import suppress
from functools import cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import xxhash

from .arrow import numbers, strings, to_numpy
from .hashes import open_regular
from .parallel import Indexed, Indexes
from .store import TokenStore, draft_path

VERSION = b"fixed-sft kept index 2"
CODE_MODULES = ("cuts.py", "kept.py", "parallel.py")  # what an index holds, and how it is read
PREFIX, SUFFIX = "index-", ".arrow"
CHECKSUM_BYTES = 16
STRINGS_AT_ONCE = 1 << 16  # ids made into Arrow strings at a time (their bytes objects are held meanwhile)
RUNS = pa.large_list(pa.int32())
SCHEMA = pa.schema(
    [
        ("tokens", pa.int64()),
        ("id", pa.large_string()),
        ("source", pa.dictionary(pa.int32(), pa.string())),
        ("invalid", pa.large_string()),
        ("begins", RUNS),
        ("ends", RUNS),
    ]
)


@cache
def _code() -> bytes | None:
    """The digest of ``VERSION`` and of the bytes of ``CODE_MODULES``; ``None`` where they
    cannot be read (a package installed without its sources)."""
    digest = xxhash.xxh3_128(VERSION)
    try:
        for name in CODE_MODULES:
            digest.update((Path(__file__).parent / name).read_bytes())
    except OSError:
        return None
    return digest.digest()


def key(store: TokenStore) -> str | None:
    """The key that names the index of what ``store`` holds now (``index-KEY.arrow``);
    ``None`` where it does not hold every source row (or the code's bytes cannot be read)."""
    code = _code()
    if code is None or not len(store.segment) or store.segment.min() < 0:
        return None
    return xxhash.xxh3_128(code + store.digest.tobytes()).hexdigest()


def keep(store: TokenStore, indexed: Indexed) -> None:
    """Write ``indexed`` (every source row's, in source order) as the index of what
    ``store`` holds now, in place of any other; nothing where it cannot be written (no
    room, say, or ``source`` values of over 2 GiB): the store is an optimisation only."""
    draft = None
    try:
        name = key(store)
        if name is None or not store.writable or len(indexed.tokens) != len(store.tokens):
            return
        path, draft = store.folder / f"{PREFIX}{name}{SUFFIX}", draft_path(store.folder)
        data = _encode(indexed)
        with open(draft, "xb") as f:
            f.write(data)
            f.write(xxhash.xxh3_128(data).digest())
        os.replace(draft, path)
        draft = None
        for other in store.folder.glob(f"{PREFIX}*{SUFFIX}"):
            if other.name != path.name:
                other.unlink(missing_ok=True)
    except Exception:  # noqa: BLE001  (nothing kept, or another index left)
        if draft is not None:
            with suppress(OSError):
                draft.unlink(missing_ok=True)


def forget(store: TokenStore) -> None:
    """Remove the index of what ``store`` holds now (a conversation is not as it says)."""
    name = key(store)
    if name is not None:
        with suppress(OSError):
            (store.folder / f"{PREFIX}{name}{SUFFIX}").unlink(missing_ok=True)


def read(store: TokenStore, order: np.ndarray) -> Indexes | None:
    """The index of what ``store`` holds now, in packing ``order``, where the entry keeps
    it whole and sound (module docstring); else ``None``."""
    name = key(store)
    if name is None:
        return None
    tokens = store.tokens
    # (an index holds a conversation's metadata once, and at most a run per 2 tokens)
    most = int(store.meta.sum() + 4 * (np.maximum(tokens, 0) + 2).sum() + 64 * len(tokens)) + (1 << 20)
    try:
        opened = open_regular(store.folder / f"{PREFIX}{name}{SUFFIX}", follow_links=False)
        if opened is None:
            return None
        with opened as f:
            size = os.fstat(f.fileno()).st_size
            if not CHECKSUM_BYTES < size <= most:
                return None
            data = f.read(size)
    except (OSError, MemoryError):
        return None
    body, checksum = memoryview(data)[:-CHECKSUM_BYTES], data[-CHECKSUM_BYTES:]
    if len(data) != size or xxhash.xxh3_128(body).digest() != checksum:
        return None
    indexed = _decode(body, tokens)
    if indexed is None or not _invalid_as_stored(store, indexed):
        return None
    indexes = Indexes(order)
    indexes.add(np.arange(len(order)), indexed)
    return indexes


def _encode(indexed: Indexed) -> pa.Buffer:
    """``indexed`` as an Arrow IPC file of ``SCHEMA``: one batch of a row per conversation
    (its ``source`` value a number into the values, which are few)."""
    n = len(indexed.tokens)
    number: dict[str | None, int] = {None: -1}
    for value in dict.fromkeys(indexed.values):
        number.setdefault(value, len(number) - 1)
    codes = np.fromiter(map(number.__getitem__, indexed.values), np.int32, n)
    names = strings([name for name in number if name is not None])
    offsets = numbers(np.concatenate([[0], np.cumsum(indexed.counts)]), pa.int64())
    batch = pa.record_batch(
        [
            numbers(indexed.tokens, pa.int64()),
            _large_strings(indexed.ids),
            pa.DictionaryArray.from_arrays(numbers(codes, pa.int32(), valid=codes >= 0), names),
            pa.nulls(n, pa.large_string()) if indexed.invalid.count(None) == n else _large_strings(indexed.invalid),
            pa.LargeListArray.from_arrays(offsets, numbers(indexed.begins, pa.int32())),
            pa.LargeListArray.from_arrays(offsets, numbers(indexed.ends, pa.int32())),
        ],
        schema=SCHEMA,
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, SCHEMA, options=pa.ipc.IpcWriteOptions(compression="lz4")) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def _large_strings(values: list[str | None]) -> pa.Array:
    """``values`` as an Arrow large string array, made ``STRINGS_AT_ONCE`` at a time."""
    parts = [strings(values[at : at + STRINGS_AT_ONCE], large=True) for at in range(0, len(values), STRINGS_AT_ONCE)]
    return pa.concat_arrays(parts) if parts else pa.nulls(0, pa.large_string())


def _decode(body: memoryview, tokens: np.ndarray) -> Indexed | None:
    """The index an IPC file ``body`` holds (``_encode``), where it is one of conversations
    of ``tokens`` (the records'): the same tokens, an invalid reason just where one has
    none, each one's supervised runs in order, apart and within its tokens; else ``None``."""
    try:
        reader = pa.ipc.open_file(pa.py_buffer(body))
        if reader.num_record_batches != 1 or not reader.schema.equals(SCHEMA):
            return None
        batch = reader.get_batch(0)
        batch.validate(full=True)  # (offsets within their buffers: else a read may crash)
        stored, ids, values, invalid, begins, ends = batch.columns
        if batch.num_rows != len(tokens) or stored.null_count or not np.array_equal(to_numpy(stored), tokens):
            return None
        if not np.array_equal(_given(invalid), tokens < 0):
            return None
        if any(runs.null_count or runs.values.null_count for runs in (begins, ends)):
            return None
        if not np.array_equal(to_numpy(begins.offsets), to_numpy(ends.offsets)):
            return None
        counts = np.diff(to_numpy(begins.offsets))
        first, last = to_numpy(begins.values), to_numpy(ends.values)
        within = np.repeat(np.maximum(tokens, 0), counts)
        if counts[tokens < 0].any() or not len(first) == len(last) == len(within):
            return None
        if not ((0 <= first) & (first < last) & (last <= within)).all():
            return None
        same = np.repeat(np.arange(len(counts)), counts)  # (each run's conversation)
        if ((same[1:] == same[:-1]) & (first[1:] <= last[:-1])).any():
            return None
        names = values.dictionary.to_pylist()
        return Indexed(
            tokens.copy(),
            ids.to_pylist(),
            [None if code is None else names[code] for code in values.indices.to_pylist()],
            [None] * len(invalid) if invalid.null_count == len(invalid) else invalid.to_pylist(),
            counts,
            first.astype(np.int32),
            last.astype(np.int32),
        )
    except Exception:  # noqa: BLE001  (pyarrow raises OSError, ArrowException and more for a file not its own)
        return None


def _given(values: pa.Array) -> np.ndarray:
    """Whether each of ``values`` is not null (``is_valid`` imports pyarrow.compute: 25 ms).

    >>> _given(strings(["a", None, "b"])[1:]).tolist(), _given(pa.nulls(2, pa.large_string())).tolist()
    ([False, True], [False, False])
    """
    if values.null_count in (0, len(values)):
        return np.full(len(values), values.null_count == 0)
    bits = np.frombuffer(values.buffers()[0], np.uint8)
    return np.unpackbits(bits, bitorder="little", count=values.offset + len(values))[values.offset :].astype(bool)


def _invalid_as_stored(store: TokenStore, indexed: Indexed) -> bool:
    """Whether the index gives each invalid row the id and reason its record holds (they
    are few; the write pass checks the valid ones it reads)."""
    rows = np.flatnonzero(indexed.tokens < 0).tolist()
    stored = store.lookup_many(rows)
    return all(
        item is not None and (item.id, item.invalid) == (indexed.ids[row], indexed.invalid[row])
        for row, item in zip(rows, stored)
    )

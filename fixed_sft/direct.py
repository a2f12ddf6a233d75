"""Rows of conversations the token store holds, read straight into their row groups, in this process.

A build whose store gives every conversation (held, and checked where sampled), valid by
its records, and which packs in this process, cuts its rows from the records before it
reads anything: a unit is a conversation's stored tokens and its ``[EOS]``
(``fixed_sft.cuts``). It then reads, a row group at a time, the conversations that the
group's rows hold straight into one buffer of their tokens (``TokenStore.read_into``), so
that the rows are views of it: no copy per conversation, none per row, and none per row
group where every row of it is kept (``output.rows_table``). A row with no supervised
token after token 0 is skipped, as ``fixed_sft.pack`` skips it. The rows, the Parquet file
and the manifest are those of packing one conversation at a time (``tests/test_direct.py``).

A conversation whose id an earlier one used, or whose bytes do not match its digest, ends
this path (``Unsuited``): the build then packs one conversation at a time, which says or
records why, and encodes what the store lacks.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .cuts import Cuts
from .hashes import row_digest
from .output import RowWriter, rows_per_group
from .pack import Row, Segment
from .parallel import Packed, Rows, Stream, left_out, tally
from .store import TokenStore, parse_metas


class Unsuited(Exception):
    """The stream repeats an id, or the store holds one of its conversations damaged."""


def usable(store: TokenStore, order: np.ndarray, given: np.ndarray) -> bool:
    """Whether this path packs ``order``: the store gives (``given``) every one of its
    conversations, and records each as valid."""
    return sys.byteorder == "little" and bool(given[order].all()) and bool((store.tokens[order] >= 0).all())


def pack(
    store: TokenStore,
    order: np.ndarray,
    wanted: int | None,
    shape: tuple[int, int, bool],
    check_every: int,
    writer: RowWriter,
    progress: Callable[[int], None],
) -> Packed:
    """Write the rows of ``order`` to ``writer``, up to ``wanted`` kept rows (``None``: all),
    with ``shape``'s row tokens, separator id and boundaries; what was packed (the file's
    sha256 is the caller's, once it closes ``writer``). ``progress`` is told of each row
    group's kept rows. ``Unsuited`` where this path cannot pack them."""
    row_tokens, eos_id, boundaries = shape
    sizes = store.tokens[order] + 1
    cuts = Cuts.of(sizes, row_tokens)
    supervised = np.zeros(cuts.rows, np.int64)
    trainable = np.zeros(cuts.rows, np.int64)
    codes = np.zeros(len(order), np.int64)  # (of the conversations read: the others are in no kept row)
    values: dict[str | None, int] = {}
    seen: dict[str, int] = {}
    digests: list[bytes] = []
    group = rows_per_group(row_tokens)
    considered, stopped = cuts.rows, False
    carried: _Unit | None = None
    for begin in range(0, cuts.rows, group):
        end = min(begin + group, cuts.rows)
        low, high = int(cuts.first[begin]), int(cuts.last[end - 1]) + 1
        ids, mask, names, fresh = _read(store, order, cuts, (low, high), eos_id, carried)
        for unit, (row_id, value) in zip(range(high - len(fresh), high), fresh):
            if left_out(int(order[unit]), row_id, None, seen) is not None:
                raise Unsuited(f"source row {int(order[unit])}: an earlier conversation has its id")
            codes[unit] = values.setdefault(value, len(values))
        last = slice(int(cuts.starts[high - 1] - cuts.starts[low]), int(cuts.starts[high] - cuts.starts[low]) - 1)
        carried = _Unit(high - 1, ids[last], mask[last], names[-1])
        at = begin * row_tokens - int(cuts.starts[low])
        ids_rows = ids[at : at + (end - begin) * row_tokens].reshape(-1, row_tokens)
        mask_rows = mask[at : at + (end - begin) * row_tokens].reshape(-1, row_tokens)
        supervised[begin:end] = np.count_nonzero(mask_rows, axis=1)
        trainable[begin:end] = np.count_nonzero(mask_rows[:, 1:], axis=1)
        where = [a[begin:end].tolist() for a in (cuts.first, cuts.head, cuts.last, cuts.tail)]
        sources, unit_sizes = order[low:high].tolist(), sizes[low:high].tolist()
        kept_before = len(digests)
        for r in np.flatnonzero(trainable[begin:end]).tolist():
            first, head, final, tail = (w[r] for w in where)
            segments = tuple(
                Segment(
                    sources[unit - low],
                    names[unit - low],
                    head if unit == first else 0,
                    tail if unit == final else unit_sizes[unit - low],
                )
                for unit in range(first, final + 1)
            )
            row = Row(ids_rows[r], mask_rows[r], segments)
            digests.append(row_digest(row.ids, row.mask, row.cu_seqlens if boundaries else None))
            writer.write(row)
            if len(digests) == wanted:
                considered, stopped = begin + r + 1, True
                break
        progress(len(digests) - kept_before)
        if stopped:
            break
    kept = trainable[:considered] > 0
    rows = Rows(np.arange(len(order)), sizes, cuts, supervised, trainable, considered, kept, stopped)
    stream = Stream()  # (what ``tally`` reads of it: the rows' masks gave the supervised tokens)
    stream.indices, stream.codes, stream.values = [order], codes.tolist(), values
    packed = tally(stream, rows, check_every)
    packed.digests = digests
    return packed


class _Unit(NamedTuple):
    """A conversation read for one row group, which the next may hold too: its position in
    the stream, its tokens and mask (without its ``[EOS]``), and its id."""

    position: int
    ids: np.ndarray
    mask: np.ndarray
    id: str | None


def _read(
    store: TokenStore,
    order: np.ndarray,
    cuts: Cuts,
    units: tuple[int, int],
    eos_id: int,
    carried: _Unit | None,
) -> tuple[np.ndarray, np.ndarray, list[str | None], list[tuple[str | None, str | None]]]:
    """The tokens and mask of ``units`` (stream positions ``low..high``, exclusive), each
    followed by its ``[EOS]`` (mask 0), in one buffer each; their ids; and the id and
    ``source`` value of each read now (all but ``carried``, the last one read before,
    where it is the first). ``Unsuited`` where one does not match its digest, or its
    metadata is not a valid conversation's."""
    low, high = units
    base = int(cuts.starts[low])
    starts = cuts.starts[low : high + 1] - base
    ids = np.empty(int(starts[-1]), np.int32)
    mask = np.empty(int(starts[-1]), np.uint8)
    names: list[str | None] = []
    if carried is not None and carried.position == low:
        ids[: len(carried.ids)], mask[: len(carried.mask)] = carried.ids, carried.mask
        names.append(carried.id)
        low += 1
    metas = store.read_into(order[low:high], starts[low - units[0] : -1].tolist(), ids, mask)
    if metas is None:
        raise Unsuited("a stored conversation does not match its digest")
    fresh = []
    for meta in parse_metas(metas):
        if meta is None or meta[2] is not None:
            raise Unsuited("a conversation stored as valid holds other metadata")
        fresh.append((meta[0], meta[1]))
        names.append(meta[0])
    ends = starts[1:] - 1  # (each unit's [EOS])
    ids[ends], mask[ends] = eos_id, 0
    return ids, mask, names, fresh

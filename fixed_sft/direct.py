"""Rows of conversations the token store holds, read straight into their row groups, in this process.

A build whose store gives the conversations its rows need (held, and checked where
sampled; ``reach``: all of the order, or for some rows a prefix of it), and which packs in
this process, cuts its rows from the records before it reads anything: a unit is a valid
conversation's stored tokens and its ``[EOS]`` (``fixed_sft.cuts``). It then reads, a row
group at a time, the conversations that the group's rows hold straight into one buffer of
the group's tokens (``store.UnitReader``), so that the rows are views of it: no copy per
conversation and none per row. A row with no supervised token after token 0 is skipped, as
``fixed_sft.pack`` skips it. Each stretch read is the rows that fill the writer's row
group, which then goes to Arrow uncopied too (``output.rows_table``); a group that a
skipped row left short takes the rows it lacks from a stretch of their own (that group
alone is copied). The rows, the Parquet file and the manifest are those of packing one
conversation at a time (``tests/test_direct.py``).

A conversation the store holds as invalid is left out of the stream and recorded (its
reason read from the store), where the build skips invalid rows; else the path ends before
it (``reach``). A conversation whose id an earlier one used, or whose bytes do not match
its digest, or a prefix whose rows (some skipped) fall short of those asked for, ends this
path (``Unsuited``): the build then packs one conversation at a time, which says or records
why, and encodes what the store lacks.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .cuts import Cuts
from .hashes import row_digest
from .output import RowWriter, rows_per_group
from .pack import Row, Segment
from .parallel import Invalid, Packed, Rows, Stream, left_out, tally
from .store import Damaged, TokenStore


class Unsuited(Exception):
    """The stream repeats an id, the store holds one of its conversations damaged, or what
    it gives fills too few rows."""


def reach(
    store: TokenStore, order: np.ndarray, given: np.ndarray, wanted: int | None, row_tokens: int, skip_invalid: bool
) -> int | None:
    """How far into ``order`` this path packs: up to the first conversation that the store
    does not give (``given``), or records as invalid where the build does not skip such
    rows. ``None`` where that is not the whole order and its valid conversations cannot
    fill the ``wanted`` rows (``None``: every row)."""
    tokens = store.tokens[order]
    stops = np.flatnonzero(~given[order] | ((tokens < 0) & (not skip_invalid)))
    if not len(stops):
        return len(order)
    before = tokens[: stops[0]]
    if wanted is None or np.where(before < 0, 0, before + 1).sum() // row_tokens < wanted:
        return None
    return int(stops[0])


def pack(
    store: TokenStore,
    order: np.ndarray,
    wanted: int | None,
    shape: tuple[int, int, bool],
    check_every: int,
    writer: RowWriter,
    progress: Callable[[int], None],
    given: int | None = None,
) -> Packed:
    """Write the rows of ``order`` to ``writer``, up to ``wanted`` kept rows (``None``: all),
    with ``shape``'s row tokens, separator id and boundaries, from its first ``given``
    conversations (``reach``; ``None``: all); what was packed (the file's sha256 is the
    caller's, once it closes ``writer``). ``progress`` is told of each row group's kept
    rows. A conversation stored as invalid is left out, and recorded where one conversation
    at a time records it: before the last row's last conversation. Where every row is
    cut, the conversations after the last are read too (their ids counted, as one
    conversation at a time counts them). ``Unsuited`` where this path cannot pack them: a
    repeated id, a damaged conversation, or too few rows before ``given``."""
    row_tokens, eos_id, boundaries = shape
    whole = given is None or given == len(order)
    streamed = order[:given]
    units = np.flatnonzero(store.tokens[streamed] >= 0)  # (the valid conversations' positions)
    conversations = streamed[units]
    sizes = store.tokens[conversations] + 1
    cuts = Cuts.of(sizes, row_tokens)
    reader = _Reader(store, conversations, eos_id)
    supervised = np.zeros(cuts.rows, np.int64)
    trainable = np.zeros(cuts.rows, np.int64)
    digests: list[bytes] = []
    group = rows_per_group(row_tokens)
    considered, stopped, begin = cuts.rows, False, 0
    while begin < cuts.rows:
        end = min(begin + group - len(digests) % group, cuts.rows)  # (the rows that fill the writer's group)
        low, high = int(cuts.first[begin]), int(cuts.last[end - 1]) + 1
        ids, mask, names = reader.take(low, high, (begin * row_tokens, end * row_tokens))
        ids_rows, mask_rows = ids.reshape(-1, row_tokens), mask.reshape(-1, row_tokens)
        supervised[begin:end] = np.count_nonzero(mask_rows, axis=1)
        trainable[begin:end] = supervised[begin:end] - (mask_rows[:, 0] != 0)  # (token 0 trains nothing)
        where = [a[begin:end].tolist() for a in (cuts.first, cuts.head, cuts.last, cuts.tail)]
        sources, unit_sizes = conversations[low:high].tolist(), sizes[low:high].tolist()
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
        begin = end
    if not stopped and not whole:
        raise Unsuited("the conversations the store gives fill too few rows")
    if not stopped and reader.read_to < len(conversations):
        reader.take(reader.read_to, len(conversations))  # (the stream's tail)
    kept = trainable[:considered] > 0
    rows = Rows(units, sizes, cuts, supervised, trainable, considered, kept, stopped)
    recorded = int(units[rows.fed - 1]) if stopped else len(streamed)  # (``tally`` records those before it)
    bad = _invalid(store, streamed[:recorded])
    codes = np.zeros(len(streamed), np.int64)
    codes[units] = reader.codes
    stream = Stream()  # (what ``tally`` reads of it: the rows' masks gave the supervised tokens)
    stream.indices, stream.codes, stream.values, stream.bad = [streamed], codes.tolist(), reader.values, bad
    packed = tally(stream, rows, check_every)
    packed.digests = digests
    return packed


def _invalid(store: TokenStore, order: np.ndarray) -> list[tuple[int, Invalid]]:
    """The conversations of ``order`` stored as invalid: their positions, and each one's
    source row, id and reason, as the store holds them; ``Unsuited`` where one is damaged
    (it is then held no more)."""
    positions = np.flatnonzero(store.tokens[order] < 0)
    bad = []
    for position, item in zip(positions.tolist(), store.lookup_many(order[positions].tolist())):
        if item is None or item.invalid is None:
            raise Unsuited(f"source row {int(order[position])}: damaged in the token store")
        bad.append((position, Invalid(item.source_index, item.id, item.invalid)))
    return bad


class _Reader:
    """Reads the stream's units from the store (``store.UnitReader``), a stretch at a time,
    each once: their ids checked as ``parallel.left_out`` checks them, their ``source``
    values numbered (``codes``: per unit read, in order of first appearance)."""

    def __init__(self, store: TokenStore, order: np.ndarray, eos_id: int) -> None:
        located = store.locate(order)
        if located is None:
            raise Unsuited("the store does not hold every conversation, valid")
        self.store, self.order, self.units = store, order, store.units(located, eos_id)
        self.codes = np.zeros(len(order), np.int64)  # (0 for a unit not read: it is in no kept row)
        self.values: dict[str | None, int] = {}
        self.seen: dict[str, int] = {}
        self.read_to = 0  # (units before it are read)

    def take(
        self, low: int, high: int, window: tuple[int, int] | None = None
    ) -> tuple[np.ndarray, np.ndarray, list[str | None]]:
        """Stream positions ``window`` (all, where ``None``) of units ``low..high``
        (exclusive; from the last one read or the first not read), each unit followed by
        its ``[EOS]`` (mask 0), in one buffer of tokens and one of mask values; and their
        ids. ``Unsuited`` where one repeats an id, does not match its digest (it is then
        held no more), or holds metadata other than a valid conversation's."""
        try:
            ids, mask, metas = self.units.take(low, high, window)
        except Damaged as damaged:
            self.store.forget(int(self.order[damaged.position]))
            raise Unsuited(f"source row {int(self.order[damaged.position])}: damaged in the token store") from None
        for unit, meta in zip(range(self.units.fresh, high), metas[self.units.fresh - low :]):
            if meta is None or meta[2] is not None:
                raise Unsuited(f"source row {int(self.order[unit])}: stored as valid, with other metadata")
            row_id, value, _ = meta
            if left_out(int(self.order[unit]), row_id, None, self.seen) is not None:
                raise Unsuited(f"source row {int(self.order[unit])}: an earlier conversation has its id")
            self.codes[unit] = self.values.setdefault(value, len(self.values))
        self.read_to = high
        return ids, mask, [meta[0] for meta in metas]  # type: ignore[index]  # (each checked when read)

"""Rows of the conversations the token store holds: cut from prefix sums, assembled and written in the workers.

A build whose conversations are all in the store, and which has started its workers to
encode (to fill the store, or to check conversations stored unchecked), packs in two passes,
each a task per block, run in those workers:

1. ``index``: a block of packing positions, read from the store, each conversation's
   digest checked: its tokens, id, ``source`` value, invalid reason and supervised runs
   (the valid ones a stretch at a time into one buffer, as the write pass reads them:
   half the CPU of reading them one at a time).
   This process then keeps the valid conversations (an invalid one, or one whose id an
   earlier one used, stops the build or is recorded and left out, as ``build._valid``
   does), cuts rows from the prefix sums of their sizes (``fixed_sft.cuts``), and keeps
   those with a supervised token after token 0, up to the rows asked for. Where the
   build's fill has just encoded and stored every source row, it kept their index
   (``Indexes``): its blocks stand for this pass, which then reads nothing back.
2. ``write``: one or more row groups of kept rows (``groups_per_part``), read again from
   the store, assembled as ``fixed_sft.pack`` assembles them, hashed, and written as a
   Parquet file of its own; this process joins the files in order (``fixed_sft.stitch``).

The rows, the Parquet file and the manifest are those of packing one conversation at a
time (``tests/test_parallel.py``), for any number of workers (a build packs so from
``build.PARALLEL_PACKING_WORKERS``). The parts are written into the build's temporary
folder (``output.PARTS_NAME``), which ``fixed_sft.folder`` removes with it where a build
stops. In the index pass, a conversation whose digest does not match, or a position the
store does not hold, ends this path (``Unheld``): the build then packs in its own process,
one conversation at a time, which encodes what the store lacks (``fixed_sft.direct``, tried
first, finds the damage too and gives way). In the write pass every conversation has
matched already: one that no longer does stops the build (``StoreChanged``).
"""

from __future__ import annotations

import re
import shutil
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .cuts import Cuts, Runs, runs
from .encode import Encoded, sampled
from .encoding import TemplateMismatch
from .errors import BuildError
from .hashes import row_digest
from .memory import give_back_between
from .output import PARTS_NAME, naming, rows_per_group, write_part
from .pack import Row, Segment
from .stitch import Stitcher, footer
from .store import Damaged, Located, SegmentReader, TokenStore, UnitReader
from .thrift import Fields

BLOCK = 4096  # packing positions per index task: at most this many
MIN_BLOCK = 256  # and at least this many (or the rest)
STRETCH_TOKENS = 1 << 22  # tokens an index task reads into one buffer: at most this many (or one conversation)
PART_VALUES = 1 << 22  # tokens a write task writes: whole row groups of at most this many, or one (``groups_per_part``)
WRITE_TASKS = 128  # and as few row groups a task as keep this many tasks
ZERO = np.zeros(1, np.uint8)
Run = Callable[[Callable[[Any, Any], Any], Iterable[Any]], Iterator[Any]]  # maps fn(state, task) over tasks, in order


class Unheld(Exception):
    """The store does not hold a conversation this path needs, or holds it damaged."""


class StoreChanged(BuildError):
    """A stored conversation read well by the index pass no longer does when its row is written."""


class Stored(NamedTuple):
    """A block of packing positions to index: its valid conversations as their records
    place them (read a stretch at a time into one buffer), and its invalid ones (each
    read by its record: a segment file, a record in it and a source row)."""

    size: int
    valid: np.ndarray  # the block's positions of valid conversations
    located: Located  # where they are
    invalid: list[tuple[int, int, int, int]]  # per invalid one: its position, file (of ``files``), record, source row
    files: tuple[str, ...]

    @classmethod
    def of(cls, store: TokenStore, indices: np.ndarray) -> Stored:
        numbers = store.segment[indices]
        if len(numbers) and numbers.min() < 0:
            raise Unheld(f"source row {int(indices[np.argmin(numbers)])}: not in the token store")
        bad = store.tokens[indices] < 0
        located = store.locate(indices[~bad])
        assert located is not None  # (each held, and valid)
        used, files = np.unique(numbers[bad], return_inverse=True)
        where = zip(np.flatnonzero(bad).tolist(), files.reshape(-1).tolist(), store.slot[indices[bad]].tolist())
        invalid = [(position, file, slot, int(indices[position])) for position, file, slot in where]
        paths = tuple(str(store.segments[number]) for number in used.tolist())
        return cls(len(indices), np.flatnonzero(~bad), located.compact(), invalid, paths)

    def read(self) -> Indexed:
        """The block's index, each conversation checked against its digest; ``Unheld``
        where one does not match, or its metadata is not a conversation's as stored."""
        located = self.located
        tokens = np.full(self.size, -1, np.int64)
        tokens[self.valid] = located.tokens
        ids: list[str | None] = [None] * self.size
        values: list[str | None] = [None] * self.size
        invalid: list[str | None] = [None] * self.size
        counts = np.zeros(self.size, np.int64)
        begins, ends = [np.zeros(0, np.int32)], [np.zeros(0, np.int32)]
        reader = SegmentReader(located.paths)
        try:
            units = UnitReader(reader, located, 0)  # (the mask of [EOS] alone is read: 0)
            for low, high in _stretches(located.tokens + 1, STRETCH_TOKENS):
                try:
                    _, mask, metas = units.take(low, high)
                except Damaged as damaged:
                    raise _damaged(int(located.indices[damaged.position])) from None
                for position, index, meta in zip(self.valid[low:high].tolist(), located.indices[low:high], metas):
                    if meta is None or meta[2] is not None:
                        raise _damaged(int(index))
                    ids[position], values[position] = meta[0], meta[1]
                stretch, first, last = _unit_runs(mask, units.starts[low : high + 1] - units.starts[low])
                counts[self.valid[low:high]] = stretch
                begins.append(first)
                ends.append(last)
        finally:
            reader.close()
        reader = SegmentReader(self.files)
        try:
            for position, number, slot, index in self.invalid:
                item = reader.read(number, slot, index)
                if item is None or item.mask is not None:
                    raise _damaged(index)
                ids[position], invalid[position] = item.id, item.invalid
        finally:
            reader.close()
        return Indexed(tokens, ids, values, invalid, counts, np.concatenate(begins), np.concatenate(ends))


def _unit_runs(mask: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The supervised runs of the units laid out in ``mask`` from ``starts`` (one more than
    the units; each unit's [EOS], unsupervised, ends its last run): each unit's count of
    runs, and where each run begins and ends within its unit.

    >>> [a.tolist() for a in _unit_runs(np.array([1, 1, 0, 0, 1, 0], np.uint8), np.array([0, 3, 3, 6]))]
    [[1, 0, 1], [0, 1], [2, 2]]
    """
    begins, ends = runs(mask)
    unit = np.searchsorted(starts, begins, side="right") - 1
    counts = np.bincount(unit, minlength=len(starts) - 1)
    return counts, (begins - starts[unit]).astype(np.int32), (ends - starts[unit]).astype(np.int32)


def _damaged(index: int) -> Unheld:
    return Unheld(f"source row {index}: damaged in the token store")


def _stretches(sizes: np.ndarray, most: int) -> Iterator[tuple[int, int]]:
    """Consecutive ranges ``[low, high)`` of units of ``sizes`` of at most ``most`` in all
    (or one unit).

    >>> list(_stretches(np.array([3, 3, 5, 1]), 6))
    [(0, 2), (2, 4)]
    """
    low, ends = 0, np.cumsum(sizes)
    while low < len(sizes):
        high = max(low + 1, int(np.searchsorted(ends, (ends[low - 1] if low else 0) + most, side="right")))
        yield low, high
        low = high


class Indexed(NamedTuple):
    """A block's conversations: tokens (-1: invalid), ids, ``source`` values and invalid
    reasons, and their supervised runs (``counts`` per conversation; begins and ends
    within it, its ``[EOS]`` after its tokens)."""

    tokens: np.ndarray
    ids: list[str | None]
    values: list[str | None]
    invalid: list[str | None]
    counts: np.ndarray
    begins: np.ndarray
    ends: np.ndarray

    @classmethod
    def of(cls, items: Iterable[Encoded]) -> Indexed:
        """The index of conversations in stream order (each followed by its ``[EOS]``)."""
        tokens: list[int] = []
        ids, values, invalid = [], [], []
        masks: list[np.ndarray] = []
        for item in items:
            ids.append(item.id)
            values.append(item.source_value)
            invalid.append(item.invalid)
            tokens.append(-1 if item.mask is None else len(item.mask))
            if item.mask is not None:
                masks.extend((item.mask, ZERO))  # (its [EOS], unsupervised, ends its last run)
        sizes = np.array(tokens, np.int64) + 1  # (with its [EOS]; an invalid one: none)
        starts = np.concatenate([[0], np.cumsum(sizes)])
        flat = np.concatenate(masks) if masks else ZERO
        return cls(np.array(tokens, np.int64), ids, values, invalid, *_unit_runs(flat, starts))


class Block(NamedTuple):
    """A block of the stream, indexed; ``mismatch``: the template check that failed at the
    conversation after it (the block of an encode task stops there), if any."""

    indexed: Indexed
    mismatch: TemplateMismatch | None = None


class Indexes:
    """The index of the conversations a fill encoded and stored (``fixed_sft.fill``), taken
    a part per chunk as the chunks are done (``add``), in place by packing position (of
    ``order``): where it holds every source row once, the stream it gives (``stream``) is
    the one the index pass would read back from the store. (Nothing is then read back
    before the write pass, which checks each conversation as it reads it.) Each part is
    put in packing order as it comes, while the fill runs: the stream is then taken at
    numpy's speed (256,000 conversations: 0.24-0.27 s -> 0.02-0.07 s after the fill, on the
    16-core machine)."""

    def __init__(self, order: np.ndarray) -> None:
        self.rows = rows = len(order)
        self.order = order
        self.position = np.empty(rows, np.int64)  # per source row: its packing position
        self.position[order] = np.arange(rows)
        # per packing position:
        self.held = np.zeros(rows, bool)
        self.tokens, self.counts = np.zeros(rows, np.int64), np.zeros(rows, np.int64)
        self.first_run = np.zeros(rows, np.int64)  # where its supervised runs start among all taken
        self.ids, self.invalid = np.empty(rows, object), np.empty(rows, object)
        self.codes = np.zeros(rows, np.int64)  # its ``source`` value's number (``values``)
        self.values: dict[str | None, int] = {}
        self.added = 0  # rows taken, each time it was taken (more than ``rows``: one twice)
        self.runs: list[tuple[np.ndarray, np.ndarray]] = []  # each part's begins and ends, as taken
        self.taken_runs = 0
        self.named: set[str | None] = set()

    def add(self, rows: np.ndarray, indexed: Indexed) -> None:
        """Take the index of source rows ``rows`` (a chunk's, in its order)."""
        at = self.position[rows]
        self.added += len(rows)
        self.held[at] = True
        self.tokens[at], self.counts[at] = indexed.tokens, indexed.counts
        self.first_run[at] = self.taken_runs + np.cumsum(indexed.counts) - indexed.counts
        self.taken_runs += int(indexed.counts.sum())
        self.runs.append((indexed.begins, indexed.ends))
        self.ids[at], self.invalid[at] = _objects(indexed.ids), _objects(indexed.invalid)
        for value in dict.fromkeys(indexed.values):  # (numbered as they first appear)
            self.values.setdefault(value, len(self.values))
        self.codes[at] = np.fromiter(map(self.values.__getitem__, indexed.values), np.int64, len(indexed.values))
        self.named.update(indexed.ids)

    def by_source(self) -> Indexed | None:
        """The index of every source row, in source order (what ``fixed_sft.kept`` keeps),
        before the stream is taken; ``None`` where a source row is not indexed, or indexed twice."""
        if self.added != self.rows or not self.held.all():
            return None
        at = self.position
        counts = self.counts[at]
        every = _runs_of(self.first_run[at], counts)
        begins = np.concatenate([np.zeros(0, np.int32), *(b for b, _ in self.runs)])
        ends = np.concatenate([np.zeros(0, np.int32), *(e for _, e in self.runs)])
        names = list(self.values)
        values = [names[code] for code in self.codes[at].tolist()]
        ids, invalid = self.ids[at].tolist(), self.invalid[at].tolist()
        return Indexed(self.tokens[at], ids, values, invalid, counts, begins[every], ends[every])

    def stream(self) -> Stream | Iterator[Block] | None:
        """What ``pack`` takes of the index (once): the whole stream where every
        conversation is valid and its id its own; else its blocks, as ``stored`` gives
        them; ``None`` where a source row is not indexed (a chunk stopped at a failed
        template check, say), or indexed twice."""
        if self.added != self.rows or not self.held.all():
            return None
        self.added = -1  # (the runs are let go as the stream is taken)
        begins = np.concatenate([b for b, _ in self.runs]) if self.runs else np.zeros(0, np.int32)
        ends = np.concatenate([e for _, e in self.runs]) if self.runs else np.zeros(0, np.int32)
        self.runs = []  # (held once, joined, while the stream is taken)

        def taken(first: int, last: int) -> np.ndarray:
            """Where the runs of positions ``first..last-1`` are among all taken, in order."""
            return _runs_of(self.first_run[first:last], self.counts[first:last])

        if len(self.named) == self.rows and None not in self.named and (not self.rows or self.tokens.min() >= 0):
            every = taken(0, self.rows)
            runs = (begins[every], ends[every])
            return Stream.whole(self.order, self.tokens, self.counts, *runs, *self._numbered(), self.ids.tolist())
        names = list(self.values)

        def block(first: int, last: int) -> Block:
            values = [names[code] for code in self.codes[first:last].tolist()]
            ids, invalid = self.ids[first:last].tolist(), self.invalid[first:last].tolist()
            runs = taken(first, last)
            counts = self.counts[first:last]
            return Block(Indexed(self.tokens[first:last], ids, values, invalid, counts, begins[runs], ends[runs]))

        return (block(first, min(first + BLOCK, self.rows)) for first in range(0, self.rows, BLOCK))

    def _numbered(self) -> tuple[np.ndarray, dict[str | None, int]]:
        """Each position's ``source`` value's number, and the values, numbered in order of
        first appearance in the stream (as ``Stream.add`` numbers them)."""
        if not self.rows:
            return self.codes, {}
        codes, first = np.unique(self.codes, return_index=True)
        seen = codes[np.argsort(first)].tolist()  # (the codes in order of first appearance)
        renumber = np.zeros(len(self.values), np.int64)
        renumber[seen] = np.arange(len(seen))
        names = list(self.values)
        return renumber[self.codes], {names[code]: number for number, code in enumerate(seen)}


def _runs_of(first: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Where the runs of conversations are among all taken, in their order: ``counts[k]``
    runs from ``first[k]`` for each conversation ``k``.

    >>> _runs_of(np.array([5, 0, 3]), np.array([2, 0, 1])).tolist()
    [5, 6, 3]
    """
    return np.repeat(first - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))


def _objects(values: list) -> np.ndarray:
    """``values`` as a numpy array of Python objects (taken by index at numpy's speed)."""
    array = np.empty(len(values), object)
    array[:] = values
    return array


def index(_: object, task: Stored) -> Block:
    """Read a block of conversations from the store (module docstring, pass 1)."""
    return Block(task.read())


class WriteTask(NamedTuple):
    """Row groups (a part): rows numbered from ``first_row``, each units ``first..last`` of
    ``units`` (the task's conversations, in stream order) from token ``head`` of the first
    to token ``tail`` (exclusive) of the last; what the index said of each row (its
    supervised and trainable tokens) and of each unit (its id and ``source`` value)."""

    units: Located
    first: np.ndarray
    head: np.ndarray
    last: np.ndarray
    tail: np.ndarray
    supervised: np.ndarray
    trainable: np.ndarray
    ids: list[str | None]
    values: list[str | None]
    first_row: int
    row_tokens: int
    eos_id: int
    boundaries: bool
    part: str


def write(_: object, task: WriteTask) -> tuple[list[bytes], tuple[Fields, int]]:
    """Assemble, hash and write a part's row groups (module docstring, pass 2); its rows' digests,
    and the part's footer (read here, in the worker: ``Stitcher.append`` needs it). A row
    group's conversations are read straight into one buffer (``store.UnitReader``), which
    its rows are views of, as it is written (``write_part``): a worker holds one row group's."""
    digests: list[bytes] = []
    group = rows_per_group(task.row_tokens)
    reader = SegmentReader(task.units.paths)
    units = UnitReader(reader, task.units, task.eos_id)

    def rows() -> Iterator[Row]:
        for begin in range(0, len(task.first), group):
            end = min(begin + group, len(task.first))
            low, high = int(task.first[begin]), int(task.last[end - 1]) + 1
            window = (int(units.starts[low] + task.head[begin]), int(units.starts[high - 1] + task.tail[end - 1]))
            try:
                ids, mask, metas = units.take(low, high, window)
            except Damaged as damaged:
                index = int(task.units.indices[damaged.position])
                raise Unheld(f"source row {index}: damaged in the token store") from None
            for r in range(begin, end):
                row = _assembled(task, r, (ids, mask, metas), units.starts, (window[0], low))
                digests.append(row_digest(row.ids, row.mask, row.cu_seqlens if task.boundaries else None))
                yield row

    try:
        write_part(Path(task.part), rows(), task.first_row, task.boundaries)
    finally:
        reader.close()
    give_back_between()  # (the part's freed memory, with many workers)
    return digests, footer(Path(task.part))


def _assembled(
    task: WriteTask, r: int, read: tuple[np.ndarray, np.ndarray, list], starts: np.ndarray, origin: tuple[int, int]
) -> Row:
    """Row ``r`` of ``task``: a view of ``read``, the tokens and mask values of its units
    (each followed by [EOS], masked) from stream position ``origin[0]`` on, each unit
    starting at ``starts`` in the stream, and the metadata of each unit from ``origin[1]``
    on; ``StoreChanged`` where it is not the row the index cut."""
    ids, mask, metas = read
    position, low = origin
    first, last = int(task.first[r]), int(task.last[r])
    at = int(starts[first]) - position + int(task.head[r])
    segments = []
    for unit in range(first, last + 1):
        meta = metas[unit - low]
        start = int(task.head[r]) if unit == first else 0
        end = int(task.tail[r]) if unit == last else int(starts[unit + 1] - starts[unit])
        if meta != (task.ids[unit], task.values[unit], None):
            raise StoreChanged(f"row {task.first_row + r}: the token store's conversations differ from their index")
        segments.append(Segment(int(task.units.indices[unit]), meta[0], start, end))
    row = Row(ids[at : at + task.row_tokens], mask[at : at + task.row_tokens], tuple(segments))
    filled = int(starts[last]) - position + int(task.tail[r]) - at
    supervised = int(np.count_nonzero(row.mask))
    if (filled, supervised, row.trainable) != (task.row_tokens, task.supervised[r], task.trainable[r]):
        raise StoreChanged(f"row {task.first_row + r}: the token store's conversations differ from their index")
    return row


@dataclass
class Packed:
    """What packing counts, for the manifest and the card: the rows kept (their digests,
    supervised and trainable tokens), the rows skipped, and the conversations the stream
    took and the rows hold (``build._Tally`` counts the same one conversation at a time)."""

    rows: int = 0
    digests: list[bytes] = field(default_factory=list)
    row_supervised: list[int] = field(default_factory=list)
    supervised: int = 0
    trainable: int = 0
    rows_skipped: int = 0
    tail_tokens: int = 0
    conversations_encoded: int = 0
    tokens_encoded: int = 0
    template_checked: int = 0
    rows_per_conversation: Counter = field(default_factory=Counter)
    conversation_tokens: list[int] = field(default_factory=list)
    mix: dict[str | None, list[int]] = field(default_factory=dict)
    skipped_invalid: list[dict] = field(default_factory=list)
    parquet_sha256: str | None = None  # the written file's, hashed as it was written


class Invalid(NamedTuple):
    """A conversation left out of the stream, and why: invalid, or its id used before. The
    first in packing order stops a build that does not skip such rows."""

    source_index: int
    id: str | None
    reason: str


DUPLICATE = "duplicate id (first used by source row {})"  # the reason ``left_out`` gives a repeated id
_DUPLICATE = re.compile(re.escape(DUPLICATE).replace(r"\{\}", r"(\d+)"))


def first_user(reason: str) -> int | None:
    """The source row that a duplicate's skip ``reason`` (``left_out``) says used its id first.

    >>> first_user("duplicate id (first used by source row 3)"), first_user("bad")
    (3, None)
    """
    match = _DUPLICATE.fullmatch(reason)
    return None if match is None else int(match[1])


def left_out(index: int, row_id: str | None, invalid: str | None, seen: dict[str, int]) -> str | None:
    """Why source row ``index`` is left out of the stream: it is ``invalid``, or an earlier
    conversation kept used its id (``seen``: id -> source row); else ``None``, and its id is
    now used.

    >>> seen = {}
    >>> left_out(3, "a", None, seen), left_out(5, "a", None, seen), left_out(6, None, "bad", seen)
    (None, 'duplicate id (first used by source row 3)', 'bad')
    """
    if invalid is not None:
        return invalid
    if row_id is not None:
        if row_id in seen:
            return DUPLICATE.format(seen[row_id])
        seen[row_id] = index
    return None


class Stream:
    """The conversations indexed so far, in packing order, and the valid ones among them."""

    def __init__(self) -> None:
        self.indices: list[np.ndarray] = []
        self.tokens: list[np.ndarray] = []
        self.counts: list[np.ndarray] = []
        self.begins: list[np.ndarray] = []
        self.ends: list[np.ndarray] = []
        self.codes: list[int] = []  # per conversation: its ``source`` value's number
        self.values: dict[str | None, int] = {}
        self.ids: list[str | None] = []  # per conversation
        self.valid: list[bool] = []
        self.bad: list[tuple[int, Invalid]] = []  # (position, why) of each conversation left out
        self.seen: dict[str, int] = {}

    @classmethod
    def whole(
        cls,
        indices: np.ndarray,
        tokens: np.ndarray,
        counts: np.ndarray,
        begins: np.ndarray,
        ends: np.ndarray,
        codes: np.ndarray,
        values: dict[str | None, int],
        ids: list[str | None],
    ) -> Stream:
        """A stream of conversations every one valid, with ``ids`` their own: each one's
        tokens, count of supervised runs, the runs, and its ``source`` value's number in
        ``values`` (numbered in order of first appearance)."""
        stream = cls()
        stream.ids = ids
        stream.indices, stream.tokens, stream.counts = [indices], [tokens], [counts]
        stream.begins, stream.ends = [begins], [ends]
        stream.codes, stream.values = codes.tolist(), values
        stream.valid = [True] * len(indices)
        return stream

    def add(self, indices: np.ndarray, block: Indexed) -> None:
        """Take a block's conversations: an invalid one, or one whose id an earlier valid
        one used, is left out (``bad``). A block of valid conversations with ids new and
        distinct is taken at once (``left_out`` leaves none of them out)."""
        self._check(indices, block)
        for value in dict.fromkeys(block.values):
            self.values.setdefault(value, len(self.values))
        self.codes += map(self.values.__getitem__, block.values)
        self.ids += block.ids
        self.indices.append(indices)
        self.tokens.append(block.tokens)
        self.counts.append(block.counts)
        self.begins.append(block.begins)
        self.ends.append(block.ends)

    def _check(self, indices: np.ndarray, block: Indexed) -> None:
        """``add``'s rule for a block's conversations, where the stream may leave some out."""
        fresh: dict[str | None, int] = dict(zip(block.ids, indices.tolist()))
        if (
            len(fresh) == len(block.ids)
            and None not in fresh
            and (not len(block.tokens) or block.tokens.min() >= 0)
            and self.seen.keys().isdisjoint(fresh)
        ):
            self.seen.update(fresh)  # type: ignore[arg-type]  # (None is not among them)
            self.valid += [True] * len(block.ids)
            return
        given = zip(indices.tolist(), block.tokens.tolist(), block.ids, block.invalid)
        for index, tokens, row_id, invalid in given:
            reason = left_out(index, row_id, invalid if tokens < 0 else None, self.seen)
            if reason is not None:
                self.bad.append((len(self.valid), Invalid(index, row_id, reason)))
            self.valid.append(reason is None)


@dataclass
class Rows:
    """The rows of the stream's valid conversations: their cuts, which are kept, and up to
    where the stream is packed (``fed``: units; ``considered``: rows)."""

    units: np.ndarray  # positions of the valid conversations
    sizes: np.ndarray
    cuts: Cuts
    supervised: np.ndarray
    trainable: np.ndarray
    considered: int
    kept: np.ndarray  # bool per considered row
    stopped: bool  # whether the rows wanted are full (the packer stops at the last)

    @property
    def fed(self) -> int:
        """Units the packer takes: to the end of the last row wanted, else all."""
        return int(self.cuts.last[self.considered - 1]) + 1 if self.stopped else len(self.units)


def _rows(stream: Stream, row_tokens: int, wanted: int | None) -> Rows:
    """Cut the valid conversations so far into rows; consider rows up to the ``wanted``-th kept one."""
    valid = np.array(stream.valid, bool)
    units = np.flatnonzero(valid)
    tokens = np.concatenate(stream.tokens) if stream.tokens else np.zeros(0, np.int64)
    sizes = tokens[units] + 1
    cuts = Cuts.of(sizes, row_tokens)
    counts = np.concatenate(stream.counts) if stream.counts else np.zeros(0, np.int64)
    keep_runs = np.repeat(valid, counts)
    begins = np.concatenate(stream.begins)[keep_runs] if stream.begins else np.zeros(0, np.int64)
    ends = np.concatenate(stream.ends)[keep_runs] if stream.ends else np.zeros(0, np.int64)
    unit_runs = Runs.of(cuts.starts[:-1], counts[units], begins, ends)
    begin = np.arange(cuts.rows, dtype=np.int64) * row_tokens
    supervised = unit_runs.before(begin + row_tokens) - unit_runs.before(begin)
    trainable = supervised - unit_runs.at(begin)
    kept = trainable > 0
    considered, stopped = cuts.rows, False
    if wanted is not None and np.count_nonzero(kept) >= wanted:
        considered, stopped = int(np.flatnonzero(kept)[wanted - 1]) + 1, True
    return Rows(units, sizes, cuts, supervised, trainable, considered, kept[:considered], stopped)


def reachable(store: TokenStore, order: np.ndarray, given: np.ndarray, row_tokens: int) -> float:
    """At most how many rows the conversations of ``order`` fill before the first the store
    does not give (``given``: held, and checked where sampled); every row where
    it gives all (``inf``)."""
    where = np.flatnonzero(~given[order])
    if not len(where):
        return np.inf
    return int((np.maximum(store.tokens[order[: where[0]]], 0) + 1).sum() // row_tokens)


def checks_reach(store: TokenStore, order: np.ndarray, given: np.ndarray, row_tokens: int, rows: int) -> int | None:
    """Where the template checks of ``rows`` rows from the store end: the packing positions
    whose stored tokens fill the rows with a fifth more (or the source's end), where the
    store holds them all and some are to be checked (not ``given``); else ``None``."""
    held = store.segment[order] >= 0
    tokens = np.cumsum(np.maximum(store.tokens[order], 0) + 1)
    reach = min(len(order), int(np.searchsorted(tokens, 1.2 * rows * row_tokens)) + 1)
    if not held[:reach].all() or given[order[:reach]].all():
        return None
    return reach


def pack(
    store: TokenStore,
    order: np.ndarray,
    blocks: Iterator[Block] | Stream,
    wanted: int | None,
    skip_invalid: bool,
    check_every: int,
    shape: tuple[int, int, bool],
    run: Run,
    out: Path,
    progress: Callable[[int], None],
    fed: Fed | None = None,
    tallied: Callable[[Packed], None] | None = None,
    checked: bool = True,
) -> tuple[Packed, Invalid | None]:
    """Pack the conversations of ``order`` into ``out`` (a Parquet file), up to ``wanted``
    kept rows (``None``: all): indexed by ``blocks`` (``stored``, the encode tasks of
    ``fixed_sft.fill``, or what ``Indexes.stream`` gives), in packing order, then read
    from ``store``. ``shape``: row tokens, the separator's id and whether rows carry
    their boundaries; ``run`` maps a task function over tasks where conversations are
    encoded; ``progress`` is told of each row group written; ``fed`` is kept up to date as
    the blocks are taken; ``tallied`` is given what was packed (but the digests and the
    file's sha256) before the rows are written; ``checked``: whether the index pass, or
    the fill that just wrote them, checked the conversations (not an index the store kept:
    ``fixed_sft.kept``), so that one no longer as indexed stops the build (``StoreChanged``)
    rather than give way (``Unheld``).
    Returns what was packed, and the invalid conversation that stops the build (without
    ``skip_invalid``), if any, in which case nothing is written; raises the
    ``TemplateMismatch`` of a conversation the rows reach; ``Unheld`` where the store lacks
    a conversation."""
    stream, rows, stop = _index(order, blocks, wanted, skip_invalid, shape[0], fed)
    if stop is not None:
        return Packed(), stop
    packed = tally(stream, rows, check_every)
    if not packed.rows or (wanted is not None and packed.rows < wanted):
        return packed, None  # (the build says there are too few)
    if tallied is not None:
        tallied(packed)
    try:
        packed.digests, packed.parquet_sha256 = _write(store, order, stream, rows, shape, run, out, progress)
    except StoreChanged as changed:
        if checked:
            raise
        raise Unheld(str(changed)) from None
    return packed, None


def stored(
    store: TokenStore, order: np.ndarray, given: np.ndarray, wanted: int | None, row_tokens: int, run: Run, workers: int
) -> Iterator[Block]:
    """The blocks of the stream read from ``store`` by index tasks (pass 1), as far as it
    gives (``given``) the conversations of ``order``; ``Unheld`` after them where the rows
    need more (and at once for all rows, where it does not give them all)."""
    where = np.flatnonzero(~given[order])
    reach = int(where[0]) if len(where) else len(order)  # (positions the store gives)
    lacking = Unheld(f"source row {int(order[reach])}: not in the token store") if reach < len(order) else None
    if wanted is None and lacking is not None:
        raise lacking
    block = max(MIN_BLOCK, min(BLOCK, -(-reach // (4 * workers))))  # (4 a worker, to even out their ends)
    tasks = (Stored.of(store, order[start : min(start + block, reach)]) for start in range(0, reach, block))
    results = run(index, tasks)
    try:
        yield from results
    finally:
        _close(results)
    if lacking is not None:
        raise lacking


def _close(iterator: Iterable[Any]) -> None:
    """Close ``iterator`` where it can be closed (a generator: its ``finally`` runs now)."""
    close = getattr(iterator, "close", None)
    if close is not None:
        close()


@dataclass
class Fed:
    """How much of the stream is indexed so far: conversations, and the valid ones' tokens
    (each with its ``[EOS]``)."""

    conversations: int = 0
    tokens: int = 0


def _index(
    order: np.ndarray,
    blocks: Iterator[Block] | Stream,
    wanted: int | None,
    skip_invalid: bool,
    row_tokens: int,
    fed: Fed | None = None,
) -> tuple[Stream, Rows, Invalid | None]:
    """Take the stream's blocks until the ``wanted``-th kept row (or the stream's end),
    or, without ``skip_invalid``, an invalid conversation before it; a failed template
    check before it raises its ``TemplateMismatch``. ``fed`` is kept up to date. A whole
    stream (``Indexes.stream``) is taken as it is: its rows are those its blocks give."""
    fed = fed or Fed()
    if isinstance(blocks, Stream):
        fed.conversations, fed.tokens = len(blocks.valid), int(sum(int(t.sum()) + len(t) for t in blocks.tokens))
        return blocks, _rows(blocks, row_tokens, wanted), None
    stream = Stream()
    try:
        for block in blocks:
            indexed = block.indexed
            start = len(stream.valid)
            stream.add(order[start : start + len(indexed.tokens)], indexed)
            fed.conversations = len(stream.valid)
            fed.tokens += int((indexed.tokens[np.array(stream.valid[start:], bool)] + 1).sum())
            if stream.bad and not skip_invalid:
                position, why = stream.bad[0]
                rows = _rows(_prefix(stream, position), row_tokens, wanted)
                return stream, rows, None if rows.stopped else why  # (no error where the rows are full before it)
            if block.mismatch is not None or (wanted is not None and fed.tokens // row_tokens >= wanted):
                rows = _rows(stream, row_tokens, wanted)  # (rows are cut only once they may be full)
                if rows.stopped:
                    return stream, rows, None
                if block.mismatch is not None:
                    raise block.mismatch
    finally:
        _close(blocks)
    return stream, _rows(stream, row_tokens, wanted), None


def _covered(first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """The units that rows spanning units ``first..last`` (inclusive, in stream order) hold, sorted.

    >>> _covered(np.array([2, 3, 7]), np.array([3, 5, 7])).tolist()
    [2, 3, 4, 5, 7]
    """
    low = int(first[0])
    span = int(last[-1]) - low + 2
    depth = np.cumsum(np.bincount(first - low, minlength=span) - np.bincount(last - low + 1, minlength=span))
    return low + np.flatnonzero(depth[:-1] > 0)


def _prefix(stream: Stream, position: int) -> Stream:
    """The stream before ``position`` (every conversation there valid)."""
    prefix = Stream()
    prefix.valid = stream.valid[:position]
    tokens = np.concatenate(stream.tokens)[:position]
    counts = np.concatenate(stream.counts)[:position]
    runs_before = int(counts.sum())
    prefix.tokens, prefix.counts = [tokens], [counts]
    prefix.begins = [np.concatenate(stream.begins)[:runs_before]]
    prefix.ends = [np.concatenate(stream.ends)[:runs_before]]
    return prefix


def tally(stream: Stream, rows: Rows, check_every: int) -> Packed:
    """What the manifest and the card say of the packed stream (as ``build._Tally`` counts it)."""
    packed = Packed()
    cuts, considered, kept, fed = rows.cuts, rows.considered, rows.kept, rows.fed
    packed.rows = int(np.count_nonzero(kept))
    packed.rows_skipped = considered - packed.rows
    packed.row_supervised = rows.supervised[:considered][kept].tolist()
    packed.supervised = sum(packed.row_supervised)
    packed.trainable = int(rows.trainable[:considered][kept].sum())
    if rows.stopped:  # (the packer stops in the last row's last conversation)
        packed.tail_tokens = int(rows.sizes[fed - 1] - cuts.tail[considered - 1])
    else:  # (every row cut: the stream ends in its tail)
        packed.tail_tokens = int(cuts.starts[-1] - cuts.rows * cuts.row_tokens)
    packed.conversations_encoded = fed
    packed.tokens_encoded = int(rows.sizes[:fed].sum())
    indices = np.concatenate([np.zeros(0, np.int64), *stream.indices])  # (none from an empty source)
    packed.template_checked = int(np.count_nonzero(sampled(indices[rows.units[:fed]], check_every)))
    every_kept = np.zeros(cuts.rows, bool)
    every_kept[:considered] = kept
    in_rows = np.zeros(len(rows.units) + 1, np.int64)  # kept rows holding each unit
    np.add.at(in_rows, cuts.first[:considered][kept], 1)
    np.add.at(in_rows, cuts.last[:considered][kept] + 1, -1)
    in_rows = np.cumsum(in_rows)[: len(rows.units)]
    in_kept = np.flatnonzero(in_rows)  # (units in kept rows)
    packed.rows_per_conversation = Counter(dict(zip(indices[rows.units[in_kept]].tolist(), in_rows[in_kept].tolist())))
    packed.conversation_tokens = (rows.sizes[in_kept] - 1).tolist()
    codes = np.array(stream.codes, np.int64)[rows.units]
    conversations = np.bincount(codes[in_kept], minlength=len(stream.values))
    tokens = np.bincount(codes, weights=cuts.kept_tokens(every_kept), minlength=len(stream.values))
    for value, code in stream.values.items():
        if conversations[code] or tokens[code]:
            packed.mix[value] = [int(conversations[code]), int(tokens[code])]
    last = int(rows.units[fed - 1]) if fed else -1
    packed.skipped_invalid = [
        {"index": why.source_index, "id": why.id, "reason": why.reason}
        for position, why in stream.bad
        if not rows.stopped or position < last
    ]
    return packed


def groups_per_part(rows: int, row_tokens: int) -> int:
    """Row groups a write task writes, as one part: as many as hold ``PART_VALUES`` tokens,
    while ``rows`` kept rows still make ``WRITE_TASKS`` tasks (at least 1, whatever its
    tokens). Each part costs this process a round trip and a join, so many rows come in
    fewer parts.

    >>> groups_per_part(66_000, 4096), groups_per_part(17_000, 4096), groups_per_part(66_000, 65_536)
    (4, 1, 1)
    """
    group = rows_per_group(row_tokens)
    return max(1, min(PART_VALUES // (group * row_tokens), rows // group // WRITE_TASKS))


def _write(
    store: TokenStore,
    order: np.ndarray,
    stream: Stream,
    rows: Rows,
    shape: tuple[int, int, bool],
    run: Run,
    out: Path,
    progress: Callable[[int], None],
) -> tuple[list[bytes], str | None]:
    """Write the kept rows a part at a time (module docstring, pass 2); their digests,
    and the file's sha256."""
    row_tokens, eos_id, boundaries = shape
    cuts = rows.cuts
    kept = np.flatnonzero(rows.kept)
    part_rows = rows_per_group(row_tokens) * groups_per_part(len(kept), row_tokens)
    parts = out.parent / PARTS_NAME  # (removed with the folder where a build stops: fixed_sft.folder)
    parts.mkdir()
    sources = order[rows.units]
    names = list(stream.values)  # (by number)
    named = _objects(stream.ids)[rows.units], _objects([names[code] for code in stream.codes])[rows.units]

    def tasks() -> Iterator[WriteTask]:
        for number, start in enumerate(range(0, len(kept), part_rows)):
            chosen = kept[start : start + part_rows]
            first, last = cuts.first[chosen], cuts.last[chosen]
            units = _covered(first, last)
            located = store.locate(sources[units])
            if located is None:
                raise Unheld(f"source rows of part {number}: not in the token store")
            yield WriteTask(
                located.compact(),
                np.searchsorted(units, first),
                cuts.head[chosen],
                np.searchsorted(units, last),
                cuts.tail[chosen],
                rows.supervised[chosen],
                rows.trainable[chosen],
                named[0][units].tolist(),
                named[1][units].tolist(),
                start,
                row_tokens,
                eos_id,
                boundaries,
                str(parts / f"{number:08d}.parquet"),
            )

    with naming(out):
        stitcher = Stitcher(out)
    digests: list[bytes] = []
    results = run(write, tasks())
    try:
        for number, (written, found) in enumerate(results):
            part = parts / f"{number:08d}.parquet"
            with naming(out):
                stitcher.append(part, found)  # (which removes the part once copied)
            digests.extend(written)
            progress(len(written))
        with naming(out):
            stitcher.close()
    except Unheld as error:
        stitcher.abort()
        raise StoreChanged(f"{error}: the token store changed during the build; build again") from None
    except BaseException:
        stitcher.abort()
        raise
    finally:
        _close(results)
        shutil.rmtree(parts, ignore_errors=True)
    return digests, stitcher.sha256

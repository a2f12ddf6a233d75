"""Unit sizes in packing order -> where each row is cut, from prefix sums (``pack``'s rule, for all rows at once).

A unit is a conversation and its ``[EOS]`` (``fixed_sft.pack``); the stream is the units in
order, and row ``r`` is its tokens ``[r * row_tokens, (r + 1) * row_tokens)``. So a row's
cut depends only on the sizes of the units before it: with ``starts``, the prefix sums of
the sizes, row ``r`` begins in the unit holding token ``r * row_tokens`` and ends in the one
holding its last token. The supervised tokens of a row come the same way from the
supervised runs of the units (``Runs``), without the rows' tokens.

>>> cuts = Cuts.of(np.array([3, 5, 2]), 4)
>>> cuts.rows, cuts.first.tolist(), cuts.head.tolist(), cuts.last.tolist(), cuts.tail.tolist()
(2, [0, 1], [0, 1], [1, 1], [1, 5])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Cuts:
    """Row ``r`` holds unit ``first[r]`` from its token ``head[r]``, the units after it, and
    unit ``last[r]`` up to its token ``tail[r]`` (exclusive; within one unit where
    ``first[r] == last[r]``). ``rows`` rows are whole; the tokens after them are the tail."""

    row_tokens: int
    starts: np.ndarray  # int64[units + 1]: where each unit starts in the stream, then its end
    rows: int
    first: np.ndarray
    head: np.ndarray
    last: np.ndarray
    tail: np.ndarray

    @classmethod
    def of(cls, sizes: np.ndarray, row_tokens: int) -> Cuts:
        """The cuts of a stream of units of ``sizes`` (each at least 1) into rows of ``row_tokens``."""
        starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        rows = int(starts[-1] // row_tokens)
        begin = np.arange(rows, dtype=np.int64) * row_tokens
        first = np.searchsorted(starts, begin, side="right") - 1
        last = np.searchsorted(starts, begin + row_tokens - 1, side="right") - 1
        return cls(row_tokens, starts, rows, first, begin - starts[first], last, begin + row_tokens - starts[last])

    def segments(self, row: int) -> list[tuple[int, int, int]]:
        """Row ``row``'s segments: ``(unit, start, end)`` in order."""
        first, last = int(self.first[row]), int(self.last[row])
        ends = np.diff(self.starts[first : last + 1])
        return [
            (unit, int(self.head[row]) if unit == first else 0, int(self.tail[row]) if unit == last else int(end))
            for unit, end in zip(range(first, last + 1), ends.tolist() + [0])
        ]

    def kept_tokens(self, kept: np.ndarray) -> np.ndarray:
        """Per unit, how many of its tokens are in the rows ``kept`` marks (bool per row)."""
        before = np.concatenate([[0], np.cumsum(kept, dtype=np.int64)])  # kept rows before row r

        def covered(x: np.ndarray) -> np.ndarray:  # kept tokens before stream position x
            row = np.minimum(x // self.row_tokens, self.rows)
            inside = np.where(row < self.rows, x - row * self.row_tokens, 0)
            return before[row] * self.row_tokens + np.where(kept[np.minimum(row, self.rows - 1)], inside, 0)

        if not self.rows:
            return np.zeros(len(self.starts) - 1, np.int64)
        return np.diff(covered(self.starts))


@dataclass(frozen=True)
class Runs:
    """The supervised tokens of a stream, as runs ``[begin, end)`` of stream positions,
    sorted and apart."""

    begin: np.ndarray
    end: np.ndarray

    @classmethod
    def of(cls, starts: np.ndarray, counts: np.ndarray, begins: np.ndarray, ends: np.ndarray) -> Runs:
        """The stream's runs, from each unit's own (``runs``: ``counts`` per unit, their
        ``begins`` and ``ends`` within it, in unit order) and where each unit ``starts``."""
        shift = np.repeat(starts, counts)
        return cls(begins.astype(np.int64) + shift, ends.astype(np.int64) + shift)

    def before(self, x: np.ndarray) -> np.ndarray:
        """Supervised tokens before each stream position in ``x``."""
        if not len(self.begin):
            return np.zeros(len(x), np.int64)
        lengths = np.concatenate([[0], np.cumsum(self.end - self.begin)])
        k = np.searchsorted(self.begin, x, side="right")  # runs that begin before x: all but the last end before it
        return lengths[k] - np.maximum(0, self.end[np.maximum(k - 1, 0)] - x) * (k > 0)

    def at(self, x: np.ndarray) -> np.ndarray:
        """Whether each stream position in ``x`` is supervised."""
        k = np.searchsorted(self.begin, x, side="right")
        return (k > 0) & (self.end[np.maximum(k - 1, 0)] > x) if len(self.begin) else np.zeros(len(x), bool)


def runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A unit's supervised runs: where each run of nonzero mask values begins and ends.

    >>> [r.tolist() for r in runs(np.array([0, 1, 1, 0, 1], np.uint8))]
    [[1, 4], [3, 5]]
    """
    supervised = np.asarray(mask) != 0
    if not len(supervised):
        return np.zeros(0, np.int32), np.zeros(0, np.int32)
    change = np.flatnonzero(supervised[1:] != supervised[:-1]).astype(np.int32) + 1
    edges = np.concatenate([[0] if supervised[0] else [], change, [len(supervised)] if supervised[-1] else []])
    return edges[0::2].astype(np.int32), edges[1::2].astype(np.int32)

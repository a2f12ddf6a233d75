"""Encoded conversations, in packing order -> fixed-length rows.

Rule: each conversation is followed by one ``[EOS]`` (mask 0), giving its *unit*;
the stream is the units in packing order; rows are its consecutive cuts of exactly
``row_tokens`` tokens, so a conversation may span rows and nothing is padded. A
segment records which part of a unit a row holds: ``start``/``end`` index the
conversation's tokens followed by its ``[EOS]`` (position ``len(tokens)`` is the
``[EOS]``), and a row is the concatenation of its segments' slices.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from .hashes import boundaries


@dataclass(frozen=True)
class Segment:
    """Tokens ``[start, end)`` of source row ``index``'s unit (``end`` may take in its ``[EOS]``)."""

    index: int
    id: str | None
    start: int
    end: int


@dataclass(frozen=True)
class Row:
    """One output row: its ids, its loss mask, and the segments it is made of, in order."""

    ids: np.ndarray  # int32[row_tokens]
    mask: np.ndarray  # uint8[row_tokens]
    segments: tuple[Segment, ...]

    @property
    def cu_seqlens(self) -> np.ndarray:
        """Its boundaries: 0, then the end of each segment in the row (``hashes.boundaries``)."""
        return boundaries([s.end - s.start for s in self.segments])

    @property
    def trainable(self) -> int:
        """Supervised tokens at position 1 or later: a trainer predicts token ``p`` from the
        tokens before it, so a row's token 0 trains nothing. A row without one is skipped."""
        return int(np.count_nonzero(self.mask[1:]))


Unit = tuple[int, str | None, np.ndarray, np.ndarray]  # (source row, id, ids, mask) of a conversation
ZERO = np.zeros(1, np.uint8)


class Packer:
    """Cuts the unit stream into rows of ``row_tokens``."""

    def __init__(self, row_tokens: int, eos_id: int):
        self.row_tokens = row_tokens
        self._eos = np.array([eos_id], np.int32)
        self._ids = np.empty(0, np.int32)  # the row being filled: its tokens so far
        self._mask = np.empty(0, np.uint8)
        self._segments: list[Segment] = []

    @property
    def filled(self) -> int:
        """Tokens already in the row being filled."""
        return len(self._ids)

    def add(self, index: int, row_id: str | None, ids: np.ndarray, mask: np.ndarray) -> Iterator[Row]:
        """Append one conversation's unit (``ids`` then ``[EOS]``); yield each row it completes."""
        yield from self.add_many([(index, row_id, ids, mask)])

    def add_many(self, units: Sequence[Unit]) -> list[Row]:
        """Append units in order; the rows they complete. Row ``r`` of the stream is its
        tokens ``[r * row_tokens, (r + 1) * row_tokens)``: a unit's segment in a row is the
        part of it that falls there.

        >>> packer = Packer(4, eos_id=9)
        >>> ones = np.ones(3, np.int32)
        >>> [row.ids.tolist() for row in packer.add_many([(0, "a", ones, ones), (1, "b", ones, ones)])]
        [[1, 1, 1, 9], [1, 1, 1, 9]]
        """
        size = self.row_tokens
        ids_parts, mask_parts = [self._ids], [self._mask]
        for _, _, ids, mask in units:
            ids_parts += (ids, self._eos)
            mask_parts += (mask, ZERO)
        stream = np.concatenate(ids_parts).astype(np.int32, copy=False)
        stream_mask = np.concatenate(mask_parts).astype(np.uint8, copy=False)
        full = len(stream) // size
        segments: list[list[Segment]] = [self._segments] + [[] for _ in range(full)]
        begin = self.filled  # (where the unit starts in the stream)
        for index, row_id, ids, _ in units:
            end, at = begin + len(ids) + 1, begin
            while at < end:
                stop = min(end, (at // size + 1) * size)
                segments[at // size].append(Segment(index, row_id, at - begin, stop - begin))
                at = stop
            begin = end
        ids_rows = stream[: full * size].reshape(full, size)
        mask_rows = stream_mask[: full * size].reshape(full, size)
        rows = [Row(ids_rows[r], mask_rows[r], tuple(segments[r])) for r in range(full)]
        self._ids, self._mask = stream[full * size :].copy(), stream_mask[full * size :].copy()
        self._segments = segments[full]
        return rows

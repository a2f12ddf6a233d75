"""Encoded conversations, in packing order -> fixed-length rows.

Rule: each conversation is followed by one ``[EOS]`` (mask 0), giving its *unit*;
the stream is the units in packing order; rows are its consecutive cuts of exactly
``row_tokens`` tokens, so a conversation may span rows and nothing is padded. A
segment records which part of a unit a row holds: ``start``/``end`` index the
conversation's tokens followed by its ``[EOS]`` (position ``len(tokens)`` is the
``[EOS]``), and a row is the concatenation of its segments' slices.
"""

from __future__ import annotations

from collections.abc import Iterator
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


class Packer:
    """Cuts the unit stream into rows of ``row_tokens``."""

    def __init__(self, row_tokens: int, eos_id: int):
        self.row_tokens = row_tokens
        self.eos_id = eos_id
        self._new_row()

    def _new_row(self) -> None:
        self._ids = np.empty(self.row_tokens, dtype=np.int32)
        self._mask = np.empty(self.row_tokens, dtype=np.uint8)
        self._segments: list[Segment] = []
        self.filled = 0  # tokens already in the row being filled

    def add(self, index: int, row_id: str | None, ids: np.ndarray, mask: np.ndarray) -> Iterator[Row]:
        """Append one conversation's unit (``ids`` then ``[EOS]``); yield each row it completes."""
        size = len(ids) + 1
        start = 0
        while start < size:
            end = min(size, start + self.row_tokens - self.filled)
            body_end = min(end, len(ids))
            body_filled = self.filled + body_end - start
            self._ids[self.filled : body_filled] = ids[start:body_end]
            self._mask[self.filled : body_filled] = mask[start:body_end]
            if end == size:  # the unit's [EOS] lands in this row
                self._ids[body_filled] = self.eos_id
                self._mask[body_filled] = 0
            self._segments.append(Segment(index, row_id, start, end))
            self.filled += end - start
            start = end
            if self.filled == self.row_tokens:
                yield Row(self._ids, self._mask, tuple(self._segments))
                self._new_row()

"""Packing invariants: exact row length, stream preserved, provenance rebuilds rows."""

from __future__ import annotations

import random

import numpy as np
import pytest

from fixed_sft.pack import Packer

EOS = 9


def _conversations(seed: int, count: int):
    rng = random.Random(seed)
    for index in range(count):
        n = rng.choice([0, 1, 3, 5, 17, 40, 100])
        ids = np.array([rng.randrange(10, 1000) for _ in range(n)], dtype=np.int32)
        mask = np.array([rng.random() < 0.3 for _ in range(n)], dtype=np.uint8)
        yield index, f"c{index}", ids, mask


@pytest.mark.parametrize("row_tokens", [1, 2, 7, 16, 64])
@pytest.mark.parametrize("seed", range(3))
def test_rows_rejoin_to_the_stream(row_tokens, seed):
    """Rows one conversation at a time, and from blocks of them, rejoin to the stream."""
    conversations = list(_conversations(seed, 60))
    packer = Packer(row_tokens, EOS)
    rows = [row for c in conversations for row in packer.add(*c)]
    stream = np.concatenate([np.append(ids, EOS) for _, _, ids, _ in conversations])
    stream_mask = np.concatenate([np.append(mask, 0) for _, _, _, mask in conversations])
    assert all(len(r.ids) == len(r.mask) == row_tokens for r in rows)
    assert len(rows) == len(stream) // row_tokens
    assert packer.filled == len(stream) % row_tokens
    joined = np.concatenate([r.ids for r in rows])
    assert np.array_equal(joined, stream[: len(joined)])
    assert np.array_equal(np.concatenate([r.mask for r in rows]), stream_mask[: len(joined)])

    units = {index: (np.append(ids, EOS), np.append(mask, 0)) for index, _, ids, mask in conversations}
    for row in rows:
        rebuilt = np.concatenate([units[s.index][0][s.start : s.end] for s in row.segments])
        assert np.array_equal(rebuilt, row.ids)
        assert all(s.id == f"c{s.index}" for s in row.segments)

    # the same rows from blocks of any size (empty ones too)
    rng, blocks, start, in_blocks = random.Random(seed), Packer(row_tokens, EOS), 0, []
    while start < len(conversations):
        size = rng.choice([0, 1, 2, 7, 30])
        in_blocks += blocks.add_many(conversations[start : start + size])
        start += size
    assert [(r.ids.tolist(), r.mask.tolist(), r.segments) for r in in_blocks] == [
        (r.ids.tolist(), r.mask.tolist(), r.segments) for r in rows
    ]
    assert blocks.filled == packer.filled


def test_eos_separates_and_is_unsupervised():
    packer = Packer(4, EOS)
    ids = np.array([1, 2], dtype=np.int32)
    mask = np.array([1, 1], dtype=np.uint8)
    rows = list(packer.add(0, "a", ids, mask)) + list(packer.add(1, "b", ids, mask))
    assert rows[0].ids.tolist() == [1, 2, EOS, 1]
    assert rows[0].mask.tolist() == [1, 1, 0, 1]
    assert [(s.index, s.start, s.end) for s in rows[0].segments] == [(0, 0, 3), (1, 0, 1)]


def test_the_rule_as_a_doctest():
    import doctest

    import fixed_sft.pack

    result = doctest.testmod(fixed_sft.pack)
    assert result.attempted >= 1 and result.failed == 0

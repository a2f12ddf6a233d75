"""The seeded order is the documented keyed-hash permutation."""

from __future__ import annotations

import numpy as np
import pytest

from fixed_sft.order import keys, permutation, positions

M = 2**64


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % M
    return z ^ (z >> 31)


def _key(seed: int, i: int) -> int:
    """data/README.md's rule in plain Python integers."""
    return _mix((_mix(seed) + (i + 1) * 0x9E3779B97F4A7C15) % M)


def test_keys_follow_the_documented_rule():
    for seed in (0, 1, 42, 2**63 + 5):
        assert keys(seed, 50).tolist() == [_key(seed, i) for i in range(50)]


def test_permutation_is_a_permutation():
    order = permutation(42, 10_000)
    assert np.array_equal(np.sort(order), np.arange(10_000))


def test_positions_invert_the_order():
    order = permutation(3, 1000)
    position = positions(order)
    assert np.array_equal(order[position], np.arange(1000))
    assert np.array_equal(position[order], np.arange(1000))


def test_prefix_stable_ranks():
    """Appending rows never changes the relative order of existing rows."""
    small, large = permutation(3, 100), permutation(3, 1000)
    assert large[large < 100].tolist() == small.tolist()


def test_golden_order():
    assert permutation(42, 12).tolist() == [3, 7, 1, 2, 5, 9, 6, 0, 8, 10, 11, 4]


def test_seeds_differ():
    assert permutation(1, 100).tolist() != permutation(2, 100).tolist()


def test_a_seed_outside_64_bits_is_refused():
    for seed in (-1, 2**64):
        with pytest.raises(ValueError, match="seed must be in 0 .. 2\\*\\*64 - 1"):
            keys(seed, 3)

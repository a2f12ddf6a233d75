"""Source rows -> the seeded global order in which they are packed.

Rule: for a seed in ``0 .. 2**64 - 1``, row ``i`` (0-based, over all source files in
order) gets the 64-bit key

    key(seed, i) = mix(mix(seed) + (i + 1) * 0x9E3779B97F4A7C15 mod 2**64)

where ``mix`` is the SplitMix64 finalizer

    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 mod 2**64
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB mod 2**64
    mix(z) = z ^ (z >> 31)

and rows are packed in ascending key order. ``mix`` is a bijection and the
multiplier is odd, so keys are distinct and the order is a permutation. It is plain
64-bit integer arithmetic: no library's random stream is involved.
"""

from __future__ import annotations

import numpy as np

GAMMA = 0x9E3779B97F4A7C15


def mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64 finalizer on uint64 values (wrapping arithmetic)."""
    z = z.astype(np.uint64, copy=True)
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


def keys(seed: int, num_rows: int) -> np.ndarray:
    """``key(seed, i)`` for ``i`` in ``range(num_rows)``."""
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must be in 0 .. 2**64 - 1, got {seed}")
    base = mix(np.array([seed], dtype=np.uint64))[0]
    steps = np.arange(1, num_rows + 1, dtype=np.uint64) * np.uint64(GAMMA)
    return mix(steps + base)


def permutation(seed: int, num_rows: int) -> np.ndarray:
    """Source row indices in packing order (``order[p]`` is the row packed p-th)."""
    return np.argsort(keys(seed, num_rows), kind="stable").astype(np.int64)


def positions(order: np.ndarray) -> np.ndarray:
    """The inverse of ``order``: ``positions(order)[i]`` is the packing position of source row ``i``."""
    position = np.empty_like(order)
    position[order] = np.arange(len(order))
    return position

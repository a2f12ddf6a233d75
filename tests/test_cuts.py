"""Row cuts from prefix sums are the packer's rows: the same segments, supervised and trainable tokens."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fixed_sft.cuts import Cuts, Runs, runs
from fixed_sft.pack import Packer


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=30),
    row_tokens=st.integers(1, 25),
    seed=st.integers(0, 2**32 - 1),
)
def test_cuts_are_the_packers_rows(lengths: list[int], row_tokens: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    masks = [(rng.random(n) < 0.5).astype(np.uint8) for n in lengths]
    packer = Packer(row_tokens, eos_id=7)
    rows = [row for n, mask in enumerate(masks) for row in packer.add(n, None, np.zeros(len(mask), np.int32), mask)]

    cuts = Cuts.of(np.array(lengths) + 1, row_tokens)
    assert cuts.rows == len(rows)
    assert cuts.starts[-1] - cuts.rows * row_tokens == packer.filled  # the tail
    found = [runs(np.append(mask, 0)) for mask in masks]  # (each unit: its mask, then its [EOS])
    counts = np.array([len(b) for b, _ in found])
    stream_runs = Runs.of(
        cuts.starts[:-1], counts, np.concatenate([b for b, _ in found]), np.concatenate([e for _, e in found])
    )
    begins = np.arange(cuts.rows) * row_tokens
    supervised = stream_runs.before(begins + row_tokens) - stream_runs.before(begins)
    first_token = stream_runs.at(begins)
    for r, row in enumerate(rows):
        assert cuts.segments(r) == [(s.index, s.start, s.end) for s in row.segments]
        assert supervised[r] == np.count_nonzero(row.mask)
        assert first_token[r] == bool(row.mask[0])
        assert supervised[r] - first_token[r] == row.trainable

    kept = rng.random(cuts.rows) < 0.7
    in_kept = np.zeros(len(lengths), np.int64)
    for r in np.flatnonzero(kept):
        for unit, start, end in cuts.segments(r):
            in_kept[unit] += end - start
    assert cuts.kept_tokens(kept).tolist() == in_kept.tolist()


def test_the_rules_as_doctests() -> None:
    import doctest

    import fixed_sft.cuts

    assert doctest.testmod(fixed_sft.cuts).attempted >= 2
    assert doctest.testmod(fixed_sft.cuts).failed == 0

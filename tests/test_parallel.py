"""Rows packed from the token store by the workers (fixed_sft.parallel) are the rows packed one
conversation at a time: the same Parquet bytes, manifest and card, for 2 and 3 workers; a
damaged stored conversation falls back to packing one at a time."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import synthetic

import fixed_sft.build
import fixed_sft.parallel
from fixed_sft.build import BuildConfig, BuildError, build
from fixed_sft.order import permutation
from fixed_sft.store import TokenStore

N = 300
LATE = N - 3  # a packing position near the end of the stream


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """300 conversations in 3 Parquet files; in packing order of seed 7, a few invalid (no
    messages: at positions 1, 4, 150 and ``LATE``), and two whose id an earlier one has (at
    positions 6 and 250)."""
    rows = synthetic.conversations(N, seed=11)
    order = permutation(7, N)
    for position in (1, 4, 150, LATE):
        rows[order[position]]["messages"] = []
    for position, earlier in ((6, 2), (250, 10)):
        rows[order[position]]["id"] = rows[order[earlier]]["id"]
    folder = tmp_path_factory.mktemp("parallel") / "source"
    synthetic.write_parquet(rows, folder, rows_per_file=100)
    return folder


@pytest.fixture
def packed(monkeypatch) -> list[str]:
    """How each build's packing from the store ended: "packed", or "unheld" where it fell
    back; packing from the store from 2 workers on (builds pack so from 4, where it pays)."""
    monkeypatch.setattr(fixed_sft.build, "PARALLEL_PACKING_WORKERS", 2)
    outcomes: list[str] = []
    real = fixed_sft.parallel.pack

    def pack(*args, **kwargs):
        try:
            result = real(*args, **kwargs)
        except fixed_sft.parallel.Unheld:
            outcomes.append("unheld")
            raise
        outcomes.append("packed")
        return result

    monkeypatch.setattr(fixed_sft.parallel, "pack", pack)
    return outcomes


def _config(source: Path, kimi_dir: Path, **overrides) -> BuildConfig:
    values = dict(
        name="parallel",
        source=str(source),
        tokenizer=str(kimi_dir),
        rows=None,
        row_tokens=256,
        seed=7,
        workers=1,
        check_every=3,
        skip_invalid=True,
    )
    return BuildConfig(**{**values, **overrides})


def _files(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


CASES = {
    "all rows": {},
    "all rows of 64, many row groups, rows skipped": {"row_tokens": 64},
    "some rows, an invalid one after them": {"rows": 60, "row_tokens": 2048},
    "boundaries": {"rows": 45, "emit_boundaries": True, "row_tokens": 4096},
    "no checks": {"check_every": 0},
}


@pytest.mark.parametrize("case", CASES)
def test_rows_packed_by_the_workers_are_those_of_one_at_a_time(
    case, corpus, kimi_dir, tmp_path, token_store, packed
) -> None:
    cfg = _config(corpus, kimi_dir, **CASES[case])
    one = build(cfg, tmp_path / "one")  # (one worker: one conversation at a time, and fills the store)
    assert packed == []
    assert one["stats"]["invalid_rows_skipped"] >= 3  # (positions 1, 4 and 6 come before every case's end)
    if cfg.row_tokens == 64:
        assert one["stats"]["rows_skipped"] > 0 and one["stats"]["rows"] > 128
    counts = (2, 3) if case == "all rows" else (2,)  # (the cuts of any worker count are the same)
    for workers in counts:
        manifest = build(dataclasses.replace(cfg, workers=workers), tmp_path / f"w{workers}")
        assert manifest == one
        assert _files(tmp_path / f"w{workers}") == _files(tmp_path / "one")
    assert packed == ["packed"] * len(counts)


def test_some_rows_record_the_invalid_rows_before_their_end(corpus, kimi_dir, tmp_path, token_store, packed) -> None:
    cfg = _config(corpus, kimi_dir, rows=60, row_tokens=2048, no_card=True)
    whole = build(dataclasses.replace(cfg, rows=None), tmp_path / "whole")
    some = build(dataclasses.replace(cfg, workers=2), tmp_path / "some")
    assert packed == ["packed"]
    assert some == build(dataclasses.replace(cfg, no_cache=True), tmp_path / "one")
    late = int(permutation(7, N)[LATE])
    assert late in {row["index"] for row in whole["skipped_invalid"]}
    assert late not in {row["index"] for row in some["skipped_invalid"]}


def test_an_invalid_row_stops_the_build_as_one_at_a_time(corpus, kimi_dir, tmp_path, token_store, packed) -> None:
    cfg = _config(corpus, kimi_dir, no_card=True)
    build(cfg, tmp_path / "filled")  # (skips the invalid rows, and stores them)
    errors = []
    for workers in (1, 2):
        with pytest.raises(BuildError) as error:
            build(dataclasses.replace(cfg, skip_invalid=False, workers=workers), tmp_path / f"w{workers}")
        errors.append(str(error.value))
        assert not (tmp_path / f"w{workers}").exists()
    assert errors[0] == errors[1] and "'messages' is empty" in errors[0]
    assert packed == ["packed"]


def test_a_damaged_stored_conversation_is_encoded_again(corpus, kimi_dir, tmp_path, token_store, packed) -> None:
    cfg = _config(corpus, kimi_dir, no_card=True)
    one = build(cfg, tmp_path / "one")
    segment = max(token_store.glob("tokens/*/*.seg"), key=lambda p: p.stat().st_size)
    data = bytearray(segment.read_bytes())
    data[-100] ^= 0xFF  # (a byte of the last conversation's ids or mask)
    segment.write_bytes(bytes(data))
    again = build(dataclasses.replace(cfg, workers=2), tmp_path / "again")
    assert again == one
    assert packed == ["unheld"]
    build(dataclasses.replace(cfg, workers=2), tmp_path / "repaired")
    assert packed == ["unheld", "packed"]


@pytest.mark.parametrize("rows", [None, 30])
def test_another_seed_checks_its_positions_then_packs_from_the_store(
    rows, corpus, kimi_dir, tmp_path, token_store, packed
) -> None:
    cfg = _config(corpus, kimi_dir, no_card=True, row_tokens=1024)
    build(cfg, tmp_path / "filled")  # (every conversation stored, checked at seed 7's positions)
    before = set(token_store.glob("tokens/*/*.seg"))
    other = dataclasses.replace(cfg, seed=8, rows=rows)
    expected = build(dataclasses.replace(other, no_cache=True), tmp_path / "one")
    assert build(dataclasses.replace(other, workers=2), tmp_path / "w2") == expected
    assert packed == ["packed"]
    assert _files(tmp_path / "w2") == _files(tmp_path / "one")
    # only the conversations at seed 8's checked positions were encoded (and stored checked)
    added = sum(len(TokenStore._read_records(p)) for p in set(token_store.glob("tokens/*/*.seg")) - before)
    assert 0 < added <= (N // 3 + 1 if rows is None else 30)

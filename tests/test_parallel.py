"""Rows packed from the token store by the workers (fixed_sft.parallel) are the rows packed one
conversation at a time: the same Parquet bytes, manifest and card, for 2 and 3 workers; a
damaged stored conversation falls back to packing one at a time."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import signal
import tempfile
from pathlib import Path

import numpy as np
import pytest
import synthetic
from hypothesis import given, settings
from hypothesis import strategies as st
from test_invalid import GOOD, _boom_tokenizer
from tqdm import tqdm

import fixed_sft.build as build_module
import fixed_sft.fill
import fixed_sft.output
import fixed_sft.parallel
import fixed_sft.plots
from fixed_sft.build import BuildConfig, BuildError, build
from fixed_sft.encode import Encoded, sampled
from fixed_sft.encoding import TemplateMismatch
from fixed_sft.order import permutation
from fixed_sft.output import RowWriter
from fixed_sft.pack import Packer
from fixed_sft.parallel import Indexed
from fixed_sft.store import SegmentWriter, TokenStore

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
    monkeypatch.setattr(build_module, "PARALLEL_PACKING_WORKERS", 2)
    return outcomes(monkeypatch, fixed_sft.parallel, fixed_sft.parallel.Unheld, "unheld")


def outcomes(monkeypatch, module, gave_way: type[Exception], named: str) -> list[str]:
    """How each call of ``module.pack`` ended: "packed", or ``named`` where it raised ``gave_way``."""
    ended: list[str] = []
    real = module.pack

    def pack(*args, **kwargs):
        try:
            result = real(*args, **kwargs)
        except gave_way:
            ended.append(named)
            raise
        ended.append("packed")
        return result

    monkeypatch.setattr(module, "pack", pack)
    return ended


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


def _prefill(cfg: BuildConfig, out: Path) -> None:
    """Store every conversation of ``cfg``'s source, unchecked (``check_every`` 0), at another
    seed: so that a build of ``cfg`` with workers encodes (the checks of its sample), and
    then packs in the same workers. (A build that encodes nothing packs in its own process,
    unless its rows hold ``build.STORED_PACKING_TOKENS``.)"""
    build(dataclasses.replace(cfg, rows=None, seed=cfg.seed + 100, workers=1, no_card=True, check_every=0), out)


@pytest.mark.parametrize("case", CASES)
def test_rows_packed_by_the_workers_are_those_of_one_at_a_time(
    case, corpus, kimi_dir, tmp_path, token_store, packed, monkeypatch
) -> None:
    """Rows packed in the workers after they filled the store (all rows), or after they
    encoded the checks of conversations stored unchecked (some rows)."""
    cfg = _config(corpus, kimi_dir, **CASES[case])
    passes: list[int] = []
    index_pass = fixed_sft.parallel.stored
    monkeypatch.setattr(fixed_sft.parallel, "stored", lambda *args: passes.append(1) or index_pass(*args))
    one = build(dataclasses.replace(cfg, no_cache=True), tmp_path / "one")  # (one conversation at a time)
    assert one["stats"]["invalid_rows_skipped"] >= 3  # (positions 1, 4 and 6 come before every case's end)
    if cfg.row_tokens == 64:
        assert one["stats"]["rows_skipped"] > 0 and one["stats"]["rows"] > 128
    counts = (2, 3) if case == "all rows" else (2,)  # (the cuts of any worker count are the same)
    for workers in counts:
        store = dataclasses.replace(cfg, cache_dir=str(tmp_path / f"store-{workers}"))
        if cfg.rows is not None:
            _prefill(store, tmp_path / f"filled-{workers}")
        manifest = build(dataclasses.replace(store, workers=workers), tmp_path / f"w{workers}")
        assert manifest == one
        assert _files(tmp_path / f"w{workers}") == _files(tmp_path / "one")
    assert packed == ["packed"] * len(counts)
    # (a build that filled the store with every row takes the index its fill kept, read back none)
    assert len(passes) == (0 if cfg.rows is None else len(counts))


FIRST = {
    "some rows, an invalid one after them": {"rows": 60, "row_tokens": 2048},
    "rows of 64, rows skipped": {"rows": 150, "row_tokens": 64},
    "boundaries": {"rows": 45, "emit_boundaries": True, "row_tokens": 4096},
    "no checks": {"rows": 30, "check_every": 0},
    "every row the source fills": {"rows": -1, "row_tokens": 1024},
    "a row more than the source fills": {"rows": -2, "row_tokens": 1024},
}


@pytest.mark.parametrize("case", FIRST)
def test_a_first_build_of_some_rows_packs_in_the_workers(case, corpus, kimi_dir, tmp_path, token_store, packed) -> None:
    """A first build of some rows (the store empty) encodes, stores and indexes its chunks
    in the workers, then cuts and writes its rows there: the same bytes, manifest and card
    as one conversation at a time; what it stored gives a later build its conversations."""
    cfg = _config(corpus, kimi_dir, **FIRST[case])
    if cfg.rows < 0:  # (the stream's end: every conversation is indexed)
        every = build(dataclasses.replace(cfg, rows=None, no_cache=True, no_card=True), tmp_path / "every")
        cfg = dataclasses.replace(cfg, rows=every["stats"]["rows"] - 1 - cfg.rows)
    if case == "a row more than the source fills":
        errors = []
        for workers, no_cache in ((1, True), (2, False)):
            with pytest.raises(BuildError) as error:
                build(dataclasses.replace(cfg, workers=workers, no_cache=no_cache), tmp_path / f"w{workers}")
            errors.append(str(error.value))
        assert errors[0] == errors[1] and "the source fills only" in errors[0]
        assert packed == ["packed"]
        return
    one = build(dataclasses.replace(cfg, no_cache=True), tmp_path / "one")
    first = build(dataclasses.replace(cfg, workers=2), tmp_path / "first")
    assert packed == ["packed"]
    assert first == one
    assert _files(tmp_path / "first") == _files(tmp_path / "one")
    stored = sum(len(TokenStore._read_records(p)) for p in token_store.glob("tokens/*/*.seg"))
    assert stored >= one["stats"]["conversations"]
    later = build(dataclasses.replace(cfg, no_card=True), tmp_path / "later")  # (1 worker: from the store)
    assert later["rows_sha256"] == one["rows_sha256"]
    assert sum(len(TokenStore._read_records(p)) for p in token_store.glob("tokens/*/*.seg")) == stored


def test_a_first_build_whose_worker_cannot_store_packs_one_at_a_time(corpus, kimi_dir, tmp_path, monkeypatch) -> None:
    """Where a worker cannot write its segment (after two did), the build packs one
    conversation at a time, taking what the store holds by then: the same rows."""
    monkeypatch.setattr(build_module, "PARALLEL_PACKING_WORKERS", 1)  # (in this process, to reach the writer)
    monkeypatch.setattr(build_module, "FRESH_CHUNK_ROWS", 4)
    flush, flushed = fixed_sft.fill.SegmentWriter.flush, []

    def failing_flush(self):
        flushed.append(1)
        if len(flushed) == 3:
            self.turn_off()
        else:
            flush(self)

    monkeypatch.setattr(fixed_sft.fill.SegmentWriter, "flush", failing_flush)
    cfg = _config(corpus, kimi_dir, rows=30, row_tokens=1024, no_card=True, cache_dir=str(tmp_path / "store"))
    outcomes = []
    pack = fixed_sft.parallel.pack

    def counted(*args, **kwargs):
        try:
            return pack(*args, **kwargs)
        except fixed_sft.parallel.Unheld:
            outcomes.append("unheld")
            raise

    monkeypatch.setattr(fixed_sft.parallel, "pack", counted)
    assert build(cfg, tmp_path / "first") == build(dataclasses.replace(cfg, no_cache=True), tmp_path / "one")
    assert outcomes == ["unheld"] and len(flushed) >= 3


def test_a_first_build_stops_at_a_failed_check_its_rows_reach(kimi_dir, tmp_path, token_store, packed) -> None:
    """A conversation the template refuses, sampled for the check, stops a first build of
    some rows in the workers with the error of one conversation at a time, where the rows
    reach it; a build whose rows end before it is built."""
    order = permutation(7, 300)
    bad = int(order[12:][sampled(order[12:], 2)][0])  # (the first sampled from position 12 on)
    rows = [
        {"id": f"row-{i}", "messages": [{"role": "user", "content": f"hi {i}"}, *GOOD["messages"][1:]]}
        for i in range(300)
    ]
    rows[bad]["messages"][0]["content"] = "BOOM"
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tokenizer = _boom_tokenizer(kimi_dir, tmp_path)
    cfg = _config(source, tokenizer, rows=20, row_tokens=64, check_every=2, allow_unpinned_tokenizer=True, no_card=True)
    errors = []
    for workers, no_cache in ((1, True), (2, False)):
        with pytest.raises(TemplateMismatch) as error:
            build(dataclasses.replace(cfg, workers=workers, no_cache=no_cache), tmp_path / "out")
        errors.append(str(error.value))
        assert not (tmp_path / "out").exists()
    assert errors[0] == errors[1] and f"source row {bad} (id row-{bad})" in errors[0]
    assert build(dataclasses.replace(cfg, rows=2, workers=2), tmp_path / "short")["stats"]["rows"] == 2
    assert packed == ["packed"]


def test_a_build_that_encodes_nothing_packs_in_its_own_process(corpus, kimi_dir, tmp_path, token_store, packed) -> None:
    cfg = _config(corpus, kimi_dir, no_card=True)
    one = build(cfg, tmp_path / "one")
    assert build(dataclasses.replace(cfg, workers=2, row_tokens=512), tmp_path / "later")["stats"]["rows"]
    assert packed == []
    assert build(dataclasses.replace(cfg, workers=2), tmp_path / "w2") == one


class EarlyPlotter:
    """A ``plots.Plotter`` that draws here, and records when it is asked to start drawing."""

    def __init__(self, events: list[str]) -> None:
        self.events, self.started = events, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def load(self):  # (as ``Plotter.load``: a build that encodes nothing)
        self.events.append("load")

    def encodes(self):  # (as ``Plotter.encodes``)
        self.events.append("encodes")

    def start(self, inputs):  # (as ``Plotter.start``: the first start draws, a later one is ignored)
        if self.started is None:
            self.events.append("plots")
            self.started = inputs

    def draw(self, inputs):
        assert self.started is not None and fixed_sft.plots.same(self.started, inputs)
        return fixed_sft.plots.draw(inputs)


@pytest.mark.parametrize("workers", [1, 2])
def test_the_cards_plots_are_drawn_before_the_rows_are_all_written(
    workers, corpus, kimi_dir, tmp_path, token_store, packed, monkeypatch
) -> None:
    """Once the rows are cut (packing one at a time: before the last row groups are written;
    in the workers: before their write pass), the plotter has what the card will plot."""
    events: list[str] = []
    close, write = RowWriter.close, fixed_sft.parallel._write
    monkeypatch.setattr(RowWriter, "close", lambda self: events.append("written") or close(self))
    monkeypatch.setattr(fixed_sft.parallel, "_write", lambda *a: events.append("writing") or write(*a))
    monkeypatch.setattr(build_module, "Plotter", lambda many=False: EarlyPlotter(events))
    cfg = _config(corpus, kimi_dir, rows=60, row_tokens=2048)
    one = build(dataclasses.replace(cfg, no_cache=True), tmp_path / "one")
    assert events == ["encodes", "plots", "written"]
    events.clear()
    _prefill(cfg, tmp_path / "filled")
    events.clear()
    assert build(dataclasses.replace(cfg, workers=workers), tmp_path / "w") == one
    assert events == ["encodes", "plots", "written" if workers == 1 else "writing"]  # (the checks of its sample)
    assert _files(tmp_path / "w") == _files(tmp_path / "one")


def test_a_build_that_encodes_nothing_has_its_plots_process_import_at_once(
    corpus, kimi_dir, tmp_path, token_store, monkeypatch
) -> None:
    events: list[str] = []
    monkeypatch.setattr(build_module, "Plotter", lambda many=False: EarlyPlotter(events))
    cfg = _config(corpus, kimi_dir, rows=None, row_tokens=2048)
    build(cfg, tmp_path / "first")
    assert events[0] == "encodes"
    events.clear()
    build(dataclasses.replace(cfg, seed=cfg.seed + 1), tmp_path / "later")
    assert events[0] == "load" and "encodes" not in events


def test_some_rows_record_the_invalid_rows_before_their_end(corpus, kimi_dir, tmp_path, token_store, packed) -> None:
    cfg = _config(corpus, kimi_dir, rows=60, row_tokens=2048, no_card=True)
    whole = build(dataclasses.replace(cfg, rows=None, no_cache=True), tmp_path / "whole")
    _prefill(cfg, tmp_path / "filled")
    some = build(dataclasses.replace(cfg, workers=2), tmp_path / "some")
    assert packed == ["packed"]
    assert some == build(dataclasses.replace(cfg, no_cache=True), tmp_path / "one")
    late = int(permutation(7, N)[LATE])
    assert late in {row["index"] for row in whole["skipped_invalid"]}
    assert late not in {row["index"] for row in some["skipped_invalid"]}


def test_an_invalid_row_stops_the_build_as_one_at_a_time(corpus, kimi_dir, tmp_path, token_store, packed) -> None:
    cfg = _config(corpus, kimi_dir, no_card=True, skip_invalid=False)
    _prefill(dataclasses.replace(cfg, skip_invalid=True), tmp_path / "filled")  # (stores the invalid rows too)
    errors = []
    for workers in (1, 2):
        with pytest.raises(BuildError) as error:
            build(dataclasses.replace(cfg, workers=workers), tmp_path / f"w{workers}")
        errors.append(str(error.value))
        assert not (tmp_path / f"w{workers}").exists()
    assert errors[0] == errors[1] and "'messages' is empty" in errors[0]
    assert packed == ["packed"]


def test_a_damaged_stored_conversation_is_encoded_again(corpus, kimi_dir, tmp_path, token_store, packed) -> None:
    cfg = _config(corpus, kimi_dir, no_card=True)
    _prefill(cfg, tmp_path / "filled")
    segment = max(token_store.glob("tokens/*/*.seg"), key=lambda p: p.stat().st_size)
    data = bytearray(segment.read_bytes())
    data[-100] ^= 0xFF  # (a byte of the last conversation's ids or mask)
    segment.write_bytes(bytes(data))
    again = build(dataclasses.replace(cfg, workers=2), tmp_path / "again")
    assert again == build(dataclasses.replace(cfg, no_cache=True), tmp_path / "one")
    assert packed == ["unheld"]


@pytest.mark.parametrize("rows", [None, 30])
def test_a_build_that_samples_more_checks_them_then_packs_from_the_store(
    rows, corpus, kimi_dir, tmp_path, token_store, packed
) -> None:
    cfg = _config(corpus, kimi_dir, no_card=True, row_tokens=1024, check_every=6)
    build(cfg, tmp_path / "filled")  # (every conversation stored, 1 in 6 checked)
    before = set(token_store.glob("tokens/*/*.seg"))
    other = dataclasses.replace(cfg, seed=8, rows=rows, check_every=3)
    expected = build(dataclasses.replace(other, no_cache=True), tmp_path / "one")
    assert build(dataclasses.replace(other, workers=2), tmp_path / "w2") == expected
    assert packed == ["packed"]
    assert _files(tmp_path / "w2") == _files(tmp_path / "one")
    # only the conversations sampled 1 in 3 and not 1 in 6 were encoded (and stored checked)
    added = sum(len(TokenStore._read_records(p)) for p in set(token_store.glob("tokens/*/*.seg")) - before)
    assert 0 < added <= np.count_nonzero(sampled(np.arange(N), 3) & ~sampled(np.arange(N), 6))


def _stored(items: list[Encoded], folder: Path) -> TokenStore:
    """A store entry ``folder`` holding ``items`` (source rows ``0..len(items)-1``), in one segment."""
    folder.mkdir()
    writer = SegmentWriter(folder)
    for item in items:
        writer.add(item)
    writer.flush()
    return TokenStore(folder, len(items))


def _one_at_a_time(items, order, wanted, skip, check_every, shape, out):
    """``build``'s own packing of ``items`` (as encoded) in ``order``: its tally and rows,
    or the invalid row's problem."""
    row_tokens, eos, boundaries = shape
    tally = build_module._Tally(row_tokens=row_tokens)
    writer = RowWriter(out, boundaries)
    stream = (
        items[i]._replace(checked=bool(sampled(np.array([i]), check_every)[0]) and items[i].invalid is None)
        for i in order.tolist()
    )

    class Source:
        def locate(self, index):
            return Path("source.parquet"), index

    try:
        valid = build_module._valid(stream, Source(), skip, tally)
        build_module._pack(
            valid, wanted, Packer(row_tokens, eos), writer, tally, tqdm(disable=True), tqdm(disable=True), boundaries
        )
    except build_module.InvalidSourceRow as error:
        writer.abort()
        return error.problem, None
    writer.close()
    return tally, len(tally.digests)


def packed_as_one_at_a_time(packed: fixed_sft.parallel.Packed, expected, row_tokens: int, one: Path) -> None:
    """``packed`` counts what ``expected`` (``_one_at_a_time``'s tally) counts, field by field,
    in its statistics and its source mix, and hashed the file ``one`` it wrote."""
    got = build_module._Tally(row_tokens=row_tokens)
    got.take(packed)
    for name in fixed_sft.parallel.Packed.__dataclass_fields__:
        if name == "parquet_sha256":
            assert got.parquet_sha256 == hashlib.sha256(one.read_bytes()).hexdigest()
        elif name != "rows":
            assert getattr(got, name) == getattr(expected, name), name
    assert (got.stats(), got.source_mix()) == (expected.stats(), expected.source_mix())


@settings(derandomize=True, max_examples=int(os.environ.get("FIXED_SFT_PACKING_EXAMPLES", "40")), deadline=None)
@given(data=st.data())
def test_packing_from_the_store_is_packing_one_at_a_time(data) -> None:
    """On random streams (invalid rows, repeated ids, empty and unsupervised conversations,
    rows of 1 token up), packing from a real store entry in blocks of 3 (each read in
    stretches of any size) gives the tally, statistics and Parquet bytes of packing one
    conversation at a time, or the same error;
    whether the blocks come from the index pass or from the index a fill kept, in parts of
    any sizes (``Indexes``), and whatever the row groups a written part holds. (A long run:
    ``FIXED_SFT_PACKING_EXAMPLES=5000``, benchmarks/README.md.)"""
    n = data.draw(st.integers(1, 40))
    pool = [f"id{k}" for k in range(max(1, n // 3))]
    distinct = data.draw(st.booleans())  # (every id its own: the stream needs no id looked up)
    valid = distinct and data.draw(st.booleans())  # (and no invalid row: a fill's index is then taken whole)
    items = []
    for i in range(n):
        row_id = f"own{i}" if distinct else data.draw(st.sampled_from([*pool, None, f"own{i}"]))
        value = data.draw(st.sampled_from([None, "a", "b"]))
        if not valid and data.draw(st.integers(0, 9)) == 0:
            items.append(Encoded(i, row_id, None, None, "not a conversation", True, value))
            continue
        mask = np.array(data.draw(st.lists(st.integers(0, 1), max_size=30)), np.uint8)
        items.append(Encoded(i, row_id, np.arange(len(mask), dtype=np.int32) + 5, mask, None, True, value))
    order = np.array(data.draw(st.permutations(range(n))), np.int64)
    wanted = data.draw(st.sampled_from([None, 1, 2, 5, 12]))
    skip = data.draw(st.booleans())
    check_every = data.draw(st.sampled_from([0, 1, 3]))
    shape = (data.draw(st.sampled_from([1, 2, 3, 7, 16])), 1, data.draw(st.booleans()))
    group_rows = data.draw(st.sampled_from([1, 2, 3, 128]))  # (rows a row group, and its parts)
    write_tasks = data.draw(st.sampled_from([1, 2, 128]))
    stretch = data.draw(st.sampled_from([1, 8, 1 << 22]))  # (tokens an index task reads at once)
    filled = None
    if data.draw(st.booleans()):  # (the index a fill kept: parts of its tasks' chunks, in any order)
        cuts = sorted(data.draw(st.sets(st.integers(1, n - 1), max_size=4))) if n > 1 else []
        chunks = data.draw(st.permutations(np.split(np.arange(n), cuts)))
        filled = fixed_sft.parallel.Indexes(order)
        for chunk in chunks:
            filled.add(chunk, Indexed.of([items[i] for i in chunk.tolist()]))
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        store = _stored(items, folder / "entry")
        (folder / "one").mkdir()
        (folder / "packed").mkdir()
        one = folder / "one" / "train.parquet"
        in_process = lambda fn, tasks: (fn(None, task) for task in tasks)  # noqa: E731
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(fixed_sft.output, "ROWS_PER_GROUP", group_rows)
            patch.setattr(fixed_sft.parallel, "WRITE_TASKS", write_tasks)
            expected, rows = _one_at_a_time(items, order, wanted, skip, check_every, shape, one)
            patch.setattr(fixed_sft.parallel, "BLOCK", 3)
            patch.setattr(fixed_sft.parallel, "MIN_BLOCK", 3)
            patch.setattr(fixed_sft.parallel, "STRETCH_TOKENS", stretch)
            blocks = filled.stream() if filled is not None else None
            if blocks is None:
                blocks = fixed_sft.parallel.stored(store, order, np.ones(n, bool), wanted, shape[0], in_process, 1)
            packed, stop = fixed_sft.parallel.pack(
                store, order, blocks, wanted, skip, check_every, shape, in_process,
                folder / "packed" / "train.parquet", lambda rows: None,
            )  # fmt: skip
        if stop is not None:
            named = "" if stop.id is None else f", id {stop.id}"  # (as the build names the row)
            assert isinstance(expected, str) and f"(source row {stop.source_index}{named}): {stop.reason}" in expected
            return
        assert not isinstance(expected, str), expected
        assert packed.rows == rows
        if not rows or (wanted is not None and rows < wanted):
            return  # (the build says there are too few)
        packed_as_one_at_a_time(packed, expected, shape[0], one)  # (its sha256 taken as the parts were joined)
        assert (folder / "packed" / "train.parquet").read_bytes() == one.read_bytes()
        assert sorted(p.name for p in (folder / "packed").iterdir()) == ["train.parquet"]


@pytest.mark.parametrize("wanted", [None, 1, 4, 9])
def test_a_fill_index_taken_whole_packs_as_its_blocks(tmp_path, wanted) -> None:
    """The whole stream a fill's index gives (every conversation valid, ids their own)
    packs the rows, tally and bytes of packing one conversation at a time, with fewer rows
    wanted than the stream holds too; ``fed`` counts the stream."""
    rng = np.random.default_rng(11)
    items = [
        Encoded(i, f"c{i}", np.arange(k, dtype=np.int32) + 5, (rng.random(k) < 0.6).astype(np.uint8), None, True, v)
        for i, (k, v) in enumerate(zip(rng.integers(0, 12, 40).tolist(), rng.choice(["x", "y", "z"], 40).tolist()))
    ]
    order, shape = permutation(3, len(items)), (5, 1, False)
    store = _stored(items, tmp_path / "entry")
    filled = fixed_sft.parallel.Indexes(order)
    for chunk in np.split(np.arange(len(items)), [7, 19, 30])[::-1]:
        filled.add(chunk, Indexed.of([items[i] for i in chunk.tolist()]))
    whole = filled.stream()
    assert isinstance(whole, fixed_sft.parallel.Stream)
    expected, rows = _one_at_a_time(items, order, wanted, False, 3, shape, tmp_path / "one.parquet")
    in_process = lambda fn, tasks: (fn(None, task) for task in tasks)  # noqa: E731
    (tmp_path / "packed").mkdir()
    out, fed = tmp_path / "packed" / "train.parquet", fixed_sft.parallel.Fed()
    packed, stop = fixed_sft.parallel.pack(
        store, order, whole, wanted, False, 3, shape, in_process, out, lambda rows: None, fed
    )  # fmt: skip
    assert stop is None and packed.rows == rows and (wanted is None or rows == wanted)
    assert (fed.conversations, fed.tokens) == (len(items), sum(len(item.ids) + 1 for item in items))
    got = build_module._Tally(row_tokens=shape[0])
    got.take(packed)
    for name in fixed_sft.parallel.Packed.__dataclass_fields__:
        if name not in ("rows", "parquet_sha256"):
            assert getattr(got, name) == getattr(expected, name), name
    assert (got.stats(), got.source_mix()) == (expected.stats(), expected.source_mix())
    assert out.read_bytes() == (tmp_path / "one.parquet").read_bytes()


def test_parts_of_several_row_groups_join_into_the_bytes_of_one_writer(tmp_path, monkeypatch) -> None:
    """Where the rows are many, each write task writes a part of several row groups
    (``groups_per_part``): the file is the one writer's, byte for byte, in its row groups.
    A task reads the conversations of one row group at a time, not its part's at once, and
    a conversation two of its groups split once."""
    n = 60
    rng = np.random.default_rng(7)
    items = [
        Encoded(i, f"id{i}", np.arange(k, dtype=np.int32) + 5, (rng.random(k) < 0.7).astype(np.uint8), None, True)
        for i, k in enumerate(rng.integers(3, 30, n).tolist())
    ]
    store = _stored(items, tmp_path / "entry")
    order, shape = permutation(1, n), (4, 1, False)
    monkeypatch.setattr(fixed_sft.output, "ROWS_PER_GROUP", 5)
    monkeypatch.setattr(fixed_sft.parallel, "WRITE_TASKS", 3)
    one = tmp_path / "one.parquet"
    _, rows = _one_at_a_time(items, order, None, False, 0, shape, one)
    parts: list[int] = []
    real = fixed_sft.parallel.write_part
    monkeypatch.setattr(fixed_sft.parallel, "write_part", lambda *a: parts.append(real(*a)) or parts[-1])
    reads: list[int] = []
    take = fixed_sft.parallel.UnitReader.take

    def counted(self, low, high, window=None):
        taken = take(self, low, high, window)
        reads.append(high - self.fresh)  # (the conversations it read: not the one carried from the last)
        return taken

    monkeypatch.setattr(fixed_sft.parallel.UnitReader, "take", counted)
    in_process = lambda fn, tasks: (fn(None, task) for task in tasks)  # noqa: E731
    blocks = list(fixed_sft.parallel.stored(store, order, np.ones(n, bool), None, shape[0], in_process, 1))
    assert reads == [n]  # (the index pass: one stretch)
    reads.clear()
    (tmp_path / "packed").mkdir()
    out = tmp_path / "packed" / "train.parquet"
    packed, stop = fixed_sft.parallel.pack(
        store, order, iter(blocks), None, False, 0, shape, in_process, out, lambda r: None
    )
    assert stop is None and packed.rows == rows > 60
    groups = fixed_sft.parallel.groups_per_part(rows, shape[0])
    assert groups > 1 and parts[:-1] == [5 * groups] * (len(parts) - 1) and sum(parts) == rows
    assert len(reads) == -(-rows // 5)  # (a read per row group)
    assert sum(reads) <= n + len(parts)  # (each conversation once, or twice where two parts split it)
    assert out.read_bytes() == one.read_bytes()


def test_the_index_a_fill_kept_stands_for_the_index_pass_only_whole() -> None:
    """A source row no fill task indexed (a chunk stopped at a failed check), or one indexed
    twice: nothing, so the build reads the index back from the store. Where every
    conversation is valid with an id of its own, the whole stream in packing order, its
    ``source`` values numbered as they first appear; else its blocks."""
    items = [
        Encoded(i, f"id{i}", np.arange(3 + i, dtype=np.int32), np.array([0, 1, 1] + [0] * i, np.uint8), None, True, v)
        for i, v in enumerate(["b", None, "a", "b"])
    ]
    order = np.array([3, 2, 1, 0])

    def indexes(*parts: list[int], given: list | None = None) -> fixed_sft.parallel.Indexes:
        kept = fixed_sft.parallel.Indexes(order)
        for rows in parts:
            kept.add(np.array(rows), Indexed.of([(given or items)[i] for i in rows]))
        return kept

    assert indexes([0, 1], [3]).stream() is None
    assert indexes([0, 1], [3], [1]).stream() is None
    assert indexes([0, 1], [3], [1], [2]).stream() is None  # (every row, one of them twice)
    assert indexes([0, 1, 1], [2, 3]).stream() is None  # (one twice in a part)
    whole = indexes([0, 1], [3], [2])
    stream = whole.stream()
    assert whole.stream() is None  # (taken once)
    assert isinstance(stream, fixed_sft.parallel.Stream)
    read = fixed_sft.parallel.Stream()
    read.add(order, Indexed.of([items[i] for i in order.tolist()]))  # (as the index pass reads it)
    for name in ("indices", "tokens", "counts", "begins", "ends"):
        assert np.concatenate(getattr(stream, name)).tolist() == np.concatenate(getattr(read, name)).tolist(), name
    assert (stream.codes, stream.values, stream.valid, stream.bad) == (read.codes, read.values, read.valid, [])
    assert stream.values == {"b": 0, "a": 1, None: 2}
    for other in (items[2]._replace(id="id0"), items[2]._replace(id=None), items[2]._replace(mask=None, invalid="x")):
        given = [*items[:2], other, items[3]]  # (an id given twice, none, an invalid one)
        blocks = indexes([0, 1, 3], [2], given=given).stream()
        assert blocks is not None and not isinstance(blocks, fixed_sft.parallel.Stream), other
        (block,) = list(blocks)
        expected = Indexed.of([given[i] for i in order.tolist()])
        assert (block.indexed.ids, block.indexed.values, block.indexed.invalid) == (
            expected.ids,
            expected.values,
            expected.invalid,
        ), other
        for name in ("tokens", "counts", "begins", "ends"):
            assert getattr(block.indexed, name).tolist() == getattr(expected, name).tolist(), (other, name)


@pytest.mark.parametrize("stretch", [1, 1 << 22])
@pytest.mark.parametrize("fault", ["byte", "metadata", "record"])
def test_the_index_pass_gives_way_to_a_conversation_it_cannot_trust(tmp_path, monkeypatch, stretch, fault) -> None:
    """The index pass reads the valid conversations a stretch at a time, and each invalid
    one by its record: a flipped byte (of a valid one's tokens, or of an invalid one's
    metadata), or a valid one stored with an invalid reason, is not indexed (``Unheld``)."""
    items = [
        Encoded(i, f"c{i}", np.arange(20, dtype=np.int32), np.ones(20, np.uint8), None, True, None) for i in range(30)
    ]
    items[7] = Encoded(7, "c7", None, None, "not a conversation", True, None)
    if fault == "metadata":
        items[11] = items[11]._replace(invalid="a reason")
    store = _stored(items, tmp_path / "entry")
    (segment,) = store.segments
    data = bytearray(segment.read_bytes())
    at = {"byte": int(store.offset[11]) + 5, "record": int(store.offset[7]) + 2, "metadata": None}[fault]
    if at is not None:
        data[at] ^= 0xFF
        segment.write_bytes(bytes(data))
    monkeypatch.setattr(fixed_sft.parallel, "STRETCH_TOKENS", stretch)
    in_process = lambda fn, tasks: (fn(None, task) for task in tasks)  # noqa: E731
    order = np.arange(len(items))
    with pytest.raises(fixed_sft.parallel.Unheld, match=f"source row {7 if fault == 'record' else 11}: damaged"):
        list(fixed_sft.parallel.stored(store, order, np.ones(len(items), bool), None, 16, in_process, 1))


def test_a_conversation_damaged_between_the_passes_stops_the_build(tmp_path) -> None:
    """The index pass checked every conversation: one whose bytes change before its row is
    written stops the build (nothing falls back to rows already cut), and no part is left."""
    items = [
        Encoded(i, f"c{i}", np.arange(20, dtype=np.int32), np.ones(20, np.uint8), None, True, None) for i in range(30)
    ]
    store = _stored(items, tmp_path / "entry")
    (segment,) = store.segments

    def run(fn, tasks):
        if fn is fixed_sft.parallel.write:  # (after the index pass: flip a byte of the last conversation)
            data = bytearray(segment.read_bytes())
            data[-30] ^= 0xFF
            segment.write_bytes(bytes(data))
        return (fn(None, task) for task in tasks)

    (tmp_path / "out").mkdir()
    order = np.arange(len(items))
    with pytest.raises(fixed_sft.parallel.StoreChanged, match="the token store changed during the build"):
        blocks = fixed_sft.parallel.stored(store, order, np.ones(len(items), bool), None, 16, run, 1)
        fixed_sft.parallel.pack(
            store, order, blocks, None, False, 0, (16, 1, False), run,
            tmp_path / "out" / "train.parquet", lambda rows: None,
        )  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["train.parquet"]  # (the build removes it)


@pytest.mark.parametrize("stale", ["ids", "mask"])
def test_a_stale_stored_copy_stops_the_build_as_one_at_a_time(
    corpus, kimi_dir, tmp_path, token_store, packed, stale
) -> None:
    """A stored conversation encoded again to check it (stored unchecked) must be its stored
    copy: one whose digest matches but whose ids, or mask alone, differ (a key that misses
    an input) stops the build, whether the workers check it or the build does one at a time."""
    cfg = _config(corpus, kimi_dir, no_card=True)
    build(cfg, tmp_path / "filled")
    (entry,) = (token_store / "tokens").iterdir()
    stored = TokenStore(entry, N)
    items = [stored.lookup(index) for index in range(N)]
    stored.close()
    for segment in entry.glob("*.seg"):
        segment.unlink()
    writer = SegmentWriter(entry)
    for item in items:
        if item.ids is not None:
            changed = {"ids": item.ids + 1} if stale == "ids" else {"mask": 1 - item.mask}
            item = item._replace(**changed, checked=False)  # (stale, with digests that match; unchecked)
        writer.add(item)
    writer.flush()
    snapshot = tmp_path / "snapshot"
    shutil.copytree(entry, snapshot)
    errors = []
    for workers in (1, 2):
        shutil.rmtree(entry)
        shutil.copytree(snapshot, entry)
        with pytest.raises(BuildError, match="the token store's copy differs from its encoding now") as error:
            build(dataclasses.replace(cfg, seed=8, workers=workers), tmp_path / f"w{workers}")
        errors.append(str(error.value))
    assert errors[0] == errors[1]


def test_the_rule_of_what_is_left_out_as_a_doctest() -> None:
    import doctest

    result = doctest.testmod(fixed_sft.parallel)
    assert result.attempted >= 1 and result.failed == 0


@pytest.fixture
def apart(monkeypatch) -> list[tuple[str, bool]]:
    """Checks apart from 2 workers on and any sample (builds check so from 8, 1 in 16 rows at
    most), and what each build did:
    ``("start", checks_apart)`` as it started its workers, ``("start to pack", False)`` as
    it started them without the renderer, ``("checkers", True)`` as it started its checkers."""
    monkeypatch.setattr(build_module, "CHECKS_APART_WORKERS", 2)
    monkeypatch.setattr(build_module, "CHECKS_APART_EVERY", 1)
    events: list[tuple[str, bool]] = []
    start, checkers = build_module._Encoding.start, build_module._Encoding.checkers

    def recorded_start(self, checks_apart=False, renderer=True):
        if self.encoders is None:
            events.append(("start", checks_apart) if renderer else ("start to pack", False))
        return start(self, checks_apart, renderer)

    def recorded_checkers(self):
        events.append(("checkers", True))
        return checkers(self)

    monkeypatch.setattr(build_module._Encoding, "start", recorded_start)
    monkeypatch.setattr(build_module._Encoding, "checkers", recorded_checkers)
    return events


def test_the_sampled_rows_are_checked_apart_where_the_probes_are_kept(
    corpus, kimi_dir, tmp_path, token_store, packed, apart
) -> None:
    """A build that fills the store, with the probes kept by an earlier build, starts its
    workers without the template renderer, and checks the sampled rows in workers of their
    own: the same bytes and manifest as one conversation at a time; each sampled row stored
    checked."""
    cfg = _config(corpus, kimi_dir)
    one = build(dataclasses.replace(cfg, no_cache=True), tmp_path / "one")
    apart.clear()
    assert build(dataclasses.replace(cfg, workers=2), tmp_path / "first") == one
    written_by_new_workers = [("start to pack", False)]  # (those that encoded end: ``_Encoding.fresh``)
    assert apart == [("start", False), *written_by_new_workers] and list(token_store.glob("probes/*.json"))
    shutil.rmtree(token_store / "tokens")  # (the probes stay)
    apart.clear()
    assert build(dataclasses.replace(cfg, workers=2), tmp_path / "apart") == one
    assert apart == [("start", True), ("checkers", True), *written_by_new_workers]
    assert _files(tmp_path / "apart") == _files(tmp_path / "one")
    passed = set()
    for path in token_store.glob("tokens/*/*.seg"):
        records = TokenStore._read_records(path)
        passed |= set(records["index"][records["flags"] & 1 == 1].tolist())
    assert set(np.flatnonzero(sampled(np.arange(N), cfg.check_every)).tolist()) <= passed


@pytest.mark.parametrize("rows", [None, 30])
def test_a_build_that_fills_apart_starts_its_fork_server_first(
    rows, corpus, kimi_dir, tmp_path, token_store, packed, apart, monkeypatch
) -> None:
    """With the probes kept, a build of every row starts its workers' fork server (without
    the renderer) before it opens the source; a build of some rows when its workers start."""
    cfg = _config(corpus, kimi_dir, rows=rows, row_tokens=1024)
    build(dataclasses.replace(cfg, rows=1, workers=1, no_card=True), tmp_path / "probes")  # (keeps them)
    events: list[str] = []
    start, open_source = build_module.start_fork_server, build_module.open_source
    early = lambda *args, **kwargs: events.append(f"fork server {kwargs}") or start(*args, **kwargs)  # noqa: E731
    monkeypatch.setattr(build_module, "start_fork_server", early)
    monkeypatch.setattr(build_module, "open_source", lambda *a: events.append("source") or open_source(*a))
    one = build(dataclasses.replace(cfg, no_cache=True, workers=1), tmp_path / "one")
    events.clear()
    assert build(dataclasses.replace(cfg, workers=2), tmp_path / "two") == one
    assert events == (["fork server {'renderer': False}", "source"] if rows is None else ["source"])
    assert _files(tmp_path / "two") == _files(tmp_path / "one")


@pytest.mark.parametrize("rows", [None, 30])
def test_a_build_that_encodes_nothing_packs_in_its_workers_where_its_rows_are_many(
    rows, corpus, kimi_dir, tmp_path, packed, monkeypatch
) -> None:
    """A build whose store gives every conversation packs in workers forked from its process
    (``_Encoding.packers``), which load no encoder, only where its rows hold
    ``STORED_PACKING_TOKENS`` tokens, with ``STORED_PACKING_CORES`` workers and cores: the
    same bytes either way. No encoding worker starts."""
    monkeypatch.setattr(build_module, "STORED_PACKING_CORES", 2)
    cfg = _config(corpus, kimi_dir, rows=rows, row_tokens=1024)
    one = build(dataclasses.replace(cfg, no_cache=True), tmp_path / "one")
    build(dataclasses.replace(cfg, seed=cfg.seed + 1, rows=None), tmp_path / "first")  # (stores every row, checked)
    started: list[dict] = []
    start = build_module._Encoding.start
    monkeypatch.setattr(build_module._Encoding, "start", lambda *a, **k: started.append(k) or start(*a, **k))
    pools: list[str] = []
    forked = build_module.forked

    def recorded(workers, setup):
        pool = forked(workers, setup)
        pools.append(pool._pool._mp_context.get_start_method())
        return pool

    monkeypatch.setattr(build_module, "forked", recorded)
    needed = None if rows is None else rows * cfg.row_tokens
    cases = [(1 << 40, 2, []), (1, 1, []), (1, 2, ["fork"])]
    if needed is not None:  # (the rows' tokens: those asked for)
        cases += [(needed + 1, 2, []), (needed, 2, ["fork"])]
    cases += [(1, 2, "not on Linux")]  # (where a fork beside threads is not sound: ``FORKS_PACKERS``)
    for number, (threshold, cores, expected) in enumerate(cases):
        monkeypatch.setattr(build_module, "STORED_PACKING_TOKENS", threshold)
        monkeypatch.setattr(build_module, "usable_cores", lambda cores=cores: cores)
        if expected == "not on Linux":
            monkeypatch.setattr(build_module, "FORKS_PACKERS", False)
            expected = []
        pools.clear()
        packed.clear()
        assert build(dataclasses.replace(cfg, workers=2), tmp_path / f"later-{number}") == one
        assert _files(tmp_path / f"later-{number}") == _files(tmp_path / "one")
        assert pools == expected and started == []
        assert packed == (["packed"] if expected else [])


def _killed(*_: object) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_forked_worker_killed_ends_the_build_in_one_line(
    corpus, kimi_dir, tmp_path, token_store, packed, monkeypatch, capsys
):
    """A worker that dies (killed by a signal, or by the system when out of memory) ends
    the build with one line that says so, exit 1, and no output. A worker forked from the
    build runs the build's code as it was when forked: here, a write that kills it."""
    from fixed_sft.cli import main

    cfg = _config(corpus, kimi_dir, row_tokens=1024)
    build(cfg, tmp_path / "first")  # (stores every row, checked)
    for name, value in (("STORED_PACKING_TOKENS", 1), ("STORED_PACKING_CORES", 2), ("usable_cores", lambda: 2)):
        monkeypatch.setattr(build_module, name, value)  # (a later build packs in forked workers)
    monkeypatch.setattr(fixed_sft.parallel, "write", _killed)
    argv = ["build", "--source", str(corpus), "--tokenizer", str(kimi_dir), "--rows", "all", "--row-tokens", "1024"]
    argv += ["--check-every", "3", "--skip-invalid"]
    out = tmp_path / "later"
    assert main([*argv, "--seed", "8", "--workers", "2", "--quiet", "--out", str(out)]) == 1
    err = capsys.readouterr().err.splitlines()  # (transformers may say first that it finds no PyTorch)
    assert err[-1:] == [
        "error: a worker process ended abruptly (killed by a signal, or by the system when out of memory)"
    ]
    assert not any("Traceback" in line for line in err)
    assert not out.exists() and not list(tmp_path.glob(".later.tmp-*"))


@pytest.mark.parametrize("rows", [None, 30])
def test_rows_are_written_by_workers_that_encoded_nothing(
    rows, corpus, kimi_dir, tmp_path, token_store, packed, monkeypatch
) -> None:
    """Workers that encoded (a fill, or a first build of some rows) end before the rows are
    written, where they are many enough (``PART_VALUES`` tokens a worker), and as many
    start anew to write them; a later build, which encodes nothing, writes them in workers
    forked from its process. The same bytes as one conversation at a time."""
    monkeypatch.setattr(fixed_sft.parallel, "PART_VALUES", 1024)  # (30 rows of 1024: parts for 2 workers)
    asked: list[tuple[object, object, bool]] = []  # the workers before and after, whether those before ended
    fresh = build_module._Encoding.fresh

    def recorded(self, *args):
        before = self.encoders
        after = fresh(self, *args)
        ended = before is not None and before.engine._pool._shutdown_thread
        asked.append((before, after, ended))
        return after

    monkeypatch.setattr(build_module._Encoding, "fresh", recorded)
    cfg = _config(corpus, kimi_dir, rows=rows, row_tokens=1024)
    one = build(dataclasses.replace(cfg, no_cache=True), tmp_path / "one")
    assert build(dataclasses.replace(cfg, workers=2), tmp_path / "first") == one
    assert packed == ["packed"] and len(asked) == 1
    before, after, ended = asked[0]
    assert before is not None and after is not before and ended
    asked.clear()
    build(dataclasses.replace(cfg, rows=None, seed=cfg.seed + 1), tmp_path / "every")  # (stores every row, checked)
    for name, value in (("STORED_PACKING_TOKENS", 1), ("STORED_PACKING_CORES", 2), ("usable_cores", lambda: 2)):
        monkeypatch.setattr(build_module, name, value)  # (workers started to pack: ``_packs_stored_apart``)
    asked.clear()
    packers: list[int] = []
    take = build_module._Encoding.packers
    monkeypatch.setattr(build_module._Encoding, "packers", lambda self: packers.append(1) or take(self))
    packed.clear()
    assert build(dataclasses.replace(cfg, workers=2), tmp_path / "later") == one
    assert asked == [] and packers == [1] and packed == ["packed"]
    assert _files(tmp_path / "first") == _files(tmp_path / "later") == _files(tmp_path / "one")


def test_rows_given_back_wait_for_their_checkers_up_to_a_bound(
    corpus, kimi_dir, tmp_path, token_store, packed, apart, monkeypatch
) -> None:
    """Rows given back to be checked wait in the build's process up to
    ``CHECKS_WAITING_BYTES`` of source bytes: with none allowed, the fill waits for a check
    before it goes on, whenever two are running, and the bytes are the same."""
    cfg = _config(corpus, kimi_dir)
    one = build(dataclasses.replace(cfg, no_cache=True), tmp_path / "one")
    build(dataclasses.replace(cfg, workers=2), tmp_path / "first")  # (keeps the probes)
    shutil.rmtree(token_store / "tokens")
    monkeypatch.setattr(build_module, "CHECKS_WAITING_BYTES", 0)
    waited, wait = [], build_module.wait

    def recorded(futures, **kwargs):
        waited.append(len(futures))
        return wait(futures, **kwargs)

    monkeypatch.setattr(build_module, "wait", recorded)
    assert build(dataclasses.replace(cfg, workers=2), tmp_path / "apart") == one
    assert waited and all(count >= 2 for count in waited)


def test_a_failed_check_apart_stops_the_build(kimi_dir, tmp_path, token_store, packed, apart) -> None:
    """A sampled row the template refuses, checked apart, stops a ``--rows all`` build with
    the error of one conversation at a time: also where an invalid row comes after it in
    packing order (a row whose check failed is not stored, so it is encoded again when
    packing reaches it)."""
    bad = int(np.flatnonzero(sampled(np.arange(300), 2))[5])
    order = permutation(7, 300)
    invalid = int(order[int(np.flatnonzero(order == bad)[0]) + 1])
    rows = [
        {"id": f"row-{i}", "source": "s", "messages": [{"role": "user", "content": f"hi {i}"}, *GOOD["messages"][1:]]}
        for i in range(300)
    ]
    (tmp_path / "good").mkdir()
    synthetic.write_parquet(rows, tmp_path / "good", rows_per_file=50)
    rows[bad]["messages"][0]["content"] = "BOOM"
    rows[invalid]["messages"] = []
    (tmp_path / "bad").mkdir()
    synthetic.write_parquet(rows, tmp_path / "bad", rows_per_file=50)
    tokenizer = _boom_tokenizer(kimi_dir, tmp_path)
    cfg = _config(tmp_path / "good", tokenizer, check_every=2, allow_unpinned_tokenizer=True, no_card=True)
    cfg = dataclasses.replace(cfg, skip_invalid=False)
    build(dataclasses.replace(cfg, workers=2), tmp_path / "kept")  # (keeps the probes)
    apart.clear()
    errors = []
    for workers, no_cache in ((1, True), (2, False)):
        with pytest.raises(TemplateMismatch) as error:
            build(
                dataclasses.replace(cfg, source=str(tmp_path / "bad"), workers=workers, no_cache=no_cache),
                tmp_path / "out",
            )
        errors.append(str(error.value))
        assert not (tmp_path / "out").exists()
    assert errors[0] == errors[1] and f"source row {bad} (id row-{bad})" in errors[0]
    assert apart == [("start", False), ("start", True), ("checkers", True)]  # (one at a time; then apart)

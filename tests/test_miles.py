"""The rows train in miles as the recipe runs them: read as miles reads them
(``miles_emulation``), through the shipped rollout function and data source."""

from __future__ import annotations

import doctest
import json
import re
from types import SimpleNamespace

import miles_emulation
import numpy as np
import pytest
import synthetic

from fixed_sft.build import BuildConfig, build
from fixed_sft.output import ROWS_PER_GROUP, read_rows

ROWS = ROWS_PER_GROUP * 2 + 44  # three row groups, the last one short


@pytest.fixture(scope="module")
def built(tmp_path_factory, kimi_dir):
    folder = tmp_path_factory.mktemp("miles")
    synthetic.write_parquet(synthetic.conversations(400, seed=8), folder / "src.parquet")
    config = BuildConfig(
        name="m",
        source=str(folder / "src.parquet"),
        tokenizer=str(kimi_dir),
        rows=ROWS,
        row_tokens=128,
        seed=3,
        workers=1,
    )
    build(config, folder / "out")
    ids, mask, offsets = read_rows(folder / "out" / "train.parquet")
    rows = [(ids[lo:hi].tolist(), mask[lo:hi].tolist()) for lo, hi in zip(offsets[:-1], offsets[1:])]
    return folder / "out", rows


@pytest.fixture
def rollout(monkeypatch):
    return miles_emulation.install(monkeypatch)


def check_sample(sample, row) -> None:
    """The rollout's rule: tokens are the row; the response starts at its first
    supervised token, at token 1 at the earliest, and runs to the end."""
    ids, mask = row
    assert sample.tokens == ids
    first = max(mask.index(1), 1)
    assert sample.response_length == len(ids) - first >= 1
    assert sample.loss_mask == mask[first:]
    assert any(sample.loss_mask)  # no sample only dilutes a per-token loss
    assert sample.reward == 0


@pytest.mark.parametrize(
    "processor",
    [None, miles_emulation.QwenStyleProcessor(), miles_emulation.ExtractMediaProcessor()],
    ids=["no processor", "qwen-vl-utils", "extract_media"],
)
def test_the_recipes_flags_train_every_row(built, rollout, processor):
    """miles' Dataset, with or without a processor, then its RolloutDataSource's groups,
    then the shipped generate_rollout: every sample is its row."""
    out, rows = built
    samples = miles_emulation.dataset(out / "train.parquet", processor)
    assert all(s.prompt == [{"role": "user", "content": ""}] for s in samples)
    if processor is not None:
        assert all(s.multimodal_inputs["images"] is None for s in samples)
    source = miles_emulation.RolloutDataSource(samples, shuffle=True, seed=1)
    args = SimpleNamespace(rollout_batch_size=64)
    seen = []
    for _ in range(5):  # past the end of the epoch
        groups = rollout.generate_rollout(args, 0, source)
        miles_emulation.train_data(groups)
        for (sample,) in groups:
            check_sample(sample, rows[sample.metadata["row"]])
            assert sorted(sample.metadata) == ["row", "segments"]  # the tokens are held once, in the sample
            seen.append(sample.metadata["row"])
    assert sorted(seen[:ROWS]) == list(range(ROWS)) and len(seen) == 320


@pytest.mark.parametrize(("rollouts", "step", "dynamic"), [(50, 16, False), (48, 16, False), (50, 16, True)])
def test_a_rollout_of_part_of_a_step_is_refused(built, rollout, rollouts, step, dynamic):
    """miles trains whole steps of a rollout's groups and drops the rest (the emulation's
    ``steps``): a rollout of 50 rows at 16 a step would leave 2 untrained each time."""
    out, _ = built
    trained = sum(len(s) for s in miles_emulation.steps(list(range(rollouts)), step))
    source = miles_emulation.RolloutDataSource(miles_emulation.dataset(out / "train.parquet"), n_samples_per_prompt=1)
    args = SimpleNamespace(rollout_batch_size=rollouts, global_batch_size=step, use_dynamic_global_batch_size=dynamic)
    if trained == rollouts or dynamic:
        assert len(rollout.generate_rollout(args, 0, source)) == rollouts
    else:
        with pytest.raises(ValueError, match=f"would drop {rollouts - trained} rows of each rollout untrained"):
            rollout.generate_rollout(args, 0, source)


def test_a_partial_train_step_is_no_way_around_the_refusal(built, rollout):
    """miles trains the rest of a rollout as a smaller step only where it holds a sample per
    data-parallel rank, which a rollout cannot see: still refused, saying so."""
    out, _ = built
    source = miles_emulation.RolloutDataSource(miles_emulation.dataset(out / "train.parquet"), n_samples_per_prompt=1)
    args = SimpleNamespace(rollout_batch_size=50, global_batch_size=16, allow_partial_train_step=True)
    with pytest.raises(ValueError, match=r"untrained \(--allow-partial-train-step trains them only where"):
        rollout.generate_rollout(args, 0, source)


def test_a_group_of_several_copies_is_refused(built, rollout):
    out, _ = built
    source = miles_emulation.RolloutDataSource(miles_emulation.dataset(out / "train.parquet"), n_samples_per_prompt=2)
    with pytest.raises(ValueError, match="pass --n-samples-per-prompt 1"):
        rollout.generate_rollout(SimpleNamespace(rollout_batch_size=4), 0, source)


@pytest.mark.parametrize(
    ("mask", "response_length"), [([1, 1, 0, 1], 3), ([0, 0, 1, 0], 2), ([0, 1, 0, 0], 3), ([0, 0, 0, 1], 1)]
)
def test_the_response_needs_a_token_before_it(rollout, mask, response_length):
    """A row that starts inside an assistant turn: its response starts at token 1."""
    sample = miles_emulation.Sample(metadata={"input_ids": [5, 6, 7, 8], "loss_mask": mask})
    rollout.apply_row(sample)
    assert sample.response_length == response_length
    assert sample.loss_mask == mask[-response_length:]


@pytest.mark.parametrize(
    ("metadata", "says"),
    [
        ({}, "not a fixed-sft row .a dict."),
        ({"input_ids": [5, 6]}, "not a fixed-sft row .a dict."),
        (None, "not a fixed-sft row .a NoneType."),
        ({"input_ids": [5, 6, 7], "loss_mask": [0, 1]}, "3 ids but 2 mask values"),
        ({"input_ids": [5, 6], "loss_mask": [0, 0]}, "no supervised token after token 0"),
        ({"input_ids": [5, 6], "loss_mask": [1, 0]}, "no supervised token after token 0"),
    ],
)
def test_what_is_not_a_row_is_refused(rollout, metadata, says):
    with pytest.raises(ValueError, match=says):
        rollout.apply_row(miles_emulation.Sample(metadata=metadata))


def test_there_is_no_evaluation_mode(rollout):
    with pytest.raises(ValueError, match="no evaluation mode"):
        rollout.generate_rollout(SimpleNamespace(rollout_batch_size=1), 0, None, evaluation=True)


def test_rollout_rules_as_doctests(rollout):
    assert doctest.testmod(rollout).failed == 0


def source_args(path, tmp_path, **overrides):
    values = dict(
        prompt_data=str(path),
        rollout_shuffle=True,
        rollout_seed=7,
        n_samples_per_prompt=1,
        save=str(tmp_path / "ckpt"),
        load=None,
        rollout_batch_size=50,
    )
    values.update(overrides)
    return SimpleNamespace(**values)


def rows_of(groups) -> list[int]:
    return [sample.metadata["row"] for (sample,) in groups]


def test_the_data_source_gives_ready_samples_in_its_documented_order(built, rollout, tmp_path):
    out, rows = built
    source = rollout.ParquetRowSource(source_args(out, tmp_path))  # the folder, or its train.parquet
    assert isinstance(source, miles_emulation.DataSource)
    assert miles_emulation.num_rollout_per_epoch(source, 50) == ROWS // 50
    groups = source.get_samples(ROWS + 10)
    miles_emulation.train_data(groups)
    for (sample,) in groups:
        check_sample(sample, rows[sample.metadata["row"]])
        assert sample.prompt == [{"role": "user", "content": ""}]
    assert [s.index for (s,) in groups] == [s.group_index for (s,) in groups] == list(range(ROWS + 10))
    # the order of the docstring: row groups shuffled, then the rows of each group
    import random

    starts = [0, ROWS_PER_GROUP, 2 * ROWS_PER_GROUP, ROWS]
    expected = []
    for epoch in (0, 1):
        groups_order = [0, 1, 2]
        random.Random(7 + epoch).shuffle(groups_order)
        for g in groups_order:
            order = list(range(starts[g + 1] - starts[g]))
            random.Random(f"7/{epoch}/{g}").shuffle(order)
            expected += [starts[g] + k for k in order]
    assert rows_of(groups) == expected[: ROWS + 10]
    assert sorted(rows_of(groups)[:ROWS]) == list(range(ROWS)) != rows_of(groups)[:ROWS]

    unshuffled = rollout.ParquetRowSource(source_args(out / "train.parquet", tmp_path, rollout_shuffle=False))
    assert rows_of(unshuffled.get_samples(ROWS + 3)) == list(range(ROWS)) + [0, 1, 2]
    other_seed = rollout.ParquetRowSource(source_args(out, tmp_path, rollout_seed=8))
    assert rows_of(other_seed.get_samples(ROWS)) != rows_of(groups)[:ROWS]


def test_the_shipped_rollout_passes_the_data_sources_samples_on(built, rollout, tmp_path):
    out, rows = built
    args = source_args(out, tmp_path)
    groups = rollout.generate_rollout(args, 0, rollout.ParquetRowSource(args))
    assert len(groups) == 50
    for (sample,) in groups:
        check_sample(sample, rows[sample.metadata["row"]])


@pytest.mark.parametrize("source", ["ParquetRowSource", "ParquetSegmentSource"])
def test_a_data_source_without_miles_rollout_dataset_is_refused(built, rollout, tmp_path, source):
    """miles saves and loads a data source only with its rollout dataset on: without it
    a resumed run would start again at row 0, so the data source refuses to start."""
    args = source_args(built[0], tmp_path, rollout_global_dataset=False, use_dynamic_batch_size=True)
    with pytest.raises(ValueError, match=f"{source} needs miles' rollout dataset on: without it"):
        getattr(rollout, source)(args)


def test_a_resumed_run_continues_at_the_next_sample(built, rollout, tmp_path):
    out, _ = built
    first = rollout.ParquetRowSource(source_args(out, tmp_path))
    for _ in range(6):  # into the second epoch
        first.get_samples(50)
    first.save(5)
    expected = first.get_samples(50)

    resumed = rollout.ParquetRowSource(source_args(out, tmp_path, load=str(tmp_path / "ckpt")))
    resumed.load(5)
    got = resumed.get_samples(50)
    assert rows_of(got) == rows_of(expected)
    assert [(s.index, s.group_index) for (s,) in got] == [(s.index, s.group_index) for (s,) in expected]
    fresh = rollout.ParquetRowSource(source_args(out, tmp_path, load=str(tmp_path / "ckpt")))
    fresh.load(99)  # no state saved for that rollout: start at the beginning
    assert rows_of(fresh.get_samples(3)) == rows_of(rollout.ParquetRowSource(source_args(out, tmp_path)).get_samples(3))


def test_a_state_saved_for_another_order_is_refused(built, rollout, tmp_path):
    out, _ = built
    rollout.ParquetRowSource(source_args(out, tmp_path)).save(1)
    other = rollout.ParquetRowSource(source_args(out, tmp_path, rollout_seed=9, load=str(tmp_path / "ckpt")))
    with pytest.raises(ValueError, match="was saved for .*'seed': 7.* but this run has .*'seed': 9"):
        other.load(1)
    unshuffled = rollout.ParquetRowSource(
        source_args(out, tmp_path, rollout_shuffle=False, rollout_seed=9, load=str(tmp_path / "ckpt"))
    )
    with pytest.raises(ValueError, match="'shuffle': True"):
        unshuffled.load(1)
    rollout.ParquetRowSource(source_args(out, tmp_path, rollout_shuffle=False, rollout_seed=1)).save(2)
    rollout.ParquetRowSource(
        source_args(out, tmp_path, rollout_shuffle=False, rollout_seed=9, load=str(tmp_path / "ckpt"))
    ).load(2)  # without a shuffle, no seed is used


def test_a_state_saved_for_another_file_is_refused(built, rollout, tmp_path):
    out, _ = built
    rollout.ParquetRowSource(source_args(out, tmp_path)).save(1)
    other = tmp_path / "other.parquet"
    import pyarrow.parquet as pq

    pq.write_table(pq.read_table(out / "train.parquet"), other, compression="none")  # same rows, other bytes
    with pytest.raises(ValueError, match="'bytes'"):
        rollout.ParquetRowSource(source_args(other, tmp_path, load=str(tmp_path / "ckpt"))).load(1)


def _edited(out, folder, edit):
    """A copy of build ``out``'s train.parquet (row groups of 128 rows, no manifest beside it)
    whose ``metadata`` rows ``edit`` changes (a list of dicts, in place)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(out / "train.parquet")
    rows = table.column("metadata").to_pylist()
    edit(rows)
    column = pa.array(rows, table.schema.field("metadata").type)
    folder.mkdir()
    pq.write_table(
        table.set_column(table.schema.get_field_index("metadata"), "metadata", column),
        folder / "train.parquet",
        row_group_size=128,
    )
    return folder


def _take_all(source):
    return [g for _ in range(3) for g in source.get_samples(ROWS // 3 + 1)]


def test_a_file_that_is_not_fixed_sft_rows_is_refused_at_start(built, rollout, tmp_path):
    out, _ = built
    source = out.parent / "src.parquet"  # (the conversations the build read)
    with pytest.raises(ValueError, match=r"src.parquet is not fixed-sft rows: metadata.input_ids is missing"):
        rollout.ParquetRowSource(source_args(source, tmp_path))
    other = tmp_path / "other"
    other.mkdir()
    (other / "train.parquet").write_bytes((out / "train.parquet").read_bytes())
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["stats"]["rows"] += 1  # (another build's manifest)
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"is not the file .*manifest.json records .*run verify on the folder"):
        rollout.ParquetRowSource(source_args(other, tmp_path))


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda rows: rows[10]["loss_mask"].append(0), "row 10 has 128 ids and 129 mask values"),
        (
            lambda rows: rows[140].update(input_ids=rows[140]["input_ids"][:-1], loss_mask=rows[140]["loss_mask"][:-1]),
            "row 140 has 127 ids and 127 mask values, not 128 of each",
        ),
        (lambda rows: rows[7]["loss_mask"].__setitem__(5, 2), "row 7 has a mask value other than 0 and 1"),
        (lambda rows: rows[3].update(loss_mask=None), "row 3 is null where its ids and mask should be"),
    ],
    ids=["a mask longer than its ids", "a short row", "a mask value of 2", "a null mask"],
)
def test_a_damaged_row_is_named_before_any_row_of_its_group_is_given(built, rollout, tmp_path, edit, says):
    """A mask one longer than its ids would shift every later row's mask in the group."""
    out, _ = built
    folder = _edited(out, tmp_path / "edited", edit)
    source = rollout.ParquetRowSource(source_args(folder, tmp_path, rollout_shuffle=False))
    with pytest.raises(ValueError, match=re.escape(says)):
        _take_all(source)


def test_a_file_of_rows_written_otherwise_is_read(built, rollout, tmp_path):
    """Without a manifest, an empty first row group and list items marked required (as
    other writers may write them) are still fixed-sft rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out, rows = built
    table = pq.read_table(out / "train.parquet")
    required = pa.schema(
        [
            field
            if field.name != "metadata"
            else pa.field(
                "metadata",
                pa.struct(
                    [
                        pa.field(f.name, pa.list_(pa.field("element", f.type.value_type, nullable=False)))
                        if f.name in ("input_ids", "loss_mask")
                        else f
                        for f in field.type
                    ]
                ),
            )
            for field in table.schema
        ]
    )
    table = table.cast(required)
    (tmp_path / "other").mkdir()
    with pq.ParquetWriter(tmp_path / "other" / "train.parquet", required) as writer:
        writer.write_table(table.slice(0, 0))
        writer.write_table(table, row_group_size=128)
    source = rollout.ParquetRowSource(source_args(tmp_path / "other", tmp_path, rollout_shuffle=False))
    assert [group[0].tokens for group in _take_all(source)][: len(rows)] == [ids for ids, _ in rows]


def test_segment_mode_names_a_row_its_segments_do_not_cover(bounded, rollout, tmp_path):
    out, _ = bounded

    def shorten(rows):
        rows[3]["segments"][-1]["end"] -= 1

    folder = _edited(out, tmp_path / "edited", shorten)
    source = rollout.ParquetSegmentSource(segment_args(folder, tmp_path, rollout_shuffle=False))
    with pytest.raises(ValueError, match=r"row 3's segments cover 127 tokens, not its 128"):
        source.get_samples(1)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"sample_offset": ROWS + 1}, f"sample_offset is {ROWS + 1}, not 0 .. {ROWS}"),
        ({"sample_offset": -1}, "sample_offset is -1"),
        ({"epoch_id": 1.5}, "epoch_id is 1.5, not a count"),
        ({"sample_index": True}, "sample_index is True"),
        ({"sample_group_index": None}, "sample_group_index is None"),
    ],
)
def test_a_saved_position_out_of_range_is_refused_naming_it(built, rollout, tmp_path, change, says):
    out, _ = built
    rollout.ParquetRowSource(source_args(out, tmp_path)).save(1)
    path = tmp_path / "ckpt" / "rollout" / "fixed_sft_row_source_1.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    loading = rollout.ParquetRowSource(source_args(out, tmp_path, load=str(tmp_path / "ckpt")))
    with pytest.raises(ValueError, match=re.escape(f"{path}: {says}")):
        loading.load(1)
    path.write_text("[1, 2")
    with pytest.raises(ValueError, match=re.escape(f"{path} is not a saved position (not JSON")):
        loading.load(1)


def test_a_save_waits_for_the_batch_being_taken(built, rollout, tmp_path):
    """miles' train_async saves while the next batch is being taken: the saved position
    is before or after that whole batch, never inside it."""
    import json
    import threading

    out, _ = built
    source = rollout.ParquetRowSource(source_args(out, tmp_path))
    real, started, release = source._row, threading.Event(), threading.Event()

    def slow_row(position):
        started.set()
        release.wait(5)
        return real(position)

    source._row = slow_row
    taker = threading.Thread(target=source.get_samples, args=(20,))
    taker.start()
    started.wait(5)
    saver = threading.Thread(target=source.save, args=(3,))
    saver.start()
    saver.join(0.2)
    assert saver.is_alive()  # waiting for the batch
    release.set()
    taker.join(5)
    saver.join(5)
    state = json.loads((tmp_path / "ckpt" / "rollout" / "fixed_sft_row_source_3.json").read_text())
    assert state["sample_offset"] == state["sample_index"] == 20


def test_the_data_source_wants_one_sample_per_group(built, rollout, tmp_path):
    out, _ = built
    with pytest.raises(ValueError, match="pass --n-samples-per-prompt 1"):
        rollout.ParquetRowSource(source_args(out, tmp_path, n_samples_per_prompt=4))
    source = rollout.ParquetRowSource(source_args(out, tmp_path))
    source.add_samples([])  # as miles' buffered source, nothing to add is fine
    with pytest.raises(RuntimeError, match="read-only"):
        source.add_samples(source.get_samples(1))


def test_the_data_source_holds_one_row_group(built, rollout, tmp_path):
    """Bounded memory by construction: a batch reads each row group it touches once, and
    only one is held."""
    out, _ = built
    source = rollout.ParquetRowSource(source_args(out, tmp_path, rollout_shuffle=False))
    reads = []
    real = source.file.read_row_group
    source.file.read_row_group = lambda g, **kw: reads.append(g) or real(g, **kw)
    source.get_samples(ROWS)
    assert reads == [0, 1, 2]
    assert len(source._held[1]) == 44 * 128  # the last group's ids only
    assert isinstance(source._held[1], np.ndarray)


def test_outside_miles_the_data_source_says_what_it_needs(built, tmp_path, monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "pretokenized_sft_rollout", raising=False)
    monkeypatch.setitem(sys.modules, "miles", None)  # miles absent
    import pretokenized_sft_rollout

    with pytest.raises(ImportError, match="runs inside miles"):
        pretokenized_sft_rollout.ParquetRowSource(source_args(built[0], tmp_path))


@pytest.fixture(scope="module")
def bounded(tmp_path_factory, kimi_dir):
    """A build with --emit-boundaries: its rows, and each row's segment lengths and cu_seqlens."""
    import pyarrow.parquet as pq

    folder = tmp_path_factory.mktemp("miles-bounded")
    synthetic.write_parquet(synthetic.conversations(400, seed=8), folder / "src.parquet")
    config = BuildConfig(
        name="m",
        source=str(folder / "src.parquet"),
        tokenizer=str(kimi_dir),
        rows=ROWS,
        row_tokens=128,
        seed=3,
        workers=1,
        emit_boundaries=True,
    )
    build(config, folder / "out")
    metadata = pq.read_table(folder / "out" / "train.parquet").column("metadata").to_pylist()
    rows = [
        (m["input_ids"], m["loss_mask"], [s["end"] - s["start"] for s in m["segments"]], m["cu_seqlens"])
        for m in metadata
    ]
    return folder / "out", rows


def segment_args(path, tmp_path, **overrides):
    trainer = dict(train_backend="megatron", indep_dp=False, use_dynamic_batch_size=True)
    return source_args(path, tmp_path, **{**trainer, **overrides})


def test_segment_mode_gives_a_rows_conversations_as_one_rollout(bounded, rollout, tmp_path):
    """Each group is one row: the samples of its segments that train, in order, sharing the
    row's rollout id; with the segments left out (none of their tokens after the first is
    supervised), they are the row again."""
    out, rows = bounded
    source = rollout.ParquetSegmentSource(segment_args(out, tmp_path))
    groups = source.get_samples(ROWS)
    miles_emulation.train_data(groups)  # (miles' compact-rollout validation and its asserts)
    assert sorted(group[0].metadata["row"] for group in groups) == list(range(ROWS))
    index, left_out = 0, 0
    for number, group in enumerate(groups):
        ids, mask, lengths, cu_seqlens = rows[group[0].metadata["row"]]
        assert {s.rollout_id for s in group} == {s.group_index for s in group} == {number}
        assert [s.index for s in group] == list(range(index, index + len(group)))
        index += len(group)
        samples = iter(group)
        sample = next(samples)
        rebuilt = []
        for k, (start, end) in enumerate(zip(cu_seqlens[:-1], cu_seqlens[1:])):
            if sample is not None and sample.metadata["segment"] == k:
                assert sample.metadata["start"] == start and sample.tokens == ids[start:end]
                first = max(mask[start:end].index(1), 1)  # the rollout's rule, within the segment
                assert sample.response_length == end - start - first and sample.loss_mask == mask[start + first : end]
                rebuilt += sample.tokens
                sample = next(samples, None)
            else:
                assert not any(mask[start + 1 : end])  # only a segment that trains nothing is left out
                rebuilt += ids[start:end]
                left_out += 1
        assert sample is None and rebuilt == ids
    assert left_out  # (the fixture has such segments: a row that starts with a conversation's [EOS], say)


def test_segment_mode_trains_the_rows_tokens_each_within_its_conversation(bounded, rollout, tmp_path):
    """Through miles' get_batch: a row's samples give one cu_seqlens entry each (the row's
    cu_seqlens, less the segments left out) and positions that restart at each; the tokens
    trained are the row mode's (no conversation starts with a supervised token), and so are
    the per-token normalizer and each row's rollout mask sum."""
    out, rows = bounded
    groups = rollout.ParquetSegmentSource(segment_args(out, tmp_path, rollout_shuffle=False)).get_samples(ROWS)
    segments = miles_emulation.train_data(groups)
    whole_rows = rollout.ParquetRowSource(source_args(out, tmp_path, rollout_shuffle=False)).get_samples(ROWS)
    whole = miles_emulation.train_data(whole_rows)
    first, kept_all = 0, 0
    for row, group in enumerate(groups):
        ids, mask, _, cu_seqlens = rows[row]
        indices = list(range(first, first + len(group)))
        first += len(group)
        assert {segments["rollout_ids"][i] for i in indices} == {row}
        batch = miles_emulation.get_batch(segments, indices)
        kept = [len(sample.tokens) for sample in group]
        ends = np.cumsum([0, *kept]).tolist()
        padded = -sum(kept) % 128
        assert batch["cu_seqlens"].tolist() == ends + ([ends[-1] + padded] if padded else [])
        if sum(kept) == len(ids):  # no segment left out: the row's own boundaries
            assert batch["cu_seqlens"].tolist() == cu_seqlens
            kept_all += 1
        assert batch["position_ids"][: sum(kept)].tolist() == [p for n in kept for p in range(n)]
        trained = set()
        for sample, start in zip(group, ends):
            local = np.flatnonzero(batch["full_loss_masks"][start : start + len(sample.tokens)])
            assert (local + 1 < len(sample.tokens)).all()  # each predicts a token of its own segment
            trained |= {sample.metadata["start"] + int(p) + 1 for p in local}  # the logit at p predicts p + 1
        row_batch = miles_emulation.get_batch(whole, [row])
        assert trained == {int(p) + 1 for p in np.flatnonzero(row_batch["full_loss_masks"])}
        assert trained == {p for p in range(1, len(ids)) if mask[p]}
        masks = [segments["loss_masks"][i] for i in indices]
        assert miles_emulation.per_token_normalizer(masks) == miles_emulation.per_token_normalizer(
            [whole["loss_masks"][row]]
        )
        assert {segments["rollout_mask_sums"][i] for i in indices} == {whole["rollout_mask_sums"][row]}
    assert kept_all  # (some rows keep every segment)
    positions: dict = {}
    for position, rollout_id in enumerate(segments["rollout_ids"]):
        positions.setdefault(rollout_id, []).append(position)
    for step in miles_emulation.steps(segments["rollout_ids"], 16):  # a row's samples train in one step
        held = {segments["rollout_ids"][i] for i in step}
        assert len(held) == 16 and sorted(step) == sorted(i for r in held for i in positions[r])


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"use_dynamic_batch_size": False}, "needs --use-dynamic-batch-size"),
        ({"train_backend": "fsdp"}, "needs the Megatron backend"),
        ({"indep_dp": True}, "without --indep-dp"),
        ({"delay_split_train_data_by_dp": True}, "cannot take --delay-split-train-data-by-dp"),
        ({"multi_lora": True}, "cannot take --multi-lora"),
        ({"use_dynamic_global_batch_size": True}, "cannot take --use-dynamic-global-batch-size"),
    ],
)
def test_segment_mode_refuses_trainers_that_count_samples(bounded, rollout, tmp_path, overrides, says):
    with pytest.raises(ValueError, match=says):
        rollout.ParquetSegmentSource(segment_args(bounded[0], tmp_path, **overrides))


def test_segment_mode_passes_through_the_rollout_and_resumes(bounded, rollout, tmp_path):
    out, _ = bounded
    args = segment_args(out, tmp_path)
    source = rollout.ParquetSegmentSource(args)
    groups = rollout.generate_rollout(args, 0, source)
    assert len(groups) == 50 and any(len(group) > 1 for group in groups)
    source.save(4)
    expected = source.get_samples(30)
    resumed = rollout.ParquetSegmentSource(segment_args(out, tmp_path, load=str(tmp_path / "ckpt")))
    resumed.load(4)
    got = resumed.get_samples(30)
    assert [[(s.index, s.rollout_id, s.tokens) for s in g] for g in got] == [
        [(s.index, s.rollout_id, s.tokens) for s in g] for g in expected
    ]
    rows = rollout.ParquetRowSource(source_args(out, tmp_path, load=str(tmp_path / "ckpt")))
    with pytest.raises(ValueError, match="'per_segment': True"):  # a position in segments is not one in rows
        rows.load(4)


def test_segment_mode_passes_over_a_row_none_of_whose_segments_trains(rollout, tmp_path):
    """A row whose only supervised token starts a conversation (a mask other than kimi_k25
    can make one) trains nothing in segment mode: it is passed over, and a file of such
    rows alone is refused."""
    from fixed_sft.output import RowWriter
    from fixed_sft.pack import Row, Segment

    def row(mask, ends):
        spans = tuple(Segment(k, None, 0, b - a) for k, (a, b) in enumerate(zip([0, *ends[:-1]], ends)))
        return Row(np.arange(8, dtype=np.int32), np.array(mask, np.uint8), spans)

    writer = RowWriter(tmp_path / "train.parquet", boundaries=True)
    writer.write(row([0, 0, 0, 1, 0, 0, 0, 0], [3, 8]))  # trains token 3 only in the row mode
    writer.write(row([0, 0, 1, 0, 0, 1, 1, 0], [4, 8]))
    writer.close()
    source = rollout.ParquetSegmentSource(segment_args(tmp_path, tmp_path, rollout_shuffle=False))
    groups = source.get_samples(2)
    assert [[(s.metadata["row"], s.tokens) for s in g] for g in groups] == [[(1, [0, 1, 2, 3]), (1, [4, 5, 6, 7])]] * 2
    assert [s.rollout_id for g in groups for s in g] == [0, 0, 1, 1]

    writer = RowWriter(tmp_path / "lone.parquet")
    writer.write(row([0, 0, 0, 1, 0, 0, 0, 0], [3, 8]))
    writer.close()
    lone = rollout.ParquetSegmentSource(segment_args(tmp_path / "lone.parquet", tmp_path))
    with pytest.raises(ValueError, match="no row has a segment that trains"):
        lone.get_samples(1)

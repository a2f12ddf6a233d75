"""``export``: TRL's and Megatron-Bridge's packed layouts, loaded as those trainers load them.

Neither library is installed here, so their loading and collating code is emulated below,
step by step, from their sources:

- TRL, huggingface/trl @ f2cd57710ae345ea6428ae95363267fcf38a3dc8:
  ``trl/data_utils.py`` ``_pack_bfd`` (a packed row's ``seq_lengths``: a ``list<int32>`` of
  its sequences' lengths); ``trl/trainer/sft_trainer.py``: ``SFTTrainer._prepare_dataset``
  (a dataset with ``input_ids`` is taken as tokenized, and a ``labels`` column is used as
  it is), ``_set_signature_columns_if_needed`` (keeps ``input_ids``, ``labels``,
  ``seq_lengths``), ``DataCollatorForLanguageModeling.torch_call`` with ``padding_free``
  (rows flattened, ``position_ids`` from ``get_position_ids_from_packed_seq_lengths``,
  labels set to -100 where a position is 0). The model's loss (transformers 5.24,
  ``loss/loss_utils.py`` ``ForCausalLMLoss``) pads the labels with -100 and shifts them,
  so the logits at ``t`` predict ``labels[t + 1]``; flash attention's sequences start
  where ``position_ids`` is 0 (``modeling_flash_attention_utils.py``
  ``prepare_fa_kwargs_from_position_ids``).
- Megatron-Bridge, NVIDIA-NeMo/Megatron-Bridge @ 067f987df03b8355b03192d88d70f1709fedf51a:
  ``src/megatron/bridge/data/packing/parquet.py`` ``GPTSFTPackedParquetDataset``
  (``REQUIRED_COLUMNS``, ``validate_row``, ``__getitem__``: a row group read with those
  columns, ``seq_boundaries = seq_start_id + [len(input_ids)]``) and
  ``src/megatron/bridge/data/packing/gpt_sft.py`` ``GPTSFTPackedDataset.collate_fn`` and
  ``_build_loss_mask`` with ``answer_only_loss`` (its default): per sequence ``[b, e)``,
  tokens ``ids[b:e-1]``, labels ``ids[b+1:e]``, loss mask ``loss_mask[b:e-1]``,
  positions ``range(e - b - 1)``, ``cu_seqlens`` by ``e - b - 1``.

Each emulation yields, per row, the trained predictions ``(target, context start,
position)``: which token is trained, from which first token of context, at which
position. They must be exactly those the build row and its segments give: each
supervised token ``t`` that does not start its segment ``[s, e)``, predicted from
``ids[s:t]``, at position ``t - 1 - s``.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fixed_sft.build import BuildConfig, build
from fixed_sft.cli import main
from fixed_sft.export import IGNORE_INDEX, export, megatron_row, trained, trl_row
from fixed_sft.output import read_rows


def _conversations(n: int) -> list[dict]:
    """Short conversations of varied lengths, so that a row holds several, some cut."""
    words = ["alpha", "beta", "gamma", "delta", "epsilon"]
    return [
        {
            "id": f"c{i}",
            "messages": [
                {"role": "user", "content": " ".join(words[: i % 5 + 1])},
                {"role": "assistant", "content": " ".join(words[j % 5] for j in range(i % 11 + 1))},
            ],
        }
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def built(tmp_path_factory, kimi_dir):
    folder = tmp_path_factory.mktemp("export")
    (folder / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in _conversations(1500)))
    config = BuildConfig(
        name="x", source=str(folder / "rows.jsonl"), tokenizer=str(kimi_dir), rows=300, row_tokens=48, seed=5, workers=1
    )
    build(config, folder / "out", progress=False)
    return folder / "out"


def _source_rows(folder):
    """Each build row: its ids, mask and segments' ``(start, end)`` within the row."""
    ids, mask, offsets = read_rows(folder / "train.parquet")
    metadata = pq.read_table(folder / "train.parquet").column("metadata").to_pylist()
    rows = []
    for n, meta in enumerate(metadata):
        lengths = [s["end"] - s["start"] for s in meta["segments"]]
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        rows.append(
            (ids[offsets[n] : offsets[n + 1]], mask[offsets[n] : offsets[n + 1]], list(zip(bounds, bounds[1:])))
        )
    return rows


def _expected(ids, mask, spans):
    """The predictions a build row trains when attention stays within each segment."""
    return sorted((t, s, t - 1 - s) for s, e in spans for t in range(s + 1, e) if mask[t] == 1)


# ----- TRL ---------------------------------------------------------------------------------


def _trl_batch(examples: list[dict]) -> dict[str, np.ndarray]:
    """``DataCollatorForLanguageModeling(padding_free=True)`` of ``examples``: one flat row."""
    lengths = np.array([n for example in examples for n in example["seq_lengths"]])
    total = [sum(example["seq_lengths"]) for example in examples]
    position_ids = np.ones(sum(total), dtype=np.int64)
    position_ids[0] = 0
    position_ids[np.cumsum(lengths[:-1])] = -(lengths[:-1] - 1)
    position_ids = np.cumsum(position_ids)
    input_ids = np.concatenate([np.array(example["input_ids"]) for example in examples])
    labels = np.concatenate([np.array(example["labels"]) for example in examples])
    labels[position_ids == 0] = IGNORE_INDEX
    return {"input_ids": input_ids, "labels": labels, "position_ids": position_ids}


def _trl_trained(batch: dict[str, np.ndarray]) -> list[tuple[int, int, int, int]]:
    """The causal-LM loss on a flat batch: ``(target index, its label, context start,
    position of the predicting token)`` of each trained prediction."""
    labels = np.concatenate([batch["labels"], [IGNORE_INDEX]])[1:]  # shift_labels
    starts = np.flatnonzero(batch["position_ids"] == 0)  # flash attention's sequences
    out = []
    for j in np.flatnonzero(labels != IGNORE_INDEX):
        start = starts[np.searchsorted(starts, j, side="right") - 1]
        out.append((int(j + 1), int(labels[j]), int(start), int(batch["position_ids"][j])))
    return out


def test_trl_export_loads_and_trains_what_the_build_rows_do(built, tmp_path):
    from datasets import load_dataset

    out = tmp_path / "train.trl.parquet"
    export(built, "trl", out)
    dataset = load_dataset("parquet", data_files=str(out), split="train")
    assert "input_ids" in dataset.column_names and "labels" in dataset.column_names  # tokenized, labels as they are
    assert set(dataset.column_names) <= {"input_ids", "labels", "seq_lengths"}  # the signature columns
    source = _source_rows(built)
    assert len(dataset) == len(source)
    cut = 0
    for n, (ids, mask, spans) in enumerate(source):
        example = dataset[n]
        assert example["input_ids"] == ids.tolist()
        assert example["labels"] == [int(i) if m == 1 else -100 for i, m in zip(ids, mask)]
        assert example["seq_lengths"] == [e - s for s, e in spans]
        got = _trl_trained(_trl_batch([example]))
        assert [(t, label) for t, label, _, _ in got] == [(t, int(ids[t])) for t, _, _ in _expected(ids, mask, spans)]
        assert [(t, s, p) for t, _, s, p in got] == _expected(ids, mask, spans)
        cut += len(spans) > 1
    assert cut > len(source) // 2  # rows of several conversations were checked


def test_trl_rows_batched_together_keep_their_boundaries(built, tmp_path):
    """Rows flattened into one batch: each row's first token starts a sequence too."""
    from datasets import load_dataset

    out = tmp_path / "t.parquet"
    export(built, "trl", out)
    dataset = load_dataset("parquet", data_files=str(out), split="train")
    source = _source_rows(built)
    got = _trl_trained(_trl_batch([dataset[0], dataset[1], dataset[2]]))
    width = len(source[0][0])
    want = [(t + n * width, s + n * width, p) for n in range(3) for t, s, p in _expected(*source[n])]
    assert [(t, s, p) for t, _, s, p in got] == want


# ----- Megatron-Bridge ---------------------------------------------------------------------

REQUIRED_COLUMNS = {"input_ids", "seq_start_id", "loss_mask"}


def _validate_row(idx, input_ids, loss_mask, seq_start_id):
    """``GPTSFTPackedParquetDataset.validate_row``'s invariants."""
    assert len(loss_mask) == len(input_ids), idx
    assert seq_start_id and seq_start_id[0] == 0, idx
    for i, start in enumerate(seq_start_id):
        assert start < len(input_ids), idx
        assert i == 0 or start >= seq_start_id[i - 1], idx


def _megatron_items(path):
    """``GPTSFTPackedParquetDataset``: its schema check, then each item of each row group."""
    assert not REQUIRED_COLUMNS - set(pq.read_schema(path).names)
    metadata = pq.read_metadata(path)
    file = pq.ParquetFile(path)
    for group in range(metadata.num_row_groups):
        table = file.read_row_group(group, columns=["input_ids", "seq_start_id", "loss_mask"])
        for row in range(table.num_rows):
            input_ids = table.column("input_ids")[row].as_py()
            seq_start_id = table.column("seq_start_id")[row].as_py()
            loss_mask = table.column("loss_mask")[row].as_py()
            _validate_row(row, input_ids, loss_mask, seq_start_id)
            yield {"input_ids": input_ids, "seq_boundaries": seq_start_id + [len(input_ids)], "loss_mask": loss_mask}


def _megatron_collate(item):
    """``collate_fn`` of one item (``answer_only_loss``): tokens, labels, loss mask,
    positions and ``cu_seqlens``, before padding."""
    bounds, ids = item["seq_boundaries"], np.array(item["input_ids"])
    pairs = list(zip(bounds, bounds[1:]))
    tokens = np.concatenate([ids[b : e - 1] for b, e in pairs])
    labels = np.concatenate([ids[b + 1 : e] for b, e in pairs])
    loss_mask = np.concatenate([np.array(item["loss_mask"])[b : e - 1] for b, e in pairs])
    positions = np.concatenate([np.arange(e - b - 1) for b, e in pairs])
    cu_seqlens = np.cumsum([0] + [e - b - 1 for b, e in pairs])
    return tokens, labels, loss_mask, positions, cu_seqlens, pairs


def _megatron_trained(item):
    """``(target index in the row, its label, context start, position)`` of each prediction
    the loss mask keeps."""
    tokens, labels, loss_mask, positions, cu_seqlens, pairs = _megatron_collate(item)
    assert len(tokens) == len(labels) == len(loss_mask) == len(positions) == cu_seqlens[-1]
    out = []
    for j in np.flatnonzero(loss_mask):
        seq = int(np.searchsorted(cu_seqlens, j, side="right")) - 1
        begin = pairs[seq][0]
        k = int(j - cu_seqlens[seq])  # the predicting token is row token begin + k
        out.append((begin + k + 1, int(labels[j]), begin, int(positions[j])))
    return out


def test_megatron_bridge_export_loads_and_trains_what_the_build_rows_do(built, tmp_path):
    out = tmp_path / "training_48.idx.parquet"
    export(built, "megatron-bridge", out)
    schema = pq.read_schema(out)
    assert schema.field("input_ids").type == pa.list_(pa.int32())
    assert schema.field("loss_mask").type == pa.list_(pa.int8())
    assert schema.field("seq_start_id").type == pa.list_(pa.int32())
    assert pq.read_metadata(out).num_row_groups == pq.read_metadata(built / "train.parquet").num_row_groups > 1
    source = _source_rows(built)
    items = list(_megatron_items(out))
    assert len(items) == len(source)
    for item, (ids, mask, spans) in zip(items, source):
        assert item["input_ids"] == ids.tolist()
        assert item["seq_boundaries"] == [s for s, _ in spans] + [len(ids)]
        got = _megatron_trained(item)
        assert [(t, label) for t, label, _, _ in got] == [(t, int(ids[t])) for t, _, _ in _expected(ids, mask, spans)]
        assert [(t, s, p) for t, _, s, p in got] == _expected(ids, mask, spans)


# ----- the row conversions, on rows made by hand ------------------------------------------


def test_row_conversions_with_a_lone_separator_and_a_supervised_first_token():
    """Segments of 1 token (a unit's separator at a row's start), and a supervised token
    that starts a segment (which no trainer attending within segments can train)."""
    ids = np.array([9, 1, 2, 3, 4, 5, 6], np.int32)
    mask = np.array([0, 0, 1, 1, 1, 0, 1], np.uint8)
    lengths = np.array([1, 3, 2, 1], np.int32)  # [0,1) [1,4) [4,6) [6,7)
    trl = trl_row(ids, mask, lengths)
    assert trl["labels"].tolist() == [-100, -100, 2, 3, 4, -100, 6]
    assert trl["seq_lengths"].tolist() == [1, 3, 2, 1]
    megatron = megatron_row(ids, mask, lengths)
    assert megatron["seq_start_id"].tolist() == [0, 1, 4, 6]
    # loss_mask[t] = mask[t + 1], 0 at each segment's last token (0, 3, 5, 6)
    assert megatron["loss_mask"].tolist() == [0, 1, 1, 0, 0, 0, 0]
    assert trained(mask, lengths) == 2  # tokens 2 and 3; 4 and 6 start their segments
    item = {"input_ids": ids.tolist(), "seq_boundaries": [0, 1, 4, 6, 7], "loss_mask": megatron["loss_mask"].tolist()}
    assert [(t, s) for t, _, s, _ in _megatron_trained(item)] == [(2, 1), (3, 1)]
    example = {k: v.tolist() for k, v in trl.items()}
    assert [(t, s) for t, _, s, _ in _trl_trained(_trl_batch([example]))] == [(2, 1), (3, 1)]


# ----- the command, and what it refuses -----------------------------------------------------


def test_export_command(built, tmp_path, capsys):
    out = tmp_path / "m.idx.parquet"
    assert main(["export", str(built), "--to", "megatron-bridge", str(out)]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"exported {out} (megatron-bridge): 300 rows, ")
    manifest = json.loads((built / "manifest.json").read_text())
    assert f"(the build: {manifest['stats']['trainable_tokens']} trainable)" in said
    provenance = json.loads(pq.read_schema(out).metadata[b"fixed_sft"])
    assert provenance["rows_sha256"] == manifest["rows_sha256"] and provenance["export"] == "megatron-bridge"
    assert sorted(os.listdir(tmp_path)) == ["m.idx.parquet"]  # no temporary file left


def test_an_existing_output_is_refused(built, tmp_path, capsys):
    out = tmp_path / "t.parquet"
    out.write_bytes(b"mine")
    assert main(["export", str(built), "--to", "trl", str(out)]) == 2
    assert capsys.readouterr().err == f"error: {out} exists; choose another output file or remove it\n"
    assert out.read_bytes() == b"mine"


@pytest.mark.parametrize("room", [0, 1])
def test_an_output_name_with_no_room_for_its_draft_is_refused(built, tmp_path, capsys, room):
    """The file is written as ``.NAME.tmp-XXXXXXXX/NAME`` first: a name whose folder's name
    the file system (255 bytes) does not take is refused before anything is read, with
    nothing left; one byte shorter, it is written."""
    out = tmp_path / ("t" * (255 - len("..tmp-") - 8 + 1 - room))
    code = main(["export", str(built), "--to", "trl", str(out)])
    if room:
        assert code == 0 and os.listdir(tmp_path) == [out.name]
        return
    says = f"error: output {out}: its name is too long for the folder beside it; choose another output file\n"
    assert code == 2 and capsys.readouterr().err == says and os.listdir(tmp_path) == []


def test_an_output_inside_a_build_is_refused(built, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(built, copy)
    out = copy / "t.parquet"
    assert main(["export", str(copy), "--to", "trl", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"error: {out} is inside the build {copy}, which would no longer be one; choose another output file\n"
    )
    assert sorted(os.listdir(copy)) == sorted(os.listdir(built))  # the build's files, nothing added


def test_an_unknown_target_is_a_usage_error(built, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit:
        main(["export", str(built), "--to", "axolotl", str(tmp_path / "t.parquet")])
    assert exit.value.code == 2
    assert "invalid choice: 'axolotl'" in capsys.readouterr().err


def test_a_folder_that_does_not_verify_is_not_exported(built, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(built, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["stats"]["supervised_tokens"] += 1
    (copy / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "t.parquet"
    assert main(["export", str(copy), "--to", "trl", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {copy} does not verify, so it is not exported: ") and err.count("\n") == 1
    assert sorted(os.listdir(tmp_path)) == ["copy"]


@pytest.mark.parametrize("change", ["a token", "a boundary", "rows cut off"])
def test_a_file_changed_after_verification_is_not_exported(built, tmp_path, monkeypatch, capsys, change):
    """The rows read for the export must still hash to the manifest's, and be the file
    verified (a file rewritten between verify and export: a boundary moved, which a
    fixed-sft/2 row's hash does not cover, or its last rows cut off): nothing is left at OUT."""
    import fixed_sft.export as module

    copy = tmp_path / "copy"
    shutil.copytree(built, copy)
    real_verify = module.verify

    def verify_then_change(folder):
        problems = real_verify(folder)
        table = pq.read_table(copy / "train.parquet")
        rows = table.to_pylist()
        if change == "a token":
            rows[3]["metadata"]["input_ids"][5] += 1
        elif change == "a boundary":
            first, second = next(row["metadata"]["segments"] for row in rows if len(row["metadata"]["segments"]) > 1)[
                :2
            ]
            first["end"], second["end"] = first["end"] - 1, second["end"] + 1  # (the same tokens)
        else:
            del rows[-3:]
        pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), copy / "train.parquet", row_group_size=16)
        return problems

    monkeypatch.setattr(module, "verify", verify_then_change)
    out = tmp_path / "t.parquet"
    assert main(["export", str(copy), "--to", "trl", str(out)]) == 1
    says = "row 3 changed since it was verified" if change == "a token" else "changed since it was verified"
    assert capsys.readouterr().err == f"error: {copy / 'train.parquet'}: {says}\n"
    assert sorted(os.listdir(tmp_path)) == ["copy"]


def test_a_draft_left_by_a_killed_export_neither_stops_nor_is_taken_by_the_next(built, tmp_path):
    """An export killed while writing leaves its hidden draft folder beside OUT (of any
    pid: pids come round again); the next export writes in a folder of its own, and
    leaves that one as it is (another process may be writing in it)."""
    out = tmp_path / "t.parquet"
    left = tmp_path / f".{out.name}.tmp-{os.getpid()}"
    left.mkdir()
    (left / out.name).write_bytes(b"part of a file")
    assert main(["export", str(built), "--to", "trl", str(out)]) == 0
    assert sorted(os.listdir(tmp_path)) == sorted([out.name, left.name]) and pq.read_table(out).num_rows > 0
    assert (left / out.name).read_bytes() == b"part of a file"


def test_an_output_in_a_folder_it_may_not_write_names_the_file(built, tmp_path, capsys, monkeypatch):
    """The error names the file asked for, not the hidden folder it is written in first."""
    import errno

    from fixed_sft import folder

    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(folder.tempfile, "mkdtemp", refused)
    out = tmp_path / "t.parquet"
    assert main(["export", str(built), "--to", "trl", str(out)]) == 1
    assert capsys.readouterr().err == f"error: cannot write {out}: Permission denied\n"
    assert os.listdir(tmp_path) == []


def test_the_command_offers_every_target():
    from fixed_sft.cli import parser
    from fixed_sft.export import TARGETS

    commands = next(a for a in parser()._actions if a.dest == "command").choices
    to = next(a for a in commands["export"]._actions if a.dest == "to")
    assert list(to.choices) == list(TARGETS)

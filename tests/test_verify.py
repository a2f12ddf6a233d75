"""verify names the first bad row or file for every kind of damage."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import synthetic

from fixed_sft.build import BuildConfig, build
from fixed_sft.output import SCHEMA
from fixed_sft.verify import verify


@pytest.fixture(scope="module")
def built(tmp_path_factory, kimi_dir):
    folder = tmp_path_factory.mktemp("verify")
    synthetic.write_jsonl(synthetic.conversations(300, seed=9), folder / "rows.jsonl")
    config = BuildConfig(
        name="v", source=str(folder / "rows.jsonl"), tokenizer=str(kimi_dir), rows=12, row_tokens=512, seed=1, workers=1
    )
    build(config, folder / "out")
    return folder / "out"


@pytest.fixture
def copy(built, tmp_path):
    target = tmp_path / "copy"
    shutil.copytree(built, target)
    return target


def _rewrite(folder, change):
    """Rewrite train.parquet with ``change(list of row dicts)`` applied."""
    path = folder / "train.parquet"
    table = pq.read_table(path)
    rows = change(table.to_pylist())
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)


def _change_rows(folder, change):
    """Apply ``change`` to the list of row dicts in place, and re-record the file's size
    and hash (``_resave``), so only the checks of the rows can tell."""
    table = pq.read_table(folder / "train.parquet")
    rows = table.to_pylist()
    change(rows)
    _resave(folder, pa.Table.from_pylist(rows, schema=table.schema))


def test_intact_build_verifies(built):
    assert verify(built) == []


def test_flipped_token(copy):
    def flip(rows):
        rows[5]["metadata"]["input_ids"][100] ^= 1
        return rows

    _rewrite(copy, flip)
    assert any(p.startswith("row 5:") for p in verify(copy))


def test_flipped_mask_bit(copy):
    def flip(rows):
        rows[3]["metadata"]["loss_mask"][7] ^= 1
        return rows

    _rewrite(copy, flip)
    assert any(p.startswith("row 3:") for p in verify(copy))


@pytest.mark.parametrize(
    "change, first_bad",
    [
        (lambda rows: rows[:4] + rows[5:], "row 4:"),  # dropped
        (lambda rows: rows[:6] + [rows[5]] + rows[6:], "row 6:"),  # duplicated
        (lambda rows: rows[:2] + [rows[3], rows[2]] + rows[4:], "row 2:"),  # swapped
    ],
)
def test_row_order_damage(copy, change, first_bad):
    _rewrite(copy, change)
    problems = verify(copy)
    assert any(p.startswith(first_bad) for p in problems), problems


def test_truncated_file(copy):
    path = copy / "train.parquet"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    problems = verify(copy)
    assert any("bytes, manifest says" in p for p in problems)
    assert any("unreadable" in p for p in problems)


def test_zero_length_file(copy):
    (copy / "train.parquet").write_bytes(b"")
    assert any("unreadable" in p for p in verify(copy))


def test_missing_file(copy):
    (copy / "train.parquet").unlink()
    assert any(p.endswith("train.parquet: missing") for p in verify(copy))


def test_missing_manifest(copy):
    (copy / "manifest.json").unlink()
    assert any("manifest.json: missing" in p for p in verify(copy))


def test_edited_manifest_row_hash(copy):
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["row_sha256"][2] = "0" * 64
    (copy / "manifest.json").write_text(json.dumps(manifest))
    problems = verify(copy)
    assert any("edited manifest" in p for p in problems)
    assert any(p.startswith("row 2:") for p in problems)


@pytest.mark.parametrize(
    "stat, says", [("supervised_tokens", "supervised tokens"), ("trainable_tokens", "trainable tokens, manifest says")]
)
def test_edited_manifest_stats(copy, stat, says):
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["stats"][stat] += 1
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert any(says in p for p in verify(copy))


def _rehash_rows(folder):
    """Record each row's hash, the file's, and the stats the rows give, as a forger who
    knows the rules would: only the checks of the rows' content can tell."""
    from fixed_sft.hashes import row_digest, rows_digest

    rows = pq.read_table(folder / "train.parquet").column("metadata").to_pylist()
    digests = [row_digest(np.array(r["input_ids"]), np.array(r["loss_mask"])) for r in rows]
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest.update(row_sha256=[d.hex() for d in digests], rows_sha256=rows_digest(digests))
    stats = manifest["stats"]
    stats["supervised_tokens"] = sum(sum(r["loss_mask"]) for r in rows)
    stats["trainable_tokens"] = sum(sum(r["loss_mask"][1:]) for r in rows)
    stats["supervised_token_ratio"] = stats["supervised_tokens"] / stats["tokens"]
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_a_negative_token_id_is_named_though_every_hash_matches(copy):
    """No tokenizer gives a negative id: a trainer's embedding lookup fails on one."""

    def negate(rows):
        rows[6]["metadata"]["input_ids"][30] = -5

    _change_rows(copy, negate)
    _rehash_rows(copy)
    assert verify(copy) == ["row 6: an input_ids value is -5, not a token id"]


def test_a_row_with_nothing_to_train_is_named_though_every_hash_matches(copy):
    """The format skips a row with no supervised token after token 0: one forged in, its
    hashes and counts recorded, is named."""

    def untrain(rows):
        mask = rows[4]["metadata"]["loss_mask"]
        mask[1:] = [0] * (len(mask) - 1)

    _change_rows(copy, untrain)
    _rehash_rows(copy)
    assert "row 4: no supervised token after token 0 (the format skips such rows)" in verify(copy)


def _split_first_segment(rows) -> None:
    """Row 2's first conversation as two touching segments: the same tokens, as one
    trainer reads them, two conversations."""
    segments = rows[2]["metadata"]["segments"]
    first = segments[0]
    middle = (first["start"] + first["end"]) // 2
    assert first["start"] < middle < first["end"]
    segments[:1] = [{**first, "end": middle}, {**first, "start": middle}]


@pytest.mark.parametrize(
    "change, says",
    [
        (lambda rows: rows[3]["messages"][0].update(content="tampered"), "row 3: messages is not"),
        (lambda rows: rows[3]["messages"][0].update(role="assistant"), "row 3: messages is not"),
        (
            lambda rows: rows[2]["metadata"]["segments"][0].update(source_index=-1),
            "row 2: a metadata segment names source row -1",
        ),
        (_split_first_segment, "row 2: two metadata segments in a row name source row "),
    ],
)
def test_an_edited_placeholder_or_provenance_is_named_by_its_row(copy, change, says):
    _change_rows(copy, change)
    assert any(p.startswith(says) for p in verify(copy))


@pytest.mark.parametrize("skip_invalid", [False, True])
def test_skipped_rows_must_agree_with_the_parameters(copy, skip_invalid):
    """A build without --skip-invalid stops at an invalid row, so its manifest lists none;
    the listed rows and their count agree."""
    manifest = json.loads((copy / "manifest.json").read_text())
    assert manifest["params"]["skip_invalid"] is False and manifest["skipped_invalid"] == []
    manifest["params"]["skip_invalid"] = skip_invalid
    manifest["skipped_invalid"] = [{"index": 3, "id": "x", "reason": "r"}]
    manifest["stats"]["invalid_rows_skipped"] = 1
    (copy / "manifest.json").write_text(json.dumps(manifest))
    problems = verify(copy)
    contradiction = "stats.invalid_rows_skipped without skip_invalid is 1, expected 0"
    assert any(contradiction in p for p in problems) != skip_invalid
    manifest["stats"]["invalid_rows_skipped"] = 2
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert any("the skipped_invalid rows is 1, expected 2" in p for p in verify(copy))


def test_garbled_manifest(copy):
    (copy / "manifest.json").write_text("{not json")
    assert any("unreadable" in p for p in verify(copy))


@pytest.mark.parametrize(
    "key, value",
    [
        ("supervised_token_ratio", 0.666),
        ("supervised_token_ratio", 1),
        ("tokens", 1),
        ("padding_tokens", 3),
        ("conversations", 1),
        ("conversations_split", 0),
    ],
)
def test_edited_derived_stats(copy, key, value):
    """Stats that follow from the rows are checked, as JSON: an integer is not a decimal."""
    manifest = json.loads((copy / "manifest.json").read_text())
    assert manifest["stats"][key] != value
    manifest["stats"][key] = value
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert any(f"stats.{key} is {value}," in p for p in verify(copy))


def test_a_manifest_that_repeats_a_key_is_refused(copy):
    """Readers that keep the first value and readers that keep the last would read two manifests."""
    text = (copy / "manifest.json").read_text()
    (copy / "manifest.json").write_text(text.replace("{", '{"rows_sha256": "' + "0" * 64 + '", ', 1))
    assert verify(copy) == [f"{copy / 'manifest.json'}: unreadable (DuplicateKey: duplicate key 'rows_sha256')"]


def test_row_hashes_are_lowercase_hex(copy):
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["row_sha256"][3] = manifest["row_sha256"][3].upper()
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert verify(copy) == [
        f'{copy / "manifest.json"}: row_sha256[3] is "{manifest["row_sha256"][3]}", not 64 lowercase hex digits'
    ]


def test_edited_params_rows(copy):
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["params"]["rows"] = 999
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert any("params.rows is 999" in p for p in verify(copy))


def test_edited_provenance(copy):
    def renumber(rows):
        rows[9]["metadata"]["row"] = 90
        rows[4]["metadata"]["row"] = 40
        return rows

    _rewrite(copy, renumber)
    problems = verify(copy)
    assert "row 4: metadata.row is 40" in problems  # the first of the two


def test_edited_segment_span(copy):
    def widen(rows):
        rows[6]["metadata"]["segments"][0]["end"] += 1
        return rows

    _rewrite(copy, widen)
    assert any(p.startswith("row 6: metadata.segments cover 513") for p in verify(copy))


def _edit_manifest(folder, keys, value):
    manifest = json.loads((folder / "manifest.json").read_text())
    target = manifest
    for key in keys[:-1]:
        target = target[key]
    if value is None:
        del target[keys[-1]]
    else:
        target[keys[-1]] = value
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("keys", "value", "says"),
    [
        (["parquet"], "x", 'parquet is "x", not an object'),
        (["parquet", "bytes"], None, "parquet.bytes is missing"),
        (["parquet", "bytes"], "12", 'parquet.bytes is "12", not an integer'),
        (["stats", "supervised_tokens"], "many", 'stats.supervised_tokens is "many", not an integer'),
        (["params", "row_tokens"], True, "params.row_tokens is true, not an integer"),
        (["parquet", "path"], "../elsewhere.parquet", 'parquet.path is "../elsewhere.parquet", not "train.parquet"'),
        (["row_sha256"], ["zz"], 'row_sha256[0] is "zz", not 64 lowercase hex digits'),
        (["format"], "other/9", 'format is "other/9", not "fixed-sft/2"'),
        (["code_version", "format"], "fixed-sft/0", 'code_version.format is "fixed-sft/0", not "fixed-sft/2"'),
        (["tokenizer"], None, "tokenizer is missing"),
        (["source", "files"], {}, "source.files is {}, not an array"),
        (["stats", "padding_tokens"], False, "stats.padding_tokens is false, not an integer"),
        (["template_check", "checked"], True, "template_check.checked is true, not an integer"),
        (["params", "row_tokens"], 10**400, "params.row_tokens is 1000"),
        (["stats", "rows"], -1, "stats.rows is -1, outside 0 .. 2**63 - 1"),
        (["parquet", "bytes"], 2**63, "parquet.bytes is 9223372036854775808, outside 0 .. 2**63 - 1"),
        (["params", "seed"], -1, "params.seed is -1, outside 0 .. 2**64 - 1"),
        (["params", "seed"], 2**64, "params.seed is 18446744073709551616, outside 0 .. 2**64 - 1"),
        (["params", "rows"], 0, "params.rows is 0, outside 1 .. 2**63 - 1"),
        (["stats", "tail_tokens_dropped"], -1, "stats.tail_tokens_dropped is -1, outside 0 .. 2**63 - 1"),
        (["template_check", "checked"], -5, "template_check.checked is -5, outside 0 .. 2**63 - 1"),
        (["source", "rows"], -2, "source.rows is -2, outside 0 .. 2**63 - 1"),
    ],
)
def test_malformed_manifest_fields(copy, keys, value, says):
    _edit_manifest(copy, keys, value)
    (problem,) = verify(copy)
    assert problem.startswith(f"{copy / 'manifest.json'}: {says}")


def test_numbers_json_does_not_have_are_refused(copy):
    """Python's json writes NaN; JSON has no such number, and readers disagree on it."""
    text = (copy / "manifest.json").read_text()
    (copy / "manifest.json").write_text(text.replace('"thinking": true', '"thinking": NaN'))
    (problem,) = verify(copy)
    assert problem == f"{copy / 'manifest.json'}: unreadable (ValueError: NaN is not JSON)"


def test_a_mask_type_recorded_twice_must_agree(copy):
    _edit_manifest(copy, ["loss_mask", "type"], "other")
    assert verify(copy) == ['manifest.json: loss_mask.type is "other", expected "kimi_k25"']


def test_a_segment_must_name_a_row_of_the_source(copy):
    """The source's row count bounds the rows the segments name; a negative row is none."""
    manifest = json.loads((copy / "manifest.json").read_text())
    named = max(
        s["source_index"]
        for row in pq.read_table(copy / "train.parquet").to_pylist()
        for s in row["metadata"]["segments"]
    )
    _edit_manifest(copy, ["source", "rows"], named)
    assert verify(copy) == [f"{copy / 'train.parquet'}: a segment names source row {named}, but source.rows is {named}"]
    _edit_manifest(copy, ["source", "rows"], manifest["source"]["rows"])

    def negative(rows):
        rows[3]["metadata"]["segments"][0]["source_index"] = -4
        return rows

    _rewrite(copy, negative)
    assert "row 3: a metadata segment names source row -4" in verify(copy)


def test_a_manifest_nested_too_deep_to_read(copy):
    (copy / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    (problem,) = verify(copy)
    assert problem.startswith(f"{copy / 'manifest.json'}: unreadable (RecursionError")


def test_missing_folder(tmp_path):
    assert verify(tmp_path / "nowhere") == [f"{tmp_path / 'nowhere'}: no such folder"]


def test_a_file_instead_of_a_folder(copy):
    assert verify(copy / "train.parquet") == [f"{copy / 'train.parquet'}: not a folder"]


def test_metadata_without_its_fields(copy):
    path = copy / "train.parquet"
    table = pq.read_table(path)
    bare = pa.StructArray.from_arrays([pa.array([0] * table.num_rows)], names=["other"])
    pq.write_table(table.set_column(1, "metadata", bare), path)
    problems = verify(copy)
    assert problems[0].startswith(f"{path}: ") and "manifest says" in problems[0]  # the earlier problems are kept
    assert problems[-1].startswith(f"{path}: schema differs from the format's")


def test_parquet_without_metadata_column(copy):
    path = copy / "train.parquet"
    pq.write_table(pq.read_table(path, columns=["messages"]), path)
    problems = verify(copy)
    assert problems[-1].startswith(f"{path}: schema differs from the format's")


def _resave(folder, table):
    """Write ``table`` as train.parquet and record its size and sha256 in the manifest,
    so that only the rows can give the damage away."""
    from fixed_sft.hashes import sha256_file

    path = folder / "train.parquet"
    pq.write_table(table, path)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["parquet"].update(bytes=path.stat().st_size, sha256=sha256_file(path))
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_wider_value_types_that_would_wrap_into_the_same_hash(copy):
    """A mask of 257 is 1 as uint8, an id + 2**32 the same int32: the schema must be the format's."""
    table = pq.read_table(copy / "train.parquet")
    rows = table.to_pylist()
    for row in rows:
        row["metadata"]["loss_mask"] = [257 if v else 0 for v in row["metadata"]["loss_mask"]]
    fields = [
        f.with_type(pa.list_(pa.int64())) if f.name == "loss_mask" else f for f in table.schema.field("metadata").type
    ]
    wide = pa.schema([table.schema.field("messages"), ("metadata", pa.struct(fields))])
    _resave(copy, pa.Table.from_pylist(rows, schema=wide))
    (problem,) = verify(copy)
    assert problem.startswith(f"{copy / 'train.parquet'}: schema differs from the format's")


@pytest.mark.parametrize("position", [5, 0])  # at 0: named by its own row, not the one before
def test_a_mask_value_other_than_0_or_1(copy, position):
    _change_rows(copy, lambda rows: rows[3]["metadata"]["loss_mask"].__setitem__(position, 2))
    assert "row 3: a loss_mask value is 2, not 0 or 1" in verify(copy)


def test_segments_must_be_non_empty_spans(copy):
    def negative(rows):
        first = rows[2]["metadata"]["segments"][0]
        first["start"], first["end"] = first["end"], first["start"]  # a negative span ...
        rows[2]["metadata"]["segments"].append({**first, "start": 0, "end": 2 * (first["start"] - first["end"])})
        return rows  # ... that the added segment makes up for

    _rewrite(copy, negative)
    assert any(p.startswith("row 2: a metadata segment spans [") for p in verify(copy))


def test_parts_of_the_build_that_are_not_files(copy):
    (copy / "train.parquet").unlink()
    (copy / "train.parquet").mkdir()
    assert verify(copy)[-1] == f"{copy / 'train.parquet'}: not a file"
    (copy / "manifest.json").unlink()
    (copy / "manifest.json").symlink_to("/dev/zero")
    assert verify(copy) == [f"{copy / 'manifest.json'}: not a file"]


def test_only_the_first_row_that_differs_is_named(copy):
    """A dropped row shifts every later one: one problem names the first, not one per row."""
    _rewrite(copy, lambda rows: rows[:4] + rows[5:])
    problems = verify(copy)
    assert [p for p in problems if "content differs" in p] == ["row 4: content differs from its manifest hash"]


def test_a_row_of_the_wrong_length_is_named_with_its_length(copy):
    def shorten(rows):
        rows[5]["metadata"]["input_ids"].pop()
        rows[5]["metadata"]["loss_mask"].pop()
        return rows

    _rewrite(copy, shorten)
    assert "row 5: 511 tokens, expected 512" in verify(copy)


def test_an_extra_row_at_the_end(copy):
    """Rows past the manifest's list are reported (not an IndexError), with the row count."""
    _rewrite(copy, lambda rows: rows + [rows[-1]])
    problems = verify(copy)
    assert "row 12: content differs from its manifest hash" in problems
    assert f"{copy / 'train.parquet'}: 13 rows, manifest lists 12" in problems


def test_a_missing_last_row_is_counted(copy):
    _rewrite(copy, lambda rows: rows[:-1])
    assert f"{copy / 'train.parquet'}: 11 rows, manifest lists 12" in verify(copy)


def test_edited_stats_rows(copy):
    _edit_manifest(copy, ["stats", "rows"], 13)
    assert "manifest.json: lists 12 row hashes but stats.rows is 13" in verify(copy)


def test_edited_parquet_sha256(copy):
    """Same size, other bytes: only the file hash can tell."""
    _edit_manifest(copy, ["parquet", "sha256"], "0" * 64)
    assert verify(copy) == [f"{copy / 'train.parquet'}: sha256 differs from the manifest"]


def test_ids_and_mask_rows_of_different_lengths(copy):
    """A mask value moved from row 4 to row 3 leaves the flat arrays, and so every hash, unchanged."""
    _change_rows(copy, lambda rows: rows[3]["metadata"]["loss_mask"].append(rows[4]["metadata"]["loss_mask"].pop(0)))
    (problem,) = verify(copy)
    assert problem.startswith(f"{copy / 'train.parquet'}: unreadable") and "differ in length" in problem


def test_segments_must_not_be_empty(copy):
    """An empty segment [s, s) covers nothing, so coverage alone would not catch it."""

    def empty(rows):
        rows[2]["metadata"]["segments"].append({**rows[2]["metadata"]["segments"][0], "start": 3, "end": 3})
        return rows

    _rewrite(copy, empty)
    assert any(p.startswith("row 2: a metadata segment spans [3, 3)") for p in verify(copy))


def test_segments_must_not_start_before_0(copy):
    def shift(rows):
        first = rows[0]["metadata"]["segments"][0]
        first["start"], first["end"] = first["start"] - 1, first["end"] - 1  # same span
        return rows

    _rewrite(copy, shift)
    assert any(p.startswith("row 0: a metadata segment spans [-1,") for p in verify(copy))


def test_a_last_row_without_segments(copy):
    def strip(rows):
        rows[-1]["metadata"]["segments"] = []
        return rows

    _rewrite(copy, strip)
    assert "row 11: metadata.segments cover 0 tokens, not 512" in verify(copy)


@pytest.mark.parametrize(
    "change, says",
    [
        (
            lambda rows: rows[1]["metadata"]["segments"][0].update(start=None),
            "row 1: a metadata segment's start is null",
        ),
        (lambda rows: rows[2]["metadata"]["segments"][-1].update(end=None), "row 2: a metadata segment's end is null"),
        (
            lambda rows: rows[3]["metadata"]["segments"][0].update(source_index=None),
            "row 3: a metadata segment's source_index is null",
        ),
        (lambda rows: rows[4]["metadata"].update(segments=None), "row 4: metadata.segments is null"),
        (lambda rows: rows[5].update(metadata=None), "row 5: metadata is null"),
        (lambda rows: rows[5]["metadata"].update(row=None), "row 5: metadata.row is null"),
        (lambda rows: rows[9]["metadata"]["segments"].__setitem__(0, None), "row 9: a metadata segment is null"),
        (lambda rows: rows[6]["metadata"]["input_ids"].__setitem__(7, None), "row 6: a value in input_ids is null"),
        (lambda rows: rows[7]["metadata"].update(loss_mask=None), "row 7: loss_mask is null"),
        (lambda rows: rows[8].update(messages=None), "row 8: messages is null"),
        (lambda rows: [rows[k]["metadata"].update(loss_mask=None) for k in (7, 2)], "row 2: loss_mask is null"),
        (
            lambda rows: [rows[k]["metadata"]["input_ids"].__setitem__(5, None) for k in (9, 3)],
            "row 3: a value in input_ids is null",
        ),
    ],
)
def test_a_null_is_named_by_its_row(copy, change, says):
    """The format never holds a null (a segment's id aside); the schema allows them."""
    _change_rows(copy, change)
    assert says in verify(copy)


def test_a_null_mask_value_is_not_a_0(copy):
    """NumPy would read a null as NaN, which hashes as 0: with the supervised count edited
    to match, only the null check tells."""

    def null_a_zero(rows):
        mask = next(r for r in rows if 0 in r["metadata"]["loss_mask"])["metadata"]["loss_mask"]
        mask[mask.index(0)] = None

    _change_rows(copy, null_a_zero)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["stats"]["supervised_tokens"] += 1
    manifest["stats"]["supervised_token_ratio"] = manifest["stats"]["supervised_tokens"] / manifest["stats"]["tokens"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert any(problem.endswith("a value in loss_mask is null") for problem in verify(copy))


def test_a_huge_manifest_is_refused_before_it_is_read(copy, monkeypatch):
    """A sparse 3 GB manifest.json takes no disk, and parsing it would take gigabytes."""
    import fixed_sft.verify

    monkeypatch.setattr(fixed_sft.verify, "loads", lambda text: pytest.fail("the manifest was parsed"))
    with (copy / "manifest.json").open("r+b") as f:
        f.truncate(3 << 30)
    (problem,) = verify(copy)
    assert problem.startswith(f"{copy / 'manifest.json'}: 3221225472 bytes, more than the ")
    assert problem.endswith("; not read")


def test_a_manifest_of_many_small_values_is_refused_before_it_is_read(copy, monkeypatch):
    """Each ``{}`` of ``[{}, {}, ...]`` is 3 bytes of JSON and a Python dict of 64: the
    bound is on what parsing takes, not on the bytes alone."""
    import fixed_sft.verify

    monkeypatch.setattr(fixed_sft.verify, "loads", lambda text: pytest.fail("the manifest was parsed"))
    monkeypatch.setattr(fixed_sft.verify, "MANIFEST_MEMORY", 1 << 20)
    (copy / "manifest.json").write_text("[" + "{}," * 10_000 + "{}]")
    (problem,) = verify(copy)
    assert problem.startswith(f"{copy / 'manifest.json'}: holds up to 10002 objects and arrays")
    assert problem.endswith("; not read")


def _no_decoding(monkeypatch):
    """Make any read of pages through pyarrow fail the test."""

    def refuse(*args, **kwargs):
        pytest.fail("a page was decoded")

    for name in ("read_row_group", "read_row_groups", "read", "iter_batches"):
        monkeypatch.setattr(pq.ParquetFile, name, refuse)
    monkeypatch.setattr(pq, "read_table", refuse)


def _with_long_row(folder, row, tokens):
    """train.parquet with row ``row`` ``tokens`` tokens long (all 0: a few bytes compressed)."""
    table = pq.read_table(folder / "train.parquet")
    rows = table.to_pylist()
    rows[row]["metadata"]["input_ids"] = pa.array(np.zeros(tokens, np.int32))
    rows[row]["metadata"]["loss_mask"] = pa.array(np.zeros(tokens, np.uint8))
    metadata = table.column("metadata").combine_chunks()
    fields = {key: metadata.field(key) for key in ("input_ids", "loss_mask", "row", "segments")}
    for key in ("input_ids", "loss_mask"):
        lists = [np.asarray(r["metadata"][key]) for r in rows]
        offsets = np.concatenate([[0], np.cumsum([len(v) for v in lists])]).astype(np.int32)
        fields[key] = pa.ListArray.from_arrays(
            pa.array(offsets), pa.array(np.concatenate(lists), fields[key].type.value_type)
        )
    metadata = pa.StructArray.from_arrays(list(fields.values()), fields=list(metadata.type))
    return table.set_column(1, "metadata", metadata)


def test_a_parquet_bomb_is_not_decoded(copy, monkeypatch):
    """One row of 4M tokens compresses to a few kB; the footer's value counts show it
    before a page is decoded, whether or not the file's size is recorded."""
    bomb = _with_long_row(copy, 3, 4_000_000)
    pq.write_table(bomb, copy / "train.parquet", compression="zstd")
    assert (copy / "train.parquet").stat().st_size < 100_000
    _no_decoding(monkeypatch)
    problems = verify(copy)
    assert problems[0].startswith(f"{copy / 'train.parquet'}: ") and "manifest says" in problems[0]
    assert problems[-1] == (
        f"{copy / 'train.parquet'}: row group 0 (rows 0 to 11) holds 4005632 metadata.input_ids "
        "values, more than its 12 rows of 512 tokens and one more row; not decoded"
    )
    _resave(copy, bomb)
    assert verify(copy) == [problems[-1]]


def test_a_long_row_that_the_footer_allows_is_named(copy):
    """Up to a row's worth of values more than a row group's rows hold, the file is read
    and the row named."""
    _resave(copy, _with_long_row(copy, 3, 1000))
    assert "row 3: 1000 tokens, expected 512" in verify(copy)


def _footer(path):
    """(the file's bytes before its footer, the footer parsed as Thrift fields)"""
    from fixed_sft import thrift

    data = path.read_bytes()
    length = int.from_bytes(data[-8:-4], "little")
    return data[: -8 - length], thrift.Reader(data[-8 - length : -8]).struct()


def _write_footer(path, head, footer):
    from fixed_sft import thrift

    encoded = thrift.write_struct(footer)
    path.write_bytes(head + encoded + len(encoded).to_bytes(4, "little") + b"PAR1")


def _edit_column_chunk(footer, column, change):
    """Apply ``change`` to the fields of row group 0's column chunk ``column`` (by leaf number)."""
    from fixed_sft import thrift

    groups = thrift.get(footer, 4)[1]
    chunk = thrift.get(groups[0], 1)[1][column]
    change(chunk)


def test_a_footer_that_understates_the_pages_is_caught_before_they_are_decoded(copy, monkeypatch):
    """The footer says each column chunk holds what 12 rows of 512 tokens need; the pages
    of the ids and the mask hold 4M values more: page headers are read before pages."""
    from fixed_sft import thrift

    path = copy / "train.parquet"
    pq.write_table(_with_long_row(copy, 3, 4_000_000), path, compression="zstd")
    head, footer = _footer(path)

    def understate(chunk):
        meta = thrift.get(chunk, 3)
        meta[:] = [(f, k, 12 * 512 if f == 5 else v) for f, k, v in meta]  # ColumnMetaData.num_values

    for column in (2, 3):  # metadata.input_ids, metadata.loss_mask
        _edit_column_chunk(footer, column, understate)
    _write_footer(path, head, footer)
    _resave_bytes(copy)
    _no_decoding(monkeypatch)
    assert verify(copy) == [
        f"{path}: row group 0, column metadata.input_ids: its pages hold 4005632 values, the "
        "footer says 6144; not decoded"
    ]


def test_a_column_chunk_in_another_file_is_not_read(copy, monkeypatch):
    from fixed_sft import thrift

    path = copy / "train.parquet"
    head, footer = _footer(path)
    _edit_column_chunk(footer, 2, lambda chunk: chunk.insert(0, (1, thrift.BINARY, b"/etc/passwd")))
    _write_footer(path, head, footer)
    _resave_bytes(copy)
    _no_decoding(monkeypatch)
    assert verify(copy) == [
        f"{path}: row group 0, column metadata.input_ids: stored in another file ('/etc/passwd'); not read"
    ]


def _resave_bytes(folder):
    """Record train.parquet's size and sha256 as it is."""
    from fixed_sft.hashes import sha256_file

    path = folder / "train.parquet"
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["parquet"].update(bytes=path.stat().st_size, sha256=sha256_file(path))
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_rows_past_the_manifests_are_not_decoded(copy, monkeypatch):
    """A file of many more rows than the manifest lists is read up to the row group
    holding the first row too many: its count comes from the footer."""
    table = pq.read_table(copy / "train.parquet")
    pq.write_table(pa.concat_tables([table] * 20), copy / "train.parquet", row_group_size=5)
    read = []
    original = pq.ParquetFile.read_row_group
    monkeypatch.setattr(
        pq.ParquetFile, "read_row_group", lambda self, g, *a, **k: read.append(g) or original(self, g, *a, **k)
    )
    problems = verify(copy)
    assert read == [0, 1, 2]  # rows 0 to 14
    assert "row 12: content differs from its manifest hash" in problems
    assert f"{copy / 'train.parquet'}: 240 rows, manifest lists 12" in problems


def test_a_mask_value_stored_as_257_is_not_read_as_1(copy):
    """Parquet stores the uint8 mask as INT32 annotated UINT_8; pyarrow casts a stored 257
    to 1, which hashes as 1: the stored value must be read."""
    path = copy / "train.parquet"
    pq.write_table(pq.read_table(path), path, compression="none", use_dictionary=False)
    chunk = pq.read_metadata(path).row_group(0).column(3)
    assert chunk.path_in_schema == "metadata.loss_mask.list.element" and chunk.num_values == 12 * 512
    data = bytearray(path.read_bytes())
    end = chunk.data_page_offset + chunk.total_compressed_size  # one PLAIN page: its values end the chunk
    values = np.frombuffer(bytes(data[end - 4 * 12 * 512 : end]), "<i4")
    position = 4 * 512 + int(np.argmax(values[4 * 512 :] == 1))  # a 1 in row 4 or after
    data[end - 4 * 12 * 512 + 4 * position + 1] = 1  # 1 -> 257
    path.write_bytes(bytes(data))
    assert pq.read_table(path).column("metadata").to_pylist()[position // 512]["loss_mask"][position % 512] == 1
    _resave_bytes(copy)
    assert verify(copy) == [f"row {position // 512}: a loss_mask value is 257, not 0 or 1"]


def _edit_schema_element(copy, monkeypatch, name, above, back, change):
    """``change`` applied to the footer's schema element ``name`` whose element ``back``
    places before it is named ``above``; the manifest re-recorded, decoding stubbed."""
    from fixed_sft import thrift

    path = copy / "train.parquet"
    head, footer = _footer(path)
    elements = thrift.get(footer, 2)[1]
    n = next(
        n for n, e in enumerate(elements) if thrift.get(e, 4) == name and thrift.get(elements[n - back], 4) == above
    )
    elements[n] = change(elements[n])
    _write_footer(path, head, footer)
    _resave_bytes(copy)
    _no_decoding(monkeypatch)
    return path


def test_parquet_types_other_than_the_formats_are_named(copy, monkeypatch):
    """The ids stored as INT32 annotated INT_32 read as the same int32 column; the
    Parquet schema must still be the format's, element by element."""
    from fixed_sft import thrift

    def annotated(element):
        return [*element, (6, thrift.I32, 17)]  # ConvertedType INT_32

    path = _edit_schema_element(copy, monkeypatch, b"element", b"input_ids", 2, annotated)
    assert pq.read_schema(path).equals(SCHEMA, check_metadata=False)
    assert verify(copy) == [
        f"{path}: its Parquet schema differs from the format's at metadata.input_ids.list.element "
        "(optional INT32 converted type 17, not optional INT32)"
    ]


def test_a_schema_element_named_otherwise_is_named(copy, monkeypatch):
    """A list's middle level named other than the format names it reads as the same
    column; the difference the description would leave out is named field by field."""

    def renamed(element):
        return [(f, k, b"lisu" if f == 4 else v) for f, k, v in element]

    path = _edit_schema_element(copy, monkeypatch, b"list", b"messages", 1, renamed)
    assert verify(copy) == [
        f"{path}: its Parquet schema differs from the format's at messages.list (name 'lisu', not name 'list')"
    ]


def test_a_row_group_of_long_rows_holds_at_most_group_values_tokens(tmp_path, monkeypatch):
    """So that verify's bound on what it decodes at once holds for any build's row group."""
    import fixed_sft.output
    from fixed_sft.output import RowWriter
    from fixed_sft.pack import Row, Segment

    monkeypatch.setattr(fixed_sft.output, "GROUP_VALUES", 1000)
    writer = RowWriter(tmp_path / "train.parquet")
    for n in range(10):
        writer.write(Row(np.full(300, n, np.int32), np.ones(300, np.uint8), (Segment(n, None, 0, 300),)))
    writer.close()
    metadata = pq.read_metadata(tmp_path / "train.parquet")
    assert [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)] == [3, 3, 3, 1]


def test_column_metadata_that_pyarrow_checks_lazily_does_not_abort_verify(copy):
    """pyarrow checks a column's size statistics against the schema only as the column's
    metadata is asked for, and its error there aborts the process: verify, in a process of
    its own here, gives pyarrow the footer without them and checks the rows."""
    import subprocess
    import sys

    from conftest import ROOT, shorten_size_statistics

    shorten_size_statistics(copy / "train.parquet")
    _resave_bytes(copy)
    result = subprocess.run(
        [sys.executable, str(ROOT / "generate_fixed_sft.py"), "verify", str(copy)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("damage", ["encrypted", "a column short"])
def test_a_footer_pyarrow_would_read_otherwise_is_refused_in_one_line(copy, damage):
    """A column chunk with an encryption key (pyarrow cannot read its values), or a row
    group with a column fewer than the format's: verify refuses the file, naming it."""
    from conftest import edit_footer

    from fixed_sft import thrift

    def edit(footer):
        chunks = thrift.get(thrift.get(footer, 4)[1][0], 1)[1]
        if damage == "encrypted":
            chunks[0].append((8, thrift.STRUCT, [(1, thrift.STRUCT, [])]))
        else:
            del chunks[-1]

    edit_footer(copy / "train.parquet", edit)
    _resave_bytes(copy)
    problems = verify(copy)
    assert len(problems) == 1 and "train.parquet" in problems[0] and "\n" not in problems[0], problems
    assert ("encrypted" if damage == "encrypted" else "row group 0 has") in problems[0], problems


def test_random_damage_is_named_on_one_line(copy):
    """Bytes flipped, zeroed or cut anywhere in the file, a third of them in a page header
    and a third in its footer (its size and hash re-recorded): verify names the damage in
    one line each, whatever reader it reaches."""
    import random

    path = copy / "train.parquet"
    original = path.read_bytes()
    rng = random.Random(21)
    verdicts = set()
    meta = pq.ParquetFile(path).metadata
    groups = [meta.row_group(g) for g in range(meta.num_row_groups)]
    pages = [group.column(c).data_page_offset for group in groups for c in range(group.num_columns)]
    footer = int.from_bytes(original[-8:-4], "little") + 8
    for n in range(90):
        data = bytearray(original)
        # anywhere; in a column chunk's first page header; in the footer
        where = [
            rng.randrange(len(data)),
            rng.choice(pages) + rng.randrange(16),
            len(data) - 1 - rng.randrange(footer),
        ][n % 3]
        kind = rng.choice(["flip", "zero", "cut"])
        if kind == "flip":
            data[where] ^= 1 << rng.randrange(8)
        elif kind == "zero":
            data[where : where + 32] = bytes(len(data[where : where + 32]))
        else:
            del data[where:]
        path.write_bytes(bytes(data))
        _resave_bytes(copy)
        problems = verify(copy)
        assert all(isinstance(p, str) and p and "\n" not in p for p in problems), problems
        verdicts.add(problems[-1].split(": ")[1][:10] if problems else "ok")
    assert {"content di", "row group ", "unreadable"} <= verdicts  # (the damage reached each reader)


@pytest.fixture(scope="module")
def bounded(tmp_path_factory, kimi_dir):
    """A build with --emit-boundaries (format fixed-sft/3)."""
    folder = tmp_path_factory.mktemp("bounded")
    synthetic.write_jsonl(synthetic.conversations(300, seed=9), folder / "rows.jsonl")
    config = BuildConfig(
        name="b",
        source=str(folder / "rows.jsonl"),
        tokenizer=str(kimi_dir),
        rows=12,
        row_tokens=512,
        seed=1,
        workers=1,
        emit_boundaries=True,
    )
    build(config, folder / "out")
    return folder / "out"


@pytest.fixture
def bounded_copy(bounded, tmp_path):
    shutil.copytree(bounded, tmp_path / "bounded")
    return tmp_path / "bounded"


def _rehash(folder):
    """Record each row's hash by the rule with boundaries, as a forger who knows it would."""
    from fixed_sft.hashes import row_digest, rows_digest

    rows = pq.read_table(folder / "train.parquet").column("metadata").to_pylist()
    digests = [row_digest(np.array(r["input_ids"]), np.array(r["loss_mask"]), np.array(r["cu_seqlens"])) for r in rows]
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest.update(row_sha256=[d.hex() for d in digests], rows_sha256=rows_digest(digests))
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_a_build_with_boundaries_verifies(bounded):
    assert json.loads((bounded / "manifest.json").read_text())["format"] == "fixed-sft/3"
    assert verify(bounded) == []


def test_boundaries_are_in_the_row_hash(bounded_copy):
    def shift(rows):
        cu = rows[4]["metadata"]["cu_seqlens"]
        cu[1] += 1  # (segments left as they are)
        return rows

    _change_rows(bounded_copy, shift)
    problems = verify(bounded_copy)
    assert "row 4: content differs from its manifest hash" in problems
    assert "row 4: metadata.cu_seqlens is not 0 and the end of each of its segments" in problems


def test_boundaries_must_be_the_segments_even_when_rehashed(bounded_copy):
    """Boundaries that disagree with the segments, with hashes recorded to match them: only
    the comparison with the segments can tell."""

    def shift(rows):
        rows[7]["metadata"]["cu_seqlens"][-1] -= 1
        return rows

    _change_rows(bounded_copy, shift)
    _rehash(bounded_copy)
    assert verify(bounded_copy) == ["row 7: metadata.cu_seqlens is not 0 and the end of each of its segments"]


def test_null_boundaries_are_named(bounded_copy):
    def null(rows):
        rows[2]["metadata"]["cu_seqlens"] = None
        return rows

    _change_rows(bounded_copy, null)
    assert verify(bounded_copy)[-1] == "row 2: cu_seqlens is null"


def test_the_manifest_says_which_schema_and_hash_rule_apply(bounded, bounded_copy, copy):
    """A boundaries file under a manifest without them, a plain file under one with them,
    and a format that is not the one the parameter gives, are each named."""
    manifest = json.loads((bounded_copy / "manifest.json").read_text())
    manifest["format"] = "fixed-sft/2"
    (bounded_copy / "manifest.json").write_text(json.dumps(manifest))
    assert verify(bounded_copy) == ["manifest.json: format is fixed-sft/2; a build with boundaries is fixed-sft/3"]
    del manifest["params"]["emit_boundaries"]
    (bounded_copy / "manifest.json").write_text(json.dumps(manifest))
    problems = verify(bounded_copy)
    assert len(problems) == 1 and "schema differs from the format's" in problems[0]
    plain = json.loads((copy / "manifest.json").read_text())
    plain["params"]["emit_boundaries"] = True
    plain["format"] = "fixed-sft/3"
    (copy / "manifest.json").write_text(json.dumps(plain))
    problems = verify(copy)
    assert len(problems) == 1 and "schema differs from the format's" in problems[0]


def test_an_empty_row_group_between_the_rows_is_read_past(copy):
    """pyarrow writes an empty row group for an empty table: a file with one holds the same
    rows, which verify reads as it reads any row-group layout."""
    table = pq.read_table(copy / "train.parquet")
    path = copy / "train.parquet"
    with pq.ParquetWriter(path, table.schema, use_dictionary=False) as writer:  # (its pages at offset 0)
        writer.write_table(table.slice(0, 5))
        writer.write_table(table.slice(0, 0))
        writer.write_table(table.slice(5))
    assert pq.ParquetFile(path).metadata.row_group(1).num_rows == 0
    _resave_bytes(copy)
    assert verify(copy) == []

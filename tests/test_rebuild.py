"""``verify DIR --rebuild``: the build a manifest records, run again from its inputs and
compared (the same rows only from the recorded input files, and only when everything
the manifest says of them is so)."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import synthetic

from fixed_sft.build import BuildError
from fixed_sft.cli import main
from fixed_sft.hashes import sha256_file
from fixed_sft.rebuild import rebuild

KEYS = (
    "format",
    "name",
    "source",
    "tokenizer",
    "loss_mask",
    "template_check",
    "stats",
    "skipped_invalid",
    "rows_sha256",
    "row_sha256",
    "provenance",
)
PARAMS_LINE = "  params: the manifest's, rebuilt with (rows_sha256 shows whether the build had them)\n"


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("rebuild") / "rows.jsonl"
    synthetic.write_jsonl(synthetic.conversations(60, seed=8), path)
    return path


@pytest.fixture(autouse=True)
def _in_the_temporary_folder(tmp_path_factory, monkeypatch):
    """Rebuild from where the tests' files lie: a recorded source path outside the current
    folder is read only when --source names it."""
    monkeypatch.chdir(tmp_path_factory.getbasetemp())


def _build(source, tokenizer, out, *extra):
    """Build from ``source``, recorded relative to the current folder when it lies inside."""
    if os.path.isabs(source) and not os.path.relpath(source).startswith(".."):
        source = os.path.relpath(source)
    args = [
        "build",
        "--source",
        str(source),
        "--tokenizer",
        str(tokenizer),
        "--row-tokens",
        "256",
        "--seed",
        "7",
        "--out",
        str(out),
        "--workers",
        "1",
        "--quiet",
        "--no-card",  # (the card's rebuild: tests/test_card.py)
        *extra,
    ]
    assert main(args) == 0


@pytest.fixture(scope="module")
def three_rows(source, kimi_dir, tmp_path_factory):
    """``_build`` of 3 rows of ``source``, made once for the module's tests that start from
    it: each takes a copy (``_copy``), which it may change."""
    out = tmp_path_factory.mktemp("three-rows") / "o"
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path_factory.getbasetemp())  # (where the tests build from)
        _build(source, kimi_dir, out, "--rows", "3")
    return out


def _copy(built, out):
    """A copy of the build folder ``built`` at ``out``, byte for byte."""
    shutil.copytree(built, out, symlinks=True)


def _rebuild(folder, *extra):
    """(A pinned tokenizer would come from the Hub: test_cli's Hub cache test rebuilds that way.)"""
    return main(["verify", str(folder), "--rebuild", "--quiet", *extra])


def _checked_then_rebuilt(folder, kimi_dir, capsys) -> tuple[int, str]:
    """``verify`` of ``folder`` passes (its rows match its manifest); then its rebuild's exit
    code and what it printed."""
    assert main(["verify", str(folder)]) == 0
    capsys.readouterr()
    code = _rebuild(folder, "--tokenizer", str(kimi_dir), "--workers", "1")
    return code, capsys.readouterr().out


def _edit(folder, change):
    manifest = json.loads((folder / "manifest.json").read_text())
    change(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("rows, workers", [("3", "1"), ("all", "2")])
def test_the_recorded_inputs_give_the_same_rows(source, kimi_dir, tmp_path, capsys, monkeypatch, rows, workers):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    _build(source, kimi_dir, tmp_path / "o", "--rows", rows, "--skip-invalid")
    capsys.readouterr()
    assert _rebuild(tmp_path / "o", "--tokenizer", str(kimi_dir), "--workers", workers) == 0
    out = capsys.readouterr().out
    assert "gives the same rows and manifest" in out and all(f"  {key}: same\n" in out for key in KEYS)
    assert PARAMS_LINE in out
    assert (
        "  parquet: same (for information)\n  card: same (for information)\n  code_sha256: same (for information)"
        in out
    )
    assert not list(tmp_path.glob("fixed-sft-rebuild-*"))  # the rebuild's folder is gone


def test_the_folder_a_killed_rebuild_left_is_deleted_by_the_next(
    three_rows, source, kimi_dir, tmp_path, capsys, monkeypatch
):
    """A rebuild killed with SIGKILL leaves its folder; the next rebuild deletes it, but
    not the folder of a rebuild still running (which holds its lock)."""
    import fcntl

    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    _copy(three_rows, tmp_path / "o")
    killed, running = (tmp_path / "tmp" / f"fixed-sft-rebuild-{name}" for name in ("killed", "running"))
    for folder in killed, running:
        (folder / ".rebuilt.tmp-1").mkdir(parents=True)
        (folder / ".rebuilt.tmp-1" / "train.parquet").write_bytes(b"partial")
        (folder / ".lock").touch()
    with (running / ".lock").open("rb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert _rebuild(tmp_path / "o", "--tokenizer", str(kimi_dir)) == 0
    assert [p.name for p in (tmp_path / "tmp").glob("fixed-sft-rebuild-*")] == [running.name]


def test_a_killed_rebuilds_folder_is_deleted_only_if_it_holds_a_rebuilds_files(
    three_rows, source, kimi_dir, tmp_path, monkeypatch
):
    """A folder named as a rebuild's, with a ``.lock`` no process holds, that holds
    anything a rebuild does not write is left as it is, and so is one whose ``.lock`` is
    a symbolic link."""
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    _copy(three_rows, tmp_path / "o")
    kept = [tmp_path / "tmp" / f"fixed-sft-rebuild-{name}" for name in ("linked", "notes", "spark")]
    linked, notes, spark = kept
    killed = tmp_path / "tmp" / "fixed-sft-rebuild-killed"
    for folder in *kept, killed:
        (folder / "rebuilt").mkdir(parents=True)
        (folder / "rebuilt" / "manifest.json").write_text('{"format": "fixed-sft/1"}')
        (folder / ".rebuilt.lock").touch()
        if folder != linked:
            (folder / ".lock").touch()
    (tmp_path / "mine.lock").write_text("keep")
    (linked / ".lock").symlink_to(tmp_path / "mine.lock")  # a lock is never followed
    (notes / "notes.txt").write_text("keep")
    (spark / "rebuilt" / "train.parquet").mkdir()
    (spark / "rebuilt" / "train.parquet" / "part-0.parquet").write_text("keep")
    assert _rebuild(tmp_path / "o", "--tokenizer", str(kimi_dir)) == 0
    assert (notes / "notes.txt").read_text() == "keep" and (notes / "rebuilt" / "manifest.json").exists()
    assert (spark / "rebuilt" / "train.parquet" / "part-0.parquet").read_text() == "keep"
    assert (linked / ".lock").is_symlink() and (tmp_path / "mine.lock").read_text() == "keep"
    assert sorted((tmp_path / "tmp").glob("fixed-sft-rebuild-*")) == kept


@pytest.mark.parametrize(
    "change, says",
    [
        (lambda m: m["params"].update(seed=42), "does not give the same rows\n"),
        (lambda m: m["template_check"].update(checked=5), "template_check: differs (checked: 5 here, 1 rebuilt)"),
        (lambda m: m["stats"].update(rows_skipped=2), "stats: differs (rows_skipped: 2 here, 1 rebuilt)"),
        (  # (consistent with its count and skip_invalid, which verify checks)
            lambda m: (
                m["skipped_invalid"].append({"index": 5, "id": "x", "reason": "r"}),
                m["stats"].update(invalid_rows_skipped=1),
                m["params"].update(skip_invalid=True),
            ),
            "skipped_invalid: differs (list: 1 items here, 0 rebuilt)",
        ),
        (lambda m: m["tokenizer"].update(mismatches=["made up"]), 'tokenizer: differs (mismatches: ["made up"] here'),
    ],
)
def test_a_manifest_that_misstates_the_build_is_caught(three_rows, source, kimi_dir, tmp_path, capsys, change, says):
    """verify checks the rows against the manifest; only a rebuild shows that what the
    manifest says of their making is not so."""
    _copy(three_rows, tmp_path / "o")
    _edit(tmp_path / "o", change)
    code, out = _checked_then_rebuilt(tmp_path / "o", kimi_dir, capsys)
    assert code == 1
    same_rows = "but not what the manifest or the file's metadata says" in out
    assert "rows_sha256: differs" in out if "does not give" in says else same_rows
    assert says in out


def test_the_checks_of_a_manifest_that_sampled_by_position_are_not_compared(three_rows, kimi_dir, tmp_path, capsys):
    """A manifest from before the template check sampled by source row (it lacks
    ``template_check.sample``) checked the conversations at other positions: its count is
    shown for information, and the rebuild still gives the same rows and manifest."""
    _copy(three_rows, tmp_path / "o")
    _edit(tmp_path / "o", lambda m: (m["template_check"].pop("sample"), m["template_check"].update(checked=5)))
    code, out = _checked_then_rebuilt(tmp_path / "o", kimi_dir, capsys)
    assert code == 0 and "gives the same rows and manifest" in out
    assert "template_check: differs (for information) (checked: 5 here, 1 rebuilt)" in out


def test_the_reason_of_a_skipped_row_is_not_compared(kimi_dir, tmp_path, capsys):
    """Its wording is the code's: a manifest from code that worded it otherwise still
    gives the same rows and manifest."""
    lines = [json.dumps(row) for row in synthetic.conversations(60, seed=8)]
    lines[3] = '{"id": "bad"}'
    (tmp_path / "rows.jsonl").write_text("\n".join(lines) + "\n")
    _build(tmp_path / "rows.jsonl", kimi_dir, tmp_path / "o", "--rows", "all", "--skip-invalid")
    assert [row["index"] for row in json.loads((tmp_path / "o" / "manifest.json").read_text())["skipped_invalid"]] == [
        3
    ]
    _edit(tmp_path / "o", lambda m: m["skipped_invalid"][0].update(reason="worded by other code"))
    capsys.readouterr()
    assert _rebuild(tmp_path / "o", "--tokenizer", str(kimi_dir), "--workers", "1") == 0
    out = capsys.readouterr().out
    assert "gives the same rows and manifest" in out and "  skipped_invalid: same\n" in out


def test_forged_provenance_is_caught(three_rows, source, kimi_dir, tmp_path, capsys):
    """Rows whose segments name another source row (wherever they named one, so the
    counts of conversations still hold), with the file's hash re-recorded."""
    _copy(three_rows, tmp_path / "o")
    parquet = tmp_path / "o" / "train.parquet"
    table = pq.read_table(parquet)
    rows = table.to_pylist()
    forged = rows[1]["metadata"]["segments"][0]["source_index"]
    named = {segment["source_index"] for row in rows for segment in row["metadata"]["segments"]}
    other = min(set(range(json.loads((tmp_path / "o" / "manifest.json").read_text())["source"]["rows"])) - named)
    for row in rows:
        for segment in row["metadata"]["segments"]:
            if segment["source_index"] == forged:
                segment["source_index"] = other
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), parquet)
    _edit(tmp_path / "o", lambda m: m["parquet"].update(bytes=parquet.stat().st_size, sha256=sha256_file(parquet)))
    code, out = _checked_then_rebuilt(tmp_path / "o", kimi_dir, capsys)
    assert code == 1 and "the rebuild from the recorded inputs does not give the same rows" in out
    assert "rows_sha256: same" in out
    assert re.search(r"provenance: differs \(rows\[\d\]\.segments\[\d\]\.source_index: ", out)
    assert "parquet: differs (" in out and "encoded otherwise" not in out


@pytest.mark.parametrize("key", [b"about", b"huggingface"])
def test_parquet_key_value_metadata_is_refused(three_rows, kimi_dir, tmp_path, capsys, key):
    """The file's own metadata may say where the rows came from, or what loaders make of
    them (``datasets`` takes features from ``huggingface``): verify refuses any key but
    pyarrow's copy of the schema, before a rebuild."""
    _copy(three_rows, tmp_path / "o")
    parquet = tmp_path / "o" / "train.parquet"
    table = pq.read_table(parquet)
    pq.write_table(table.replace_schema_metadata({key: b"{}"}), parquet)
    _edit(tmp_path / "o", lambda m: m["parquet"].update(bytes=parquet.stat().st_size, sha256=sha256_file(parquet)))
    capsys.readouterr()
    assert _rebuild(tmp_path / "o", "--tokenizer", str(kimi_dir), "--workers", "1") == 1
    said = f"{parquet}: its key-value metadata holds {key.decode()!r}, which a build does not write, but loaders read"
    assert said in capsys.readouterr().out


def test_metadata_kept_inside_the_stored_arrow_schema_is_refused(three_rows, kimi_dir, tmp_path, capsys):
    """pyarrow reads the schema metadata that ``ARROW:schema`` itself holds as it reads a key
    of the file's own (pandas takes its index from ``pandas``): a file that keeps it there
    alone is refused as well."""
    from fixed_sft import thrift

    _copy(three_rows, tmp_path / "o")
    parquet = tmp_path / "o" / "train.parquet"
    pq.write_table(pq.read_table(parquet).replace_schema_metadata({"pandas": "{}"}), parquet)
    data = parquet.read_bytes()
    length = int.from_bytes(data[-8:-4], "little")
    fields = thrift.Reader(data[-8 - length : -8]).value(thrift.STRUCT)
    for n, (field, kind, value) in enumerate(fields):
        if field == 5:  # (FileMetaData.key_value_metadata: ARROW:schema alone is left)
            fields[n] = (field, kind, (value[0], [kv for kv in value[1] if thrift.get(kv, 1) == b"ARROW:schema"]))
    footer = thrift.write_struct(fields)
    parquet.write_bytes(data[: -8 - length] + footer + len(footer).to_bytes(4, "little") + b"PAR1")
    assert list(pq.ParquetFile(parquet).metadata.metadata) == [b"ARROW:schema"]
    _edit(tmp_path / "o", lambda m: m["parquet"].update(bytes=parquet.stat().st_size, sha256=sha256_file(parquet)))
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "o")]) == 1
    assert "its key-value metadata holds 'pandas', which a build does not write" in capsys.readouterr().out


@pytest.mark.parametrize("field", ["metadata", "segments"])
def test_field_metadata_in_the_arrow_schema_is_provenance(three_rows, source, kimi_dir, tmp_path, capsys, field):
    """A field of the Arrow schema the file stores (``ARROW:schema``) may carry key-value
    metadata too, at any depth."""
    _copy(three_rows, tmp_path / "o")
    parquet = tmp_path / "o" / "train.parquet"
    table = pq.read_table(parquet)
    metadata = table.schema.field("metadata")
    if field == "metadata":
        metadata = metadata.with_metadata({"about": "seed 1"})
    else:
        children = [f.with_metadata({"about": "seed 1"}) if f.name == "segments" else f for f in metadata.type]
        metadata = metadata.with_type(pa.struct(children))
    schema = pa.schema([table.schema.field("messages"), metadata])
    pq.write_table(table.cast(schema), parquet)
    assert pq.read_schema(parquet).field("metadata").type == table.schema.field("metadata").type
    _edit(tmp_path / "o", lambda m: m["parquet"].update(bytes=parquet.stat().st_size, sha256=sha256_file(parquet)))
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "o")]) == 0
    assert _rebuild(tmp_path / "o", "--tokenizer", str(kimi_dir), "--workers", "1") == 1
    path = "metadata" if field == "metadata" else "metadata.segments"
    out = capsys.readouterr().out
    assert f'provenance: differs (field metadata.{path}: {{"about": "seed 1"}} here, missing rebuilt)' in out
    assert "gives the same rows, but not what the manifest or the file's metadata says of them" in out


def test_a_source_with_other_bytes_is_not_the_recorded_input(source, kimi_dir, tmp_path, capsys):
    """Even where the changed row is not in the rows, the source is not the one recorded."""
    _build(source, kimi_dir, tmp_path / "o", "--rows", "1")
    lines = source.read_text().splitlines(keepends=True)
    (tmp_path / "copy.jsonl").write_text("".join(lines[:-1]) + lines[-1].replace('"', ' "', 1))
    capsys.readouterr()
    assert (
        _rebuild(
            tmp_path / "o", "--source", str(tmp_path / "copy.jsonl"), "--tokenizer", str(kimi_dir), "--workers", "1"
        )
        == 1
    )
    out = capsys.readouterr().out
    assert "rows_sha256: same" in out and "source: differs (files[0].bytes: " in out


@pytest.mark.parametrize("rows", [[], ["--rows", "1"]], ids=["rebuild", "spot check"])
def test_a_caller_s_tokenizer_of_other_files_is_named_as_theirs(three_rows, source, kimi_dir, tmp_path, capsys, rows):
    """The manifest records the pinned files and their revision: a --tokenizer folder whose
    files differ is named, with the files that differ, not the recorded revision."""
    tokenizer = tmp_path / "tok"
    shutil.copytree(kimi_dir, tokenizer)
    config = tokenizer / "tokenizer_config.json"
    config.write_text(config.read_text().replace("{", '{"x_extra": 1, ', 1))
    _copy(three_rows, tmp_path / "o")
    capsys.readouterr()
    assert _rebuild(tmp_path / "o", "--tokenizer", str(tokenizer), "--workers", "1", *rows) == 1
    err = capsys.readouterr().err
    assert err == (
        f"error: the tokenizer files in {tokenizer} are not the ones the manifest records "
        "(tokenizer_config.json differ); pass --tokenizer FOLDER holding those\n"
    )


def test_tokenizer_files_other_than_the_recorded_ones_are_refused(source, kimi_dir, tmp_path, capsys):
    tokenizer = tmp_path / "tok"
    shutil.copytree(kimi_dir, tokenizer)
    with (tokenizer / "chat_template.jinja").open("a") as f:
        f.write("{#- a comment changes the hash, not the rows -#}")
    _build(source, tokenizer, tmp_path / "o", "--rows", "3", "--allow-unpinned-tokenizer")
    capsys.readouterr()
    assert _rebuild(tmp_path / "o", "--workers", "1") == 2  # a folder: no Hub repo to get it from
    assert "pass --tokenizer FOLDER" in capsys.readouterr().err
    assert _rebuild(tmp_path / "o", "--tokenizer", str(tokenizer), "--workers", "1") == 0
    assert _rebuild(tmp_path / "o", "--tokenizer", str(kimi_dir), "--workers", "1") == 1  # same rows, other files
    err = capsys.readouterr().err
    assert "are not the ones the manifest records (chat_template.jinja differ)" in err
    _edit(tmp_path / "o", lambda m: m["tokenizer"].update(name="kimi-k2.6", repo="moonshotai/Kimi-K2.6"))
    assert _rebuild(tmp_path / "o", "--workers", "1") == 2  # a named build's folder records its spec's name
    assert "pass --tokenizer FOLDER" in capsys.readouterr().err


def test_a_source_that_is_not_where_recorded_must_be_named(source, kimi_dir, tmp_path, capsys, monkeypatch):
    """A recorded path is relative to the folder the build ran in; with a '/' and no
    revision it is still a path, not a Hub id."""
    (tmp_path / "data").mkdir()
    shutil.copy(source, tmp_path / "data" / "rows.jsonl")
    monkeypatch.chdir(tmp_path)
    _build("data/rows.jsonl", kimi_dir, tmp_path / "o", "--rows", "3")
    monkeypatch.chdir(tmp_path / "data")
    capsys.readouterr()
    assert _rebuild(tmp_path / "o", "--tokenizer", str(kimi_dir), "--workers", "1") == 2
    assert "pass --source PATH" in capsys.readouterr().err
    assert _rebuild(tmp_path / "o", "--source", "rows.jsonl", "--tokenizer", str(kimi_dir), "--workers", "1") == 0


def test_the_recorded_source_files_are_read_again(kimi_dir, tmp_path, capsys):
    """A build of some of a folder's files records their globs; the rebuild reads the
    same files, from the folder or from the one file named."""
    for split, seed in (("train", 1), ("test", 2)):
        synthetic.write_jsonl(synthetic.conversations(30, seed=seed), tmp_path / "src" / "data" / f"{split}.jsonl")
    _build(tmp_path / "src", kimi_dir, tmp_path / "o", "--rows", "3", "--source-files", "data/train.*")
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["source"]["file_patterns"] == ["data/train.*"]
    assert [f["path"] for f in manifest["source"]["files"]] == ["data/train.jsonl"] and manifest["source"]["rows"] == 30
    assert _rebuild(tmp_path / "o", "--tokenizer", str(kimi_dir), "--workers", "1") == 0
    assert (
        _rebuild(
            tmp_path / "o",
            "--source",
            str(tmp_path / "src" / "data" / "train.jsonl"),
            "--tokenizer",
            str(kimi_dir),
            "--workers",
            "1",
        )
        == 0
    )
    _edit(tmp_path / "o", lambda m: m["source"].pop("file_patterns"))  # as before globs: every file
    capsys.readouterr()
    assert _rebuild(tmp_path / "o", "--tokenizer", str(kimi_dir), "--workers", "1") == 1
    assert "/src has 60 rows; custom expects 30" in capsys.readouterr().err


@pytest.mark.parametrize(
    "change, says",
    [
        (lambda m: m.pop("template_check"), "template_check is missing"),
        (lambda m: m["params"].update(seed="42"), 'params.seed is "42", not an integer'),
        (lambda m: m["params"].update(skip_invalid="no"), 'params.skip_invalid is "no", not true or false'),
        (lambda m: m["source"].update(files="x"), 'source.files is "x", not an array'),
        (
            lambda m: m["source"].update(file_patterns="data/*"),
            'source.file_patterns is "data/*", not null or a non-empty',
        ),
        (lambda m: m["source"].update(file_patterns=[]), "source.file_patterns is [], not null or a non-empty array"),
        (lambda m: m["tokenizer"].pop("pinned"), "tokenizer.pinned is missing"),
        (lambda m: m["code_version"].update(code_sha256=7), "code_version.code_sha256 is 7, not a string or null"),
        (lambda m: m["stats"].update(note=None), "stats: unknown key 'note' (known: rows, tokens, "),
        (lambda m: m.update(built_with={"seed": 1}), "unknown key 'built_with' (known: format, name, code_version, "),
        (
            lambda m: m["stats"].update(supervised_token_ratio=1),
            "stats.supervised_token_ratio is 1, not a decimal number",
        ),
    ],
)
def test_a_manifest_of_another_shape_fails_verify_before_any_rebuild(
    three_rows, source, kimi_dir, tmp_path, capsys, change, says
):
    _copy(three_rows, tmp_path / "o")
    _edit(tmp_path / "o", change)
    capsys.readouterr()
    assert _rebuild(tmp_path / "o", "--tokenizer", str(kimi_dir), "--workers", "1") == 1
    out = capsys.readouterr().out
    assert f"manifest.json: {says}" in out and "rebuild" not in out
    with pytest.raises(BuildError, match=re.escape(says)):  # a rebuild alone checks the same fields
        rebuild(tmp_path / "o", tokenizer=str(kimi_dir))


@pytest.mark.parametrize(
    "change, says",
    [
        (lambda m: m["params"].update(order="other"), 'params.order is "other"; this builder orders by splitmix64'),
        (
            lambda m: (m["params"].update(loss_mask_type="other"), m["loss_mask"].update(type="other")),
            "the manifest records a parameter this builder refuses: ",
        ),
        (
            lambda m: m["params"].update(separator="two words"),
            "the manifest records a parameter this builder refuses: params.separator 'two words' is not a single",
        ),
        (
            lambda m: (m["params"].update(loss_mask_type="assistant"), m["loss_mask"].update(type="assistant")),
            "the manifest records a parameter this builder refuses: tokenizer kimi-k2.6 goes with loss mask kimi_k25",
        ),
        (lambda m: m["tokenizer"].update(revision="zzz"), "tokenizer.revision zzz: the files in "),
    ],
)
@pytest.mark.parametrize("rows", [[], ["--rows", "1"]], ids=["rebuild", "spot check"])
def test_a_manifest_this_builder_cannot_rebuild(three_rows, source, kimi_dir, tmp_path, capsys, change, says, rows):
    """A recorded parameter the builder refuses, even one found only once the tokenizer is
    read, names the manifest and its key there, not a flag the caller did not pass."""
    _copy(three_rows, tmp_path / "o")
    _edit(tmp_path / "o", change)
    capsys.readouterr()
    assert _rebuild(tmp_path / "o", "--tokenizer", str(kimi_dir), "--workers", "1", *rows) == 1
    err = capsys.readouterr().err
    assert f"manifest.json: cannot rebuild: {says}" in err and len(err.strip().splitlines()) == 1


def test_a_damaged_folder_is_not_rebuilt(three_rows, source, kimi_dir, tmp_path, capsys):
    _copy(three_rows, tmp_path / "o")
    _edit(tmp_path / "o", lambda m: m.update(rows_sha256="0" * 64))
    capsys.readouterr()
    assert _rebuild(tmp_path / "o", "--tokenizer", str(kimi_dir), "--workers", "1") == 1
    assert "MISMATCH" in capsys.readouterr().out


def test_empty_input_flags_are_refused(three_rows, source, kimi_dir, tmp_path, capsys):
    _copy(three_rows, tmp_path / "o")
    capsys.readouterr()
    assert _rebuild(tmp_path / "o", "--source", "", "--workers", "1") == 2
    assert "must not be empty" in capsys.readouterr().err


@pytest.mark.parametrize("rows", [[], ["--rows", "0"]])
@pytest.mark.parametrize("workers", ["0", "5000"])
def test_a_workers_flag_out_of_range_is_a_usage_error_before_any_check(three_rows, tmp_path, capsys, rows, workers):
    """The caller's own flag: exit 2 naming it, not a manifest the builder refuses, and
    before the folder is hashed."""
    _copy(three_rows, tmp_path / "o")
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "o"), "--rebuild", "--workers", workers, *rows]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"error: --workers must be between 1 and 1024, got {workers}\n"


@pytest.mark.parametrize("flags", [["--source", "x"], ["--tokenizer", "x"], ["--workers", "2"], ["--quiet"]])
def test_rebuild_flags_need_rebuild(tmp_path, capsys, flags):
    assert main(["verify", str(tmp_path), *flags]) == 2
    assert "add --rebuild" in capsys.readouterr().err


def test_an_unreachable_hub_source_says_how_to_pass_a_copy(three_rows, source, kimi_dir, tmp_path, capsys, monkeypatch):
    _copy(three_rows, tmp_path / "o")
    _edit(tmp_path / "o", lambda m: m["source"].update(name="owner/dataset", revision="0" * 40))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # read by huggingface_hub at each call
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf"))
    capsys.readouterr()
    assert _rebuild(tmp_path / "o", "--tokenizer", str(kimi_dir), "--workers", "1") == 1
    err = capsys.readouterr().err
    assert f"cannot get dataset owner/dataset@{'0' * 40}" in err and err.strip().endswith("pass --source PATH")


def test_an_invalid_row_in_a_given_source_says_the_source_is_another(three_rows, source, kimi_dir, tmp_path, capsys):
    """The recorded build read its rows without stopping: a row of the given source that
    stops the rebuild shows that source is another, and ``--skip-invalid`` (a build's
    flag) is not offered."""
    _copy(three_rows, tmp_path / "o")
    rows = synthetic.read_jsonl(source)
    metadata = pq.read_table(tmp_path / "o" / "train.parquet").column("metadata").to_pylist()
    index = metadata[0]["segments"][0]["source_index"]  # a row the build read
    rows[index]["messages"] = "hi"
    synthetic.write_jsonl(rows, tmp_path / "other.jsonl")
    capsys.readouterr()
    assert (
        _rebuild(
            tmp_path / "o", "--source", str(tmp_path / "other.jsonl"), "--tokenizer", str(kimi_dir), "--workers", "1"
        )
        == 1
    )
    err = capsys.readouterr().err
    assert f"line {index + 1} (source row {index}" in err
    assert err.strip().endswith("the recorded build did not stop at this row, so its source was another")
    assert "--skip-invalid" not in err and len(err.strip().splitlines()) == 1
    _edit(tmp_path / "o", lambda m: m["code_version"].update(code_sha256="0" * 64))  # built by other code
    assert (
        _rebuild(
            tmp_path / "o", "--source", str(tmp_path / "other.jsonl"), "--tokenizer", str(kimi_dir), "--workers", "1"
        )
        == 1
    )
    assert capsys.readouterr().err.strip().endswith("so its source or its code (code_sha256) was another")


def test_a_manifest_without_code_sha256_verifies_and_rebuilds(three_rows, source, kimi_dir, tmp_path, capsys):
    """The first builds did not record it; it is compared for information only."""
    _copy(three_rows, tmp_path / "o")
    _edit(tmp_path / "o", lambda m: m["code_version"].pop("code_sha256"))
    capsys.readouterr()
    assert _rebuild(tmp_path / "o", "--tokenizer", str(kimi_dir), "--workers", "1") == 0
    assert "  code_sha256: differs (for information) (missing here, " in capsys.readouterr().out


def test_a_rebuild_reads_no_manifest_larger_than_a_build_writes(three_rows, source, kimi_dir, tmp_path):
    _copy(three_rows, tmp_path / "o")
    with (tmp_path / "o" / "manifest.json").open("r+b") as f:
        f.truncate(3 << 30)
    with pytest.raises(BuildError, match=r"manifest.json: cannot read it \(3221225472 bytes, more than the "):
        rebuild(tmp_path / "o", tokenizer=str(kimi_dir))


def test_provenance_is_compared_a_row_group_at_a_time(source, kimi_dir, tmp_path):
    """Files of other row groups hold the same provenance; the first row that differs is
    named, in whichever row group of either file it lies."""
    from fixed_sft.rebuild import _provenance, difference

    _build(source, kimi_dir, tmp_path / "o", "--rows", "9")
    shutil.copytree(tmp_path / "o", tmp_path / "p")
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    parquet = tmp_path / "p" / "train.parquet"
    table = pq.read_table(parquet)
    pq.write_table(table, parquet, row_group_size=2)
    here, again = _provenance(tmp_path / "p", manifest, tmp_path / "o", manifest)
    assert here == again and here["rows"] == 9
    rows = table.to_pylist()
    rows[5]["metadata"]["segments"][-1]["id"] = "another"
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), parquet, row_group_size=4)
    here, again = _provenance(tmp_path / "p", manifest, tmp_path / "o", manifest)
    last = len(rows[5]["metadata"]["segments"]) - 1
    assert difference(here, again).startswith(f'rows[5].segments[{last}].id: "another" here, ')
    pq.write_table(pa.Table.from_pylist(rows[:5], schema=table.schema), parquet, row_group_size=3)
    here, again = _provenance(tmp_path / "p", manifest, tmp_path / "o", manifest)
    assert difference(here, again) == "rows[5]: none here, a row rebuilt"


@pytest.mark.parametrize("recorded", ["absolute", "parent", "link"])
def test_a_recorded_source_outside_the_current_folder_is_read_only_when_named(
    source, kimi_dir, tmp_path, capsys, monkeypatch, recorded
):
    """A stranger's manifest may record any path (``/root``, ``../..``, a link out of the
    folder): a rebuild reads one outside the current folder only when --source names it."""
    import fixed_sft.build

    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "link").symlink_to(source)
    monkeypatch.chdir(tmp_path / "here")
    _build(source, kimi_dir, tmp_path / "o", "--rows", "3")
    name = {"absolute": str(source), "parent": os.path.relpath(source), "link": "link"}[recorded]
    _edit(tmp_path / "o", lambda m: m["source"].update(name=name))
    original = fixed_sft.build.open_source
    monkeypatch.setattr(fixed_sft.build, "open_source", lambda *a, **k: pytest.fail("the source was opened"))
    capsys.readouterr()
    assert _rebuild(tmp_path / "o", "--tokenizer", str(kimi_dir), "--workers", "1") == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: the manifest's source {name!r} is outside the current folder; a rebuild reads a "
        "recorded path only inside it: pass --source PATH to read it\n"
    )
    monkeypatch.setattr(fixed_sft.build, "open_source", original)
    assert _rebuild(tmp_path / "o", "--source", str(source), "--tokenizer", str(kimi_dir), "--workers", "1") == 0


def test_a_recorded_source_with_a_nul_is_named_not_an_internal_error(three_rows, source, kimi_dir, tmp_path, capsys):
    _copy(three_rows, tmp_path / "o")
    _edit(tmp_path / "o", lambda m: m["source"].update(name="rows\u0000.jsonl"))
    capsys.readouterr()
    assert _rebuild(tmp_path / "o", "--tokenizer", str(kimi_dir), "--workers", "1") == 2
    assert capsys.readouterr().err == (
        "error: the manifest's source 'rows\\x00.jsonl' is not a path; pass --source PATH to name the one to read\n"
    )


def test_a_recorded_tokenizer_folder_outside_the_current_folder_is_read_only_when_named(
    source, kimi_dir, tmp_path, capsys
):
    _build(source, kimi_dir, tmp_path / "o", "--rows", "3", "--allow-unpinned-tokenizer")
    _edit(tmp_path / "o", lambda m: m["tokenizer"].update(name=None, repo=str(kimi_dir), pinned=False))
    capsys.readouterr()
    assert _rebuild(tmp_path / "o", "--source", str(source), "--workers", "1") == 2
    assert capsys.readouterr().err == (
        f"error: the manifest's tokenizer {str(kimi_dir)!r} is outside the current "
        "folder; a rebuild reads a recorded path only inside it: pass --tokenizer "
        "FOLDER to read it\n"
    )


def test_a_long_segment_id_is_shown_cut(three_rows, source, kimi_dir, tmp_path):
    from fixed_sft.rebuild import _provenance, difference

    _copy(three_rows, tmp_path / "o")
    shutil.copytree(tmp_path / "o", tmp_path / "p")
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    parquet = tmp_path / "p" / "train.parquet"
    table = pq.read_table(parquet)
    rows = table.to_pylist()
    for segment in rows[1]["metadata"]["segments"]:
        segment["id"] = "x" * 100_000
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), parquet)
    here, again = _provenance(tmp_path / "p", manifest, tmp_path / "o", manifest)
    assert {len(s["id"]) for s in here["rows"].row["segments"]} == {200}
    assert difference(here, again).startswith(f'rows[1].segments[0].id: "{"x" * 79}')


def test_a_build_with_boundaries_is_rebuilt_with_them(source, kimi_dir, tmp_path, capsys):
    """--emit-boundaries is recorded (params.emit_boundaries, format fixed-sft/3), so the
    rebuild writes the boundaries again, and their rows, hashes and provenance are the same."""
    _build(source, kimi_dir, tmp_path / "o", "--rows", "3", "--emit-boundaries")
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["format"] == "fixed-sft/3" and manifest["params"]["emit_boundaries"] is True
    capsys.readouterr()
    assert _rebuild(tmp_path / "o", "--tokenizer", str(kimi_dir), "--workers", "1") == 0
    out = capsys.readouterr().out
    assert "gives the same rows and manifest" in out and all(f"  {key}: same\n" in out for key in KEYS)
    assert PARAMS_LINE in out
    # a spot check re-encodes rows and hashes them by the same rule
    assert _rebuild(tmp_path / "o", "--tokenizer", str(kimi_dir), "--rows", "0,2") == 0
    assert main(["export", str(tmp_path / "o"), "--to", "trl", str(tmp_path / "o.trl.parquet")]) == 0


def test_the_boundaries_are_provenance_compared_row_by_row():
    """Two metadata columns that differ only in a row's cu_seqlens differ at that row."""
    from fixed_sft.output import BOUNDARIES_SCHEMA
    from fixed_sft.rebuild import _first_row_difference

    segment = {"source_index": 0, "id": None, "start": 0, "end": 2}
    rows = [
        {
            "input_ids": [1, 2, 3, 4],
            "loss_mask": [0, 1, 0, 1],
            "row": n,
            "segments": [segment] * 2,
            "cu_seqlens": [0, 2, 4],
        }
        for n in range(3)
    ]
    kind = BOUNDARIES_SCHEMA.field("metadata").type
    here = pa.array(rows, kind)
    rows[2] = {**rows[2], "cu_seqlens": [0, 1, 4]}
    assert _first_row_difference(here, pa.array(rows, kind)) == 2
    assert _first_row_difference(here, here) is None

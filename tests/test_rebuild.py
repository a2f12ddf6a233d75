"""``verify DIR --rebuild``: the build a manifest records, run again from its inputs and
compared (same rows only from files with the recorded hashes)."""

from __future__ import annotations

import json
import shutil

import pytest

import synthetic
from fixed_sft.cli import main


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("rebuild") / "rows.jsonl"
    synthetic.write_jsonl(synthetic.conversations(60, seed=8), path)
    return path


def _build(source, tokenizer, out, *extra):
    args = ["build", "--source", str(source), "--tokenizer", str(tokenizer), "--row-tokens", "256", "--seed", "7",
            "--out", str(out), "--workers", "1", "--quiet", *extra]
    assert main(args) == 0


def _rebuild(folder, *extra):
    """(A pinned tokenizer would come from the Hub: test_cli's Hub cache test rebuilds that way.)"""
    return main(["verify", str(folder), "--rebuild", "--workers", "1", "--quiet", *extra])


def _edit(folder, change):
    manifest = json.loads((folder / "manifest.json").read_text())
    change(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("rows", ["3", "all"])
def test_the_recorded_inputs_give_the_same_rows(source, kimi_dir, tmp_path, capsys, rows):
    _build(source, kimi_dir, tmp_path / "o", "--rows", rows)
    capsys.readouterr()
    assert _rebuild(tmp_path / "o", "--tokenizer", str(kimi_dir)) == 0
    out = capsys.readouterr().out
    assert "gives the same rows" in out
    for key in ("rows_sha256", "stats", "source files", "tokenizer files", "parquet", "code_sha256"):
        assert f"  {key}: same" in out
    assert not list(tmp_path.glob("fixed-sft-rebuild-*"))


def test_a_manifest_that_misstates_a_parameter_is_caught(source, kimi_dir, tmp_path, capsys):
    """verify checks the rows against the manifest; only a rebuild shows that the stated
    seed does not give them."""
    _build(source, kimi_dir, tmp_path / "o", "--rows", "3")
    _edit(tmp_path / "o", lambda m: m["params"].update(seed=42))
    assert main(["verify", str(tmp_path / "o")]) == 0
    capsys.readouterr()
    assert _rebuild(tmp_path / "o", "--tokenizer", str(kimi_dir)) == 1
    out = capsys.readouterr().out
    assert "does not give the same rows" in out and "rows_sha256: differs" in out and "source files: same" in out


def test_a_source_with_other_bytes_is_not_the_recorded_input(source, kimi_dir, tmp_path, capsys):
    """Even where the changed row is not in the rows, the source is not the one recorded."""
    _build(source, kimi_dir, tmp_path / "o", "--rows", "1")
    lines = source.read_text().splitlines(keepends=True)
    (tmp_path / "copy.jsonl").write_text("".join(lines[:-1]) + lines[-1].replace('"', ' "', 1))
    capsys.readouterr()
    assert _rebuild(tmp_path / "o", "--source", str(tmp_path / "copy.jsonl"), "--tokenizer", str(kimi_dir)) == 1
    out = capsys.readouterr().out
    assert "rows_sha256: same" in out and "source files: differs (file 1 of 1: sha256" in out


def test_an_unpinned_tokenizer_folder_must_be_named_again(source, kimi_dir, tmp_path, capsys):
    tokenizer = tmp_path / "tok"
    shutil.copytree(kimi_dir, tokenizer)
    with (tokenizer / "chat_template.jinja").open("a") as f:
        f.write("{#- a comment changes the hash, not the rows -#}")
    _build(source, tokenizer, tmp_path / "o", "--rows", "3", "--allow-unpinned-tokenizer")
    capsys.readouterr()
    assert _rebuild(tmp_path / "o") == 2
    assert "pass --tokenizer FOLDER" in capsys.readouterr().err
    assert _rebuild(tmp_path / "o", "--tokenizer", str(tokenizer)) == 0
    assert _rebuild(tmp_path / "o", "--tokenizer", str(kimi_dir)) == 1  # the same rows, from other files
    assert "tokenizer files: differs (chat_template.jinja sha256" in capsys.readouterr().out


def test_a_source_that_is_gone_must_be_named(source, kimi_dir, tmp_path, capsys):
    moved = tmp_path / "rows.jsonl"
    shutil.copy(source, moved)
    _build(moved, kimi_dir, tmp_path / "o", "--rows", "3")
    moved.rename(tmp_path / "elsewhere.jsonl")
    capsys.readouterr()
    assert _rebuild(tmp_path / "o", "--tokenizer", str(kimi_dir)) == 2
    assert "pass --source PATH" in capsys.readouterr().err
    assert _rebuild(tmp_path / "o", "--source", str(tmp_path / "elsewhere.jsonl"), "--tokenizer", str(kimi_dir)) == 0


@pytest.mark.parametrize("change, says", [
    (lambda m: m["params"].update(order="another-order"), "order another-order"),
    (lambda m: m.pop("template_check"), "cannot read the build it records (KeyError: 'template_check')"),
    (lambda m: m["params"].update(seed="42"), "cannot read the build it records (TypeError: "),
    (lambda m: m["params"].update(seed=-1), "a parameter this builder refuses: --seed must be between"),
])
def test_a_manifest_this_builder_cannot_rebuild(source, kimi_dir, tmp_path, capsys, change, says):
    _build(source, kimi_dir, tmp_path / "o", "--rows", "3")
    _edit(tmp_path / "o", change)
    capsys.readouterr()
    assert _rebuild(tmp_path / "o", "--tokenizer", str(kimi_dir)) == 1
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1


def test_a_damaged_folder_is_not_rebuilt(source, kimi_dir, tmp_path, capsys):
    _build(source, kimi_dir, tmp_path / "o", "--rows", "3")
    _edit(tmp_path / "o", lambda m: m.update(rows_sha256="0" * 64))
    capsys.readouterr()
    assert _rebuild(tmp_path / "o", "--tokenizer", str(kimi_dir)) == 1
    assert "MISMATCH" in capsys.readouterr().out


@pytest.mark.parametrize("flag", ["--source", "--tokenizer"])
def test_input_flags_need_rebuild(tmp_path, capsys, flag):
    assert main(["verify", str(tmp_path), flag, "x"]) == 2
    assert "add --rebuild" in capsys.readouterr().err


def test_an_unreachable_hub_source_says_how_to_pass_a_copy(source, kimi_dir, tmp_path, capsys, monkeypatch):
    _build(source, kimi_dir, tmp_path / "o", "--rows", "3")
    _edit(tmp_path / "o", lambda m: m["source"].update(name="owner/dataset", revision="0" * 40))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # read by huggingface_hub at each call
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf"))
    capsys.readouterr()
    assert _rebuild(tmp_path / "o", "--tokenizer", str(kimi_dir)) == 1
    err = capsys.readouterr().err
    assert f"cannot get dataset owner/dataset@{'0' * 40}" in err and err.strip().endswith("pass --source PATH")


def test_the_recorded_source_files_are_read_again(kimi_dir, tmp_path, capsys):
    """A build of some of a folder's files records their globs; the rebuild reads the same files."""
    for split, seed in (("train", 1), ("test", 2)):
        synthetic.write_jsonl(synthetic.conversations(30, seed=seed), tmp_path / "src" / f"{split}.jsonl")
    _build(tmp_path / "src", kimi_dir, tmp_path / "o", "--rows", "3", "--source-files", "train.*")
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["source"]["file_patterns"] == ["train.*"]
    assert [f["path"] for f in manifest["source"]["files"]] == ["train.jsonl"] and manifest["source"]["rows"] == 30
    capsys.readouterr()
    assert _rebuild(tmp_path / "o", "--tokenizer", str(kimi_dir)) == 0

"""inspect: a build's summary from its rows, and one row decoded (plain, coloured, HTML)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import synthetic

from fixed_sft import specs
from fixed_sft.build import BuildConfig, build
from fixed_sft.cli import main
from fixed_sft.inspect_rows import print_coloured, row_view
from fixed_sft.tokenizer import KimiTokenizer

HOSTILE_ID = 'row <b>&"x"</b>'
HOSTILE_TEXT = "\x1b[31mred\x1b[0m <script>alert('x')</script> & more"


@pytest.fixture(scope="module")
def built(tmp_path_factory, kimi_dir):
    folder = tmp_path_factory.mktemp("inspect")
    synthetic.write_parquet(synthetic.conversations(600, seed=5), folder / "source.parquet")
    out = folder / "build"
    config = BuildConfig(
        name="fixture",
        source=str(folder / "source.parquet"),
        tokenizer=str(kimi_dir),
        rows=12,
        row_tokens=1024,
        seed=5,
        workers=1,
    )
    return out, build(config, out)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, kimi_dir):
    """A build whose text and ids hold HTML and terminal escapes."""
    folder = tmp_path_factory.mktemp("hostile")

    def chat(row_id, answer):
        return {"id": row_id, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": answer}]}

    rows = [chat(HOSTILE_ID, HOSTILE_TEXT), *(chat(f"filler {k}", "y " * 40) for k in range(4))]
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = folder / "build"
    config = BuildConfig(
        name="hostile", source=str(folder / "rows.jsonl"), tokenizer=str(kimi_dir), rows=None, row_tokens=64, workers=1
    )
    return out, build(config, out)


def _row(out, k):
    metadata = pq.read_table(out / "train.parquet").column("metadata")[k].as_py()
    return metadata["input_ids"], metadata["loss_mask"], metadata["segments"]


def _runs(ids, mask, segments):
    """``(segment, supervised, ids)`` runs of a row, cut where the segment or the mask changes."""
    runs, at = [], 0
    for n, segment in enumerate(segments):
        for k in range(at, at + segment["end"] - segment["start"]):
            if runs and runs[-1][0] == n and runs[-1][1] == bool(mask[k]):
                runs[-1][2].append(ids[k])
            else:
                runs.append((n, bool(mask[k]), [ids[k]]))
        at += segment["end"] - segment["start"]
    return runs


def test_summary_figures_are_the_manifests(built, capsys):
    out, manifest = built
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    stats = manifest["stats"]

    def number(pattern):
        return int(re.search(pattern, text).group(1).replace(",", ""))

    assert number(r"rows: ([\d,]+) of") == stats["rows"] == 12
    assert number(r"tokens: ([\d,]+)\n") == stats["tokens"]
    assert number(r"supervised tokens: ([\d,]+)") == stats["supervised_tokens"]
    assert re.search(r"ratio (\d\.\d+)", text).group(1) == f"{stats['supervised_token_ratio']:.4f}"
    assert number(r"conversations: ([\d,]+)") == stats["conversations"]
    assert number(r"split across rows: ([\d,]+)") == stats["conversations_split"]
    assert "manifest says" not in text
    mix = {
        m.group(1): (int(m.group(2).replace(",", "")), int(m.group(3).replace(",", "")))
        for m in re.finditer(r"^  (\S+)\s+([\d,]+)\s+([\d,]+)\s+[\d.]+%$", text, re.M)
    }
    assert mix == {s["source"]: (s["conversations"], s["tokens"]) for s in manifest["source_mix"]}
    assert "card: README.md" in text


def test_summary_says_where_the_rows_differ_from_the_manifest(built, tmp_path, capsys):
    out, _ = built
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["stats"]["supervised_tokens"] += 1
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert main(["inspect", str(copy)]) == 1  # (as verify would: the folder is not what its manifest says)
    out = capsys.readouterr().out
    assert f"supervised tokens: {manifest['stats']['supervised_tokens'] - 1:,} (the manifest says " in out
    assert out.count("the manifest says") == 1


def test_a_changed_token_is_named_by_the_summary_and_not_shown(built, kimi_dir, tmp_path, capsys):
    """One id of row 1 changed, the counts kept: the summary names the Parquet file's
    sha256 (exit 1), and the row is not shown as the build's, even with the file's sha256
    re-recorded in the manifest; the rows beside it are."""
    import pyarrow as pa

    out, _ = built
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    table = pq.read_table(copy / "train.parquet")
    rows = table.to_pylist()
    rows[1]["metadata"]["input_ids"][7] += 1
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), copy / "train.parquet")
    capsys.readouterr()
    assert main(["inspect", str(copy)]) == 1
    text = capsys.readouterr().out
    assert re.search(
        r"^train\.parquet: sha256 [0-9a-f]{64} \(the manifest says [0-9a-f]{64}: run verify\)$", text, re.M
    )
    assert text.count("the manifest says") == 1
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["parquet"]["sha256"] = hashlib.sha256((copy / "train.parquet").read_bytes()).hexdigest()
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert main(["inspect", str(copy)]) == 0 and "the manifest says" not in capsys.readouterr().out
    assert main(["inspect", str(copy), "--row", "1", "--tokenizer", str(kimi_dir)]) == 1
    captured = capsys.readouterr()
    says = f"error: {copy / 'train.parquet'}: row 1: content differs from its manifest hash: run verify\n"
    assert captured.err == says and captured.out == ""
    assert main(["inspect", str(copy), "--row", "2", "--tokenizer", str(kimi_dir)]) == 0


def test_a_row_as_plain_text_marks_the_supervised_tokens(built, kimi_dir, capsys):
    out, _ = built
    assert main(["inspect", str(out), "--row", "5", "--tokenizer", str(kimi_dir)]) == 0
    text = capsys.readouterr().out
    ids, mask, segments = _row(out, 5)
    decode = KimiTokenizer(kimi_dir).encoding.decode
    for n, segment in enumerate(segments):
        assert f"segment {n}: source row {segment['source_index']} (id {segment['id']})" in text
    body = text.split("\n", 1)[1]
    supervised = [decode(run) for _, on, run in _runs(ids, mask, segments) if on]
    assert re.findall(r"\[\[(.*?)\]\]", body, re.S) == supervised
    assert "\x1b" not in text  # no colour off a terminal


def test_a_row_on_a_terminal_is_coloured(built, kimi_dir, monkeypatch, capsys):
    out, _ = built
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert main(["inspect", str(out), "--row", "0", "--tokenizer", str(kimi_dir)]) == 0
    text = capsys.readouterr().out
    assert "\x1b[" in text and "[[" not in text
    console_text = io.StringIO()
    from rich.console import Console

    print_coloured(row_view(out, 0, str(kimi_dir)), Console(file=console_text, force_terminal=True, width=300))
    ids, mask, segments = _row(out, 0)
    first = next(run for _, on, run in _runs(ids, mask, segments) if on)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", console_text.getvalue())
    assert KimiTokenizer(kimi_dir).encoding.decode(first)[:40] in plain.replace("\n", "")


def test_escapes_in_the_text_are_shown_not_run(hostile, kimi_dir, capsys):
    out, manifest = hostile
    for k in range(manifest["stats"]["rows"]):
        assert main(["inspect", str(out), "--row", str(k), "--tokenizer", str(kimi_dir)]) == 0
    text = capsys.readouterr().out
    assert "\x1b" not in text and "\\x1b" in text


def test_html_page_escapes_every_text(hostile, kimi_dir, tmp_path, capsys):
    out, _ = hostile
    rows = json.loads((out / "manifest.json").read_text())["stats"]["rows"]
    pages = []
    for k in range(rows):
        page = tmp_path / f"row{k}.html"
        assert main(["inspect", str(out), "--row", str(k), "--tokenizer", str(kimi_dir), "--html", str(page)]) == 0
        pages.append(page.read_text(encoding="utf-8"))
    assert f"wrote {tmp_path / 'row0.html'}" in capsys.readouterr().out
    html = "".join(pages)
    assert html.startswith("<!DOCTYPE html>")
    assert "<script>" not in html and "<b>" not in html and "\x1b" not in html
    assert "&lt;script&gt;" in html and "&lt;b&gt;&amp;&quot;x&quot;&lt;/b&gt;" in html
    assert '<span class="supervised">' in html


def test_html_never_replaces_a_file_or_writes_into_a_build(built, kimi_dir, tmp_path, capsys):
    """``--html`` writes a new file only: not over the build's manifest, a source file or an
    earlier page, and not inside a build folder (which would no longer be one)."""
    out, _ = built
    manifest = (out / "manifest.json").read_bytes()
    earlier = tmp_path / "earlier.html"
    earlier.write_text("kept")
    common = ["inspect", str(out), "--row", "0", "--tokenizer", str(kimi_dir), "--html"]
    for target, says in (
        (out / "manifest.json", "exists; choose another output file"),
        (earlier, "exists; choose another output file"),
        (out / "row.html", "is inside the build"),
        (tmp_path / "absent" / "row.html", "no such folder"),
    ):
        capsys.readouterr()
        assert main([*common, str(target)]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1
    assert (out / "manifest.json").read_bytes() == manifest and earlier.read_text() == "kept"
    assert not (out / "row.html").exists() and main(["verify", str(out)]) == 0


def test_an_html_page_that_cannot_be_written_whole_leaves_nothing(built, kimi_dir, tmp_path, capsys, monkeypatch):
    """A write that fails part way (a full disk, a file size limit) leaves no part of the
    page at FILE, which a second try would refuse as existing, and no temporary file."""
    import errno

    from fixed_sft import inspect_rows

    out, _ = built
    pages = tmp_path / "pages"
    pages.mkdir()
    real = Path.write_text

    def half_then_full(path, text, *args, **kwargs):
        real(path, text[: len(text) // 2], *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(inspect_rows, "page", lambda view: "<html>" + "x" * 10000)
    monkeypatch.setattr(Path, "write_text", half_then_full)
    target = pages / "row.html"
    assert main(["inspect", str(out), "--row", "0", "--tokenizer", str(kimi_dir), "--html", str(target)]) == 1
    assert capsys.readouterr().err == f"error: cannot write {target}: No space left on device\n"
    assert list(pages.iterdir()) == []


def test_errors_are_one_line(built, tmp_path, capsys):
    out, _ = built
    assert main(["inspect", str(out), "--row", "12"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "row 12 is out of range" in err and "0 to 11" in err
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("x")
    assert main(["inspect", str(tmp_path / "notes")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a build folder (it has no manifest.json)" in err
    assert main(["inspect", str(tmp_path / "absent")]) == 1
    assert "no such folder" in capsys.readouterr().err
    assert main(["inspect", str(out), "--html", str(tmp_path / "x.html")]) == 2
    assert "add --row K" in capsys.readouterr().err


def test_the_tokenizer_comes_from_the_cache_alone(built, tmp_path, monkeypatch, capsys):
    from huggingface_hub import constants

    out, manifest = built
    assert manifest["tokenizer"]["name"] == "kimi-k2.6"  # the folder's files are the pinned spec's
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # (inspect goes offline itself, then back)
    offline = []
    download = specs._download

    def recorded(*args, **kwargs):
        offline.append(constants.HF_HUB_OFFLINE)
        return download(*args, **kwargs)

    monkeypatch.setattr(specs, "_download", recorded)
    assert main(["inspect", str(out), "--row", "0"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--tokenizer FOLDER" in err and "reads the Hugging Face cache alone" in err
    assert offline == [True] and constants.HF_HUB_OFFLINE is False


def test_a_tokenizer_with_other_files_is_refused(built, kimi_dir, tmp_path, capsys):
    out, _ = built
    other = tmp_path / "tok"
    shutil.copytree(kimi_dir, other)
    (other / "chat_template.jinja").write_text("{{ messages }}")
    assert main(["inspect", str(out), "--row", "0", "--tokenizer", str(other)]) == 1
    assert "not the ones the manifest records" in capsys.readouterr().err


def test_a_build_with_a_file_of_the_users_beside_it_is_inspected_as_verify_checks_it(built, kimi_dir, tmp_path, capsys):
    """Other files in a build's folder are neither verify's concern nor inspect's and diff's."""
    out, _ = built
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / "notes.txt").write_text("trained on this")
    assert main(["verify", str(copy)]) == 0
    assert main(["inspect", str(copy)]) == 0
    assert main(["inspect", str(copy), "--row", "0", "--tokenizer", str(kimi_dir)]) == 0
    capsys.readouterr()
    assert main(["diff", str(out), str(copy)]) == 0
    assert "hold the same rows and manifest" in capsys.readouterr().out


def test_a_fifo_in_place_of_the_rows_is_named_without_blocking(built, kimi_dir, tmp_path, capsys):
    """Opening a FIFO to read it waits for a writer: ``inspect``, with a row or without, and
    ``diff`` name it in one line at once, as ``verify`` does."""
    import threading

    out, _ = built
    fifo_build = tmp_path / "fifo"
    shutil.copytree(out, fifo_build)
    (fifo_build / "train.parquet").unlink()
    os.mkfifo(fifo_build / "train.parquet")
    for args in (
        ["inspect", str(fifo_build)],
        ["inspect", str(fifo_build), "--row", "0", "--tokenizer", str(kimi_dir)],
        ["diff", str(out), str(fifo_build)],
    ):
        codes: list[int] = []
        worker = threading.Thread(target=lambda args=args, codes=codes: codes.append(main(args)), daemon=True)
        worker.start()
        worker.join(60)
        assert codes, f"{args[0]} blocked on a FIFO"
        err = capsys.readouterr().err
        assert codes[0] != 0 and err.count("\n") == 1 and f"{fifo_build / 'train.parquet'}: not a file" in err, err


@pytest.mark.parametrize("name", ["train.parquet", "manifest.json"])
def test_a_folder_in_place_of_a_build_file_is_not_a_file(built, tmp_path, capsys, name):
    """A folder opens, and only then is seen not to be a file: named by its path, as
    ``verify`` names it (not by the descriptor the open gave)."""
    out, _ = built
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / name).unlink()
    (copy / name).mkdir()
    for args in (["inspect", str(copy)], ["diff", str(out), str(copy)]):
        assert main(args) != 0
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{copy / name}: not a file" in err, err


@pytest.mark.parametrize("damage", ["segment", "short"])
def test_a_damaged_row_is_named_not_decoded(built, kimi_dir, tmp_path, capsys, damage):
    """A row whose segments do not cover its ids (one segment more; ids cut short) is named
    in one line, not shown as text a trainer would not read."""
    import pyarrow as pa

    out, _ = built
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    table = pq.read_table(copy / "train.parquet")
    rows = table.to_pylist()
    metadata = rows[1]["metadata"]
    if damage == "segment":
        metadata["segments"].append({**metadata["segments"][-1], "source_index": 10**6})
    else:
        metadata["input_ids"], metadata["loss_mask"] = metadata["input_ids"][:100], metadata["loss_mask"][:100]
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), copy / "train.parquet")
    capsys.readouterr()
    assert main(["inspect", str(copy), "--row", "1", "--tokenizer", str(kimi_dir)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "row 1: " in err and err.rstrip().endswith(": run verify"), err
    assert "internal error" not in err

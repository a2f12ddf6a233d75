"""The dataset card a build writes beside its rows: content, determinism, and what verify makes of it."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import synthetic
import yaml
from conftest import ROOT

from fixed_sft.build import BuildConfig, UsageError, build
from fixed_sft.cli import main
from fixed_sft.folder import is_build
from fixed_sft.rebuild import rebuild, report
from fixed_sft.verify import verify

CARD = ["README.md", "supervised_ratio.png", "conversation_tokens.png", "source_mix.png"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TULU = "allenai/tulu-3-sft-mixture"


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("card-source")
    rows = synthetic.conversations(600, seed=5)
    synthetic.write_parquet(rows, folder / "source.parquet")
    return folder / "source.parquet", rows


def config(source, kimi_dir, **overrides) -> BuildConfig:
    values = dict(name="custom", source=str(source), tokenizer=str(kimi_dir), rows=12, row_tokens=1024, seed=5)
    values.update({"workers": 1, **overrides})
    return BuildConfig(**values)


@pytest.fixture(scope="module")
def built(source, kimi_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("card") / "build"
    return out, build(config(source[0], kimi_dir), out)


def _card(folder: Path) -> tuple[dict, str]:
    text = (folder / "README.md").read_text(encoding="utf-8")
    match = re.fullmatch(r"---\n(.*?)\n---\n(.*)", text, re.S)
    assert match, "the card starts with a YAML header between --- lines"
    return yaml.safe_load(match.group(1)), match.group(2)


def _figure(body: str, name: str) -> str:
    return re.search(rf"^\| {re.escape(name)} \| (.+?) \|$", body, re.M).group(1)


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def test_a_build_writes_its_card_and_records_it(built):
    out, manifest = built
    assert sorted(p.name for p in out.iterdir()) == sorted(["manifest.json", "train.parquet", *CARD])
    files = manifest["card"]["files"]
    assert sorted(files) == sorted(CARD)
    for name, recorded in files.items():
        data = (out / name).read_bytes()
        assert recorded == {"bytes": len(data), "sha256": __import__("hashlib").sha256(data).hexdigest()}
        if name.endswith(".png"):
            assert data.startswith(PNG_MAGIC) and b"matplotlib" not in data  # no Software stamp
    assert verify(out) == []
    assert is_build(out)


def test_the_yaml_header_is_a_dataset_cards(built, kimi_dir):
    out, manifest = built
    header, _ = _card(out)
    split = {"split": "train", "path": "train.parquet"}
    assert header["configs"] == [{"config_name": "default", "data_files": [split]}]
    assert (out / header["configs"][0]["data_files"][0]["path"]).is_file()
    assert header["license"] == manifest["card"]["license"] == "unknown"  # a local source without a license
    assert header["size_categories"] == ["n<1K"]  # 12 rows
    assert header["task_categories"] == ["text-generation"]
    assert header["tokenizer"] == manifest["tokenizer"]["repo"] == "moonshotai/Kimi-K2.6"
    assert "source_datasets" not in header  # a local file is no Hub dataset
    assert header["pretty_name"] == "custom"  # (as a build from the command line without NAME)


def test_datasets_loads_the_folder_by_its_card(built, tmp_path, monkeypatch):
    """The Hugging Face datasets library reads the card's configs: one train split, the build's rows."""
    import datasets

    out, manifest = built
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    loaded = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "cache"))
    assert list(loaded) == ["train"] and loaded["train"].num_rows == manifest["stats"]["rows"]
    assert len(loaded["train"][0]["metadata"]["input_ids"]) == manifest["params"]["row_tokens"]


def test_the_cards_figures_are_the_manifests(built, source):
    out, manifest = built
    _, body = _card(out)
    stats = manifest["stats"]
    for name, key in [
        ("rows", "rows"),
        ("tokens", "tokens"),
        ("supervised tokens", "supervised_tokens"),
        ("trainable tokens", "trainable_tokens"),
        ("conversations", "conversations"),
        ("conversations split across rows", "conversations_split"),
    ]:
        assert _number(_figure(body, name)) == stats[key], name
    assert float(_figure(body, "supervised token ratio")) == stats["supervised_token_ratio"]
    assert _figure(body, "rows_sha256") == f"`{manifest['rows_sha256']}`"
    assert _figure(body, "train.parquet sha256") == f"`{manifest['parquet']['sha256']}`"
    assert "generate-fixed-sft verify DIR" in body and "--rebuild" in body
    for name in CARD[1:]:
        assert f"]({name})" in body


def test_the_source_mix_counts_the_rows_conversations_by_their_source(built, source):
    out, manifest = built
    _, rows = source
    metadata = pq.read_table(out / "train.parquet").column("metadata").to_pylist()
    conversations, tokens = Counter(), Counter()
    seen = set()
    for row in metadata:
        for segment in row["segments"]:
            value = rows[segment["source_index"]]["source"]
            tokens[value] += segment["end"] - segment["start"]
            if segment["source_index"] not in seen:
                seen.add(segment["source_index"])
                conversations[value] += 1
    mix = manifest["source_mix"]
    assert mix == [{"source": v, "conversations": conversations[v], "tokens": tokens[v]} for v in sorted(tokens)]
    _, body = _card(out)
    for share in mix:
        line = re.search(rf"^\| `{re.escape(share['source'])}` \| ([\d,]+) \| ([\d,]+) \|", body, re.M)
        assert (_number(line.group(1)), _number(line.group(2))) == (share["conversations"], share["tokens"])


def test_a_jsonl_source_gives_the_same_source_mix(built, source, kimi_dir, tmp_path):
    synthetic.write_jsonl(source[1], tmp_path / "rows.jsonl")
    manifest = build(config(tmp_path / "rows.jsonl", kimi_dir), tmp_path / "out")
    assert manifest["rows_sha256"] == built[1]["rows_sha256"]
    assert manifest["source_mix"] == built[1]["source_mix"]


def test_a_source_without_a_source_column_records_no_mix(kimi_dir, tmp_path):
    rows = [{k: v for k, v in r.items() if k != "source"} for r in synthetic.conversations(300, seed=2)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    manifest = build(config(tmp_path / "rows.jsonl", kimi_dir, rows=3), tmp_path / "out")
    assert "source_mix" not in manifest
    assert sorted(manifest["card"]["files"]) == sorted(CARD[:3])  # no source mix plot
    assert not (tmp_path / "out" / "source_mix.png").exists()
    assert "have no `source` column" in _card(tmp_path / "out")[1]
    assert verify(tmp_path / "out") == []


@pytest.mark.parametrize("workers", [1, 4])
def test_a_source_column_of_large_chunks_is_not_read(source, kimi_dir, tmp_path, monkeypatch, workers):
    """Its rows count as without a ``source``: the source's rule, which the workers follow too."""
    from fixed_sft import source as source_module

    rows = source[1][:200] + [{**row, "source": row["source"] + "/" + "x" * 100} for row in source[1][200:400]]
    paths = synthetic.write_parquet(rows, tmp_path / "source", rows_per_file=200)
    for path in paths:  # (row groups enough for a fill task per worker)
        pq.write_table(pq.read_table(path), path, row_group_size=50)
    chunks = [_largest_source_chunk(path) for path in paths]
    monkeypatch.setattr(source_module, "SOURCE_CHUNK_BYTES", chunks[0])  # (the second file's are larger)
    assert source_module.open_source(str(tmp_path / "source")).source_columns == (True, False)
    extra = dict(rows=None, workers=workers, cache_dir=str(tmp_path / "store"))
    manifest = build(config(tmp_path / "source", kimi_dir, **extra), tmp_path / "out")
    metadata = pq.read_table(tmp_path / "out" / "train.parquet").column("metadata").to_pylist()
    first = {segment["source_index"] for row in metadata for segment in row["segments"]}
    expected = Counter(rows[index]["source"] if index < 200 else None for index in first)
    assert {share["source"]: share["conversations"] for share in manifest["source_mix"]} == expected


def _largest_source_chunk(path: Path) -> int:
    """The largest uncompressed ``source`` column chunk of a Parquet file."""
    meta = pq.ParquetFile(path).metadata
    leaf = next(n for n in range(meta.num_columns) if meta.schema.column(n).path == "source")
    return max(meta.row_group(g).column(leaf).total_uncompressed_size for g in range(meta.num_row_groups))


def test_a_source_mix_of_too_many_values_is_not_recorded(source, kimi_dir, tmp_path, monkeypatch):
    from fixed_sft import build as build_module

    monkeypatch.setattr(build_module, "MAX_SOURCE_VALUES", 3)  # the fixture's rows hold more
    manifest = build(config(source[0], kimi_dir), tmp_path / "out")
    assert "source_mix" not in manifest and "source_mix.png" not in manifest["card"]["files"]


@pytest.mark.parametrize(
    "value, read",
    [("tulu/math", "tulu/math"), ("x" * 256, "x" * 256), ("x" * 257, None), (7, None), ("\ud800", None), (None, None)],
)
def test_only_short_unicode_source_strings_are_read(value, read):
    from fixed_sft.encode import source_value

    assert source_value({"source": value, "messages": []}) == read


def test_cards_are_byte_identical_and_a_rebuild_replaces_a_build_with_one(built, source, kimi_dir):
    out, manifest = built
    before = {name: (out / name).read_bytes() for name in [*CARD, "manifest.json"]}
    again = build(config(source[0], kimi_dir), out)  # into the folder holding the previous build and its card
    assert again == manifest
    assert {name: (out / name).read_bytes() for name in before} == before
    assert verify(out) == []


def test_another_process_writes_the_same_card(built, source, kimi_dir, tmp_path):
    """The card's bytes depend on no state of the process (hash seed, matplotlib's font cache as loaded)."""
    out, manifest = built
    command = [sys.executable, str(ROOT / "generate_fixed_sft.py"), "build", "--source", str(source[0])]
    command += ["--tokenizer", str(kimi_dir), "--rows", "12", "--row-tokens", "1024", "--seed", "5", "--workers", "1"]
    command += ["--quiet", "--out", str(tmp_path / "fixture")]
    environment = {**os.environ, "PYTHONHASHSEED": "12345", "MPLCONFIGDIR": str(tmp_path / "mpl")}
    subprocess.run(command, check=True, env=environment, capture_output=True)
    again = json.loads((tmp_path / "fixture" / "manifest.json").read_text())
    assert again["card"] == manifest["card"]
    for name in CARD:
        assert (tmp_path / "fixture" / name).read_bytes() == (out / name).read_bytes(), name


def test_no_card(source, kimi_dir, tmp_path, built):
    out = tmp_path / "out"
    shutil.copytree(built[0], out)  # a previous build with a card, replaced by one without
    manifest = build(config(source[0], kimi_dir, no_card=True), out)
    assert "card" not in manifest
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "train.parquet"]
    assert manifest["rows_sha256"] == built[1]["rows_sha256"]
    assert {k: v for k, v in manifest.items() if k != "card"} == {k: v for k, v in built[1].items() if k != "card"}
    assert verify(out) == []
    (out / "README.md").write_text("# a card nobody built\n")
    assert verify(out) == [f"{out / 'README.md'}: a card file the manifest does not record"]


def test_no_card_flag(source, kimi_dir, tmp_path, capsys):
    args = ["build", "--source", str(source[0]), "--tokenizer", str(kimi_dir), "--rows", "2", "--row-tokens", "256"]
    assert main([*args, "--workers", "1", "--quiet", "--no-card", "--out", str(tmp_path / "a")]) == 0
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["manifest.json", "train.parquet"]
    assert main([*args, "--workers", "1", "--quiet", "--card-license", "apache-2.0", "--out", str(tmp_path / "b")]) == 0
    assert _card(tmp_path / "b")[0]["license"] == "apache-2.0"
    assert json.loads((tmp_path / "b" / "manifest.json").read_text())["card"]["license"] == "apache-2.0"
    capsys.readouterr()
    assert main([*args, "--card-license", "Apache 2.0", "--out", str(tmp_path / "c")]) == 2
    assert "--card-license must be a license id" in capsys.readouterr().err


@pytest.mark.parametrize(
    "change, says",
    [
        (lambda out: (out / "README.md").write_text((out / "README.md").read_text() + "\nedited\n"), "README.md: "),
        (lambda out: _flip_last_byte(out / "supervised_ratio.png"), "supervised_ratio.png: sha256 differs"),
        (lambda out: (out / "source_mix.png").unlink(), "source_mix.png: missing"),
        (lambda out: _replace_with_link(out / "conversation_tokens.png"), "conversation_tokens.png: not a regular"),
    ],
)
def test_verify_detects_a_tampered_card(built, tmp_path, change, says):
    out = tmp_path / "copy"
    shutil.copytree(built[0], out)
    change(out)
    problems = verify(out)
    assert len(problems) == 1 and says in problems[0], problems


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))


def _replace_with_link(path: Path) -> None:
    target = path.with_name("elsewhere.png")
    path.rename(target)
    path.symlink_to(target.name)


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda m: m["card"].update(extra=1), "card: unknown key 'extra'"),
        (lambda m: m["card"].update(license=7), "card.license is 7"),
        (lambda m: m["card"]["files"].update({"notes.txt": {"bytes": 1, "sha256": "0" * 64}}), 'names "notes.txt"'),
        (lambda m: m["card"]["files"].pop("README.md"), "card.files lacks README.md"),
        (lambda m: m["source_mix"][0].update(tokens=m["source_mix"][0]["tokens"] + 1), "source_mix tokens is"),
    ],
)
def test_the_manifests_card_and_mix_are_read_strictly(built, tmp_path, edit, says):
    out = tmp_path / "copy"
    shutil.copytree(built[0], out)
    manifest = json.loads((out / "manifest.json").read_text())
    edit(manifest)
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert any(says in problem for problem in verify(out)), verify(out)


TULU_REVISION = "b14afda60f1bbebe55d5d2fa1e4df5042f97f8be"


def test_a_tulu_source_declares_odc_by_with_its_attribution(source, kimi_dir, tmp_path):
    """A local copy of the named build's source, given its revision and license as README's offline build does."""
    out = tmp_path / "tulu"
    named = config(
        source[0], kimi_dir, name="kimi-k26-tulu3-fixed8192-v1", source_license="ODC-By-1.0",
        source_revision=TULU_REVISION, rows=2,
    )  # fmt: skip
    manifest = build(named, out)
    header, body = _card(out)
    assert header["license"] == manifest["card"]["license"] == "odc-by"
    assert header["source_datasets"] == [TULU]
    assert "requires attribution" in body and f"[{TULU}](https://huggingface.co/datasets/{TULU})" in body
    assert "https://opendatacommons.org/licenses/by/1-0/" in body
    assert verify(out) == []


@pytest.mark.parametrize(
    ("overrides", "license"),
    [
        ({"source_license": "ODC-By-1.0", "card_license": "apache-2.0"}, "apache-2.0"),
        ({"name": "kimi-k26-tulu3-fixed8192-v1", "source_revision": TULU_REVISION}, "unknown"),  # (no license given)
    ],
    ids=["another license declared", "tulu 3 without its license"],
)
def test_the_attribution_an_odc_by_source_requires_is_written_whatever_the_card_declares(
    source, kimi_dir, tmp_path, overrides, license
):
    out = tmp_path / "card"
    build(config(source[0], kimi_dir, rows=2, **overrides), out)
    header, body = _card(out)
    assert header["license"] == license
    assert "which is licensed under ODC-By 1.0. The license requires attribution" in body
    assert ("Check the source's own terms" in body) is (license == "unknown")


def test_a_named_build_of_another_source_claims_no_upstream(source, kimi_dir, tmp_path):
    """The named build with a local source that is not shown to be its source (neither its
    revision nor its row count): the card names no upstream dataset, and none of its terms."""
    out = tmp_path / "card"
    manifest = build(config(source[0], kimi_dir, name="kimi-k26-tulu3-fixed8192-v1", rows=2), out)
    header, body = _card(out)
    assert manifest["source"]["license"] is None and header["license"] == "unknown"
    assert "source_datasets" not in header and TULU not in body and "ODC-By" not in body


def test_odc_by_declared_for_a_source_of_another_license_claims_no_odc_by_source(source, kimi_dir, tmp_path):
    out = tmp_path / "card"
    build(config(source[0], kimi_dir, rows=2, source_license="MIT", card_license="odc-by"), out)
    header, body = _card(out)
    assert header["license"] == "odc-by" and "the source's recorded license is `MIT`" in body
    assert "licensed under ODC-By 1.0" not in body


def test_text_of_the_inputs_cannot_break_the_card(source, kimi_dir, tmp_path):
    """The source's revision and license, from the command line or a spec, are shown in
    code spans no line break or backtick of theirs can end."""
    out = tmp_path / "card"
    hostile = "x`\n\n---\nlicense: mit\n# Heading <script>alert(1)</script>"
    build(config(source[0], kimi_dir, rows=2, source_revision=hostile, source_license=hostile), out)
    header, body = _card(out)
    assert header["license"] == "other"
    assert not [line for line in body.splitlines() if line.startswith(("# Heading", "license:", "---"))]
    assert "`x' --- license: mit # Heading <script>alert(1)</script>`" in body
    piped = tmp_path / "piped"
    build(config(source[0], kimi_dir, rows=2, source_license="MIT | see NOTICE"), piped)
    assert "the source's recorded license is `MIT | see NOTICE`" in _card(piped)[1]  # (a code span, not a table cell)
    assert verify(out) == []


def test_a_rebuild_compares_the_card_for_information(built, source, kimi_dir):
    out, _ = built
    proven, lines = report(rebuild(out, str(source[0]), str(kimi_dir)))
    assert proven, lines
    assert "  card: same (for information)" in lines
    assert "  source_mix: same" in lines


def test_a_bad_card_license_is_refused(source, kimi_dir, tmp_path):
    with pytest.raises(UsageError, match="--card-license must be a license id"):
        build(config(source[0], kimi_dir, card_license="ODC By"), tmp_path / "out")


@pytest.mark.parametrize("boundaries", [False, True])
def test_the_cards_row_hash_rule_gives_rows_sha256(source, kimi_dir, tmp_path, boundaries):
    """The card's sentence on ``rows_sha256`` names every part a row's hash covers: each row's
    ids and mask, and for a build with boundaries its ``cu_seqlens`` (0 first) too."""
    import hashlib

    import numpy as np

    out = tmp_path / "build"
    manifest = build(config(source[0], kimi_dir, rows=6, emit_boundaries=boundaries), out)
    sentence = next(line for line in _card(out)[1].splitlines() if line.startswith("`rows_sha256` is"))
    assert ("cu_seqlens" in sentence) == boundaries
    digests = []
    for row in pq.read_table(out / "train.parquet").column("metadata").to_pylist():
        parts = [np.array(row["input_ids"], "<i4").tobytes(), np.array(row["loss_mask"], np.uint8).tobytes()]
        if boundaries:
            assert row["cu_seqlens"][0] == 0 and row["cu_seqlens"][-1] == len(row["input_ids"])
            parts.append(np.array(row["cu_seqlens"], "<i4").tobytes())
        digests.append(hashlib.sha256(b"".join(parts)).digest())
    assert hashlib.sha256(b"".join(digests)).hexdigest() == manifest["rows_sha256"]


def _header_going_on_past_the_limit(text: str) -> str:
    """A header padded so that a ``---`` ends the first ``HEADER_BYTES`` bytes (ASCII), where
    the line goes on (so loaders read on, to a later ``---``, and other values)."""
    from fixed_sft.card import HEADER_BYTES

    close = text.index("\n---\n", 4)
    pad = HEADER_BYTES - close - len("\n# ") - len("\n---")
    forged = text[:close] + "\n# " + "p" * pad + "\n---" + "x: 1\nlicense: mit\n---\n" + text[close + 5 :]
    assert forged[:HEADER_BYTES].endswith("\n---") and forged[HEADER_BYTES:].startswith("x: 1\n")
    return forged


def _recard(out: Path, edit) -> None:
    """Edit README.md's text with ``edit`` and record its new size and sha256, as a forger
    would: only the check of what loaders read of the card can tell."""
    path = out / "README.md"
    path.write_text(edit(path.read_text(encoding="utf-8")), encoding="utf-8")
    manifest = json.loads((out / "manifest.json").read_text())
    data = path.read_bytes()
    manifest["card"]["files"]["README.md"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda text: text.replace("path: train.parquet", "path: extra.parquet"), "header's configs do not name"),
        (lambda text: text.replace("\nlicense: ", "\ndataset_info:\n  features: []\nlicense: ", 1), "'dataset_info'"),
        (lambda text: text.replace("\nlicense: unknown\n", "\nlicense: mit\n", 1), "header's license is not 'unknown'"),
        (lambda text: text.replace("---\n", "---\n[", 1), "its YAML header does not read"),
        (lambda text: text.replace("---\n", "", 1), "it has no YAML header within its first 65536 bytes"),
        (lambda text: text.replace("\n---\n", "\n" + " " * 70000 + "\n---\n", 1), "no YAML header within"),
        (lambda text: text.replace("\n---\n\n", "\n---\r", 1), "no YAML header within"),  # (as loaders read it)
        (lambda text: "\ufeff" + text, "no YAML header within"),
        (lambda text: _header_going_on_past_the_limit(text), "no YAML header within"),
        (  # (YAML's aliases: a value that would print as gigabytes is not shown)
            lambda text: text.replace(
                "\nlicense: unknown\n",
                "\nlicense: &a0 [x, x]\n" + "".join(f"x{k}: &a{k} [*a{k - 1}, *a{k - 1}]\n" for k in range(1, 40)),
                1,
            ),
            "which the card does not write",
        ),
    ],
)
def test_a_card_whose_header_loaders_act_on_is_forged_is_named(built, tmp_path, edit, says):
    """``configs`` says which files ``datasets`` loads: a card that names other data, or
    declares another license than the manifest's, is a difference though its hash is recorded."""
    out = tmp_path / "copy"
    shutil.copytree(built[0], out)
    _recard(out, lambda text: text)
    assert verify(out) == []
    _recard(out, edit)
    problems = verify(out)
    assert len(problems) == 1 and problems[0].startswith(f"{out / 'README.md'}: ") and says in problems[0], problems


@pytest.mark.parametrize(
    "name, card",
    [
        ("extra.parquet", True),
        ("data/train-00001.parquet", True),
        ("_x.parquet", True),
        ("sub/part-0", True),  # (Parquet by its bytes: pyarrow reads it, skipping files it cannot)
        ("source_mix.png", True),  # (a card file, as the manifest records it, with Parquet's bytes)
        (".hidden.parquet", True),  # (polars' glob reads it)
        (".cache/x.parquet", True),
        ("train-1.parquet.bak", False),  # (datasets matches any dot-part)
        ("train-2.jsonl.orig", False),
        ("train/a/task.toml", False),
        ("more.jsonl.gz", False),
        ("config.json", False),
        ("a.txt", False),
        ("b.zip", False),
    ],
)
def test_a_data_file_the_build_did_not_write_is_named(source, kimi_dir, built, tmp_path, name, card):
    """Loaders read a folder's data files as rows: pyarrow and polars its Parquet files;
    datasets those its card names, and without a card those of its formats. A build's
    folder holds none but its own. As datasets, it passes over names that start with a
    dot, and folders that start with two underscores."""
    out = tmp_path / "__builds__" / "copy"  # (a folder above the build's is not one of its own)
    if card:
        shutil.copytree(built[0], out)
        (out / "notes.txt").write_text("mine: the card names the data")
        (out / "notes.md").write_text("mine")
    else:
        build(config(source[0], kimi_dir, no_card=True), out)
    (out / ".cache" / "huggingface").mkdir(parents=True)
    (out / ".cache" / "huggingface" / "x.json").write_text("{}")
    (out / "__pycache__").mkdir()
    (out / "__pycache__" / "x.json").write_text("{}")
    (out / ".gitattributes").write_text("*.parquet filter=lfs")
    (out / ".cache" / "huggingface" / "train.parquet.metadata").write_text("x")  # (as a Hub download leaves)
    (out / "photo.png").write_bytes(b"\x89PNG")  # (images are not rows of these formats)
    if card:
        (out / "train.parquet.sha256").write_text("x")  # (beside a card: no loader reads it)
    assert verify(out) == []
    (out / name).parent.mkdir(parents=True, exist_ok=True)
    if card:
        shutil.copy(out / "train.parquet", out / name)
    else:  # (found by its name alone)
        (out / name).write_text('{"text": "other rows"}\n')
    if name == "source_mix.png":  # (recorded as a forger would)
        manifest = json.loads((out / "manifest.json").read_text())
        data = (out / name).read_bytes()
        manifest["card"]["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    said = f"{out / name}: a data file the build did not write, which loaders of the folder read as rows"
    assert verify(out) == [said]


def test_a_loader_config_beside_the_card_is_named(built, tmp_path, capsys):
    """datasets takes which files to load from ``.huggingface.yaml``, and their features from
    ``dataset_infos.json``, over the card's header."""
    out = tmp_path / "copy"
    shutil.copytree(built[0], out)
    (out / ".huggingface.yaml").write_text("configs:\n- config_name: default\n  data_files: .x/evil.parquet\n")
    said = f"{out / '.huggingface.yaml'}: it tells loaders what to read, and the build did not write it"
    assert verify(out) == [said]
    (out / ".huggingface.yaml").unlink()
    (out / "dataset_infos.json").write_text('{"default": {"features": {"input_ids": [{"dtype": "string"}]}}}')
    said = f"{out / 'dataset_infos.json'}: it tells loaders what to read, and the build did not write it"
    assert verify(out) == [said]


def test_a_files_name_is_shown_in_one_line(built, tmp_path, capsys):
    """A name may hold a line break, an escape sequence or bytes that are not UTF-8: the
    MISMATCH line shows each escaped, and stays one line."""
    out = tmp_path / "copy"
    shutil.copytree(built[0], out)
    shutil.copy(out / "train.parquet", out / "x\nok: it matches\x1b[2J.parquet")
    os.makedirs(os.fsencode(out / "sub"))
    (Path(os.fsdecode(os.fsencode(out / "sub") + b"/\xff.parquet"))).write_text("{}")
    capsys.readouterr()
    assert main(["verify", str(out)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("MISMATCH ") and "\\n" in lines[0] and "\\x1b" in lines[0]
    os.unlink(out / "x\nok: it matches\x1b[2J.parquet")
    assert main(["verify", str(out)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and "sub/\\xff.parquet: a data file the build did not write" in lines[0], lines


def test_a_link_to_a_folder_and_what_cannot_be_read_are_named(built, tmp_path, monkeypatch):
    """pyarrow and polars may follow a link to a folder of other rows; a folder verify
    cannot list may hold some."""
    out = tmp_path / "copy"
    shutil.copytree(built[0], out)
    (tmp_path / "elsewhere").mkdir()
    (out / "data").symlink_to(tmp_path / "elsewhere")
    said = f"{out / 'data'}: a link to a folder the build did not make, which loaders may follow to rows"
    assert verify(out) == [said]
    (out / "data").unlink()
    deep = out / "sub"
    deep.mkdir()
    os.chmod(deep, 0)
    try:
        problems = verify(out)
        readable = os.access(deep, os.R_OK)  # (as root: every folder is)
    finally:
        os.chmod(deep, 0o755)
    assert problems == ([] if readable else [f"{deep}: Permission denied, so what loaders read there is not known"])

    def unlistable(top, onerror=None):  # (as os.walk meets a folder it may not list, whoever runs this)
        onerror(PermissionError(13, "Permission denied", str(deep)))
        yield from ()

    monkeypatch.setattr(os, "walk", unlistable)
    assert verify(out) == [f"{deep}: Permission denied, so what loaders read there is not known"]

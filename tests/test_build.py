"""End-to-end builds on a generated Tulu-like corpus."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import synthetic
from conftest import cache_link

from fixed_sft import build as build_module
from fixed_sft.build import BuildConfig, BuildError, UsageError, build
from fixed_sft.chat import ChatEncoder
from fixed_sft.encode import EncoderConfig, sampled
from fixed_sft.order import permutation
from fixed_sft.output import read_rows
from fixed_sft.params import MAX_ROW_TOKENS
from fixed_sft.source import SourceError
from fixed_sft.tokenizer import FILES

# rows_sha256 of FIXTURE built from synthetic.conversations(1200, seed=5). A change here
# changes the row stream: bump the format version and say why in the commit.
GOLDEN_ROWS_SHA256 = "d070b2aa5f53eba051762f22ed55189f5e56b5ace97f41e73cb27ab114daa91d"
# and the provenance and counts that go with those rows: sha256 of the ``metadata`` column's
# ``row`` and ``segments`` as JSON (sorted keys), and the manifest's stats and template check
GOLDEN_METADATA_SHA256 = "d46d59980e91631379f058479c79e27ec719abff53322dc6a48bbb085b6b719a"
GOLDEN_STATS = {
    "rows": 40,
    "tokens": 40960,
    "supervised_tokens": 31223,
    "supervised_token_ratio": 0.7622802734375,
    "trainable_tokens": 31198,
    "padding_tokens": 0,
    "conversations": 18,
    "conversations_split": 9,
    "rows_skipped": 0,
    "tail_tokens_dropped": 1758,
    "invalid_rows_skipped": 0,
}
GOLDEN_TEMPLATE_CHECK = {"every": 8, "checked": 2, "sample": "source_row"}
# rows_sha256 of the same build with --emit-boundaries (format fixed-sft/3): the row hash
# then also covers each row's cu_seqlens (data/README.md)
GOLDEN_BOUNDARIES_ROWS_SHA256 = "dd21a8dae05aa5673174970c69db3ccb2e639725a9371e73872245bc88b5c64d"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    rows = synthetic.conversations(1200, seed=5)
    synthetic.write_parquet(rows, folder / "parquet", rows_per_file=400)
    synthetic.write_jsonl(rows, folder / "rows.jsonl")
    return folder, rows


def config(source, kimi_dir, **overrides) -> BuildConfig:
    values = dict(
        name="fixture",
        source=str(source),
        tokenizer=str(kimi_dir),
        rows=40,
        row_tokens=1024,
        seed=5,
        workers=1,
        check_every=8,
        no_card=True,  # (drawn by the tests of the card: tests/test_card.py, and below)
    )
    values.update(overrides)
    return BuildConfig(**values)


@pytest.fixture(scope="module")
def fixture_build(corpus, kimi_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("builds") / "fixture"
    return out, build(config(corpus[0] / "parquet", kimi_dir), out)


def test_golden_rows_sha256(fixture_build):
    _, manifest = fixture_build
    assert manifest["rows_sha256"] == GOLDEN_ROWS_SHA256


def test_golden_provenance_and_stats(fixture_build):
    out, manifest = fixture_build
    metadata = [
        {key: row[key] for key in ("row", "segments")}
        for row in pq.read_table(out / "train.parquet", columns=["metadata"]).column("metadata").to_pylist()
    ]
    assert hashlib.sha256(json.dumps(metadata, sort_keys=True).encode()).hexdigest() == GOLDEN_METADATA_SHA256
    assert (manifest["stats"], manifest["template_check"]) == (GOLDEN_STATS, GOLDEN_TEMPLATE_CHECK)


def test_manifest_describes_the_rows(fixture_build, corpus):
    out, manifest = fixture_build
    ids, mask, offsets = read_rows(out / "train.parquet")
    stats = manifest["stats"]
    assert stats["rows"] == 40 == len(offsets) - 1
    assert np.all(np.diff(offsets) == 1024)
    assert stats["padding_tokens"] == 0
    assert stats["supervised_tokens"] == int(mask.sum())
    assert stats["supervised_token_ratio"] == pytest.approx(mask.mean())
    assert manifest["template_check"]["checked"] > 0
    assert manifest["tokenizer"]["pinned"] and manifest["tokenizer"]["name"] == "kimi-k2.6"
    assert [f["path"] for f in manifest["source"]["files"]] == [
        "train-00000-of-00003.parquet",
        "train-00001-of-00003.parquet",
        "train-00002-of-00003.parquet",
    ]
    assert manifest["source"]["rows"] == 1200
    assert len(manifest["row_sha256"]) == 40
    rows_of = Counter(
        s["source_index"]
        for row in pq.read_table(out / "train.parquet").column("metadata").to_pylist()
        for s in {seg["source_index"]: seg for seg in row["segments"]}.values()
    )
    assert stats["conversations"] == len(rows_of)
    assert stats["conversations_split"] == sum(1 for n in rows_of.values() if n > 1) > 0


def test_code_version_identifies_the_package_files(fixture_build):
    import hashlib

    import fixed_sft

    _, manifest = fixture_build
    digest = hashlib.sha256()
    for path in sorted(Path(fixed_sft.__file__).parent.glob("*.py")):  # the rule of data/README.md
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    assert manifest["code_version"]["code_sha256"] == digest.hexdigest()
    assert manifest["code_version"]["format"] == "fixed-sft/2"


def _code_version_in(folder: Path) -> dict:
    """``code_version()`` as a process importing the package from ``folder`` records it."""
    import subprocess

    probe = [sys.executable, "-c", "import json, fixed_sft.build as b; print(json.dumps(b.code_version()))"]
    return json.loads(subprocess.run(probe, cwd=folder, capture_output=True, text=True, check=True).stdout)


def test_git_commit_and_dirty_are_recorded_from_the_project_checkout(tmp_path):
    """In the project's own checkout the commit is HEAD's, and ``git_dirty`` says whether
    ``fixed_sft/`` differs from it; a copy of the package inside another repository
    records neither."""
    import shutil
    import subprocess

    import fixed_sft
    from fixed_sft.build import code_version

    package = Path(fixed_sft.__file__).parent

    def commit_all(repo: Path) -> str:
        """A new repository at ``repo`` with everything in it committed; its HEAD."""
        git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        subprocess.run([*git, "add", "."], check=True)
        subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "c"], check=True)
        return subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()

    project = tmp_path / "project"
    shutil.copytree(package, project / "fixed_sft")
    head = commit_all(project)
    clean = _code_version_in(project)
    assert (clean["git_commit"], clean["git_dirty"], clean["code_sha256"]) == (
        head,
        False,
        code_version()["code_sha256"],
    )
    with (project / "fixed_sft" / "pack.py").open("a") as f:
        f.write("# edited\n")
    dirty = _code_version_in(project)
    assert (dirty["git_commit"], dirty["git_dirty"]) == (head, True) and dirty["code_sha256"] != clean["code_sha256"]

    other = tmp_path / "other"
    other.mkdir()
    commit_all(other)
    shutil.copytree(package, other / "venv" / "site-packages" / "fixed_sft")
    copied = _code_version_in(other / "venv" / "site-packages")
    assert "git_commit" not in copied and "git_dirty" not in copied
    assert copied["code_sha256"] == code_version()["code_sha256"]


def test_rows_are_the_ordered_conversation_stream(fixture_build, corpus, encoder):
    """Re-joined rows equal the conversations in packing order joined with [EOS], and
    each row's provenance rebuilds it."""
    out, manifest = fixture_build
    rows = corpus[1]
    ids, mask, offsets = read_rows(out / "train.parquet")
    order = permutation(5, len(rows))
    units = {}
    stream, stream_mask = [], []
    for index in order[: manifest["stats"]["conversations"] + 1]:
        conv_ids, conv_mask = encoder.encode(rows[index]["messages"])
        units[int(index)] = conv_ids + [163585]
        stream += conv_ids + [163585]
        stream_mask += conv_mask + [0]
    assert manifest["stats"]["rows_skipped"] == 0
    assert ids.tolist() == stream[: len(ids)]
    used = list(order[: manifest["stats"]["conversations"]])
    assert sum(len(units[int(i)]) for i in used) - len(ids) == manifest["stats"]["tail_tokens_dropped"]
    assert mask.tolist() == stream_mask[: len(mask)]
    for n, row in enumerate(pq.read_table(out / "train.parquet").column("metadata").to_pylist()):
        assert row["row"] == n
        rebuilt = [t for s in row["segments"] for t in units[s["source_index"]][s["start"] : s["end"]]]
        assert rebuilt == ids[offsets[n] : offsets[n + 1]].tolist()
        assert all(s["id"] == rows[s["source_index"]]["id"] for s in row["segments"])


def test_two_builds_are_identical(fixture_build, corpus, kimi_dir, tmp_path):
    out, manifest = fixture_build
    again = build(config(corpus[0] / "parquet", kimi_dir), tmp_path / "again")
    assert again == manifest
    assert (tmp_path / "again" / "train.parquet").read_bytes() == (out / "train.parquet").read_bytes()


@pytest.mark.parametrize("workers", [2, 3])
def test_workers_do_not_change_output(fixture_build, corpus, kimi_dir, tmp_path, monkeypatch, workers):
    monkeypatch.setattr(build_module, "CHUNK_ROWS", 8)  # many more chunks than the 2 x workers in flight
    out, manifest = fixture_build
    other = build(config(corpus[0] / "parquet", kimi_dir, workers=workers), tmp_path / "w")
    assert other == manifest
    assert (tmp_path / "w" / "train.parquet").read_bytes() == (out / "train.parquet").read_bytes()


def test_workers_check_the_same_positions_whatever_the_chunk_size(
    fixture_build, corpus, kimi_dir, tmp_path, monkeypatch
):
    """Chunks of 3 in 2 workers check the sampled source rows the stream takes, as one
    worker does (checks every 8)."""
    monkeypatch.setattr(build_module, "CHUNK_ROWS", 3)
    _, manifest = fixture_build
    other = build(config(corpus[0] / "parquet", kimi_dir, workers=2), tmp_path / "w")
    taken = permutation(5, len(corpus[1]))[: other["stats"]["conversations"]]
    expected = {"every": 8, "checked": int(np.count_nonzero(sampled(taken, 8))), "sample": "source_row"}
    assert other["template_check"] == expected == manifest["template_check"]
    assert other == manifest


def test_bands_chunks_and_batches_do_not_change_output(fixture_build, corpus, kimi_dir, tmp_path, monkeypatch):
    """Many consecutive bands of a few rows, cut into chunks of 2 and read in batches of 7
    rows (smaller than a row group): the same build."""
    import fixed_sft.bands as bands_module

    monkeypatch.setattr(build_module, "BAND_BYTES", 10_000)
    monkeypatch.setattr(build_module, "CHUNK_ROWS", 2)
    monkeypatch.setattr(bands_module, "READ_BATCH_ROWS", 7)
    bands = []
    read_band = build_module.read_band
    monkeypatch.setattr(
        build_module,
        "read_band",
        lambda src, rank, lo, hi, *skip: bands.append((lo, hi)) or read_band(src, rank, lo, hi, *skip),
    )
    _, manifest = fixture_build
    assert build(config(corpus[0] / "parquet", kimi_dir), tmp_path / "b") == manifest
    assert len(bands) > 3 and bands[0][0] == 0
    assert all(previous[1] == lo for previous, (lo, _) in zip(bands, bands[1:]))  # no row between bands is lost


def test_a_band_of_large_rows_leaves_room_for_its_read_copies(fixture_build, corpus, kimi_dir, tmp_path, monkeypatch):
    """Where rows are large (here: over 0 bytes on average), a source of one file (JSONL)
    is read in bands of a third of ``LARGE_BAND_BYTES`` of rows (the rest is for the copies
    that sort them), three files of even sizes in bands of three fifths; rows under the
    size get bands of ``BAND_BYTES`` counted the same way. The rows are the same. (Without the
    token store, which would give the later builds the rows of the first.)"""
    from fixed_sft.bands import bytes_per_row
    from fixed_sft.source import open_source

    bands = []
    read_band = build_module.read_band
    monkeypatch.setattr(
        build_module,
        "read_band",
        lambda src, rank, lo, hi, *skip: bands.append(hi - lo) or read_band(src, rank, lo, hi, *skip),
    )
    one_file = corpus[0] / "rows.jsonl"
    per_row = bytes_per_row(open_source(str(one_file)))
    monkeypatch.setattr(build_module, "LARGE_BAND_BYTES", 3 * 5.5 * per_row)
    monkeypatch.setattr(build_module, "LARGE_ROW_BYTES", 0)
    manifest = build(config(one_file, kimi_dir, no_cache=True), tmp_path / "jsonl")
    assert manifest["rows_sha256"] == fixture_build[1]["rows_sha256"]
    assert len(bands) > 3 and set(bands) == {5}
    bands.clear()
    per_row = bytes_per_row(open_source(str(corpus[0] / "parquet")))
    monkeypatch.setattr(build_module, "LARGE_BAND_BYTES", 5 / 3 * 6.5 * per_row)
    assert build(config(corpus[0] / "parquet", kimi_dir, no_cache=True), tmp_path / "parquet") == fixture_build[1]
    assert len(bands) >= 3 and set(bands) <= {5, 6}
    bands.clear()
    monkeypatch.setattr(build_module, "LARGE_ROW_BYTES", per_row)
    monkeypatch.setattr(build_module, "BAND_BYTES", 5 / 3 * 6.5 * per_row)
    assert build(config(corpus[0] / "parquet", kimi_dir, no_cache=True), tmp_path / "small-rows") == fixture_build[1]
    assert len(bands) >= 3 and set(bands) == {6}


def test_a_build_of_several_bands_maps_its_large_allocations(fixture_build, corpus, kimi_dir, tmp_path, monkeypatch):
    """The build's process maps its large allocations where it reads more than one band of
    rows (it then holds a band while it reads the next), not where one band holds them."""
    from fixed_sft.bands import bytes_per_row
    from fixed_sft.source import open_source

    mapped, bands = [], []
    monkeypatch.setattr(build_module, "map_large_allocations", lambda: mapped.append(True))
    read_band = build_module.read_band
    monkeypatch.setattr(
        build_module,
        "read_band",
        lambda src, rank, lo, hi, *skip: bands.append(hi - lo) or read_band(src, rank, lo, hi, *skip),
    )
    source = corpus[0] / "parquet"
    assert build(config(source, kimi_dir, no_cache=True), tmp_path / "one-band") == fixture_build[1]
    assert len(bands) == 1 and mapped == []
    per_row = bytes_per_row(open_source(str(source)))
    monkeypatch.setattr(build_module, "BAND_BYTES", 5 / 3 * 6.5 * per_row)
    assert build(config(source, kimi_dir, no_cache=True), tmp_path / "bands") == fixture_build[1]
    assert len(bands) > 2 and mapped == [True]


def test_a_small_build_reads_a_band_sized_to_its_rows(corpus, kimi_dir, tmp_path, monkeypatch):
    """A band holds what the rows still to fill need (plus a fifth), not the whole source."""
    bands = []
    read_band = build_module.read_band
    monkeypatch.setattr(
        build_module,
        "read_band",
        lambda src, rank, lo, hi, *skip: bands.append((lo, hi)) or read_band(src, rank, lo, hi, *skip),
    )
    manifest = build(config(corpus[0] / "parquet", kimi_dir, rows=3, row_tokens=256), tmp_path / "small")
    assert bands == [(0, bands[0][1])] and manifest["stats"]["conversations"] <= bands[0][1] <= 300 < 1200


def test_build_allocates_from_the_system_pool_and_restores_the_callers(corpus, kimi_dir, tmp_path, monkeypatch):
    import pyarrow as pa

    pools = []
    read_band = build_module.read_band
    monkeypatch.setattr(
        build_module,
        "read_band",
        lambda src, rank, lo, hi, *skip: (
            pools.append(pa.default_memory_pool().backend_name) or read_band(src, rank, lo, hi, *skip)
        ),
    )
    before = pa.default_memory_pool().backend_name
    assert before != "system"  # pyarrow's default: the test would prove nothing otherwise
    build(config(corpus[0] / "parquet", kimi_dir, rows=3), tmp_path / "ok")
    with pytest.raises(BuildError):
        build(config(corpus[0] / "parquet", kimi_dir, rows=10**6), tmp_path / "too-many")
    assert set(pools) == {"system"} and len(pools) >= 2
    assert pa.default_memory_pool().backend_name == before


def test_whole_source_over_many_row_groups_verifies(corpus, kimi_dir, tmp_path):
    from fixed_sft.output import ROWS_PER_GROUP
    from fixed_sft.verify import verify

    out = tmp_path / "all"
    manifest = build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=None, row_tokens=512, check_every=0), out)
    metadata = pq.read_table(out / "train.parquet").column("metadata").to_pylist()
    assert manifest["stats"]["rows"] == len(metadata) > 2 * ROWS_PER_GROUP
    assert pq.ParquetFile(out / "train.parquet").num_row_groups == -(-len(metadata) // ROWS_PER_GROUP)
    assert [m["row"] for m in metadata] == list(range(len(metadata)))
    assert manifest["params"]["rows"] == "all" and verify(out) == []


def test_template_check_runs_on_the_sampled_source_rows(corpus, kimi_dir, tmp_path, monkeypatch):
    rows = corpus[1]
    index_of = {tuple((m["role"], m["content"]) for m in row["messages"]): i for i, row in enumerate(rows)}
    checked = []
    check = ChatEncoder.check
    monkeypatch.setattr(
        ChatEncoder,
        "check",
        lambda self, messages, ids, tools=None: (
            checked.append(index_of[tuple((m["role"], m["content"]) for m in messages)])
            or check(self, messages, ids, tools)
        ),
    )
    manifest = build(config(corpus[0] / "parquet", kimi_dir, check_every=5), tmp_path / "c")
    taken = permutation(5, len(rows))[: manifest["stats"]["conversations"]]  # (one worker encodes these only)
    assert checked == taken[sampled(taken, 5)].tolist() and len(checked) >= 2
    assert manifest["template_check"] == {"every": 5, "checked": len(checked), "sample": "source_row"}


def test_a_build_whose_stream_takes_no_sampled_row_checks_its_first(
    corpus, kimi_dir, tmp_path, monkeypatch, token_store
):
    """Every build with ``check_every`` checks one conversation at least: where the stream
    takes none of the sampled rows, the first conversation of row 0. Its copy in the store
    counts where it passed; one that did not is checked, and must be the stored copy. A
    difference from the template stops the build."""
    from fixed_sft.chat import TemplateMismatch
    from fixed_sft.store import SegmentWriter, StoreMismatch, TokenStore

    cfg = config(corpus[0] / "parquet", kimi_dir, rows=2, check_every=500)
    order = permutation(5, len(corpus[1]))
    assert not sampled(order[:20], 500).any()  # (2 rows of 1,024 tokens take fewer)
    checked = []
    check = ChatEncoder.check

    def recording(self, messages, ids, tools=None):
        checked.append(messages)
        return check(self, messages, ids, tools)

    monkeypatch.setattr(ChatEncoder, "check", recording)
    manifest = build(cfg, tmp_path / "few")
    assert manifest["template_check"] == {"every": 500, "checked": 1, "sample": "source_row"}
    first = int(order[0])
    assert checked == [corpus[1][first]["messages"]]
    assert manifest == build(dataclasses.replace(cfg, no_cache=True), tmp_path / "plain")
    checked.clear()
    assert build(cfg, tmp_path / "again") == manifest and checked == []  # (stored as passed)

    (entry,) = (token_store / "tokens").iterdir()
    held = TokenStore(entry, len(corpus[1]))
    items = [held.lookup(int(index)) for index in np.flatnonzero(held.segment >= 0)]
    held.close()
    for segment in entry.glob("*.seg"):
        segment.unlink()
    writer = SegmentWriter(entry)
    for item in items:  # the first one stale and unchecked, with digests that match
        writer.add(item._replace(ids=item.ids + 1, checked=False) if item.source_index == first else item)
    writer.flush()
    with pytest.raises(StoreMismatch, match=rf"source row {first}: the token store's copy differs"):
        build(cfg, tmp_path / "stale")

    def differs(self, messages, ids, tools=None):
        raise TemplateMismatch("fast-path ids differ from the rendered chat template")

    monkeypatch.setattr(ChatEncoder, "check", differs)
    with pytest.raises(TemplateMismatch, match=rf"source row {first} \(id {corpus[1][first]['id']}\): fast-path"):
        build(dataclasses.replace(cfg, no_cache=True), tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_a_template_mismatch_names_the_source_row(corpus, kimi_dir, tmp_path, monkeypatch):
    from fixed_sft.chat import TemplateMismatch

    order = permutation(5, len(corpus[1]))
    first = int(order[sampled(order, 8)][0])  # (the first sampled in packing order)

    def differs(self, messages, ids, tools=None):
        raise TemplateMismatch("fast-path ids differ from the rendered chat template")

    monkeypatch.setattr(ChatEncoder, "check", differs)
    with pytest.raises(TemplateMismatch, match=rf"source row {first} \(id {corpus[1][first]['id']}\): fast-path ids"):
        build(config(corpus[0] / "parquet", kimi_dir), tmp_path / "m")
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("bpe", ["gigatoken", "tiktoken"])
def test_each_bpe_builds_the_golden_rows_and_records_itself(fixture_build, corpus, kimi_dir, tmp_path, bpe):
    """Rows are byte-identical whichever BPE encodes them; only ``code_version.bpe`` differs."""
    out, manifest = fixture_build
    built = build(config(corpus[0] / "parquet", kimi_dir, bpe=bpe), tmp_path / bpe)
    assert built["rows_sha256"] == GOLDEN_ROWS_SHA256
    assert built["code_version"]["bpe"] == f"{bpe} {importlib.metadata.version(bpe)}"
    assert manifest["code_version"]["bpe"].startswith("gigatoken ")  # the default, where installed
    assert (tmp_path / bpe / "train.parquet").read_bytes() == (out / "train.parquet").read_bytes()
    assert {**built, "code_version": None} == {**manifest, "code_version": None}


def test_a_gigatoken_difference_stops_the_build_naming_the_row(corpus, kimi_dir, tmp_path, monkeypatch):
    """gigatoken made to give a wrong id for one conversation's content (the first sampled
    for the check in packing order): its template check names the row and the flag that
    turns gigatoken off, and that flag builds the golden rows."""
    import gigatoken

    from fixed_sft.chat import BPEMismatch

    order = permutation(5, len(corpus[1]))
    first = int(order[sampled(order, 8)][0])
    marker = corpus[1][first]["messages"][0]["content"]
    encode = gigatoken.Tokenizer.encode

    def wrong(self, text):
        ids = encode(self, text)
        if marker in text:
            ids = ids.copy()
            ids[-1] = 163600 if ids[-1] != 163600 else 163601
        return ids

    monkeypatch.setattr(gigatoken.Tokenizer, "encode", wrong)
    message = (
        rf"^source row {first} \(id {corpus[1][first]['id']}\): gigatoken's ids of the rendered chat template "
        r"differ from tiktoken's; build with --bpe tiktoken$"
    )
    with pytest.raises(BPEMismatch, match=message):
        build(config(corpus[0] / "parquet", kimi_dir, bpe="gigatoken"), tmp_path / "m")
    assert not (tmp_path / "m").exists()
    assert build(config(corpus[0] / "parquet", kimi_dir, bpe="tiktoken"), tmp_path / "t")["rows_sha256"] == (
        GOLDEN_ROWS_SHA256
    )


def test_bpe_gigatoken_when_it_is_not_installed_is_a_usage_error(corpus, kimi_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(build_module, "fast_bpe_installed", lambda: False)
    with pytest.raises(UsageError, match=r"^--bpe gigatoken: gigatoken is not installed \(pip install gigatoken\)$"):
        build(config(corpus[0] / "rows.jsonl", kimi_dir, bpe="gigatoken"), tmp_path / "x")


def test_jsonl_source_gives_the_same_rows(fixture_build, corpus, kimi_dir, tmp_path):
    _, manifest = fixture_build
    other = build(config(corpus[0] / "rows.jsonl", kimi_dir), tmp_path / "j")
    assert other["row_sha256"] == manifest["row_sha256"]


def test_lazy_build_encodes_only_needed_conversations(corpus, kimi_dir, tmp_path, monkeypatch):
    import fixed_sft.encode

    encoded = []
    original = fixed_sft.encode.conversation

    def counting(record, schema):
        encoded.append(record)
        return original(record, schema)

    monkeypatch.setattr(fixed_sft.encode, "conversation", counting)
    manifest = build(config(corpus[0] / "parquet", kimi_dir, rows=3, check_every=0), tmp_path / "lazy")
    used = {
        s["source_index"]
        for row in pq.read_table(tmp_path / "lazy" / "train.parquet").column("metadata").to_pylist()
        for s in row["segments"]
    }
    assert len(encoded) == len(used) == manifest["stats"]["conversations"]
    assert len(used) < 100


@pytest.mark.parametrize("no_cache", [True, False], ids=["one at a time", "encoded, stored and indexed"])
def test_workers_get_little_more_than_the_rows_need(corpus, kimi_dir, tmp_path, monkeypatch, no_cache):
    """Workers get a chunk only while those in flight hold fewer conversations than the
    rows still need (plus a fifth), not always 2 x workers chunks; whether the build packs
    one conversation at a time or the workers index what they encode."""
    monkeypatch.setattr(build_module, "CHUNK_ROWS", 4)
    monkeypatch.setattr(build_module, "FRESH_CHUNK_ROWS", 4)
    read = []
    chunks = build_module._chunks

    def counting(*args, **kwargs):
        for chunk in chunks(*args, **kwargs):
            read.append(chunk.num_rows)
            yield chunk

    monkeypatch.setattr(build_module, "_chunks", counting)
    cfg = config(corpus[0] / "parquet", kimi_dir, rows=200, workers=4, no_cache=no_cache, cache_dir=str(tmp_path / "c"))
    manifest = build(cfg, tmp_path / "w")
    used = manifest["stats"]["conversations"]
    assert used <= sum(read) <= used + 3 * 4  # 2 x 4 chunks of 4 in flight would reach 28 past


def test_workers_start_one_per_core_and_more_only_for_waiting_chunks(corpus, kimi_dir, tmp_path, monkeypatch):
    """16 workers asked on 2 cores, for a row that takes a chunk or two: 2 processes start
    at once, and at most one more per chunk (when it arrives before either is ready)."""
    from concurrent.futures import ProcessPoolExecutor

    started, chunks = [], []
    spawn, submit = ProcessPoolExecutor._spawn_process, ProcessPoolExecutor.submit
    monkeypatch.setattr(ProcessPoolExecutor, "_spawn_process", lambda self: started.append(1) or spawn(self))
    monkeypatch.setattr(
        ProcessPoolExecutor,
        "submit",
        lambda self, fn, *a: (fn is not time.sleep and chunks.append(1)) or submit(self, fn, *a),
    )
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    manifest = build(config(corpus[0] / "parquet", kimi_dir, rows=1, row_tokens=64, workers=16), tmp_path / "w")
    assert manifest["stats"]["rows"] == 1 and 1 <= len(chunks) <= 2
    assert 2 <= len(started) <= 2 + len(chunks)


def _encoder_config(folder: Path) -> EncoderConfig:
    """The encoder config a build with ``config(..., tokenizer=folder)`` gives its workers."""
    from fixed_sft.hashes import sha256_file
    from fixed_sft.tokenizer import TEMPLATE_KWARGS

    return EncoderConfig(folder, {name: sha256_file(folder / name) for name in FILES}, "kimi_k25", TEMPLATE_KWARGS)


def _tokenizer_copy(kimi_dir: Path, folder: Path) -> Path:
    folder.mkdir()
    for name in FILES:
        (folder / name).write_bytes((kimi_dir / name).read_bytes())
    return folder


def test_workers_take_the_fork_servers_encoder_only_for_its_own_config(kimi_dir, tmp_path, monkeypatch):
    """The fork server loads the encoder its config names; a worker takes it for the same
    config alone (the same JSON: ``1`` is not ``true``), and else loads its own, which
    fails naming a tokenizer file that changed since the build read its sha256."""
    import dataclasses

    from fixed_sft import encode
    from fixed_sft.tokenizer import TokenizerError

    folder = _tokenizer_copy(kimi_dir, tmp_path / "tok")
    config = _encoder_config(folder)
    assert EncoderConfig.from_json(config.to_json()) == config
    preloaded = encode.preload(config.to_json())
    assert preloaded[0] == config.to_json() and isinstance(preloaded[1], ChatEncoder)
    assert encode.preload(None) is None and encode.preload("{") is None
    monkeypatch.setattr(encode, "_preloaded", preloaded)
    assert encode.worker_encoder(config) is preloaded[1]
    other = dataclasses.replace(config, template_kwargs={**config.template_kwargs, "thinking": 1})
    own = encode.worker_encoder(other)
    assert isinstance(own, ChatEncoder) and own is not preloaded[1]

    template = folder / "chat_template.jinja"
    template.write_text(template.read_text() + "\n")
    assert encode.preload(config.to_json()) is None
    error = encode.worker_encoder(other)
    assert isinstance(error, TokenizerError) and "chat_template.jinja changed since the build read" in str(error)
    changed = _encoder_config(folder)
    assert isinstance(encode.worker_encoder(changed), ChatEncoder)
    error = encode.worker_encoder(dataclasses.replace(changed, tokenizer_dir=tmp_path / "gone"))
    assert isinstance(error, TokenizerError) and "gone/tiktoken.model" in str(error)


def test_starting_the_fork_server_leaves_ctrl_c_and_the_environment_as_they_were(kimi_dir):
    import signal

    from fixed_sft.early import BUILDER_VARIABLE
    from fixed_sft.encode import PRELOAD_VARIABLE, WORKER_MODULES
    from fixed_sft.engine import forkserver_context

    handler, mask = signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, [])
    environment = dict(os.environ)
    forkserver_context(WORKER_MODULES, {PRELOAD_VARIABLE: _encoder_config(kimi_dir).to_json(), BUILDER_VARIABLE: "1"})
    assert signal.getsignal(signal.SIGINT) is handler and signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask
    assert dict(os.environ) == environment and PRELOAD_VARIABLE not in os.environ and BUILDER_VARIABLE not in os.environ


ARROW_POOL_IN_WORKER = """
import os
from fixed_sft.engine import forkserver_context
context = forkserver_context(["fixed_sft.engine"], {})
with context.Pool(1) as pool:
    seen = pool.apply(os.getenv, ("ARROW_DEFAULT_MEMORY_POOL",))
print(seen, os.environ.get("ARROW_DEFAULT_MEMORY_POOL"))
"""


@pytest.mark.parametrize("chosen", [None, "jemalloc"])
def test_the_fork_servers_arrow_pool_is_the_c_librarys_unless_one_is_named(chosen):
    """The fork server and its workers allocate Arrow's own buffers (its Parquet reader's
    and writer's) from the C library, unless the caller named a pool; the caller's
    environment is left as it was."""
    environment = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if chosen:
        environment["ARROW_DEFAULT_MEMORY_POOL"] = chosen
    done = subprocess.run(
        [sys.executable, "-c", ARROW_POOL_IN_WORKER], capture_output=True, text=True, timeout=120, env=environment
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ([chosen, chosen] if chosen else ["system", "None"])


# evaluated in a worker: whether it took the fork server's encoder
TOOK_PRELOADED = "__import__('fixed_sft.engine').engine._state is __import__('fixed_sft.encode').encode._preloaded[1]"


def test_workers_of_a_later_build_load_the_encoder_of_its_files(corpus, kimi_dir, tmp_path):
    """Two 2-worker builds in one process, the tokenizer's template edited in between: the
    fork server keeps the first build's encoder, which its workers take; the second
    build's rows are those of its own files (as one worker builds them)."""
    folder = _tokenizer_copy(kimi_dir, tmp_path / "tok")
    header = "<|im_user|>{{role_name}}<|im_middle|>"
    assert (folder / "chat_template.jinja").read_text().count(header) == 1
    one_worker = config(corpus[0] / "parquet", folder, allow_unpinned_tokenizer=True)
    values = {**vars(one_worker), "workers": 2}
    script = f"""
import json, sys
from pathlib import Path
from fixed_sft import encode
from fixed_sft.build import BuildConfig, build, encoder_setup
values = {values!r}
first = build(BuildConfig(**values), Path({str(tmp_path / "first")!r}))
with encode.Encoders(encoder_setup(BuildConfig(**values)).encoder, 2, 8) as encoders:
    took = encoders.engine._pool.submit(eval, {TOOK_PRELOADED!r}).result()
template = Path({str(folder / "chat_template.jinja")!r})
template.write_text(template.read_text().replace({header!r}, {header.replace("}}<", "}}!<")!r}))
second = build(BuildConfig(**values), Path({str(tmp_path / "second")!r}))
print(json.dumps([first["rows_sha256"], took, second["rows_sha256"]]))
"""
    import subprocess

    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    first, took, second = json.loads(run.stdout.splitlines()[-1])
    assert took  # the first build's workers took the server's encoder
    assert second == build(one_worker, tmp_path / "one")["rows_sha256"] != first


def test_a_build_of_many_workers_starts_their_fork_server_before_its_imports(corpus, kimi_dir, tmp_path):
    """From ``EARLY_WORKERS`` workers, the program starts the fork server before it imports
    the build (``fixed_sft.early``); the server waits until the build names its encoder,
    loads it, and the workers take it: the rows are those of one worker. A build that then
    forks no worker (the store gives it all) leaves it waiting, and exits."""
    one = build(config(corpus[0] / "parquet", kimi_dir, rows=None, no_cache=True), tmp_path / "one")
    argv = ["build", "--source", str(corpus[0] / "parquet"), "--tokenizer", str(kimi_dir), "--rows", "all"]
    argv += ["--row-tokens", "1024", "--seed", "5", "--check-every", "8", "--no-card", "--quiet", "--workers", "2"]
    argv += ["--cache-dir", str(tmp_path / "store")]

    def run(out: str, took: bool) -> list:
        script = f"""
import json, sys
from fixed_sft import cli, early, engine
cli.EARLY_WORKERS = 2
engine.usable_cores = lambda: 2
seen, start = [], early.start
modules = ("fixed_sft.build", "numpy")
early.start = lambda *hint: seen.append(sorted(m for m in modules if m in sys.modules)) or start(*hint)
code = cli.main({argv + ["--out", str(tmp_path / out)]!r}, early=True)
result = [code, seen, early._awaited is None]
if {took!r}:  # (whether a worker takes the server's encoder)
    from fixed_sft import encode
    from fixed_sft.build import encoder_setup
    config = cli._config(cli.parser().parse_args({argv!r}))[0]
    with encode.Encoders(encoder_setup(config).encoder, 2, 8) as encoders:
        result.append(encoders.engine._pool.submit(eval, {TOOK_PRELOADED!r}).result())
print(json.dumps(result))
"""
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.splitlines()[-1])

    import subprocess

    assert run("first", True) == [0, [[]], True, True]  # (it encodes, in the workers: the server was given)
    assert run("later", False) == [0, [[]], False]  # (it encodes nothing: the server waited, and the process ended)
    for out in ("first", "later"):
        assert json.loads((tmp_path / out / "manifest.json").read_text())["rows_sha256"] == one["rows_sha256"]


@pytest.mark.parametrize("named", [True, False])
def test_the_early_fork_server_loads_the_tokenizer_it_is_told_of_while_it_waits(
    corpus, kimi_dir, tmp_path, monkeypatch, named
) -> None:
    """A server started early loads the tokenizer of the folder the command line names
    before the build gives it its encoder, which then takes that tokenizer as loaded; a
    folder that holds no tokenizer is passed over, and the given encoder loads as before."""
    from fixed_sft import encode
    from fixed_sft.build import encoder_setup

    given = encoder_setup(config(corpus[0] / "parquet", kimi_dir)).encoder
    awaited = tmp_path / "encoder.json"
    first: list = []
    real = encode.load_kimi

    def give() -> None:  # (as the build does, once: as the first load ends, else after a while)
        draft = tmp_path / "draft.json"
        draft.write_text(json.dumps({"encoder": given.to_json(), "renderer": False}))
        draft.replace(awaited)

    loading: list[bool] = []

    def load_kimi(*args):
        loading.append(True)
        try:
            loaded = real(*args)
            if not first:
                first.append((awaited.exists(), loaded))
                give()
        finally:
            loading.pop()
        return loaded

    monkeypatch.setattr(encode, "load_kimi", load_kimi)
    hint = json.dumps([str(kimi_dir if named else tmp_path), None, str(tmp_path / "store"), False])
    timer = threading.Timer(1.0, lambda: None if loading or first else give())  # (without a guess: no hang)
    timer.start()
    try:
        text, loaded = encode.preload(None, None, str(awaited), hint)
    finally:
        timer.cancel()
    assert text == given.to_json()
    assert not (tmp_path / "store").exists()  # (a guess writes into no store folder it would make)
    if named:
        assert first[0] == (False, loaded.tokenizer)  # (loaded before the file was given, and taken)
    else:
        assert first[0][1] is loaded.tokenizer


@pytest.mark.parametrize("renders", [True, False])
def test_the_fork_server_readies_the_check_where_its_workers_render(corpus, kimi_dir, tmp_path, monkeypatch, renders):
    """Where the workers check conversations (they render the template), the fork server
    makes the tiktoken twin they encode the rendered text with, once for them all; where
    they do not, it makes none (the parity ids are kept)."""
    from collections import OrderedDict

    from fixed_sft import encode, tokenizer

    monkeypatch.setattr(tokenizer, "_loaded", OrderedDict())  # (none loaded by an earlier test)
    given = build_module.encoder_setup(config(corpus[0] / "parquet", kimi_dir)).encoder
    given = dataclasses.replace(given, probes=str(tmp_path / "kept" / "probes.json"))
    given.load()  # (keeps the probes and the parity ids)
    monkeypatch.setattr(tokenizer, "_loaded", OrderedDict())
    preloaded = encode.preload(given.to_json(), None, None, None, renders)
    assert preloaded is not None and isinstance(preloaded[1], ChatEncoder)
    kimi = preloaded[1].tokenizer
    assert kimi.bpe == "gigatoken" and (kimi._reference is not None) == renders
    assert renders is False or kimi.reference._encoding is not None


def test_a_signal_as_the_early_fork_server_starts_leaves_it_to_be_given(corpus, kimi_dir, tmp_path):
    """A Ctrl-C as ``early.start`` starts the server (raised once it is unblocked) leaves
    the server named as waiting: a build in the same process then gives it its encoder,
    rather than wait for ever on workers that wait for it."""
    values = {**vars(config(corpus[0] / "parquet", kimi_dir)), "workers": 2}
    script = f"""
import json
import threading
from pathlib import Path
from fixed_sft import early
from fixed_sft.build import BuildConfig, build
real = early.forkserver_context
def interrupted(*args):
    real(*args)
    raise KeyboardInterrupt
early.forkserver_context = interrupted
try:
    early.start()
except KeyboardInterrupt:
    pass
early.forkserver_context = real
manifest = build(BuildConfig(**{values!r}), Path({str(tmp_path / "two")!r}))
print(json.dumps([manifest["rows_sha256"], early._awaited is None]))
"""
    import subprocess

    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows, given = json.loads(done.stdout.splitlines()[-1])
    assert given and rows == build(config(corpus[0] / "parquet", kimi_dir), tmp_path / "one")["rows_sha256"]


@pytest.mark.parametrize(
    "argv, cores, started",
    [
        (["build"], 8, True),
        (["build"], 7, False),
        (["build", "--workers", "8"], 16, True),
        (["build", "--workers=4"], 16, False),
        (["build", "--workers=4", "--workers", "8"], 16, True),
        (["build", "--workers", "8", "--workers=4"], 16, False),
        (["build", "--work", "2"], 16, False),
        (["build", "--workers"], 16, False),
        (["build", "--workers", "16"], 4, False),
        (["build", "--workers", "many"], 16, False),
        (["build", "--help"], 16, False),
        (["verify", "out"], 16, False),
    ],
)
def test_the_fork_server_starts_early_for_builds_of_many_workers(argv, cores, started, monkeypatch) -> None:
    from fixed_sft import cli, early, engine, plots

    calls: list[int] = []
    monkeypatch.setattr(early, "start", lambda *hint: calls.append(1))
    monkeypatch.setattr(plots, "start_early", lambda lazy=False: None)
    monkeypatch.setattr(engine, "usable_cores", lambda: cores)
    cli._start_early(argv)
    assert calls == ([1] if started else [])


@pytest.mark.parametrize(
    "argv, started",
    [
        (["build"], True),
        (["build", "--workers", "16", "--no-cache"], True),
        (["build", "--workers", "16"], True),
        (["build", "--no-card"], False),
        (["build", "--no-car"], False),
        (["build", "--no-ca"], False),  # (ambiguous: the build's parser names the error)
        (["build", "--help"], False),
        (["verify", "out"], False),
    ],
)
def test_the_drawing_process_starts_early_for_builds_with_a_card(argv, started, monkeypatch) -> None:
    """The program starts the card's drawing process before the build's imports, as it reads
    the command line: not for a build without a card, nor for another command; one that
    imports matplotlib only when asked for a build of ``engine.MANY_WORKERS`` workers or more
    without the store (which encodes: ``plots.Plotter.encodes``)."""
    from fixed_sft import cli, early, engine, plots

    calls: list[bool] = []
    monkeypatch.setattr(plots, "start_early", lambda lazy=False: calls.append(lazy))
    monkeypatch.setattr(early, "start", lambda *hint: None)
    monkeypatch.setattr(engine, "usable_cores", lambda: 2)
    cli._start_early(argv)
    assert calls == ([engine.MANY_WORKERS <= 16 and "16" in argv and "--no-cache" in argv] if started else [])


@pytest.mark.parametrize(
    "argv, told",
    [
        (["--workers", "8"], (None, None, None, False)),
        (["--tokenizer", "KIMI", "--bpe", "tiktoken"], ("KIMI", "tiktoken", None, False)),
        (["--tok", "KIMI", "--cache-dir", "STORE"], ("KIMI", None, "STORE", False)),
        (["--tokenizer", "KIMI", "--no-cache"], ("KIMI", None, None, True)),
        (["--tokenizer", "ELSEWHERE"], ("ELSEWHERE", None, None, False)),
    ],
)
def test_the_early_fork_server_is_told_the_tokenizer_folder(argv, told, kimi_dir, tmp_path, monkeypatch) -> None:
    """The early start passes ``--tokenizer``, ``--bpe``, ``--cache-dir`` and ``--no-cache``
    on; the server is told of a folder only where it holds ``tiktoken.model`` (a spec name,
    a Hub id or a Hugging Face folder is left to the build)."""
    from fixed_sft import cli, early, engine, plots

    names = {"KIMI": str(kimi_dir), "ELSEWHERE": str(tmp_path), "STORE": str(tmp_path / "store")}
    argv = [names.get(arg, arg) for arg in argv]
    told = tuple(names.get(arg, arg) if isinstance(arg, str) else arg for arg in told)
    calls: list[tuple] = []
    start = early.start
    monkeypatch.setattr(early, "start", lambda *given: calls.append(given))
    monkeypatch.setattr(engine, "usable_cores", lambda: 8)
    monkeypatch.setattr(plots, "start_early", lambda lazy=False: None)
    cli._start_early(["build", *argv])
    assert calls == [told]
    environments: list[dict] = []
    monkeypatch.setattr(early, "_awaited", None)
    monkeypatch.setattr(early, "forkserver_context", lambda modules, environment: environments.append(environment))
    start(*told)
    hint = environments[0].get(early.HINT_VARIABLE)
    assert hint == (json.dumps(list(told)) if told[0] == str(kimi_dir) else None)


def test_rows_all_packs_everything(corpus, kimi_dir, tmp_path, encoder):
    """Every full row of the whole stream; the partial last one is dropped."""
    from fixed_sft.order import permutation

    rows = corpus[1][:60]
    synthetic.write_jsonl(rows, tmp_path / "small.jsonl")
    manifest = build(config(tmp_path / "small.jsonl", kimi_dir, rows=None, row_tokens=512), tmp_path / "all")
    owner, mask = [], []  # per token of the stream: its conversation, its mask
    for index in permutation(5, len(rows)).tolist():
        unit_mask = encoder.encode(rows[index]["messages"])[1] + [0]
        owner += [index] * len(unit_mask)
        mask += unit_mask
    full = len(mask) // 512
    kept = [k for k in range(full) if any(mask[k * 512 + 1 : (k + 1) * 512])]  # token 0 trains nothing
    stats = manifest["stats"]
    assert (stats["rows"], stats["rows_skipped"], stats["tail_tokens_dropped"]) == (
        len(kept),
        full - len(kept),
        len(mask) % 512,
    )
    assert stats["conversations"] == len({owner[t] for k in kept for t in range(k * 512, (k + 1) * 512)})


def test_too_many_rows_is_an_error(corpus, kimi_dir, tmp_path):
    with pytest.raises(BuildError, match="fills only"):
        build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=100_000), tmp_path / "big")
    assert not (tmp_path / "big").exists()


def test_all_zero_mask_rows_are_dropped(kimi_dir, tmp_path):
    rows = [{"id": f"u{i}", "messages": [{"role": "user", "content": "word " * 300}], "source": "t"} for i in range(30)]
    rows[17]["messages"].append({"role": "assistant", "content": "ok"})
    synthetic.write_jsonl(rows, tmp_path / "users.jsonl")
    manifest = build(config(tmp_path / "users.jsonl", kimi_dir, rows=1, row_tokens=64, seed=0), tmp_path / "o")
    assert manifest["stats"]["rows"] == 1
    assert manifest["stats"]["rows_skipped"] > 0
    _, mask, _ = read_rows(tmp_path / "o" / "train.parquet")
    assert mask.any()


def test_a_row_whose_only_supervised_token_is_its_first_is_skipped(kimi_dir, tmp_path, encoder):
    """A trainer predicts token p from the tokens before it, so a row whose only
    supervised token is token 0 trains nothing: it is skipped like an all-0 row."""
    from fixed_sft.order import permutation

    answer = {
        "id": "a",
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}],
        "source": "t",
    }
    talk = {"id": "b", "messages": [{"role": "user", "content": "word " * 400}], "source": "t"}
    seed = next(s for s in range(100) if permutation(s, 2).tolist() == [0, 1])  # the answer first
    mask = encoder.encode(answer["messages"])[1]
    last = max(i for i, m in enumerate(mask) if m)  # its <|im_end|>
    synthetic.write_jsonl([answer, talk], tmp_path / "two.jsonl")
    manifest = build(
        config(tmp_path / "two.jsonl", kimi_dir, rows=None, row_tokens=last, seed=seed, check_every=1), tmp_path / "o"
    )
    stats = manifest["stats"]
    assert stats["rows"] == 1 and stats["rows_skipped"] >= 1  # the row starting at the <|im_end|> is gone
    _, kept, _ = read_rows(tmp_path / "o" / "train.parquet")
    assert kept.sum() == sum(mask[:last]) == stats["supervised_tokens"]
    assert stats["trainable_tokens"] == sum(mask[1:last])


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"row_tokens": 1}, "row-tokens"),
        ({"rows": 0}, "rows"),
        ({"seed": -1}, "seed"),
        ({"loss_mask_type": "nope"}, "loss-mask-type"),
        ({"bpe": "sentencepiece"}, r"^unknown --bpe 'sentencepiece' \(known: gigatoken, tiktoken\)$"),
    ],
)
def test_bad_parameters(corpus, kimi_dir, tmp_path, overrides, message):
    with pytest.raises(UsageError, match=message):
        build(config(corpus[0] / "rows.jsonl", kimi_dir, **overrides), tmp_path / "x")


def test_refuses_a_folder_that_is_not_a_build(corpus, kimi_dir, tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("keep me")
    with pytest.raises(UsageError, match="not a previous build"):
        build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=1), tmp_path / "notes")
    assert (tmp_path / "notes" / "mine.txt").read_text() == "keep me"


def test_builds_into_an_empty_folder(corpus, kimi_dir, tmp_path):
    (tmp_path / "empty").mkdir()
    build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=1, no_card=False), tmp_path / "empty")
    card = ["README.md", "supervised_ratio.png", "conversation_tokens.png", "source_mix.png"]
    assert sorted(p.name for p in (tmp_path / "empty").iterdir()) == sorted(["manifest.json", "train.parquet", *card])


def test_rebuild_replaces_a_previous_build(fixture_build, corpus, kimi_dir, tmp_path):
    out = tmp_path / "re"
    build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=2), out)
    manifest = build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=3), out)
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".re.")) == [".re.lock"]


def test_a_build_of_the_earlier_format_is_replaced(corpus, kimi_dir, tmp_path):
    out = tmp_path / "old"
    build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=2), out)
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "format": "fixed-sft/1"}))
    assert build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=3), out)["format"] == "fixed-sft/2"


def test_a_folder_with_a_foreign_manifest_is_not_replaced(corpus, kimi_dir, tmp_path):
    victim = tmp_path / "app"
    victim.mkdir()
    (victim / "manifest.json").write_text('{"name": "my web app"}')
    (victim / "notes.txt").write_text("keep")
    with pytest.raises(UsageError, match="not a previous build"):
        build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=1), victim)
    assert (victim / "notes.txt").read_text() == "keep"


def test_row_tokens_has_an_upper_limit(corpus, kimi_dir, tmp_path):
    with pytest.raises(UsageError, match="between 2 and"):
        build(config(corpus[0] / "rows.jsonl", kimi_dir, row_tokens=MAX_ROW_TOKENS + 1), tmp_path / "x")


def test_a_held_lock_refuses_a_second_build(corpus, kimi_dir, tmp_path):
    """While another build holds the folder's lock, a build into it is refused and
    touches nothing."""
    import fcntl

    with (tmp_path / ".held.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(BuildError, match="another build is writing"):
            build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=1), tmp_path / "held")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".held.lock"]
    build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=1), tmp_path / "held")  # free again


def test_a_lock_file_is_never_truncated_nor_followed(corpus, kimi_dir, tmp_path):
    """The lock is taken on an existing ``.NAME.lock`` as it is; a symbolic link of that
    name is refused, and what it points to is left alone."""
    (tmp_path / ".kept.lock").write_text("someone's notes")
    build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=1), tmp_path / "kept")
    assert (tmp_path / ".kept.lock").read_text() == "someone's notes"

    (tmp_path / "victim.txt").write_text("keep me")
    (tmp_path / ".linked.lock").symlink_to(tmp_path / "victim.txt")
    with pytest.raises(UsageError, match=re.escape(f"cannot lock {tmp_path / '.linked.lock'}: it is a symbolic link")):
        build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=1), tmp_path / "linked")
    assert (tmp_path / "victim.txt").read_text() == "keep me"
    assert not (tmp_path / "linked").exists()


def test_an_output_inside_a_build_or_a_source_folder_is_refused(corpus, kimi_dir, tmp_path):
    good = tmp_path / "good"
    build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=1), good)
    before = sorted(p.name for p in good.iterdir())
    with pytest.raises(UsageError, match=f"inside the build {good}"):
        build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=1), good / "sub" / "deeper")
    assert sorted(p.name for p in good.iterdir()) == before  # no lock file or folder left in it
    with pytest.raises(UsageError, match="inside the source folder"):
        build(config(corpus[0] / "parquet", kimi_dir, rows=1), corpus[0] / "parquet" / "out")
    assert not (corpus[0] / "parquet" / "out").exists()


def test_an_output_that_holds_the_token_store_is_refused_before_building(corpus, kimi_dir, tmp_path, monkeypatch):
    """A store inside the output would be written into it, which then is no build; a
    previous build there is left as it was."""
    source = corpus[0] / "rows.jsonl"
    build(config(source, kimi_dir, rows=1, no_cache=True), tmp_path / "o")
    before = sorted(p.name for p in (tmp_path / "o").iterdir())
    for cache in (tmp_path / "o" / "cache", tmp_path / "o"):
        with pytest.raises(UsageError, match=f"the token store {cache} is inside the output {tmp_path / 'o'}; choose"):
            build(config(source, kimi_dir, rows=1, cache_dir=str(cache)), tmp_path / "o")
        assert sorted(p.name for p in (tmp_path / "o").iterdir()) == before
    monkeypatch.setenv("FIXED_SFT_CACHE", str(tmp_path / "o" / "store"))
    with pytest.raises(UsageError, match="is inside the output"):
        build(config(source, kimi_dir, rows=1), tmp_path / "o")
    build(config(source, kimi_dir, rows=1, no_cache=True), tmp_path / "o")  # (no store: nothing written there)


def test_an_output_that_is_a_mount_point_is_refused_before_building(corpus, kimi_dir, tmp_path, monkeypatch):
    """No rename replaces a mount point: a build into one would fail only at its end."""
    from fixed_sft import folder

    mount = Path("/proc")  # (a mount point wherever there is /proc; the check comes first)
    if not os.path.ismount(mount):
        mount = Path("/")
    with pytest.raises(UsageError, match=f"output {mount} is a mount point, which a build cannot replace"):
        folder.check_target(mount, str(corpus[0] / "rows.jsonl"))
    bound = tmp_path / "a volume"  # (a bind mount of the same device: listed in mountinfo alone)
    bound.mkdir()
    listed = tmp_path / "mountinfo"
    listed.write_text(f"36 35 98:0 /src {str(bound).replace(' ', chr(92) + '040')} rw,noatime - ext4 /dev/x rw\n")
    monkeypatch.setattr(folder, "MOUNTINFO", listed)
    with pytest.raises(UsageError, match="is a mount point"):
        folder.check_target(bound, str(corpus[0] / "rows.jsonl"))
    folder.check_target(tmp_path / "elsewhere", str(corpus[0] / "rows.jsonl"))


def test_an_output_that_is_or_holds_the_current_folder_is_refused(corpus, kimi_dir, tmp_path, monkeypatch, capsys):
    """A build moves its target away as it publishes: never the folder the user stands in
    (``--out .``; ``--out ''`` is refused as empty), nor one that holds it, even where it
    is empty or a previous build."""
    from fixed_sft.cli import main

    here = tmp_path / "empty" / "here"
    here.mkdir(parents=True)
    monkeypatch.chdir(here)
    for out, which in ((".", "the current folder"), ("..", "a folder that holds the current one")):
        with pytest.raises(UsageError, match=f"output {Path(out).resolve()} is {which}; choose another --out"):
            build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=1), Path(out))
    argv = ["build", "--source", str(corpus[0] / "rows.jsonl"), "--tokenizer", str(kimi_dir), "--rows", "1"]
    assert main([*argv, "--row-tokens", "256", "--workers", "1", "--quiet", "--out", ""]) == 2
    assert capsys.readouterr().err == "error: --out must not be empty\n"
    assert Path.cwd() == here and here.is_dir() and sorted(tmp_path.rglob("*")) == [tmp_path / "empty", here]
    monkeypatch.chdir(tmp_path)
    build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=1), here)  # (from elsewhere: an empty folder is replaced)
    monkeypatch.chdir(here)
    with pytest.raises(UsageError, match="is the current folder"):
        build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=1), Path("."))


def test_a_source_that_fills_no_row_is_an_error(kimi_dir, tmp_path):
    synthetic.write_jsonl(synthetic.conversations(1, seed=1), tmp_path / "one.jsonl")
    with pytest.raises(BuildError, match="fills only 0 rows of 8192 tokens with supervised tokens; a build needs"):
        build(config(tmp_path / "one.jsonl", kimi_dir, rows=None, row_tokens=8192), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    bad = ['{"id": "a", "messages": [{"role": "robot", "content": "x"}]}', '{"id": "b", "messages": []}', '{"id": "c"}']
    (tmp_path / "bad.jsonl").write_text("\n".join(bad) + "\n")
    says = r"fills only 0 rows of 4 tokens with supervised tokens \(3 source rows skipped as invalid, of 3\); a build"
    with pytest.raises(BuildError, match=says):
        build(config(tmp_path / "bad.jsonl", kimi_dir, rows=None, row_tokens=4, skip_invalid=True), tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("workers", [1, 4])
@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_an_empty_source_is_an_error_with_the_store_and_workers(kimi_dir, tmp_path, token_store, workers, kind):
    """With 4 workers the build packs in them: an empty source fills no row there too."""
    path = tmp_path / f"empty.{kind}"
    if kind == "jsonl":
        path.write_text("")
    else:
        messages = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
        pq.write_table(pa.table({"id": pa.array([], pa.string()), "messages": pa.array([], messages)}), path)
    for rows, says in ((1, "--rows is 1"), (None, "a build needs at least one")):
        with pytest.raises(BuildError, match=f"fills only 0 rows of 16 tokens with supervised tokens; {says}"):
            build(config(path, kimi_dir, rows=rows, row_tokens=16, workers=workers), tmp_path / "out")
        assert not (tmp_path / "out").exists()


def test_an_output_that_is_a_link_is_rebuilt_where_it_points(corpus, kimi_dir, tmp_path):
    real, link = tmp_path / "real", tmp_path / "link"
    build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=1), real)
    link.symlink_to(real)
    manifest = build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=2), link)
    assert link.is_symlink() and json.loads((real / "manifest.json").read_text()) == manifest
    assert sorted(p.name for p in tmp_path.iterdir()) == [".real.lock", "link", "real"]


def test_overlapping_builds_switch_the_allocator_back_once_both_end():
    import pyarrow as pa

    from fixed_sft.memory import system_allocator

    before = pa.default_memory_pool().backend_name
    first, second = system_allocator(), system_allocator()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # the second build still runs
    assert pa.default_memory_pool().backend_name == "system"
    second.__exit__(None, None, None)
    assert pa.default_memory_pool().backend_name == before != "system"


def test_refuses_a_file_as_the_output(corpus, kimi_dir, tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(UsageError, match="not a previous build"):
        build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=1), tmp_path / "notes.txt")
    assert (tmp_path / "notes.txt").read_text() == "keep me"


def test_a_build_folder_holding_another_file_is_not_replaced(corpus, kimi_dir, tmp_path):
    """A fixed-sft manifest is not enough: a folder that also holds other files is not a build."""
    out = tmp_path / "b"
    build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=1), out)
    (out / "notes.txt").write_text("keep")
    with pytest.raises(UsageError, match="not a previous build"):
        build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=2), out)
    assert (out / "notes.txt").read_text() == "keep"


def test_an_output_inside_a_source_folder_given_relative_is_refused(corpus, kimi_dir, monkeypatch):
    monkeypatch.chdir(corpus[0])
    with pytest.raises(UsageError, match="inside the source folder"):
        build(config("parquet", kimi_dir, rows=1), corpus[0] / "parquet" / "out")
    assert not (corpus[0] / "parquet" / "out").exists()


def test_a_folder_with_a_manifest_of_another_format_is_not_replaced(corpus, kimi_dir, tmp_path):
    victim = tmp_path / "app"
    victim.mkdir()
    (victim / "manifest.json").write_text('{"format": "other/1"}')
    with pytest.raises(UsageError, match="not a previous build"):
        build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=1), victim)
    assert (victim / "manifest.json").read_text() == '{"format": "other/1"}'


@pytest.mark.parametrize("manifest", ["repeated key", "sparse 3 GB"])
def test_a_target_whose_manifest_a_build_would_not_write_is_not_replaced(corpus, kimi_dir, tmp_path, manifest):
    """A target's manifest is read as verify reads one: strictly and bounded in size."""
    victim = tmp_path / "app"
    victim.mkdir()
    (victim / "manifest.json").write_text('{"format": "other/1", "format": "fixed-sft/2"}')
    if manifest == "sparse 3 GB":
        (victim / "manifest.json").write_text('{"format": "fixed-sft/2"}')
        with (victim / "manifest.json").open("r+b") as f:
            f.truncate(3 << 30)
    with pytest.raises(UsageError, match="not a previous build .its manifest.json cannot be read as JSON."):
        build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=1), victim)
    assert (victim / "manifest.json").exists()


def _lookalike(folder: Path, parquet: str) -> Path:
    """A folder holding a fixed-sft manifest and a ``train.parquet`` that is not a regular file."""
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"format": "fixed-sft/2", "name": "mine"}))
    data = folder.parent / "data.parquet"
    data.write_bytes(b"PAR1 my rows")
    if parquet == "folder":  # Spark's and pyarrow.dataset.write_dataset's layout
        (folder / "train.parquet").mkdir()
        (folder / "train.parquet" / "part-0.parquet").write_bytes(b"PAR1 my rows")
    else:
        (folder / "train.parquet").symlink_to(data)
    return folder


def _tree(folder: Path) -> dict[str, bytes | str]:
    return {
        p.relative_to(folder).as_posix(): f"-> {os.readlink(p)}" if p.is_symlink() else p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_symlink() or p.is_file()
    }


@pytest.mark.parametrize("parquet", ["folder", "link"])
def test_a_manifest_beside_a_parquet_that_is_no_regular_file_is_not_replaced(corpus, kimi_dir, tmp_path, parquet):
    """A previous build holds only regular files the format names: a ``train.parquet``
    folder or link beside a fixed-sft manifest makes the build refuse, touching nothing."""
    victim = _lookalike(tmp_path / "out", parquet)
    before = _tree(tmp_path)
    with pytest.raises(UsageError, match=f"output {victim} exists and is not a previous build .*train.parquet"):
        build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=1), victim)
    assert _tree(tmp_path) == before


def test_a_manifest_that_is_a_link_is_not_a_build(corpus, kimi_dir, tmp_path):
    good = tmp_path / "good"
    build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=1), good)
    victim = tmp_path / "out"
    victim.mkdir()
    (victim / "manifest.json").symlink_to(good / "manifest.json")
    with pytest.raises(UsageError, match="not a previous build .*manifest.json"):
        build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=1), victim)
    assert (victim / "manifest.json").is_symlink() and (good / "manifest.json").is_file()


@pytest.mark.parametrize("kind", ["tmp", "old"])
def test_a_leftover_folder_holding_anything_else_is_refused(corpus, kimi_dir, tmp_path, kind):
    """The temporary and old folders a killed build leaves are deleted by the next one only
    when they hold a build's files alone; otherwise the build refuses, naming the folder."""
    leftover = _lookalike(tmp_path / f".out.{kind}-123", "folder")
    before = _tree(tmp_path)
    with pytest.raises(UsageError, match=re.escape(str(leftover))):
        build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=1), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert _tree(tmp_path) == {**before, ".out.lock": b""}  # (the lock, taken before the folders are looked at)


def test_an_output_that_changes_during_the_build_is_left_as_it_is(corpus, kimi_dir, tmp_path, monkeypatch):
    """A file put into the previous build while the new one runs is never deleted: the
    folder is no longer a previous build, so the build stops and publishes nothing."""
    out = tmp_path / "out"
    first = build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=1), out)
    real = build_module._build_into

    def and_meanwhile(*args, **kwargs):
        manifest = real(*args, **kwargs)
        (out / "notes.txt").write_text("keep")
        return manifest

    monkeypatch.setattr(build_module, "_build_into", and_meanwhile)
    with pytest.raises(BuildError, match=f"output {out} changed during the build .*notes.txt"):
        build(config(corpus[0] / "rows.jsonl", kimi_dir, rows=2), out)
    assert (out / "notes.txt").read_text() == "keep"
    assert json.loads((out / "manifest.json").read_text()) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock", "out"]


def test_conversations_are_counted_in_kept_rows_only(kimi_dir, tmp_path):
    """Conversations in all-0 rows that were dropped are not counted, nor split by them."""
    rows = [{"id": f"u{i}", "messages": [{"role": "user", "content": "word " * 300}], "source": "t"} for i in range(30)]
    rows[17]["messages"].append({"role": "assistant", "content": "ok"})
    synthetic.write_jsonl(rows, tmp_path / "users.jsonl")
    manifest = build(config(tmp_path / "users.jsonl", kimi_dir, rows=1, row_tokens=64, seed=0), tmp_path / "o")
    metadata = pq.read_table(tmp_path / "o" / "train.parquet").column("metadata").to_pylist()
    used = {s["source_index"] for row in metadata for s in row["segments"]}
    stats = manifest["stats"]
    assert stats["rows_skipped"] > 0
    assert (stats["conversations"], stats["conversations_split"]) == (len(used), 0)


def test_a_source_file_damaged_in_the_hub_cache_stops_the_build(kimi_dir, tmp_path):
    """A cached source file whose bytes are not the ones the Hub named it by (here a valid
    Parquet file, so the rows read well) fails the build naming it, and nothing is
    published; each file of the source is checked against its own digest."""
    shards = synthetic.write_parquet(synthetic.conversations(60, seed=2), tmp_path / "rows", rows_per_file=30)
    snapshot = tmp_path / "hub" / "datasets--o--d" / "snapshots" / ("c" * 40)
    for shard in shards:
        cache_link(snapshot, f"data/{shard.name}", shard.read_bytes())
    assert build(config(snapshot, kimi_dir, rows=2, row_tokens=256), tmp_path / "ok")["stats"]["rows"] == 2

    other = hashlib.sha256(b"the bytes the Hub holds").hexdigest()
    (snapshot / "data" / shards[1].name).unlink()
    cache_link(snapshot, f"data/{shards[1].name}", shards[1].read_bytes(), etag=other)
    with pytest.raises(BuildError, match=f"data/{shards[1].name} is damaged in the Hugging Face cache"):
        build(config(snapshot, kimi_dir, rows=2, row_tokens=256), tmp_path / "damaged")
    assert not (tmp_path / "damaged").exists()


@pytest.mark.parametrize("when", ["before reading", "after reading"])
def test_a_source_file_that_changes_during_the_build_is_an_error(kimi_dir, tmp_path, monkeypatch, when):
    """Rows, row count, size and hash must all be of one version of each file: a file
    written to while the build reads it stops the build, and nothing is published."""
    source = synthetic.write_jsonl(synthetic.conversations(60, seed=2), tmp_path / "rows.jsonl")
    extra = (json.dumps(synthetic.conversations(61, seed=2)[60]) + "\n").encode()
    patched = "open_source" if when == "before reading" else "read_band"
    original = getattr(build_module, patched)

    def then_append(*args, **kwargs):
        result = original(*args, **kwargs)
        with open(source, "ab") as f:
            f.write(extra)
        return result

    monkeypatch.setattr(build_module, patched, then_append)
    with pytest.raises(SourceError, match=re.escape(f"{source} changed while the build read it")):
        build(config(source, kimi_dir, rows=2, row_tokens=256), tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_a_damaged_cached_source_is_named_whatever_error_it_causes(kimi_dir, tmp_path):
    """Damaged bytes usually fail before the end of the build, where every file's hash is
    compared: the error they cause is explained by naming the damaged file instead."""
    good = synthetic.write_jsonl(synthetic.conversations(60, seed=2), tmp_path / "rows.jsonl").read_bytes()
    snapshot = tmp_path / "hub" / "datasets--o--d" / "snapshots" / ("c" * 40)
    link = cache_link(snapshot, "rows.jsonl", good)
    link.resolve().write_bytes(good.replace(b'"messages"', b'"massages"'))  # every row now invalid
    with pytest.raises(BuildError, match=re.escape(f"{link} is damaged in the Hugging Face cache")):
        build(config(snapshot, kimi_dir, rows=2, row_tokens=256), tmp_path / "o")

    shard = synthetic.write_parquet(synthetic.conversations(60, seed=2), tmp_path / "rows.parquet")[0].read_bytes()
    snapshot = tmp_path / "hub" / "datasets--o--p" / "snapshots" / ("c" * 40)
    link = cache_link(snapshot, "rows.parquet", shard)
    link.resolve().write_bytes(shard[: len(shard) // 2])  # cut short: not even readable Parquet
    with pytest.raises(SourceError, match=re.escape(f"{link} is damaged in the Hugging Face cache")):
        build(config(snapshot, kimi_dir, rows=2, row_tokens=256), tmp_path / "o")
    assert not (tmp_path / "o").exists()


@pytest.fixture(scope="module")
def boundaries_build(corpus, kimi_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("builds") / "boundaries"
    return out, build(config(corpus[0] / "parquet", kimi_dir, emit_boundaries=True), out)


def test_golden_rows_sha256_with_boundaries(boundaries_build):
    _, manifest = boundaries_build
    assert manifest["rows_sha256"] == GOLDEN_BOUNDARIES_ROWS_SHA256


def test_boundaries_are_the_segments_ends_and_hashed_as_documented(fixture_build, boundaries_build):
    """The same rows and segments as without the flag, and one more column: each row's
    cu_seqlens, 0 then the end of each segment; the row hash is recomputed here by the rule
    of data/README.md with hashlib alone (ids int32 LE, mask bytes, cu_seqlens int32 LE)."""
    (plain, plain_manifest), (out, manifest) = fixture_build, boundaries_build
    assert (manifest["format"], plain_manifest["format"]) == ("fixed-sft/3", "fixed-sft/2")
    assert manifest["params"] == {**plain_manifest["params"], "emit_boundaries": True}
    assert "emit_boundaries" not in plain_manifest["params"]  # (the default build's manifest is unchanged)
    assert manifest["stats"] == plain_manifest["stats"]
    rows = pq.read_table(out / "train.parquet", columns=["metadata"]).column("metadata").to_pylist()
    plain_rows = pq.read_table(plain / "train.parquet", columns=["metadata"]).column("metadata").to_pylist()
    assert [{k: v for k, v in r.items() if k != "cu_seqlens"} for r in rows] == plain_rows
    digests = []
    for row in rows:
        ends, total = [0], 0
        for segment in row["segments"]:
            total += segment["end"] - segment["start"]
            ends.append(total)
        assert row["cu_seqlens"] == ends and ends[-1] == 1024 and len(ends) == len(row["segments"]) + 1
        data = b"".join(i.to_bytes(4, "little", signed=True) for i in row["input_ids"]) + bytes(row["loss_mask"])
        digests.append(hashlib.sha256(data + b"".join(e.to_bytes(4, "little") for e in ends)).digest())
    assert [d.hex() for d in digests] == manifest["row_sha256"]
    assert hashlib.sha256(b"".join(digests)).hexdigest() == manifest["rows_sha256"] != GOLDEN_ROWS_SHA256
    schema = pq.read_schema(out / "train.parquet").field("metadata").type
    assert schema.field("cu_seqlens").type == pa.list_(pa.int32())
    assert pq.read_schema(plain / "train.parquet").field("metadata").type.get_field_index("cu_seqlens") == -1


EARLY_DRAWING = """
import json, sys
from fixed_sft import cli, plots
started, real = [], plots.start_early
plots.start_early = lambda lazy=False: real(lazy) or started.append(plots._early)
try:
    code = cli.main(ARGV, early=True)
except SystemExit as stopped:  # (the parser's usage error)
    code = stopped.code
process = started[0] if started else None  # (its exit: 0 where it drew, -9 where it was killed)
ended = None if process is None else process.poll()
print(json.dumps([code, len(started), plots._early is None, ended, "matplotlib" in sys.modules]))
"""


def _early_drawing(argv: list[str]) -> list:
    """What the program's ``main`` does with the drawing process it starts early, in a
    process of its own without matplotlib loaded."""
    import subprocess

    script = EARLY_DRAWING.replace("ARGV", repr(argv))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_build_draws_its_card_in_the_process_started_early(corpus, kimi_dir, tmp_path):
    """The program's build takes the drawing process it started before its imports: the
    card is drawn there (matplotlib never loaded here), as a build drawing here draws it."""
    source = corpus[0] / "parquet"
    argv = ["build", "--source", str(source), "--tokenizer", str(kimi_dir), "--rows", "3", "--row-tokens", "512"]
    argv += ["--seed", "5", "--workers", "1", "--quiet", "--no-cache", "--out", str(tmp_path / "early")]
    assert _early_drawing(argv) == [0, 1, True, 0, False]  # (it drew, and ended)
    here = build(config(source, kimi_dir, rows=3, row_tokens=512, no_cache=True, no_card=False), tmp_path / "here")
    early = json.loads((tmp_path / "early" / "manifest.json").read_text())
    plots = {name: hashed for name, hashed in early["card"]["files"].items() if name.endswith(".png")}
    assert plots and plots == {name: here["card"]["files"][name] for name in plots}
    assert early["rows_sha256"] == here["rows_sha256"]


@pytest.mark.parametrize(
    "argv, code, started",
    [
        (["build", "--bogus"], 2, 1),  # (the parser's usage error)
        (["build", "--row-tokens", "0"], 2, 1),  # (the build's own)
        (["build", "--he"], 0, 0),  # (help, abbreviated)
    ],
)
def test_a_drawing_process_no_build_takes_ends_with_the_command(argv, code, started, tmp_path):
    """A command line the build rejects, or a help, leaves no drawing process behind: the
    one started early is killed as the command returns."""
    ended = -9 if started else None
    assert _early_drawing([*argv, "--out", str(tmp_path / "out")]) == [code, started, True, ended, False]


def test_git_failing_for_a_moment_is_asked_again(monkeypatch):
    """git failing once (a busy machine) does not leave a build without its commit, which
    another build of the same code records."""
    import subprocess

    import fixed_sft.build as build_module

    expected = build_module.code_version()
    if "git_commit" not in expected:
        pytest.skip("the package is not in its project's checkout")
    calls, run = [], subprocess.run

    def flaky(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise OSError("Resource temporarily unavailable")
        return run(*args, **kwargs)

    monkeypatch.setattr(build_module.subprocess, "run", flaky)
    assert build_module.code_version() == expected and len(calls) == 3

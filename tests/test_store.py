"""The token store: later builds reuse earlier encodings, with the same rows; each key part, damage and sharing."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import synthetic
from conftest import ROOT
from test_build import GOLDEN_ROWS_SHA256

import fixed_sft.encode
from fixed_sft import store as store_module
from fixed_sft.build import BuildConfig, build, encoder_setup
from fixed_sft.chat import ChatEncoder, TemplateMismatch
from fixed_sft.encode import sampled
from fixed_sft.order import permutation
from fixed_sft.store import SegmentWriter, TokenStore, default_dir, store_key


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The golden corpus of tests/test_build.py (1,200 conversations in 3 Parquet files) and its rows."""
    folder = tmp_path_factory.mktemp("corpus")
    rows = synthetic.conversations(1200, seed=5)
    synthetic.write_parquet(rows, folder / "parquet", rows_per_file=400)
    return folder / "parquet", rows


def config(source, kimi_dir, **overrides) -> BuildConfig:
    """tests/test_build.py's golden build (rows_sha256 ``GOLDEN_ROWS_SHA256``, no card), with ``overrides``."""
    from test_build import config as golden

    return golden(source, kimi_dir, **overrides)


@pytest.fixture
def encoded(monkeypatch) -> list[int]:
    """The source rows encoded in this process (one worker), in order."""
    rows: list[int] = []
    original = fixed_sft.encode.encode_rows

    def counting(encoder, chunk):
        for item in original(encoder, chunk):
            rows.append(item.source_index)
            yield item

    monkeypatch.setattr(fixed_sft.encode, "encode_rows", counting)
    monkeypatch.setattr("fixed_sft.build.encode_rows", counting)
    return rows


def _without_store(cfg: BuildConfig, out: Path) -> dict:
    return build(dataclasses.replace(cfg, no_cache=True), out)


def _segments(folder: Path) -> list[Path]:
    return sorted(folder.glob("tokens/*/*.seg"))


def test_the_default_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("FIXED_SFT_CACHE", str(tmp_path / "a"))
    assert default_dir() == tmp_path / "a"
    monkeypatch.delenv("FIXED_SFT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_dir() == tmp_path / "xdg" / "fixed-sft"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_dir() == tmp_path / "home" / ".cache" / "fixed-sft"


def test_a_build_writes_its_conversations_to_the_store(corpus, kimi_dir, tmp_path, token_store, encoded):
    manifest = build(config(corpus[0], kimi_dir), tmp_path / "a")
    assert manifest["rows_sha256"] == GOLDEN_ROWS_SHA256
    segments = _segments(token_store)
    assert segments and all(not p.name.startswith(".") for p in segments)
    assert not list(token_store.glob("tokens/*/.tmp-*"))
    assert len(encoded) >= manifest["stats"]["conversations"]


@pytest.mark.parametrize(
    "later",
    [{"seed": 6}, {"row_tokens": 512}, {"rows": 20}, {"seed": 7, "row_tokens": 700, "rows": 25}],
    ids=["seed", "row-tokens", "rows", "all-three"],
)
def test_a_later_build_reuses_the_store_with_the_same_rows(corpus, kimi_dir, tmp_path, encoded, later):
    """A build of the whole source fills the store; a later build (another seed, row length,
    rows) encodes only the conversations it checks against the template, and its rows and
    manifest are those of a build without the store."""
    build(config(corpus[0], kimi_dir, rows=None), tmp_path / "all")
    assert sorted(encoded) == list(range(1200))
    encoded.clear()
    cfg = config(corpus[0], kimi_dir, **later)
    manifest = build(cfg, tmp_path / "later")
    used = manifest["stats"]["conversations"]
    checked = manifest["template_check"]["checked"]
    assert checked > 0 and len(encoded) <= checked + 1 < used  # (the first build checked some of them)
    assert manifest == _without_store(cfg, tmp_path / "plain")
    assert (tmp_path / "later" / "train.parquet").read_bytes() == (tmp_path / "plain" / "train.parquet").read_bytes()
    encoded.clear()
    assert build(cfg, tmp_path / "again") == manifest  # its checks are stored now: nothing is encoded
    assert encoded == []


@pytest.mark.parametrize("workers", [1, 2])
def test_rows_are_byte_identical_from_the_store_at_each_worker_count(corpus, kimi_dir, tmp_path, workers):
    build(config(corpus[0], kimi_dir, rows=None, seed=1), tmp_path / "fill")
    cfg = config(corpus[0], kimi_dir, workers=workers)
    manifest = build(cfg, tmp_path / "stored")
    assert manifest["rows_sha256"] == GOLDEN_ROWS_SHA256
    assert manifest == _without_store(cfg, tmp_path / "plain")
    assert (tmp_path / "stored" / "train.parquet").read_bytes() == (tmp_path / "plain" / "train.parquet").read_bytes()


@pytest.mark.parametrize(
    ("rows", "workers"),
    [(None, 1), (None, 2), (None, 4), (50, 2)],
    ids=["the fill, 1 worker", "the fill, 2 workers", "the fill read here (fewer files than workers)", "a band"],
)
def test_rows_read_after_a_source_file_changed_are_not_stored(corpus, kimi_dir, tmp_path, token_store, workers, rows):
    """The store's key hashes the source as the build opens it: a file written to once the
    key is made (here, as the entry opens) stops the build, and what was read of its new
    bytes is not stored under the old bytes' key, so the file put back builds the right rows."""
    import shutil

    source = tmp_path / "source"
    shutil.copytree(corpus[0], source)
    first = sorted(source.glob("*.parquet"))[0]
    other = tmp_path / "other"
    synthetic.write_parquet(synthetic.conversations(400, seed=9), other, rows_per_file=400)
    cfg = config(source, kimi_dir, rows=rows, workers=workers)
    _changed_as_the_store_opens(cfg, first, lambda: shutil.copyfile(next(other.glob("*.parquet")), first), tmp_path)


def _changed_as_the_store_opens(cfg: BuildConfig, path: Path, change, tmp_path: Path) -> None:
    """A build of ``cfg`` whose source file ``path`` is changed by ``change()`` as the build
    opens its store entry stops, naming it; with the file put back, the store gives the
    rows a build without it gives (nothing of the other bytes was stored)."""
    import fixed_sft.build

    original = path.read_bytes()
    opened = fixed_sft.build._open_store

    def open_then_change(*args, **kwargs):
        entry = opened(*args, **kwargs)
        change()
        return entry

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fixed_sft.build, "_open_store", open_then_change)
        with pytest.raises(Exception, match=f"{path} changed while the build read it"):
            build(cfg, tmp_path / "changed")
    path.write_bytes(original)
    assert build(cfg, tmp_path / "stored")["rows_sha256"] == _without_store(cfg, tmp_path / "plain")["rows_sha256"]


@pytest.mark.parametrize("how", ["written in place", "put in its place"])
def test_a_source_file_changed_with_its_size_and_time_kept_is_not_stored(kimi_dir, tmp_path, token_store, how):
    """A file rewritten as the build opens its store, with bytes of the same size and its
    modification time set back (as ``cp -p`` or ``touch -r`` do), in place or as a new file
    renamed over it: its change time (or inode) tells, so the build stops and stores
    nothing of the new bytes under the old bytes' key."""
    source = synthetic.write_jsonl(synthetic.conversations(80, seed=3), tmp_path / "rows.jsonl")
    other = source.read_bytes().replace(b"e", b"a")  # (the same size: other text)
    assert len(other) == source.stat().st_size and other != source.read_bytes()

    def rewrite():
        times = source.stat()
        target = source if how == "written in place" else tmp_path / "new.jsonl"
        target.write_bytes(other)
        os.utime(target, ns=(times.st_atime_ns, times.st_mtime_ns))
        if target != source:
            os.replace(target, source)

    _changed_as_the_store_opens(config(source, kimi_dir, rows=None, workers=1), source, rewrite, tmp_path)


def test_no_cache_writes_nothing(corpus, kimi_dir, tmp_path, token_store):
    manifest = build(config(corpus[0], kimi_dir, no_cache=True), tmp_path / "a")
    assert manifest["rows_sha256"] == GOLDEN_ROWS_SHA256
    assert list(token_store.iterdir()) == []


def test_the_cli_takes_cache_dir_and_no_cache(corpus, kimi_dir, tmp_path, token_store):
    from fixed_sft.cli import main

    args = ["build", "--source", str(corpus[0]), "--tokenizer", str(kimi_dir), "--rows", "3", "--row-tokens", "256"]
    args += ["--workers", "1", "--quiet", "--no-card"]
    assert main([*args, "--out", str(tmp_path / "a"), "--cache-dir", str(tmp_path / "mine")]) == 0
    assert _segments(tmp_path / "mine") and list(token_store.iterdir()) == []
    assert main([*args, "--out", str(tmp_path / "b"), "--no-cache"]) == 0
    assert list(token_store.iterdir()) == []
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert "cache_dir" not in json.dumps(manifest["params"]) and "no_cache" not in json.dumps(manifest["params"])


def _key(kimi_dir: Path, **changes) -> str:
    encoder = encoder_setup(BuildConfig(name="k", source="x", tokenizer=str(kimi_dir))).encoder
    sources = changes.pop("source", ["a" * 64, "b" * 64])
    return store_key(sources, dataclasses.replace(encoder, **changes))


@pytest.mark.parametrize(
    "change",
    [
        {"tokenizer_sha256": "other"},
        {"template_kwargs": {"thinking": False}},
        {"loss_mask_type": "assistant"},
        {"source": ["a" * 64, "c" * 64]},
        {"source": ["a" * 64]},
        {"bpe": "other"},
        {"version": 2},
        {"family": "other"},
        {"trust_remote_code": True},
        {"declarations": ("tool_declaration_ts.py", "0" * 64)},
    ],
    ids=[
        "tokenizer-file",
        "template-kwargs",
        "mask-type",
        "source-file",
        "source-files",
        "bpe",
        "encoding-version",
        "family",
        "remote-code",
        "declarations",
    ],
)
def test_each_key_part_changes_the_key(kimi_dir, monkeypatch, change):
    before = _key(kimi_dir)
    assert _key(kimi_dir) == before
    if "version" in change:
        monkeypatch.setattr(store_module, "ENCODING_VERSION", store_module.ENCODING_VERSION + 1)
        change = {}
    elif change.get("tokenizer_sha256"):
        encoder = encoder_setup(BuildConfig(name="k", source="x", tokenizer=str(kimi_dir))).encoder
        name = sorted(encoder.tokenizer_sha256)[0]
        change = {"tokenizer_sha256": {**encoder.tokenizer_sha256, name: "0" * 64}}
    assert _key(kimi_dir, **change) != before


@pytest.mark.parametrize("upgraded", ["python", "pyarrow", "numpy", "transformers"])
def test_the_versions_that_read_and_encode_are_in_the_key(kimi_dir, monkeypatch, upgraded):
    """Python (its JSON reader, Unicode tables) and the libraries that turn the source's
    values into text and encode it: another version of any is another entry."""
    import importlib.metadata

    before = _key(kimi_dir)
    if upgraded == "python":
        monkeypatch.setattr(sys, "version", sys.version + " (another)")
    else:
        real = importlib.metadata.version
        monkeypatch.setattr(importlib.metadata, "version", lambda name: real(name) + ("1" if name == upgraded else ""))
    assert _key(kimi_dir) != before


def test_the_modules_that_encode_are_in_the_key(kimi_dir, monkeypatch, tmp_path):
    package = tmp_path / "fixed_sft"
    package.mkdir()
    for name in store_module.ENCODING_MODULES:
        (package / name).write_bytes((Path(store_module.__file__).parent / name).read_bytes())
    before = _key(kimi_dir)
    (package / "chat.py").write_text((package / "chat.py").read_text() + "\n# changed\n")
    monkeypatch.setattr(store_module, "__file__", str(package / "store.py"))
    assert _key(kimi_dir) != before


# The package's modules that the encoding modules import and that decide nothing of an encoding
OUTSIDE_THE_KEY = {
    "early.py": "starts the fork server",
    "engine.py": "where tasks run",
    "errors.py": "error classes",
    "folder.py": "whether a source folder is a build's output",
    "hashes.py": "files' sha256 and checksummed JSON",
    "hub.py": "downloads",
    "memory.py": "allocators",
    "pages.py": "a source's page sizes, refused as it is opened",
    "parallel.py": "the index a fill task gives back",
    "reader.py": "a Parquet file's footer",
}


def test_every_module_the_encoding_modules_import_is_in_the_key_or_named_outside():
    import ast

    package = Path(store_module.__file__).parent
    imported = set()
    for name in store_module.ENCODING_MODULES:
        for node in ast.walk(ast.parse((package / name).read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                imported |= {f"{node.module}.py"} if node.module else {f"{a.name}.py" for a in node.names}
    assert imported - set(store_module.ENCODING_MODULES) <= set(OUTSIDE_THE_KEY)


def test_other_template_kwargs_encode_again(corpus, kimi_dir, tmp_path, encoded):
    build(config(corpus[0], kimi_dir), tmp_path / "a")
    first = len(encoded)
    encoded.clear()
    cfg = config(corpus[0], kimi_dir, template_kwargs={"thinking": False, "preserve_thinking": False})
    manifest = build(cfg, tmp_path / "b")
    assert len(encoded) == first >= manifest["stats"]["conversations"]


@pytest.mark.parametrize("damage", ["flip", "truncate", "header", "record tokens", "record meta"])
def test_a_damaged_entry_is_encoded_again_and_stored_anew(corpus, kimi_dir, tmp_path, token_store, encoded, damage):
    """Whatever bytes are damaged; a record's size too, which is never read past the file's end."""
    cfg = config(corpus[0], kimi_dir)
    golden = build(cfg, tmp_path / "a")
    [segment] = _segments(token_store)
    data = bytearray(segment.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01  # a byte of some conversation's ids
    elif damage.startswith("record"):  # the first record's tokens (2**36 more) or metadata bytes (2**28 more)
        field = store_module.RECORD.fields[damage.split()[1]][1]
        data[store_module.HEADER_BYTES + field + (4 if damage == "record tokens" else 3)] ^= 0x10
    elif damage == "truncate":
        data = data[: len(data) * 2 // 3]
    else:
        data[0] ^= 0xFF  # the magic: not a segment
    segment.write_bytes(bytes(data))
    encoded.clear()
    again = build(cfg, tmp_path / "b")
    assert again == golden
    assert (tmp_path / "b" / "train.parquet").read_bytes() == (tmp_path / "a" / "train.parquet").read_bytes()
    assert encoded  # the damaged ones, encoded again
    encoded.clear()
    assert build(cfg, tmp_path / "c") == golden
    assert encoded == []  # stored anew


def test_a_segment_of_another_entry_is_not_read(corpus, kimi_dir, tmp_path, token_store, encoded):
    """A segment copied into another source's entry (each record's checksum matches its
    bytes) is not that source's: its rows are encoded again, and the rows are the same."""
    other = tmp_path / "other"
    synthetic.write_parquet(synthetic.conversations(300, seed=6), other, rows_per_file=300)
    cfg = config(other, kimi_dir, rows=None)
    golden = build(cfg, tmp_path / "a")
    [entry] = token_store.glob("tokens/*")
    build(config(corpus[0], kimi_dir), tmp_path / "corpus")
    for segment in entry.glob("*.seg"):
        segment.unlink()
    for segment in _segments(token_store):  # (the corpus's entry's, under the names they had)
        (entry / segment.name).write_bytes(segment.read_bytes())
    encoded.clear()
    assert build(cfg, tmp_path / "b") == golden
    assert sorted(encoded) == list(range(300))


@pytest.mark.timeout(120)
def test_a_fifo_named_as_a_segment_is_passed_over(corpus, kimi_dir, tmp_path, token_store):
    """Opening a FIFO to read it would wait for a writer: the build goes on without it."""
    cfg = config(corpus[0], kimi_dir)
    golden = build(cfg, tmp_path / "a")
    [entry] = token_store.glob("tokens/*")
    os.mkfifo(entry / "00000000000000000000-1-fifo.seg")
    assert build(cfg, tmp_path / "b") == golden


@pytest.mark.parametrize(
    "name",
    [
        "²" * 20 + "-1-a.seg",  # (digits to str.isdigit, not to int)
        "٣" * 20 + "-1-a.seg",  # (digits to both: not a stamp either)
        "{draft}{host}-" + "9" * 30 + "-x",  # (no process has that pid)
        "{draft}{host}-³-x",
    ],
)
def test_a_file_of_another_name_in_an_entry_is_passed_over(corpus, kimi_dir, tmp_path, token_store, name):
    """A file in a store's entry whose name is not one a build writes, but close to one
    (a segment's stamp, a temporary file's pid, in other digits): the build goes on."""
    import socket

    from fixed_sft.store import DRAFT_PREFIX

    cfg = config(corpus[0], kimi_dir)
    golden = build(cfg, tmp_path / "a")
    [entry] = token_store.glob("tokens/*")
    (entry / name.format(draft=DRAFT_PREFIX, host=socket.gethostname())).write_bytes(b"")
    assert build(cfg, tmp_path / "b") == golden


@pytest.mark.parametrize(("limit", "kept"), [(64, 16), (400, 100)])
def test_a_reader_keeps_a_quarter_of_the_open_files_limit(limit, kept):
    """Under a low limit on open files (``ulimit -n 64``), the store's reader leaves the
    build the most of it: a build of many segments would else fail where ``--no-cache`` runs."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]  # (at least 4,096 where builds run)
    code = (
        f"import resource; resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {hard})); "
        "from fixed_sft import store; print(store.OPEN_FILES)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert int(done.stdout) == kept


def test_a_failing_check_of_a_stored_conversation_stops_the_build(corpus, kimi_dir, tmp_path, monkeypatch):
    """A stored conversation sampled for the check that was not checked before is checked
    now; a difference stops the build naming its row, as without the store."""
    build(config(corpus[0], kimi_dir, rows=None, check_every=0), tmp_path / "fill")
    order = permutation(5, len(corpus[1]))
    first = int(order[sampled(order, 8)][0])  # (the first sampled in packing order)

    def differs(self, messages, ids, tools=None):
        raise TemplateMismatch("fast-path ids differ from the rendered chat template")

    monkeypatch.setattr(ChatEncoder, "check", differs)
    with pytest.raises(TemplateMismatch, match=rf"source row {first} \(id {corpus[1][first]['id']}\): fast-path ids"):
        build(config(corpus[0], kimi_dir), tmp_path / "m")
    assert not (tmp_path / "m").exists()


def _store_is_consistent(folder: Path, rows: int) -> int:
    """Every conversation the store's entries hold reads back with its digest; their count."""
    held = 0
    for entry in folder.glob("tokens/*"):
        store = TokenStore(entry, rows)
        for index in (store.segment >= 0).nonzero()[0].tolist():
            assert store.lookup(index) is not None
            held += 1
        assert store.damaged == 0
        store.close()
    return held


def test_two_builds_sharing_a_store_at_once(corpus, kimi_dir, tmp_path, token_store, monkeypatch):
    """Two processes build into one store at the same time, written a few conversations a
    segment: both build the golden rows, and the store they leave reads back whole."""
    small = "import sys, fixed_sft.store as s, fixed_sft.cli as c; s.SEGMENT_CONVERSATIONS = 5; "
    small += "sys.exit(c.main(sys.argv[1:]))"
    command = [sys.executable, "-c", small, "build", "--source", str(corpus[0])]
    command += ["--tokenizer", str(kimi_dir), "--rows", "40", "--row-tokens", "1024", "--seed", "5"]
    command += ["--check-every", "8", "--workers", "1", "--quiet", "--no-card"]
    runs = [
        subprocess.Popen([*command, "--out", str(tmp_path / name)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        for name in ("one", "two")
    ]
    outputs = [run.communicate(timeout=300)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    for name in ("one", "two"):
        assert json.loads((tmp_path / name / "manifest.json").read_text())["rows_sha256"] == GOLDEN_ROWS_SHA256
    assert len(_segments(token_store)) > 2
    assert _store_is_consistent(token_store, 1200) > 0
    assert build(config(corpus[0], kimi_dir), tmp_path / "three")["rows_sha256"] == GOLDEN_ROWS_SHA256


def test_a_killed_build_resumes_from_its_store(corpus, kimi_dir, tmp_path, token_store, encoded, monkeypatch):
    """A build stopped part way (its last segment not written) leaves what it wrote; the next
    build encodes only the rest, and its rows are those of an uninterrupted build."""
    monkeypatch.setattr(store_module, "SEGMENT_CONVERSATIONS", 4)
    cfg = config(corpus[0], kimi_dir, rows=None)
    original = SegmentWriter.flush
    flushes = []

    def killed_after_three(self):
        if len(flushes) == 3:
            raise KeyboardInterrupt
        flushes.append(1)
        original(self)

    monkeypatch.setattr(SegmentWriter, "flush", killed_after_three)
    with pytest.raises(KeyboardInterrupt):
        build(cfg, tmp_path / "killed")
    monkeypatch.setattr(SegmentWriter, "flush", original)
    assert _store_is_consistent(token_store, 1200) == 12
    encoded.clear()
    manifest = build(cfg, tmp_path / "resumed")
    assert len(encoded) == 1200 - 12
    assert manifest == _without_store(cfg, tmp_path / "plain")


def test_a_store_that_cannot_be_made_is_turned_off_with_a_warning(corpus, kimi_dir, tmp_path, capsys):
    (tmp_path / "file").write_text("not a folder")
    manifest = build(config(corpus[0], kimi_dir, cache_dir=str(tmp_path / "file")), tmp_path / "a")
    assert manifest["rows_sha256"] == GOLDEN_ROWS_SHA256
    assert "warning: token store off: cannot use" in capsys.readouterr().err


def _disk_full_for_segments(monkeypatch) -> None:
    """Make every segment of the store fail to be written (as on a full disk)."""
    rename = Path.rename

    def full(self, target):
        if self.name.startswith(store_module.DRAFT_PREFIX):  # (a segment of the store)
            raise OSError(28, "No space left on device")
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", full)


def test_a_store_that_cannot_be_written_is_turned_off_with_a_warning(
    corpus, kimi_dir, tmp_path, token_store, monkeypatch, capsys
):
    _disk_full_for_segments(monkeypatch)
    manifest = build(config(corpus[0], kimi_dir), tmp_path / "a")
    assert manifest["rows_sha256"] == GOLDEN_ROWS_SHA256
    assert "warning: token store off: cannot write" in capsys.readouterr().err
    assert not list(token_store.glob("tokens/*/*"))


def _decoded(monkeypatch) -> list[int]:
    """The rows of each Parquet batch decoded in this process (the build's reads)."""
    import pyarrow.parquet as pq

    batches: list[int] = []
    original = pq.ParquetFile.iter_batches

    def counting(self, *args, **kwargs):
        for batch in original(self, *args, **kwargs):
            batches.append(batch.num_rows)
            yield batch

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", counting)
    return batches


def _bands_of(source: Path, monkeypatch, count: int) -> None:
    """Make ``source`` about ``count`` bands of rows for a build."""
    import fixed_sft.build as build_module
    from fixed_sft.bands import band_bytes, file_bytes
    from fixed_sft.source import open_source

    sizes = file_bytes(open_source(str(source)))
    monkeypatch.setattr(build_module, "BAND_BYTES", sum(sizes) / count / band_bytes(1, sizes))


@pytest.mark.parametrize("workers, large", [(1, False), (2, False), (4, False), (2, True)])
def test_a_build_of_every_row_over_several_bands_decodes_the_source_once(
    corpus, kimi_dir, tmp_path, monkeypatch, workers, large
):
    """A ``--rows all`` build of a source of several bands encodes it into the store in one
    pass (each row read by one task, of its row group, and encoded once; with 2 workers,
    none in the build's process; with more workers than the 3 row groups, or rows counted
    as large, the build's process reads them, once, for the workers to encode), then packs
    from the store: the rows of the band-by-band
    build without the store, which decodes the source once per band. A later build of
    another row length or seed decodes nothing; one that samples more rows for the
    template check reads those to check them, in one pass too."""
    import fixed_sft.build as build_module

    _bands_of(corpus[0], monkeypatch, 4)
    if large:
        monkeypatch.setattr(build_module, "LARGE_ROW_BYTES", 0)
        monkeypatch.setattr(build_module, "LARGE_BAND_BYTES", build_module.BAND_BYTES)
    cfg = config(corpus[0], kimi_dir, rows=None, workers=workers)
    decoded = _decoded(monkeypatch)
    plain = _without_store(cfg, tmp_path / "plain")
    assert sum(decoded) >= 3 * 1200  # (read once per band)
    decoded.clear()
    tasks = []
    fill_tasks = build_module.fill_tasks
    monkeypatch.setattr(build_module, "fill_tasks", lambda *args: (tasks.append(t) or t for t in fill_tasks(*args)))
    assert build(cfg, tmp_path / "filled") == plain
    rows = np.concatenate([task.start + task.local for task in tasks])
    assert sorted(rows.tolist()) == list(range(1200))  # each row in one task
    groups = [(task.path, task.start + task.local[0]) for task in tasks]
    assert len(tasks) == len(set(groups)) == 3  # (a row group per file here)
    assert sum(decoded) == (0 if (workers, large) == (2, False) else 1200)
    decoded.clear()
    assert build(dataclasses.replace(cfg, row_tokens=512), tmp_path / "again")["stats"]["conversations"] == 1200
    assert sum(decoded) == 0
    assert build(dataclasses.replace(cfg, seed=6), tmp_path / "seed")["stats"]["conversations"] == 1200
    assert sum(decoded) == 0
    more = dataclasses.replace(cfg, seed=6, check_every=cfg.check_every // 2)
    assert build(more, tmp_path / "more")["stats"]["conversations"] == 1200
    assert sum(decoded) <= 1200 and ((workers, large) == (2, False) or sum(decoded) > 0)  # (checked ones, read again)


def test_the_sample_checked_is_the_same_at_another_seed(corpus, kimi_dir, tmp_path, monkeypatch):
    """The pass that fills the store checks the sampled rows, as the build without the store
    does; a build at another seed finds them checked and checks nothing again, and one
    that samples more (a smaller ``check_every``) checks only the rows stored unchecked."""
    _bands_of(corpus[0], monkeypatch, 3)
    cfg = config(corpus[0], kimi_dir, rows=None)
    checked: list[int] = []
    original = ChatEncoder.check

    def counting(self, *args, **kwargs):
        checked.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ChatEncoder, "check", counting)
    first = build(cfg, tmp_path / "a")
    sample = sampled(np.arange(1200), cfg.check_every)
    assert first["template_check"]["checked"] == len(checked) == np.count_nonzero(sample) > 0
    checked.clear()
    other = build(dataclasses.replace(cfg, seed=9), tmp_path / "b")
    assert not checked and other["template_check"] == first["template_check"]
    assert other == _without_store(dataclasses.replace(cfg, seed=9), tmp_path / "b-plain")
    half = dataclasses.replace(cfg, check_every=cfg.check_every // 2)
    checked.clear()
    more = build(half, tmp_path / "c")
    wider = sampled(np.arange(1200), half.check_every)
    assert np.all(wider[sample]) and len(checked) == np.count_nonzero(wider & ~sample) > 0
    assert more == _without_store(half, tmp_path / "c-plain")


def test_an_invalid_row_in_the_pass_that_fills_the_store_stops_the_build(tmp_path, kimi_dir, monkeypatch):
    """An invalid row is stored as such by the filling pass, and stops the build, naming it;
    with ``skip_invalid`` it is recorded, as without the store. JSONL is read in batches of
    a few lines."""
    import fixed_sft.bands as bands_module
    from fixed_sft.build import InvalidSourceRow

    rows = synthetic.conversations(300, seed=3)
    rows[200]["messages"][0]["role"] = "robot"
    source = synthetic.write_jsonl(rows, tmp_path / "rows.jsonl")
    monkeypatch.setattr(bands_module, "READ_BATCH_BYTES", 20_000)
    _bands_of(source, monkeypatch, 3)
    cfg = config(source, kimi_dir, rows=None, row_tokens=256)
    with pytest.raises(InvalidSourceRow, match=r"rows.jsonl: line 201 \(source row 200"):
        build(cfg, tmp_path / "stopped")
    skipping = dataclasses.replace(cfg, skip_invalid=True)
    manifest = build(skipping, tmp_path / "skipped")
    assert manifest["skipped_invalid"][0]["index"] == 200
    assert manifest == _without_store(skipping, tmp_path / "plain")


# Run by a fresh interpreter: build the config (JSON, argv[1]) into argv[2], with segments of 8
# conversations, and SIGKILL this process halfway through writing the segment after argv[3]
# whole ones.
SIGKILLED_BUILD = """
import json, os, signal, sys
from pathlib import Path
from fixed_sft import store
from fixed_sft.build import BuildConfig, build

store.SEGMENT_CONVERSATIONS = 8
flush, written = store.SegmentWriter.flush, []

def killing_flush(self):
    if len(written) == int(sys.argv[3]):
        os.kill(os.getpid(), signal.SIGKILL)  # (its segment's bytes written, not its records)
    written.append(1)
    flush(self)

store.SegmentWriter.flush = killing_flush
build(BuildConfig(**json.loads(sys.argv[1])), Path(sys.argv[2]))
"""


@pytest.mark.parametrize("workers", [1, 2])
def test_a_build_killed_with_sigkill_resumes_from_its_store(corpus, kimi_dir, tmp_path, token_store, workers):
    """A build SIGKILLed while it writes the store leaves no output, its whole segments and
    the temporary file of the one it was writing, which the store removes when next opened
    (its process is gone); the next build takes the whole ones from the store, encodes the
    rest, and ends with the rows and manifest of a build that was never stopped."""
    import signal

    from fixed_sft.store import STALE_SECONDS

    cfg = config(corpus[0], kimi_dir, rows=None, workers=workers)
    arguments = [json.dumps(dataclasses.asdict(cfg)), str(tmp_path / "out"), "5"]
    child = subprocess.run([sys.executable, "-c", SIGKILLED_BUILD, *arguments], cwd=ROOT, timeout=120)
    assert child.returncode == -signal.SIGKILL
    assert not (tmp_path / "out").exists()
    assert len(list(token_store.glob("tokens/*/.tmp-*"))) == 1
    assert _store_is_consistent(token_store, 1200) == 5 * 8
    assert not list(token_store.glob("tokens/*/.tmp-*"))  # (its writer gone: removed as the store opened)
    resumed = build(cfg, tmp_path / "out")
    assert resumed == _without_store(cfg, tmp_path / "plain")
    store = TokenStore(next(token_store.glob("tokens/*")), 1200)
    assert (store.segment >= 0).all() and STALE_SECONDS > 0


def test_fill_tasks_cut_by_row_group(tmp_path):
    """A task holds the wanted rows of one row group, in source order; all of them, once."""
    import pyarrow.parquet as pq

    from fixed_sft.fill import fill_tasks
    from fixed_sft.source import open_source

    table = pq.read_table(synthetic.write_parquet(synthetic.conversations(230, seed=2), tmp_path / "a.parquet")[0])
    (tmp_path / "src").mkdir()
    pq.write_table(table, tmp_path / "src" / "a.parquet", row_group_size=50)
    pq.write_table(table.slice(0, 30), tmp_path / "src" / "b.parquet", row_group_size=7)
    source = open_source(str(tmp_path / "src"))
    wanted = np.random.default_rng(1).random(260) < 0.6
    tasks = list(fill_tasks(source, wanted, 4, (128, 1 << 20), tmp_path / "store"))
    rows = np.concatenate([task.start + task.local for task in tasks])
    assert rows.tolist() == np.flatnonzero(wanted).tolist()
    for task in tasks:
        assert task.rows == (230 if task.path.endswith("a.parquet") else 30)
        group = 50 if task.path.endswith("a.parquet") else 7
        assert len(set((task.local // group).tolist())) == 1
    assert len(tasks) == 5 + 5


def test_a_store_that_cannot_be_written_during_the_fill_warns_once(corpus, kimi_dir, tmp_path, monkeypatch, capfd):
    """Segments that cannot be written stop the filling pass, with one warning; the build
    reads the rest by bands, and its rows are those of a build without the store."""
    _disk_full_for_segments(monkeypatch)
    _bands_of(corpus[0], monkeypatch, 4)
    cfg = config(corpus[0], kimi_dir, rows=None)
    assert build(cfg, tmp_path / "a") == _without_store(cfg, tmp_path / "b")
    assert capfd.readouterr().err.count("warning: token store off") == 1


def test_lookups_a_block_at_a_time_are_lookups_one_at_a_time(tmp_path):
    """``lookup_many`` gives what ``lookup`` gives, row by row: stored conversations (valid,
    invalid, checked or not), ``None`` for rows not held, for a damaged payload and for
    metadata that is not the stored kind (bytes its digest matches); each counted."""
    from fixed_sft.encode import Encoded
    from fixed_sft.store import HEAD, RECORD_STRUCT, ROOM_BYTES, _digest

    rng = np.random.default_rng(3)
    writer = SegmentWriter(tmp_path)
    items = []
    for index in range(0, 60, 2):  # (odd rows: not held)
        if index % 10 == 4:
            items.append(Encoded(index, f"r{index}", None, None, "no assistant turn"))
        else:
            n = int(rng.integers(0, 9))
            ids, mask = rng.integers(0, 1 << 20, n).astype(np.int32), (rng.random(n) < 0.5).astype(np.uint8)
            items.append(Encoded(index, f"r{index}", ids, mask, None, index % 3 == 0, f"src{index % 4}"))
        writer.add(items[-1])
    for index, meta in ((60, b'["a", null]'), (62, b'["a", null, null], ["b", null, null]'), (64, b"{")):
        head = HEAD.pack(index, -1, len(meta), 1)  # (written as the store never writes them)
        offset = ROOM_BYTES + writer._pending
        writer._records.append(RECORD_STRUCT.pack(offset, index, -1, len(meta), 1, _digest(head, meta)))
        writer._file.write(meta)
        writer._pending += len(meta)
    writer.flush()
    [segment] = tmp_path.glob("*.seg")
    data = bytearray(segment.read_bytes())
    data[-80] ^= 0x01  # (a byte of one of the last conversations)
    segment.write_bytes(bytes(data))

    rows = rng.permutation(66)
    one = TokenStore(tmp_path, 66)
    alone = [one.lookup(int(i)) for i in rows]
    many = TokenStore(tmp_path, 66)
    together = many.lookup_many(rows)
    assert len(together) == len(alone)
    for a, b in zip(alone, together):
        assert (a is None) == (b is None)
        if a is not None:
            assert b is not None and store_module.same_encoding(a, b) and a.checked == b.checked
    by_row = {item.source_index: item for item in items}
    held = [int(i) for i, a in zip(rows, alone) if a is not None]
    assert all(store_module.same_encoding(by_row[i], many.lookup(i)) for i in held)
    assert many.taken == one.taken + len(held) and one.taken == len(held) == len(items) - 1
    assert one.damaged == many.damaged == 4  # the flipped one, and the three metadata not stored so
    assert (many.segment[[60, 62, 64]] == -1).all()  # (forgotten, as a damaged one is)


def test_rows_in_any_order_are_read_a_segment_at_a_time(tmp_path, monkeypatch) -> None:
    """Stored conversations come back in the order asked, whatever segments hold them, and
    each segment is opened once by a reader that keeps fewer open than there are segments:
    by ``lookup_many``, and by a ``UnitReader`` of them all at once."""
    from fixed_sft.encode import Encoded

    monkeypatch.setattr(store_module, "SEGMENT_CONVERSATIONS", 5)
    monkeypatch.setattr(store_module, "OPEN_FILES", 2)
    writer = SegmentWriter(tmp_path)
    for i in range(40):
        writer.add(Encoded(i, f"id{i}", np.arange(i % 7, dtype=np.int32) + i, np.ones(i % 7, np.uint8)))
    writer.flush()
    store = TokenStore(tmp_path, 40)  # (which reads each segment's records once)
    opened: list[str] = []
    real_open = store_module.os.open
    monkeypatch.setattr(store_module.os, "open", lambda path, *a: opened.append(str(path)) or real_open(path, *a))
    order = permutation(5, 40)
    found = store.lookup_many(order.tolist())
    assert [item.id for item in found] == [f"id{i}" for i in order.tolist()]
    assert [item.ids.tolist() for item in found] == [list(range(i, i + i % 7)) for i in order.tolist()]
    assert sorted(opened) == sorted(set(opened)) and len(opened) == 8  # (40 conversations, 5 a segment)
    opened.clear()
    located = store.locate(order).compact()
    reader = store_module.SegmentReader(located.paths)
    ids, mask, metas = store_module.UnitReader(reader, located, eos_id=1).take(0, 40)
    reader.close()
    assert [meta[0] for meta in metas] == [f"id{i}" for i in order.tolist()] and len(opened) == 8
    assert ids.tolist() == [token for i in order.tolist() for token in [*range(i, i + i % 7), 1]]
    assert mask.tolist() == [value for i in order.tolist() for value in [1] * (i % 7) + [0]]
    store.close()


def test_a_copy_written_again_is_found_before_a_damaged_one_named_ahead(tmp_path) -> None:
    """A damaged copy in a segment named by a clock a day ahead is read, found damaged and
    written again once: the new copy's segment is named after it, so it is the one found next."""
    from fixed_sft.encode import Encoded

    item = Encoded(3, "r3", np.arange(5, dtype=np.int32), np.ones(5, np.uint8), None, True)
    writer = SegmentWriter(tmp_path)
    writer.add(item)
    writer.flush()
    [segment] = tmp_path.glob("*.seg")
    data = bytearray(segment.read_bytes())
    data[-20] ^= 0x01  # (a byte of its ids)
    ahead = time.time_ns() + 86_400 * 10**9
    segment.with_name(f"{ahead:020d}-1-00000000.seg").write_bytes(bytes(data))
    segment.unlink()

    store = TokenStore(tmp_path, 5)
    assert store.lookup(3) is None and store.damaged == 1
    store.add(item)
    store.close()
    again = TokenStore(tmp_path, 5)
    found = again.lookup(3)
    assert found is not None and store_module.same_encoding(found, item) and again.damaged == 0
    assert len(list(tmp_path.glob("*.seg"))) == 2


@pytest.mark.parametrize("stray", ["9" * 20, "0" + "9" * 19])
def test_a_name_stamp_that_leaves_no_room_after_it_is_not_followed(tmp_path, stray) -> None:
    """A stray file named with the largest stamp, or the last one below ``LAST_STAMP``:
    segments written later keep stamps that are read, in name order after the store's
    earlier ones (one stamp more would take 21 digits, or be past ``LAST_STAMP``)."""
    from fixed_sft.encode import Encoded

    (tmp_path / f"{stray}-1-00000000.seg").write_bytes(b"")
    for index in (3, 4):
        store = TokenStore(tmp_path, 5)
        store.add(Encoded(index, f"r{index}", np.arange(5, dtype=np.int32), np.ones(5, np.uint8), None, True))
        store.close()
    written = sorted(path.name for path in tmp_path.glob("*.seg") if not path.name.startswith(stray))
    assert len(written) == 2 and all(len(name.split("-")[0]) == 20 for name in written)
    assert [store_module._stamp(name) for name in written] == sorted(store_module._stamp(name) for name in written)
    assert 0 < store_module._stamp(written[0]) < store_module._stamp(written[1])


@pytest.mark.parametrize("damaged", [True, False])
def test_a_copy_that_passed_the_check_stands_unless_damaged(tmp_path, damaged) -> None:
    """A copy that passed the template check, then one that did not (a build that sampled
    the row for no check stored it again): the one that passed is held, unless its bytes
    are damaged. Then the later copy is held, so that later builds do not find the damage
    again, each encoding and storing the row once more."""
    from fixed_sft.encode import Encoded

    item = Encoded(3, "r3", np.arange(5, dtype=np.int32), np.ones(5, np.uint8), None, True)
    writer = SegmentWriter(tmp_path)
    writer.add(item)
    writer.flush()
    [segment] = tmp_path.glob("*.seg")
    if damaged:
        data = bytearray(segment.read_bytes())
        data[-20] ^= 0x01  # (a byte of its ids)
        segment.write_bytes(bytes(data))
    writer = SegmentWriter(tmp_path)
    writer.add(item._replace(checked=False))
    writer.flush()
    for _ in range(2):
        store = TokenStore(tmp_path, 5)
        found = store.lookup(3)
        assert found is not None and store_module.same_encoding(found, item) and store.damaged == 0
        assert found.checked is not damaged
        store.close()
    assert len(list(tmp_path.glob("*.seg"))) == 2


def test_a_writer_holds_no_segments_bytes_and_its_segment_reads_back(tmp_path, monkeypatch) -> None:
    """Each conversation's bytes are in the writer's temporary file once added, not held
    until the segment is written; the segment, its records in the room before them (the
    rest a hole), reads back as added. A writer turned off leaves no temporary file."""
    from fixed_sft.encode import Encoded
    from fixed_sft.store import ROOM_BYTES

    monkeypatch.setattr(store_module, "WRITE_BUFFER_BYTES", 0)  # (each write reaches the file at once)
    rng = np.random.default_rng(5)
    writer = SegmentWriter(tmp_path)
    items = []
    for index in range(5):
        n = int(rng.integers(1000, 3000))
        ids, mask = rng.integers(0, 1 << 17, n).astype(np.int32), (rng.random(n) < 0.5).astype(np.uint8)
        items.append(Encoded(index, f"r{index}", ids, mask, None, True))
        writer.add(items[-1])
        [draft] = tmp_path.glob(".tmp-*")
        assert draft.stat().st_size == ROOM_BYTES + writer._pending and len(writer._records) == index + 1
    writer.flush()
    assert not list(tmp_path.glob(".tmp-*")) and len(list(tmp_path.glob("*.seg"))) == 1
    store = TokenStore(tmp_path, 5)
    for item in items:
        got = store.lookup(item.source_index)
        assert got is not None and store_module.same_encoding(got, item) and got.checked
    writer.add(items[0])
    writer.turn_off()
    assert not list(tmp_path.glob(".tmp-*")) and not writer.writable


def test_a_task_that_fails_leaves_no_temporary_file_and_a_dead_writers_goes(tmp_path) -> None:
    """A writer left by an error drops its temporary file; one whose process is gone (this
    host's) is removed when the store is opened, a live one's and another host's are kept."""
    import os
    import socket

    from fixed_sft.encode import Encoded
    from fixed_sft.store import DRAFT_PREFIX

    item = Encoded(0, "r0", np.arange(5, dtype=np.int32), np.ones(5, np.uint8), None, True)
    with pytest.raises(RuntimeError), SegmentWriter(tmp_path) as writer:
        writer.add(item)
        assert len(list(tmp_path.glob(".tmp-*"))) == 1
        raise RuntimeError("a later batch cannot be read")
    assert not list(tmp_path.glob(".tmp-*"))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = socket.gethostname()
    names = [f"{host}-{dead.stdout.strip()}-ab", f"{host}-{os.getpid()}-cd", f"elsewhere-{dead.stdout.strip()}-ef"]
    for name in names:
        (tmp_path / f"{DRAFT_PREFIX}{name}").write_bytes(b"x")
    TokenStore(tmp_path, 1)
    assert sorted(p.name for p in tmp_path.glob(".tmp-*")) == sorted(DRAFT_PREFIX + n for n in names[1:])


def test_a_segment_header_claiming_more_records_than_a_writer_writes_is_read_to_that_bound(tmp_path) -> None:
    """A damaged count in a segment's header (a sparse file of zeros behind it) is read no
    further than the most records a writer writes: memory stays bounded, and the records
    there are still found."""
    from fixed_sft.encode import Encoded

    item = Encoded(3, "r3", np.arange(5, dtype=np.int32), np.ones(5, np.uint8), None, True)
    writer = SegmentWriter(tmp_path)
    writer.add(item)
    writer.flush()
    [segment] = tmp_path.glob("*.seg")
    with segment.open("r+b") as f:
        f.seek(store_module.HEADER_BYTES - 8)
        f.write((1 << 40).to_bytes(8, "little"))
        f.truncate(1 << 30)  # (sparse: no disk used)
    records = TokenStore._read_records(segment)
    assert records is not None and len(records) == store_module.SEGMENT_CONVERSATIONS
    store = TokenStore(tmp_path, 5)
    found = store.lookup(3)
    assert found is not None and store_module.same_encoding(found, item)
    store.close()


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_kept_json_file_that_is_no_file_reads_as_none_at_once(tmp_path, kind) -> None:
    """The store's probes and parity files: a FIFO in their place would block a plain read forever."""
    import threading

    from fixed_sft.hashes import read_checked_json, write_checked_json

    path = tmp_path / "kept.json"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    got: list[object] = []
    reading = threading.Thread(target=lambda: got.append(read_checked_json(path)), daemon=True)
    reading.start()
    reading.join(30)
    assert got == [None], "blocked"
    other = tmp_path / "other.json"
    write_checked_json(other, {"a": 1})
    assert read_checked_json(other) == {"a": 1}

"""Source resolution: local files and folders, Hub download at a revision, row reading."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import threading

import numpy as np
import pytest
import synthetic
from conftest import cache_link

from fixed_sft.bands import band_bytes, read_band
from fixed_sft.chat import SCHEMA
from fixed_sft.conversation import InvalidRow, conversation
from fixed_sft.hub import cache_damage
from fixed_sft.order import positions
from fixed_sft.records import records
from fixed_sft.source import SourceError, open_source


def test_hub_download_is_pinned_and_cached(tmp_path, monkeypatch):
    calls = {}
    synthetic.write_parquet(synthetic.conversations(10), tmp_path / "snap" / "data" / "train-0.parquet")

    def fake_snapshot_download(repo_id, **kwargs):
        calls.update(kwargs, repo_id=repo_id)
        return str(tmp_path / "snap")

    monkeypatch.setattr("huggingface_hub.snapshot_download", fake_snapshot_download)
    src = open_source("org/data", "abc123", license="ODC-By-1.0")
    assert calls == {
        "repo_id": "org/data",
        "repo_type": "dataset",
        "revision": "abc123",
        "allow_patterns": ["*.parquet", "*.jsonl"],
    }
    assert src.num_rows == 10 and src.revision == "abc123"


def test_hub_source_files_are_chosen_by_glob(tmp_path, monkeypatch):
    """Only the matching files are downloaded, and only they are read, even where the
    cached snapshot holds others from an earlier download."""
    calls = {}
    for split in ("train", "test"):
        synthetic.write_parquet(synthetic.conversations(10), tmp_path / "snap" / "data" / f"{split}-0.parquet")

    def fake_snapshot_download(repo_id, **kwargs):
        calls.update(kwargs)
        return str(tmp_path / "snap")

    monkeypatch.setattr("huggingface_hub.snapshot_download", fake_snapshot_download)
    src = open_source("org/data", "abc123", patterns=("data/train-*",))
    assert calls["allow_patterns"] == ["data/train-*"]
    assert [f.name for f in src.files] == ["train-0.parquet"] and src.patterns == ("data/train-*",)


def test_local_source_files_are_chosen_by_glob(tmp_path):
    for split in ("train", "test", "validation"):
        synthetic.write_jsonl(synthetic.conversations(3), tmp_path / "data" / f"{split}.jsonl")
    assert [f.name for f in open_source(str(tmp_path), patterns=("*/t*",)).files] == ["test.jsonl", "train.jsonl"]
    assert [f.name for f in open_source(str(tmp_path), patterns=("data/train.jsonl", "*/val*")).files] == [
        "train.jsonl",
        "validation.jsonl",
    ]
    assert open_source(str(tmp_path / "data" / "test.jsonl"), patterns=("test.*",)).num_rows == 3
    assert len(open_source(str(tmp_path), patterns=("data/",)).files) == 3  # a folder, as huggingface_hub reads it
    with pytest.raises(SourceError, match=re.escape(f"no .parquet or .jsonl files matching train* or x in {tmp_path}")):
        open_source(str(tmp_path), patterns=("train*", "x"))  # paths are relative to the folder
    with pytest.raises(SourceError, match="matching other.jsonl"):
        open_source(str(tmp_path / "data" / "test.jsonl"), patterns=("other.jsonl",))


def test_a_set_of_shards_chosen_by_a_glob_must_be_whole(tmp_path):
    """A folder, or a glob, that holds some shards of a set (a download or copy cut short)
    is refused naming the first shard it lacks; files named one by one are a choice."""
    import doctest

    import fixed_sft.source

    assert doctest.testmod(fixed_sft.source).failed == 0
    for k in (0, 2):
        synthetic.write_parquet(synthetic.conversations(3), tmp_path / "data" / f"train-0000{k}-of-00003.parquet")
    synthetic.write_parquet(synthetic.conversations(3), tmp_path / "data" / "extra.parquet")
    says = f"{tmp_path} lacks data/train-00001-of-00003.parquet: 2 of the 3 files of its set are there"
    for patterns in (None, ("data/*",), ("data/",), ("*/train-*", "data/extra.parquet")):
        with pytest.raises(SourceError, match=re.escape(says)):
            open_source(str(tmp_path), patterns=patterns)
    chosen = ("data/train-00000-of-00003.parquet", "data/train-00002-of-00003.parquet")
    assert open_source(str(tmp_path), patterns=chosen).num_rows == 6
    assert open_source(str(tmp_path), patterns=(chosen[0], "*/extra*")).num_rows == 6
    assert open_source(str(tmp_path / "data" / "train-00000-of-00003.parquet")).num_rows == 3  # (a file: a choice)
    synthetic.write_parquet(synthetic.conversations(3), tmp_path / "data" / "train-00001-of-00003.parquet")
    assert open_source(str(tmp_path)).num_rows == 12


@pytest.mark.parametrize(
    "names",
    [
        [f"train-{k}-of-12.jsonl" for k in range(12)],  # (unpadded: 2 and 10 are not told apart by width)
        [f"train-{k:05d}-of-00003.jsonl" for k in (1, 2, 3)],  # (numbered from 1)
        [f"train-{k:05d}-of-00002-{'ab' * 8}.jsonl" for k in range(2)],  # (an older release's fingerprint)
        ["data/train-00000-of-00001.jsonl", "data/test-00000-of-00002.jsonl", "data/test-00001-of-00002.jsonl"],
    ],
    ids=["unpadded", "from 1", "fingerprint", "two splits"],
)
def test_whole_shard_sets_of_any_numbering_are_read(tmp_path, names):
    for name in names:
        synthetic.write_jsonl(synthetic.conversations(1), tmp_path / name)
    assert open_source(str(tmp_path)).num_rows == len(names)
    (tmp_path / names[1]).unlink()
    with pytest.raises(SourceError, match=f"lacks {re.escape(names[1].split('-of-')[0])}-of-"):
        open_source(str(tmp_path))


def test_unreachable_hub_says_how_to_use_local_files(monkeypatch):
    def offline(repo_id, **kwargs):
        raise OSError("offline")

    monkeypatch.setattr("huggingface_hub.snapshot_download", offline)
    with pytest.raises(SourceError, match="--source PATH"):
        open_source("org/data", "abc123")


def test_hub_id_needs_a_revision():
    with pytest.raises(SourceError, match="revision"):
        open_source("org/data")


def test_folder_files_are_read_in_sorted_order(tmp_path):
    rows = synthetic.conversations(30, seed=2)
    synthetic.write_parquet(rows, tmp_path / "src", rows_per_file=7)
    src = open_source(str(tmp_path / "src"))
    assert src.row_counts == (7, 7, 7, 7, 2)
    rank = np.arange(30)[::-1].copy()  # position of row i is 29 - i
    band = read_band(src, rank, 5, 12)
    got = [record["id"] for chunk in band.chunks(3) for _, record in records(chunk)]
    assert got == [f"synthetic_{i}" for i in range(24, 17, -1)]


@pytest.mark.parametrize("seed", range(4))
def test_band_chunks_follow_the_packing_order(tmp_path, seed):
    rng = np.random.default_rng(seed)
    rows = synthetic.conversations(61, seed=seed)
    synthetic.write_parquet(rows, tmp_path / "src", rows_per_file=int(rng.integers(1, 20)))
    src = open_source(str(tmp_path / "src"))
    order = rng.permutation(61)  # order[p]: the row at packing position p
    rank = positions(order)
    lo, hi = sorted(rng.integers(0, 62, size=2).tolist())
    size = int(rng.integers(1, 9))
    chunks = list(read_band(src, rank, lo, hi).chunks(size))
    assert [chunk.num_rows for chunk in chunks[:-1]] == [size] * (len(chunks) - 1)
    got = [(index, record["id"]) for chunk in chunks for index, record in records(chunk)]
    assert got == [(int(i), f"synthetic_{i}") for i in order[lo:hi]]


def test_jsonl_without_final_newline(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"id": "a", "messages": []}\n{"id": "b", "messages": []}')
    src = open_source(str(path))
    assert src.num_rows == 2
    assert [r["id"] for _, r in records(next(read_band(src, np.arange(2), 0, 2).chunks(10)))] == ["a", "b"]


def test_a_byte_order_mark_that_starts_a_jsonl_file_is_not_data(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"id": "a", "messages": []}\n\xef\xbb\xbf{"id": "b", "messages": []}\n')
    src = open_source(str(path))
    first, second = records(next(read_band(src, np.arange(2), 0, 2).chunks(10)))
    assert first[1]["id"] == "a"
    assert isinstance(second[1], InvalidRow)  # only the file's start may hold one


def test_a_jsonl_file_of_a_byte_order_mark_alone_has_no_rows(tmp_path):
    """The mark is not part of a first line: a file of the mark alone holds no row, as
    it is read (before, it was counted as one row that no read gave)."""
    (tmp_path / "a.jsonl").write_bytes(b"\xef\xbb\xbf")
    (tmp_path / "b.jsonl").write_bytes(b'{"id": "b", "messages": []}\n')
    src = open_source(str(tmp_path))
    assert src.num_rows == 1
    assert [r["id"] for _, r in records(next(read_band(src, np.arange(1), 0, 1).chunks(10)))] == ["b"]
    (tmp_path / "a.jsonl").write_bytes(b"\xef\xbb\xbf\n")  # the mark, then a blank line: one (invalid) row
    assert open_source(str(tmp_path)).num_rows == 2


def test_repeated_names_in_a_parquet_schema_are_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    message = pa.struct([("role", pa.string()), ("content", pa.string()), ("content", pa.string())])
    messages = pa.array([[{"role": "user"}]], pa.list_(pa.struct([("role", pa.string())])))
    twice = pa.ListArray.from_arrays(
        pa.array([0, 1], pa.int32()),
        pa.StructArray.from_arrays([pa.array(["user"]), pa.array(["a"]), pa.array(["b"])], fields=list(message)),
    )
    pq.write_table(pa.table({"id": ["a"], "messages": twice}), tmp_path / "fields.parquet")
    with pytest.raises(SourceError, match="fields.parquet: 'messages' has two fields named 'content' in one struct"):
        open_source(str(tmp_path / "fields.parquet"))
    table = pa.Table.from_arrays([pa.array(["a"]), messages, messages], names=["id", "messages", "messages"])
    pq.write_table(table, tmp_path / "columns.parquet")
    with pytest.raises(SourceError, match="columns.parquet: 2 columns are named 'messages'"):
        open_source(str(tmp_path / "columns.parquet"))


def test_empty_folder_is_an_error(tmp_path):
    with pytest.raises(SourceError, match="no .parquet or .jsonl files"):
        open_source(str(tmp_path))


def test_missing_messages_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": ["a"], "text": ["x"]}), tmp_path / "x.parquet")
    with pytest.raises(SourceError, match="x.parquet: no 'messages' column"):
        open_source(str(tmp_path / "x.parquet"))


def test_mixed_formats_are_refused(tmp_path):
    rows = synthetic.conversations(4)
    synthetic.write_parquet(rows, tmp_path / "a.parquet")
    synthetic.write_jsonl(rows, tmp_path / "b.jsonl")
    with pytest.raises(SourceError, match="mixes"):
        open_source(str(tmp_path))


def test_folder_order_is_relative_path_code_points(tmp_path):
    rows = synthetic.conversations(3)
    (tmp_path / "a").mkdir()
    synthetic.write_jsonl(rows[:1], tmp_path / "a" / "b.jsonl")
    synthetic.write_jsonl(rows[1:], tmp_path / "a-c.jsonl")
    src = open_source(str(tmp_path))
    assert [p.relative_to(tmp_path).as_posix() for p in src.files] == ["a-c.jsonl", "a/b.jsonl"]
    assert src.locate(2) == (tmp_path / "a" / "b.jsonl", 0)


def test_files_whose_messages_types_differ_are_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    synthetic.write_parquet(synthetic.conversations(2), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": ["x"], "messages": ['[{"role": "user", "content": "hi"}]']}), tmp_path / "b.parquet")
    with pytest.raises(
        SourceError,
        match=r"b\.parquet: 'messages' is string, which does not combine with the "
        r"earlier files' list<",
    ):
        open_source(str(tmp_path))


def test_files_whose_messages_types_combine_give_the_same_rows(tmp_path):
    """``large_string`` content in one file and an extra message key, null in every row,
    in another still form one source: the same conversations, in the same order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = synthetic.conversations(6, seed=2)
    synthetic.write_parquet(rows, tmp_path / "plain", rows_per_file=2)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    files = sorted((tmp_path / "plain").glob("*.parquet"))
    large = pa.list_(pa.struct([("role", pa.string()), ("content", pa.large_string())]))
    first = pq.read_table(files[0])
    pq.write_table(
        first.set_column(first.schema.get_field_index("messages"), "messages", first.column("messages").cast(large)),
        mixed / "a.parquet",
    )
    second = pq.read_table(files[1])
    named = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string()), ("name", pa.string())]))
    with_name = pa.array([[{**m, "name": None} for m in ms] for ms in second.column("messages").to_pylist()], named)
    pq.write_table(
        second.set_column(second.schema.get_field_index("messages"), "messages", with_name), mixed / "b.parquet"
    )
    shutil.copy(files[2], mixed / "c.parquet")

    def conversations(folder):
        src = open_source(str(folder))
        return [
            (i, conversation(r, SCHEMA))
            for chunk in read_band(src, np.arange(6), 0, 6).chunks(4)
            for i, r in records(chunk)
        ]

    # every file's rows carry the key ``name`` once combined with b's, null: as if absent
    assert conversations(mixed) == conversations(tmp_path / "plain")


def _calls(arguments: list, kind) -> pa.Table:  # noqa: F821
    """A table of one conversation per tool call's ``arguments``, as ``kind`` holds them."""
    import pyarrow as pa

    call = pa.struct(
        [
            ("id", pa.string()),
            ("type", pa.string()),
            ("function", pa.struct([("name", pa.string()), ("arguments", kind)])),
        ]
    )
    message = pa.struct([("role", pa.string()), ("content", pa.string()), ("tool_calls", pa.list_(call))])
    rows = [
        [
            {"role": "user", "content": "weather?", "tool_calls": None},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": a}}],
            },
        ]
        for a in arguments
    ]
    return pa.table({"messages": pa.array(rows, pa.list_(message))})


@pytest.mark.parametrize(
    "first, second, why",
    [
        ("int64", "float64", "integers in one, floats in the other"),
        ("int64", "uint64", "integers in one, unsigned integers in the other"),
        ("int64", "decimal", "integers in one, decimals in the other"),
        ("text", "bytes", "text in one, bytes in the other"),
        ("keys", "other keys", "tool_calls with other keys, or in another order"),
        ("keys", "keys swapped", "tool_calls with other keys, or in another order"),
    ],
)
def test_files_whose_values_would_change_when_read_together_are_refused(tmp_path, first, second, why):
    """A tool call's arguments held as objects render as JSON: joined with another file's,
    they would gain its keys (null), take its key order, or read its integers as floats
    (``3`` -> ``3.0``), text the model is trained on; such files are refused, not joined."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    kinds = {
        "int64": (pa.struct([("days", pa.int64())]), [{"days": 3}]),
        "uint64": (pa.struct([("days", pa.uint64())]), [{"days": 2**63 + 5}]),
        "decimal": (pa.struct([("days", pa.decimal128(5, 2))]), [{"days": __import__("decimal").Decimal("2.50")}]),
        "text": (pa.struct([("days", pa.string())]), [{"days": "s"}]),
        "bytes": (pa.struct([("days", pa.binary())]), [{"days": b"s"}]),
        "float64": (pa.struct([("days", pa.float64())]), [{"days": 2.5}]),
        "keys": (pa.struct([("city", pa.string()), ("days", pa.int64())]), [{"city": "Oslo", "days": 3}]),
        "other keys": (pa.struct([("query", pa.string()), ("days", pa.int64())]), [{"query": "x", "days": 2}]),
        "keys swapped": (pa.struct([("days", pa.int64()), ("city", pa.string())]), [{"days": 2, "city": "Rome"}]),
    }
    for name, kind in (("a", first), ("b", second)):
        pq.write_table(_calls(kinds[kind][1], kinds[kind][0]), tmp_path / f"{name}.parquet")
    with pytest.raises(
        SourceError,
        match=re.escape("b.parquet: its 'messages' and the earlier files' cannot be read together unchanged")
        + ".*"
        + re.escape(why),
    ):
        open_source(str(tmp_path))
    (tmp_path / "b.parquet").unlink()
    assert open_source(str(tmp_path)).num_rows == 1  # (each file alone reads)


def test_tools_of_other_keys_are_refused_and_message_keys_combine(tmp_path):
    """Another file's ``tools`` with other keys would change this file's; messages with
    other keys combine (a missing key is null, which counts as absent)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    messages = [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]]
    tool = lambda *keys: pa.list_(pa.struct([(k, pa.string()) for k in keys]))  # noqa: E731
    pq.write_table(
        pa.table({"messages": messages, "tools": pa.array([[{"name": "f"}]], tool("name"))}), tmp_path / "a.parquet"
    )
    both = pa.array([[{"name": "g", "description": "d"}]], tool("name", "description"))
    pq.write_table(pa.table({"messages": messages, "tools": both}), tmp_path / "b.parquet")
    with pytest.raises(SourceError, match=r"b\.parquet: its 'tools' .*tools with other keys"):
        open_source(str(tmp_path))


@pytest.mark.parametrize("name", ["b.jsonl.gz", "b.JSONL", "b.Parquet", "sub/b.parquet.zst"])
def test_data_files_a_build_does_not_read_are_named(tmp_path, name):
    """A compressed data file, or one named in capitals, in a source folder would be left
    out unsaid: it is named, unless the files are chosen with --source-files."""
    synthetic.write_jsonl(synthetic.conversations(2), tmp_path / "a.jsonl")
    (tmp_path / name).parent.mkdir(exist_ok=True)
    (tmp_path / name).write_bytes(b"\x1f\x8b")
    with pytest.raises(SourceError, match=re.escape(f"{tmp_path / name}: ") + "(compressed|named in capitals)"):
        open_source(str(tmp_path))
    assert open_source(str(tmp_path), patterns=("a.jsonl",)).num_rows == 2
    (tmp_path / ".hidden").mkdir()
    (tmp_path / name).rename(tmp_path / ".hidden" / "x.jsonl.gz")
    (tmp_path / "raw.json.gz").write_bytes(b"\x1f\x8b")  # (a .json file is not read decompressed either)
    (tmp_path / "dataset_infos.json").write_text("{}")
    assert open_source(str(tmp_path)).num_rows == 2


def test_a_link_to_a_folder_in_a_source_folder_is_refused(tmp_path):
    """Its files would not be searched: the build says so rather than leave them out."""
    synthetic.write_jsonl(synthetic.conversations(2), tmp_path / "src" / "a.jsonl")
    synthetic.write_jsonl(synthetic.conversations(2), tmp_path / "outside" / "b.jsonl")
    (tmp_path / "src" / "sub").symlink_to(tmp_path / "outside")
    with pytest.raises(SourceError, match=re.escape(f"{tmp_path / 'src' / 'sub'}: a link to a folder")):
        open_source(str(tmp_path / "src"))
    assert open_source(str(tmp_path / "src"), patterns=("a.jsonl",)).num_rows == 2  # (files chosen: not searched)
    (tmp_path / "src" / "sub").unlink()
    (tmp_path / "src" / ".hidden").symlink_to(tmp_path / "outside")
    assert open_source(str(tmp_path / "src")).num_rows == 2


def test_a_folder_that_cannot_be_read_is_named(tmp_path, monkeypatch):
    """os.walk passes over a folder it cannot list: its rows would be left out unsaid."""
    import errno

    import fixed_sft.source as source_module

    synthetic.write_jsonl(synthetic.conversations(2), tmp_path / "a.jsonl")
    walk = os.walk

    def denied(top, onerror=None, **kwargs):
        yield from walk(top, onerror=onerror, **kwargs)
        onerror(PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "locked")))

    monkeypatch.setattr(source_module.os, "walk", denied)
    with pytest.raises(
        SourceError,
        match=re.escape(f"{tmp_path / 'locked'}: cannot read (Permission denied): its files would be left out; choose"),
    ):
        open_source(str(tmp_path))
    assert open_source(str(tmp_path), patterns=("a.jsonl",)).num_rows == 2


def test_a_folder_of_json_files_says_how_they_are_read(tmp_path):
    synthetic.write_jsonl(synthetic.conversations(2), tmp_path / "a.json")
    with pytest.raises(
        SourceError, match=r"no \.parquet or \.jsonl files in .*\(JSON Lines files are read named \.jsonl\)"
    ):
        open_source(str(tmp_path))


def test_file_paths_are_relative_to_the_source_folder(tmp_path):
    (tmp_path / "data").mkdir()
    synthetic.write_jsonl(synthetic.conversations(2), tmp_path / "data" / "train.jsonl")
    assert open_source(str(tmp_path)).root == tmp_path
    assert open_source(str(tmp_path / "data" / "train.jsonl")).root == tmp_path / "data"


@pytest.mark.parametrize("name", ["./missing", "/no/such/folder", "missing.parquet", "data/missing.jsonl"])
def test_a_missing_local_source_is_named(name):
    with pytest.raises(SourceError, match="no such file or folder"):
        open_source(name)


def test_hidden_files_and_folders_are_not_read(tmp_path):
    """As the datasets library leaves them: a name that starts with '.', anywhere in the path."""
    rows = synthetic.conversations(6, seed=2)
    for name in ("a.jsonl", ".b.jsonl", ".git/c.jsonl", "d/.cache/e.jsonl", "d/f.jsonl"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        synthetic.write_jsonl(rows[:2], tmp_path / name)
    src = open_source(str(tmp_path))
    assert [f.relative_to(tmp_path).as_posix() for f in src.files] == ["a.jsonl", "d/f.jsonl"]


def test_a_build_in_a_source_folder_is_refused(tmp_path, kimi_dir):
    """Its rows are packed tokens, not conversations: a build inside the folder, or the
    folder itself, is named rather than read."""
    from fixed_sft.build import BuildConfig, build

    source = tmp_path / "chats"
    synthetic.write_jsonl(synthetic.conversations(20, seed=2), source / "a.jsonl")
    config = BuildConfig(name="t", source=str(source), tokenizer=str(kimi_dir), rows=2, row_tokens=64, workers=1)
    build(config, tmp_path / "prev")
    shutil.copytree(tmp_path / "prev", source / "old" / "prev")
    inside = f"{source / 'old' / 'prev'} is a fixed-sft build, not a chat source; move it out of {source} or"
    with pytest.raises(SourceError, match=re.escape(inside)):
        open_source(str(source))
    itself = re.escape(f"{tmp_path / 'prev'} is a fixed-sft build, not a chat source") + "$"
    with pytest.raises(SourceError, match=itself):
        open_source(str(tmp_path / "prev"))
    assert [f.name for f in open_source(str(source), patterns=("a.jsonl",)).files] == ["a.jsonl"]
    shutil.copy(tmp_path / "prev" / "train.parquet", tmp_path / "rows.parquet")  # (its rows, anywhere)
    for path in (tmp_path / "prev" / "train.parquet", tmp_path / "rows.parquet"):
        with pytest.raises(SourceError, match=re.escape(f"{path} holds a fixed-sft build's rows (packed token ids)")):
            open_source(str(path))


def test_a_file_of_another_kind_is_refused(tmp_path):
    (tmp_path / "rows.txt").write_text("{}\n")
    with pytest.raises(SourceError, match="rows.txt: not a .parquet or .jsonl file"):
        open_source(str(tmp_path / "rows.txt"))


@pytest.mark.parametrize(
    "ids, expected",
    [
        (lambda pa: pa.array([None, None], pa.null()), [None, None]),
        (lambda pa: pa.array(["a", "b"]).dictionary_encode(), ["a", "b"]),
        (lambda pa: pa.array(["a", "b"], pa.large_string()), ["a", "b"]),
        (lambda pa: pa.array(["a", "b"], pa.string_view()), ["a", "b"]),
        (lambda pa: pa.array([7, -1], pa.int32()), ["7", "-1"]),
    ],
    ids=["null", "dictionary", "large_string", "string_view", "int32"],
)
def test_parquet_id_columns_of_strings_integers_or_nulls_are_read_as_text(tmp_path, ids, expected):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(synthetic.conversations(2, seed=1), schema=synthetic.TULU_SCHEMA)
    pq.write_table(table.set_column(0, "id", ids(pa)), tmp_path / "src.parquet")
    src = open_source(str(tmp_path / "src.parquet"))
    assert [r["id"] for _, r in records(next(read_band(src, np.arange(2), 0, 2).chunks(10)))] == expected


def test_a_folder_named_like_a_data_file_is_not_a_file(tmp_path):
    """Such as the ``NAME.parquet/`` folder of part files Spark writes: its files are
    read, the folder itself is not."""
    synthetic.write_parquet(synthetic.conversations(3), tmp_path / "src" / "set.parquet" / "part-0.parquet")
    src = open_source(str(tmp_path / "src"))
    assert src.files == (tmp_path / "src" / "set.parquet" / "part-0.parquet",) and src.num_rows == 3


def _without_blocking(call):
    """``call()``'s result or exception, failing the test if it blocks (as opening a FIFO does)."""
    outcome = []
    worker = threading.Thread(target=lambda: outcome.append(_outcome(call)), daemon=True)
    worker.start()
    worker.join(20)
    assert outcome, "blocked"
    return outcome[0]


def _outcome(call):
    try:
        return call()
    except Exception as error:
        return error


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_a_fifo_named_like_a_data_file_is_refused_without_opening_it(tmp_path, suffix):
    """A FIFO (or any file that is not a regular file) named as a data file is named and
    refused, in a folder or as the source itself, and never opened (which would block)."""
    rows = synthetic.conversations(3)
    if suffix == ".jsonl":
        synthetic.write_jsonl(rows, tmp_path / "src" / "a.jsonl")
    else:
        synthetic.write_parquet(rows, tmp_path / "src" / "a.parquet")
    fifo = tmp_path / "src" / "sub" / f"b{suffix}"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    for source in fifo.parents[1], fifo:
        error = _without_blocking(lambda source=source: open_source(str(source)))
        assert isinstance(error, SourceError) and str(error) == f"{fifo}: not a regular file (a FIFO)", error


def test_an_empty_jsonl_file_has_no_rows(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.jsonl").write_bytes(b"")
    synthetic.write_jsonl(synthetic.conversations(2), tmp_path / "src" / "b.jsonl")
    src = open_source(str(tmp_path / "src"))
    assert src.row_counts == (0, 2)
    got = [r["id"] for _, r in records(next(read_band(src, np.arange(2), 0, 2).chunks(10)))]
    assert got == ["synthetic_0", "synthetic_1"]


def test_a_cached_file_is_checked_against_its_etag(tmp_path):
    """The Hugging Face cache names a Git LFS file's blob by its sha256 and a Git file's
    by its Git blob sha1 (``git hash-object``: ce013625... for "hello\\n")."""
    snapshot = tmp_path / "hub" / "datasets--o--d" / "snapshots" / ("c" * 40)
    lfs = cache_link(snapshot, "data/train.parquet", b"rows")
    git = cache_link(snapshot, "README.md", b"hello\n", etag="ce013625030ba8dba906f756967f9e9ca394464a")
    assert cache_damage(lfs, hashlib.sha256(b"rows").hexdigest()) is None
    assert cache_damage(git, "any sha256: a Git file is checked by its sha1") is None

    damage = cache_damage(lfs, hashlib.sha256(b"other rows").hexdigest())
    blob = tmp_path / "hub" / "datasets--o--d" / "blobs" / hashlib.sha256(b"rows").hexdigest()
    assert damage.startswith(f"{lfs} is damaged in the Hugging Face cache") and f"delete {blob} and" in damage
    git.resolve().write_bytes(b"hellO\n")
    assert "its bytes give " + hashlib.sha1(b"blob 6\0hellO\n").hexdigest() in cache_damage(git, "")


def test_a_cached_file_whose_blob_is_gone_is_named_as_damage(tmp_path):
    """Explaining an error by cache damage never ends in the error of reading the file."""
    from fixed_sft.hub import raise_cache_damage

    snapshot = tmp_path / "hub" / "datasets--o--d" / "snapshots" / ("c" * 40)
    link = cache_link(snapshot, "train.parquet", b"rows")
    blob = tmp_path / "hub" / "datasets--o--d" / "blobs" / hashlib.sha256(b"rows").hexdigest()
    blob.unlink()
    with pytest.raises(SourceError, match=f"{re.escape(str(link))} is damaged in the Hugging Face cache: No such file"):
        raise_cache_damage([link], SourceError)


def test_a_cached_blob_kept_in_a_shared_store_is_checked_by_its_etag(tmp_path):
    """huggingface_hub may keep a blob in a store shared by repos, named by another hash,
    and link ``blobs/ETAG`` to it: the etag still says what the bytes must be, and both
    the link and the stored file must go for a new download."""
    snapshot = tmp_path / "hub" / "datasets--o--d" / "snapshots" / ("c" * 40)
    link = cache_link(snapshot, "train.parquet", b"rows")
    blob = link.resolve()
    stored = tmp_path / "hub" / "store" / ("5" * 64)
    stored.parent.mkdir()
    blob.rename(stored)
    blob.symlink_to(stored)
    assert cache_damage(link, hashlib.sha256(b"rows").hexdigest()) is None
    assert f"delete {blob} and {stored} and run again" in cache_damage(link, "0" * 64)


def test_files_outside_the_cache_have_no_etag_to_check(tmp_path):
    plain = tmp_path / "snapshots" / "c" / "train.parquet"  # a folder named like the cache's, without links
    plain.parent.mkdir(parents=True)
    plain.write_bytes(b"rows")
    assert cache_damage(plain, "0" * 64) is None
    elsewhere = tmp_path / "store" / "blobs" / ("a" * 64)  # a link to a blob of another repo
    elsewhere.parent.mkdir(parents=True)
    elsewhere.write_bytes(b"rows")
    (tmp_path / "snapshots" / "c" / "link.parquet").symlink_to(elsewhere)
    assert cache_damage(tmp_path / "snapshots" / "c" / "link.parquet", "0" * 64) is None
    named = cache_link(tmp_path / "r" / "snapshots" / "c", "x.parquet", b"rows", etag="not-a-digest")
    assert cache_damage(named, "0" * 64) is None


def test_a_band_leaves_room_for_the_copies_that_sort_its_largest_file():
    """Reading a band holds its rows and two copies of one file's rows: of a budget, a
    source of one file leaves a third to rows, of four even files two thirds, and of
    uneven files what the largest file's share leaves."""
    assert band_bytes(300, [1000]) == 100
    assert band_bytes(300, [250, 250, 250, 250]) == 200
    assert band_bytes(300, [750, 250]) == 120
    assert band_bytes(300, [0]) == band_bytes(300, []) == 100  # no bytes known: as one file


def test_a_band_of_one_row_group_holds_a_batch_not_the_files_column_chunks(tmp_path, monkeypatch):
    """Reading a file of one row group holds a batch at a time: its column chunks are read
    in pieces as they are decoded, not pre-buffered (pyarrow's default reads every column
    chunk of the row group into Arrow's pool before the first batch)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fixed_sft import bands as bands_module

    rng = np.random.default_rng(1)
    replies = [rng.bytes(2048).hex() for _ in range(8000)]  # hex of random bytes: compresses little
    rows = [{"id": str(k), "messages": [{"role": "user", "content": r}]} for k, r in enumerate(replies)]
    path = tmp_path / "one.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=len(rows))
    meta = pq.ParquetFile(path).metadata
    assert meta.num_row_groups == 1
    compressed = sum(meta.row_group(0).column(c).total_compressed_size for c in range(meta.num_columns))
    monkeypatch.setattr(bands_module, "READ_BATCH_BYTES", 1 << 20)  # batches of about 250 rows
    pool = pa.default_memory_pool()
    before = pool.bytes_allocated()
    batches = bands_module._read_parquet(path, np.ones(len(rows), bool), False)
    first, table = next(batches)
    held = pool.bytes_allocated() - before
    assert compressed > 30 << 20 and len(first) == table.num_rows < 300
    assert held < compressed / 2, (held, compressed)
    assert table.num_rows + sum(t.num_rows for _, t in batches) == len(rows)


def test_a_parquet_file_whose_size_statistics_pyarrow_refuses_is_a_one_line_error(tmp_path, kimi_dir):
    """A file whose first column's size statistics disagree with its schema: pyarrow aborts
    the process where that column's metadata is asked for (the source's checks ask it of a
    footer without them, ``reader.bare_metadata``) and refuses to read its values, which
    the build says in one line naming the file."""
    import subprocess
    import sys

    from conftest import ROOT, shorten_size_statistics

    [path] = synthetic.write_parquet(synthetic.conversations(40, seed=2), tmp_path / "rows.parquet")
    shorten_size_statistics(path)
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, str(ROOT / "generate_fixed_sft.py"), "build", "--source", str(path), "--tokenizer",
         str(kimi_dir), "--rows", "1", "--row-tokens", "64", "--no-cache", "--quiet", "--out", str(out)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1 and str(path) in result.stderr, result.stderr
    assert not out.exists()

"""Bad source rows and tokenizer files: a clear error naming file, row and id, or a
recorded skip that never shifts which rows the valid conversations come from."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import synthetic

from fixed_sft.build import BuildConfig, BuildError, InvalidSourceRow, build
from fixed_sft.specs import SpecError

GOOD = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]}

BAD_LINES = {
    3: (b'{"id": "no-messages"}', "'messages' is missing"),
    5: (b'{"id": "none", "messages": null}', "'messages' is missing"),
    8: (b'{"id": "str", "messages": "hi"}', "'messages' is a str, not a list"),
    11: (b'{"id": "norole", "messages": [{"content": "x"}]}', "message 0 has no role"),
    14: (b'{"id": "nocontent", "messages": [{"role": "user"}]}', "message 0 has no content"),
    17: (b'{"id": "int", "messages": [{"role": "user", "content": 5}]}', "message 0 content is a int, not a string"),
    20: (
        b'{"id": "tool", "messages": [{"role": "tool", "content": "x"}]}',
        "message 0 is a tool message without 'tool_call_id'",
    ),
    23: (b'{"id": "empty", "messages": []}', "'messages' is empty"),
    26: (b'{"id": "row-1", "messages": [{"role": "user", "content": "dup"}]}', "duplicate id"),
    29: (b'{"id": "utf8", "messages": [{"role": "user", "content": "\xff\xfe"}]}', "invalid UTF-8"),
    32: (b"this is not json", "not JSON"),
    35: (b'{"id": "surrogate", "messages": [{"role": "user", "content": "\\ud800"}]}', "lone surrogate"),
    36: (
        b'{"id": "x\\udfff", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}',
        "'id' has a lone surrogate",
    ),
    38: (b'{"id": "list", "messages": ["hello"]}', "message 0 is a str, not an object"),
    41: (b"[1, 2]", "not a JSON object"),
    40: (b"", "a blank line, not JSON"),  # a blank line is a row too
    12: (b" \t\r", "a blank line, not JSON"),
    43: (b'{"id": 7.5, "messages": [{"role": "user", "content": "x"}]}', "'id' is a float, not a string or integer"),
    44: (b'{"id": true, "messages": [{"role": "user", "content": "x"}]}', "'id' is a bool, not a string or integer"),
    42: (
        b'{"id": "long", "n": 1' + b"0" * 5000 + b', "messages": [{"role": "user", "content": "x"}]}',
        "not readable JSON",
    ),  # past Python's integer digit limit
    # a repeated key: readers that keep the first value and readers that keep the last read two rows
    2: (
        b'{"id": "dup-role", "messages": [{"role": "user", "content": "hi"}, '
        b'{"role": "assistant", "content": "ok", "role": "user"}]}',
        "repeats the key 'role'",
    ),
    6: (
        b'{"messages": [{"role": "user", "content": "hi"}], "id": "dup-top", '
        b'"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}',
        "repeats the key 'messages'",
    ),
    9: (
        b'{"id": "dup-deep", "meta": [{"a": {"b": 1, "b": 2}}], "messages": [{"role": "user", "content": "hi"}, '
        b'{"role": "assistant", "content": "ok"}]}',
        "repeats the key 'b'",
    ),
}


def _lines(bad: bool) -> list[bytes]:
    lines = []
    for i in range(45):
        if bad and i in BAD_LINES:
            lines.append(BAD_LINES[i][0])
        else:
            lines.append(json.dumps({"id": f"row-{i}", **GOOD}).encode())
    return lines


def _config(path, kimi_dir, **overrides) -> BuildConfig:
    values = dict(
        name="bad", source=str(path), tokenizer=str(kimi_dir), rows=None, row_tokens=16, seed=7, workers=1, no_card=True
    )
    values.update(overrides)
    return BuildConfig(**values)


@pytest.fixture
def sources(tmp_path):
    bad, good = tmp_path / "bad.jsonl", tmp_path / "good.jsonl"
    bad.write_bytes(b"\n".join(_lines(True)) + b"\n")
    good.write_bytes(b"\n".join(_lines(False)) + b"\n")
    return bad, good


def test_default_stops_naming_file_row_id_and_reason(sources, kimi_dir, tmp_path):
    with pytest.raises(BuildError) as error:
        build(_config(sources[0], kimi_dir), tmp_path / "out")
    message = str(error.value)
    match = re.match(rf"{re.escape(str(sources[0]))}: line (\d+) \(source row (\d+)(, id [^)]*)?\): ", message)
    line, index = int(match[1]), int(match[2])
    assert line == index + 1 and index in BAD_LINES  # JSONL lines are counted from 1
    assert BAD_LINES[index][1] in message and "--skip-invalid" in message
    assert not (tmp_path / "out").exists()


def test_skip_invalid_records_every_bad_row(sources, kimi_dir, tmp_path):
    manifest = build(_config(sources[0], kimi_dir, skip_invalid=True), tmp_path / "out")
    skipped = {entry["index"]: entry for entry in manifest["skipped_invalid"]}
    assert sorted(skipped) == sorted(BAD_LINES)
    for index, (_, reason) in BAD_LINES.items():
        assert reason in skipped[index]["reason"], (index, skipped[index])
    assert skipped[26]["id"] == "row-1" and skipped[3]["id"] == "no-messages"
    assert skipped[36]["id"] == "x\\udfff"  # the id's text, escaped: the manifest is valid UTF-8
    assert manifest["stats"]["invalid_rows_skipped"] == len(BAD_LINES)


def test_workers_record_the_same_skipped_rows(sources, kimi_dir, tmp_path):
    """Invalid rows encoded in worker processes keep their ids and reasons."""
    one = build(_config(sources[0], kimi_dir, skip_invalid=True), tmp_path / "one")
    two = build(_config(sources[0], kimi_dir, skip_invalid=True, workers=2), tmp_path / "two")
    assert {e["index"]: e["id"] for e in two["skipped_invalid"]}[3] == "no-messages"
    assert two == one


def test_skipping_never_shifts_the_rows_used(sources, kimi_dir, tmp_path):
    """The order is over all rows: the valid conversations keep their positions."""

    def order_of_use(folder):
        metadata = pq.read_table(folder / "train.parquet").column("metadata").to_pylist()
        seen = []
        for row in metadata:
            for segment in row["segments"]:
                if not seen or seen[-1] != segment["source_index"]:
                    seen.append(segment["source_index"])
        return seen

    build(_config(sources[0], kimi_dir, skip_invalid=True), tmp_path / "skip")
    build(_config(sources[1], kimi_dir), tmp_path / "all")
    with_skips = order_of_use(tmp_path / "skip")
    assert not set(with_skips) & set(BAD_LINES)
    assert with_skips == [i for i in order_of_use(tmp_path / "all") if i not in BAD_LINES][: len(with_skips)]


def test_parquet_rows_with_bad_messages(kimi_dir, tmp_path):
    rows = synthetic.conversations(20, seed=1)
    rows[4]["messages"][1]["role"] = "narrator"
    synthetic.write_parquet(rows, tmp_path / "src.parquet")
    with pytest.raises(
        BuildError, match=r"row 4 \(source row 4, id synthetic_4\): message 1 has unknown role 'narrator'"
    ):
        build(_config(tmp_path / "src.parquet", kimi_dir), tmp_path / "out")


def _tampered_tokenizer(kimi_dir, tmp_path):
    folder = tmp_path / "tok"
    shutil.copytree(kimi_dir, folder)
    template = folder / "chat_template.jinja"
    template.write_text(template.read_text() + " ")
    return folder


def test_tokenizer_mismatch_is_refused(sources, kimi_dir, tmp_path):
    folder = _tampered_tokenizer(kimi_dir, tmp_path)
    with pytest.raises(SpecError) as error:
        build(_config(sources[1], folder, expected_tokenizer="kimi-k2.6"), tmp_path / "out")
    message = str(error.value)
    assert "chat_template.jinja: expected sha256 8bf859698fd4781c" in message and "got " in message
    assert "--allow-unpinned-tokenizer" in message


def test_unpinned_tokenizer_is_recorded(sources, kimi_dir, tmp_path):
    folder = _tampered_tokenizer(kimi_dir, tmp_path)
    manifest = build(
        _config(sources[1], folder, expected_tokenizer="kimi-k2.6", allow_unpinned_tokenizer=True, rows=2),
        tmp_path / "out",
    )
    assert manifest["tokenizer"]["pinned"] is False
    assert "chat_template.jinja" in manifest["tokenizer"]["mismatches"][0]


def test_folder_matching_no_spec_is_refused(sources, kimi_dir, tmp_path):
    folder = _tampered_tokenizer(kimi_dir, tmp_path)
    with pytest.raises(
        SpecError,
        match=rf"tokenizer files in {folder} differ from every pinned spec in .*: the "
        r"files match no pinned spec; closest is kimi-k2.6, from which "
        r"chat_template.jinja: expected sha256 8bf85969\S+ \(4022 bytes\), got",
    ) as error:
        build(_config(sources[1], folder), tmp_path / "out")
    assert "tiktoken.model" not in str(error.value)  # only the file that differs
    manifest = build(_config(sources[1], folder, allow_unpinned_tokenizer=True, rows=2), tmp_path / "out")
    first, closest = manifest["tokenizer"]["mismatches"]
    assert first == "the files match no pinned spec" and closest.startswith("closest is kimi-k2.6, from which chat_")
    assert str(tmp_path) not in closest  # no path of this machine


@pytest.mark.parametrize("name", ["./no-such-tokenizer", "/no/such/tokenizer"])
def test_a_missing_tokenizer_folder_is_named(sources, tmp_path, name):
    with pytest.raises(SpecError, match="no such folder"):
        build(_config(sources[1], name), tmp_path / "out")


def test_a_tokenizer_file_instead_of_a_folder_is_named(sources, kimi_dir, tmp_path):
    with pytest.raises(SpecError, match="tiktoken.model' is not a folder"):
        build(_config(sources[1], kimi_dir / "tiktoken.model"), tmp_path / "out")


@pytest.mark.parametrize(
    ("file", "content", "says"),
    [
        ("tiktoken.model", b"garbage line here\n", "tiktoken.model: not a tiktoken BPE file"),
        (
            "chat_template.jinja",
            b"{% if %}",
            "chat_template.jinja: cannot render a system message (TemplateSyntaxError",
        ),
        ("chat_template.jinja", b"\xff\xfe{{ x }}", "chat_template.jinja: cannot read it"),
    ],
)
def test_damaged_tokenizer_files_are_one_clear_error(sources, kimi_dir, tmp_path, file, content, says):
    """Even when unpinned files are allowed: named, exit 1, nothing written."""
    from fixed_sft.cli import main

    folder = tmp_path / "tok"
    shutil.copytree(kimi_dir, folder)
    (folder / file).write_bytes(content)
    args = [
        "build",
        "--source",
        str(sources[1]),
        "--tokenizer",
        str(folder),
        "--allow-unpinned-tokenizer",
        "--rows",
        "1",
        "--row-tokens",
        "16",
        "--out",
        str(tmp_path / "out"),
        "--quiet",
    ]
    assert main(args) == 1
    assert not (tmp_path / "out").exists()
    from fixed_sft.chat import TemplateMismatch
    from fixed_sft.tokenizer import TokenizerError

    with pytest.raises((TokenizerError, TemplateMismatch), match=re.escape(says)):
        build(_config(sources[1], folder, allow_unpinned_tokenizer=True, rows=1), tmp_path / "out")


def test_bad_template_is_one_clear_error_with_workers(sources, kimi_dir, tmp_path):
    from fixed_sft.chat import TemplateMismatch

    folder = tmp_path / "tok"
    shutil.copytree(kimi_dir, folder)
    template = folder / "chat_template.jinja"
    template.write_text(template.read_text().replace("{{ c }}", "~{{ c }}~"))
    with pytest.raises(TemplateMismatch, match="does not bound"):
        build(_config(sources[1], folder, allow_unpinned_tokenizer=True, workers=2), tmp_path / "out")


def test_parquet_string_that_is_not_utf8(kimi_dir, tmp_path):
    import pyarrow as pa

    rows = synthetic.conversations(30, seed=2)
    table = pa.Table.from_pylist(rows, schema=synthetic.TULU_SCHEMA)
    bad = pa.Array.from_buffers(
        pa.string(), 1, [None, pa.py_buffer(b"\x00\x00\x00\x00\x02\x00\x00\x00"), pa.py_buffer(b"\xff\xfe")]
    )
    ids = pa.concat_arrays([table.column("id").combine_chunks()[:5], bad, table.column("id").combine_chunks()[6:]])
    pq.write_table(table.set_column(0, "id", ids), tmp_path / "src.parquet")
    with pytest.raises(BuildError, match="row 5 .*invalid UTF-8"):
        build(_config(tmp_path / "src.parquet", kimi_dir), tmp_path / "out")
    manifest = build(_config(tmp_path / "src.parquet", kimi_dir, skip_invalid=True), tmp_path / "out")
    assert [e["index"] for e in manifest["skipped_invalid"]] == [5]


def test_parquet_content_that_is_not_utf8_names_the_id(kimi_dir, tmp_path):
    import pyarrow as pa

    rows = synthetic.conversations(30, seed=2)
    table = pa.Table.from_pylist(rows, schema=synthetic.TULU_SCHEMA)
    content = pa.Array.from_buffers(
        pa.string(), 1, [None, pa.py_buffer(b"\x00\x00\x00\x00\x02\x00\x00\x00"), pa.py_buffer(b"\xff\xfe")]
    )
    message = pa.StructArray.from_arrays([content, pa.array(["user"])], fields=list(synthetic.MESSAGE_TYPE.value_type))
    bad = pa.ListArray.from_arrays(pa.array([0, 1], pa.int32()), message, type=synthetic.MESSAGE_TYPE)
    column = table.column("messages").combine_chunks()
    table = table.set_column(1, "messages", pa.concat_arrays([column[:5], bad, column[6:]]))
    pq.write_table(table, tmp_path / "src.parquet")
    with pytest.raises(BuildError, match=rf"row 5 \(source row 5, id {rows[5]['id']}\): invalid UTF-8"):
        build(_config(tmp_path / "src.parquet", kimi_dir), tmp_path / "out")


def test_a_source_value_that_is_not_utf8_counts_as_none(kimi_dir, tmp_path):
    """``source`` is read for the source mix alone: a value that is not a string, or not
    UTF-8, counts as none; the conversation is kept."""
    import pyarrow as pa

    rows = synthetic.conversations(30, seed=2)
    table = pa.Table.from_pylist(rows, schema=synthetic.TULU_SCHEMA)
    bad = pa.Array.from_buffers(
        pa.string(), 1, [None, pa.py_buffer(b"\x00\x00\x00\x00\x02\x00\x00\x00"), pa.py_buffer(b"\xff\xfe")]
    )
    where = table.schema.get_field_index("source")
    values = table.column(where).combine_chunks()
    pq.write_table(
        table.set_column(where, "source", pa.concat_arrays([values[:5], bad, values[6:]])), tmp_path / "a.parquet"
    )
    none = [{**row, "source": None} if k == 5 else row for k, row in enumerate(rows)]
    pq.write_table(pa.Table.from_pylist(none, schema=synthetic.TULU_SCHEMA), tmp_path / "b.parquet")
    built = [build(_config(tmp_path / f"{name}.parquet", kimi_dir), tmp_path / name) for name in "ab"]
    assert built[0]["rows_sha256"] == built[1]["rows_sha256"] and built[0]["source_mix"] == built[1]["source_mix"]
    assert not built[0]["skipped_invalid"]


def test_a_link_in_a_source_folder_to_no_file_is_named(kimi_dir, tmp_path):
    from fixed_sft.source import SourceError

    synthetic.write_parquet(synthetic.conversations(10, seed=2), tmp_path / "src" / "a.parquet")
    (tmp_path / "src" / "b.parquet").symlink_to(tmp_path / "gone.parquet")
    with pytest.raises(
        SourceError,
        match=re.escape(
            f"{tmp_path / 'src' / 'b.parquet'}: a link that cannot be followed (to a file that does not exist)"
        ),
    ):
        build(_config(tmp_path / "src", kimi_dir), tmp_path / "out")
    (tmp_path / "src" / "b.parquet").unlink()
    (tmp_path / "src" / "b.parquet").symlink_to(tmp_path / "src" / "b.parquet")  # (a loop)
    with pytest.raises(
        SourceError, match=re.escape(f"{tmp_path / 'src' / 'b.parquet'}: a link that cannot be followed (")
    ):
        build(_config(tmp_path / "src", kimi_dir), tmp_path / "out")
    (tmp_path / "src" / "b.parquet").unlink()
    (tmp_path / "folder").mkdir()
    (tmp_path / "src" / "b.parquet").symlink_to(tmp_path / "folder")
    with pytest.raises(SourceError, match=re.escape(f"{tmp_path / 'src' / 'b.parquet'}: a link to a folder, whose")):
        build(_config(tmp_path / "src", kimi_dir), tmp_path / "out")


def test_ids_of_different_types_across_files(kimi_dir, tmp_path):
    import pyarrow as pa

    rows = synthetic.conversations(20, seed=3)
    first = pa.Table.from_pylist(rows[:10], schema=synthetic.TULU_SCHEMA)
    first = first.set_column(0, "id", pa.array(range(10), pa.int64()))
    (tmp_path / "src").mkdir()
    pq.write_table(first, tmp_path / "src" / "a.parquet")
    synthetic.write_parquet(rows[10:], tmp_path / "src" / "b.parquet")
    manifest = build(_config(tmp_path / "src", kimi_dir), tmp_path / "out")
    ids = {
        s["id"]
        for r in pq.read_table(tmp_path / "out" / "train.parquet").column("metadata").to_pylist()
        for s in r["segments"]
    }
    assert "3" in ids and "synthetic_15" in ids
    assert manifest["stats"]["conversations"] == 20


def test_integer_ids_are_their_decimal_text_in_both_formats(kimi_dir, tmp_path):
    """A JSONL id 7 and a Parquet int64 id 7 are both "7", so they are one id."""
    import pyarrow as pa

    rows = synthetic.conversations(2, seed=4)
    (tmp_path / "src").mkdir()
    table = pa.Table.from_pylist(rows[:1], schema=synthetic.TULU_SCHEMA)
    pq.write_table(table.set_column(0, "id", pa.array([7], pa.int64())), tmp_path / "src" / "a.parquet")
    (tmp_path / "b.jsonl").write_text(json.dumps({"id": 7, "messages": rows[1]["messages"]}) + "\n")
    parquet = build(_config(tmp_path / "src", kimi_dir, rows=1, row_tokens=8), tmp_path / "p")
    jsonl = build(_config(tmp_path / "b.jsonl", kimi_dir, rows=1, row_tokens=8), tmp_path / "j")
    ids = [
        pq.read_table(folder / "train.parquet").column("metadata").to_pylist()[0]["segments"][0]["id"]
        for folder in (tmp_path / "p", tmp_path / "j")
    ]
    assert ids == ["7", "7"] and parquet["stats"]["rows"] == jsonl["stats"]["rows"] == 1


def test_parquet_ids_that_are_not_strings_or_integers_are_refused(kimi_dir, tmp_path):
    import pyarrow as pa

    from fixed_sft.source import SourceError

    table = pa.Table.from_pylist(synthetic.conversations(3, seed=4), schema=synthetic.TULU_SCHEMA)
    path = tmp_path / "src.parquet"
    pq.write_table(table.set_column(0, "id", pa.array([1.5, 2.0, 3.0])), path)
    with pytest.raises(SourceError, match=rf"{re.escape(str(path))}: 'id' is double; ids must be strings or integers"):
        build(_config(path, kimi_dir), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_source_row_count_must_match_the_spec(sources, kimi_dir, tmp_path):
    with pytest.raises(BuildError, match="has 45 rows; bad expects 939343"):
        build(_config(sources[1], kimi_dir, source_rows=939343), tmp_path / "out")


def test_an_error_drops_queued_background_hashes():
    """Source files are hashed in the background; on an error, hashes not yet started are
    dropped, so a failed build does not wait to hash the whole source."""
    import threading

    from fixed_sft.build import _cancelling_pool

    ran, release = [], threading.Event()
    with pytest.raises(RuntimeError):
        with _cancelling_pool() as pool:
            futures = [pool.submit(lambda n: ran.append(n) or release.wait(10), n) for n in range(4)]
            futures[-1].add_done_callback(lambda _: release.set())  # done once dropped: lets the first end
            while not ran:
                threading.Event().wait(0.01)
            raise RuntimeError("a row error")
    assert ran == [0] and all(f.cancelled() for f in futures[1:])


def test_template_without_the_assistant_header_end_is_one_clear_error(sources, kimi_dir, tmp_path):
    from fixed_sft.chat import TemplateMismatch

    folder = tmp_path / "tok"
    shutil.copytree(kimi_dir, folder)
    template = folder / "chat_template.jinja"
    template.write_text(
        template.read_text().replace(
            "<|im_assistant|>{{role_name}}<|im_middle|>", "<|im_assistant|>{{role_name}}<|im_end|>"
        )
    )
    with pytest.raises(TemplateMismatch, match=re.escape("assistant header has no <|im_middle|>, which ends it")):
        build(_config(sources[1], folder, allow_unpinned_tokenizer=True), tmp_path / "out")


def test_eos_token_as_an_added_token_object_and_no_bos_token(sources, kimi_dir, tmp_path):
    """``eos_token`` may be written as transformers' added-token object, and a tokenizer
    may have no ``bos_token`` (rows never hold one): same rows."""
    folder = tmp_path / "tok"
    shutil.copytree(kimi_dir, folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["eos_token"] = {"content": config["eos_token"], "lstrip": False, "rstrip": False, "special": True}
    config["bos_token"] = None
    config_path.write_text(json.dumps(config))
    pinned = build(_config(sources[1], kimi_dir, rows=3), tmp_path / "a")
    unpinned = build(_config(sources[1], folder, rows=3, allow_unpinned_tokenizer=True), tmp_path / "b")
    assert unpinned["rows_sha256"] == pinned["rows_sha256"]


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        ({"eos_token": "<|no-such-token|>"}, "eos_token '<|no-such-token|>' is not an added token"),
        ({"eos_token": ["[EOS]"]}, "eos_token ['[EOS]'] is not an added token"),
        ({"added_tokens_decoder": None}, "'added_tokens_decoder' is missing or malformed"),
    ],
)
def test_unusable_tokenizer_config_is_one_clear_error(sources, kimi_dir, tmp_path, edit, says):
    from fixed_sft.tokenizer import TokenizerError

    folder = tmp_path / "tok"
    shutil.copytree(kimi_dir, folder)
    config_path = folder / "tokenizer_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), **edit}))
    with pytest.raises(TokenizerError, match=re.escape(says)):
        build(_config(sources[1], folder, allow_unpinned_tokenizer=True), tmp_path / "out")


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (5, "added token 163587 is named 5, not a non-empty string"),
        ("", "added token 163587 is named '', not a non-empty string"),
        ("<|im_assistant|>", "added tokens 163587 and 163588 are both named '<|im_assistant|>'"),
    ],
)
def test_added_tokens_need_distinct_names(sources, kimi_dir, tmp_path, content, says):
    """Whatever the flags: a name shared by two ids would leave one of them unreachable from text."""
    from fixed_sft.tokenizer import TokenizerError

    folder = tmp_path / "tok"
    shutil.copytree(kimi_dir, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config["added_tokens_decoder"]["163588"]["content"] == "<|im_assistant|>"
    config["added_tokens_decoder"]["163587"]["content"] = content
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(TokenizerError, match=re.escape(says)):
        build(_config(sources[1], folder, allow_unpinned_tokenizer=True), tmp_path / "out")


def test_json_nested_too_deeply_is_an_invalid_row(kimi_dir, tmp_path):
    good = json.dumps({"id": "ok", **GOOD}).encode()
    (tmp_path / "deep.jsonl").write_bytes(good + b"\n" + b"[" * 100_000 + b"]" * 100_000 + b"\n")
    with pytest.raises(BuildError, match=r"line 2 \(source row 1\): JSON nested too deeply"):
        build(_config(tmp_path / "deep.jsonl", kimi_dir, rows=1, row_tokens=4), tmp_path / "out")
    manifest = build(
        _config(tmp_path / "deep.jsonl", kimi_dir, rows=1, row_tokens=4, skip_invalid=True), tmp_path / "out"
    )
    assert [e["index"] for e in manifest["skipped_invalid"]] == [1]


def test_a_parquet_date_out_of_pythons_range_is_an_invalid_row(kimi_dir, tmp_path):
    """pyarrow cannot give a date past year 9999 as Python's: that row, not the build, fails."""
    import pyarrow as pa

    def messages(stamp):
        return [{"role": "user", "content": "hi " * 30, "at": stamp}, {"role": "assistant", "content": "ok " * 30}]

    kind = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string()), ("at", pa.int64())]))
    stamps = pa.array([messages(None)] * 5 + [messages(10**15)] + [messages(None)] * 4, kind)
    timed = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string()), ("at", pa.timestamp("s"))]))
    ids = pa.array([f"r{k}" for k in range(10)])
    pq.write_table(pa.table({"id": ids, "messages": stamps.cast(timed)}), tmp_path / "src.parquet")
    with pytest.raises(BuildError, match=r"row 5 \(source row 5, id r5\): holds a value out of Python's range"):
        build(_config(tmp_path / "src.parquet", kimi_dir, row_tokens=16), tmp_path / "out")
    manifest = build(_config(tmp_path / "src.parquet", kimi_dir, row_tokens=16, skip_invalid=True), tmp_path / "out")
    assert [(e["index"], e["id"]) for e in manifest["skipped_invalid"]] == [(5, "r5")]


@pytest.mark.parametrize("number", ["NaN", "-Infinity", "1e999"])
def test_a_number_json_has_not_is_an_invalid_row(kimi_dir, tmp_path, number):
    """Python's json reads ``NaN`` and ``Infinity`` (and ``1e999`` as infinity); a template
    would write them back as such, which is not JSON: the row is refused."""
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
    row = {"id": "bad", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [call]}]}
    line = json.dumps(row).replace('{"x": 1}', '{"x": ' + number + "}")
    good = json.dumps({"id": "ok", **GOOD})
    (tmp_path / "src.jsonl").write_text(good + "\n" + line + "\n")
    with pytest.raises(BuildError, match=r"line 2 \(source row 1, id bad\): message 1 holds (nan|-?inf), which is not"):
        build(_config(tmp_path / "src.jsonl", kimi_dir, rows=1, row_tokens=4), tmp_path / "out")


def test_an_integer_of_too_many_digits_is_named_plainly(kimi_dir, tmp_path):
    good = json.dumps({"id": "ok", **GOOD})
    (tmp_path / "src.jsonl").write_text(good + "\n" + '{"n": ' + "9" * 5000 + "}\n")
    with pytest.raises(
        BuildError, match=r"line 2 \(source row 1\): not readable JSON \(an integer of more than \d+ digits\) \(--skip"
    ):
        build(_config(tmp_path / "src.jsonl", kimi_dir, rows=1, row_tokens=4), tmp_path / "out")


def test_a_conversation_the_template_refuses_is_a_mismatch_naming_its_row(kimi_dir, tmp_path):
    """A template may refuse some conversations (here: roles that do not alternate); a
    checked one that it refuses stops the build in one line naming the row."""
    from fixed_sft.chat import TemplateMismatch

    folder = tmp_path / "tok"
    shutil.copytree(kimi_dir, folder)
    template = folder / "chat_template.jinja"
    guard = (
        "{%- for m in messages -%}{%- if not loop.first and m['role'] == messages[loop.index0 - 1]['role'] -%}"
        "{{ raise_exception('roles must alternate') }}{%- endif -%}{%- endfor -%}"
    )
    template.write_text(guard + template.read_text())
    user = {"role": "user", "content": "q"}
    (tmp_path / "one.jsonl").write_text(json.dumps({"id": "twice", "messages": [user, user]}) + "\n")
    config = _config(tmp_path / "one.jsonl", folder, rows=1, row_tokens=4, check_every=1, allow_unpinned_tokenizer=True)
    with pytest.raises(
        TemplateMismatch,
        match=r"source row 0 \(id twice\): the chat template refuses the "
        r"conversation \(TemplateError: roles must alternate\)",
    ):
        build(config, tmp_path / "out")


@pytest.mark.parametrize("position", [0, 30], ids=["reached", "past-the-last-row"])
def test_a_template_failure_stops_the_build_where_it_reaches_it_at_any_worker_count(kimi_dir, tmp_path, position):
    """Workers encode whole chunks ahead of the build; a checked conversation the template
    refuses stops the build only when the build reaches it, as with one worker: past
    the last row the build needs, it changes nothing."""
    from fixed_sft.chat import TemplateMismatch
    from fixed_sft.order import permutation

    folder = tmp_path / "tok"
    shutil.copytree(kimi_dir, folder)
    template = folder / "chat_template.jinja"
    guard = "{%- for m in messages if m['content'] == 'BOOM' -%}{{ raise_exception('boom') }}{%- endfor -%}"
    template.write_text(guard + template.read_text())
    bad = int(permutation(7, 40)[position])
    rows = [
        {"id": f"row-{i}", "messages": [{"role": "user", "content": "BOOM" if i == bad else "hi"}, GOOD["messages"][1]]}
        for i in range(40)
    ]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    manifests = []
    for workers in (1, 2):
        config = _config(
            tmp_path / "rows.jsonl",
            folder,
            rows=1,
            row_tokens=16,
            check_every=1,
            workers=workers,
            allow_unpinned_tokenizer=True,
        )
        if position == 0:
            with pytest.raises(
                TemplateMismatch,
                match=rf"source row {bad} \(id row-{bad}\): the chat template refuses "
                r"the conversation \(TemplateError: boom\)",
            ):
                build(config, tmp_path / f"out{workers}")
            assert not (tmp_path / f"out{workers}").exists()
        else:
            manifest = build(config, tmp_path / f"out{workers}")
            assert manifest["stats"]["conversations"] < position
            manifests.append({key: manifest[key] for key in ("rows_sha256", "parquet", "template_check", "stats")})
    assert manifests == ([] if position == 0 else [manifests[0]] * 2)


def test_an_id_is_used_only_by_a_valid_row_and_duplicates_name_its_user(kimi_dir, tmp_path):
    """In packing order: an invalid row with id x, then two valid ones. The invalid row
    does not use the id, so the first valid row keeps it and the second names that row."""
    from fixed_sft.order import permutation

    first, second, third = (int(i) for i in permutation(7, 10)[:3])
    lines = [json.dumps({"id": f"row-{i}", **GOOD}).encode() for i in range(10)]
    lines[first] = b'{"id": "x"}'
    lines[second] = lines[third] = json.dumps({"id": "x", **GOOD}).encode()
    (tmp_path / "src.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    manifest = build(_config(tmp_path / "src.jsonl", kimi_dir, skip_invalid=True), tmp_path / "out")
    assert manifest["skipped_invalid"] == [
        {"index": first, "id": "x", "reason": "'messages' is missing"},
        {"index": third, "id": "x", "reason": f"duplicate id (first used by source row {second})"},
    ]


def test_rows_skipped_counts_only_all_zero_rows(sources, kimi_dir, tmp_path, encoder):
    """Invalid rows skipped are counted in invalid_rows_skipped, not in rows_skipped: the
    kept and dropped rows and the tail hold the valid conversations' tokens exactly."""
    manifest = build(_config(sources[0], kimi_dir, skip_invalid=True), tmp_path / "out")
    stats = manifest["stats"]
    unit = len(encoder.encode(GOOD["messages"])[0]) + 1
    assert (stats["rows"] + stats["rows_skipped"]) * 16 + stats["tail_tokens_dropped"] == (45 - len(BAD_LINES)) * unit


# rows given a message key the Kimi fast path does not read, and that key
UNREAD_KEYS = {
    3: ("thinking", "thought"),
    8: ("weight", 0),
    13: ("extra", {"note": "kept out of the ids"}),
}


def _unread_key_rows(spoil=lambda message, key, value: message.update({key: value})) -> list[dict]:
    rows = []
    for i in range(20):
        messages = [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]
        if i in UNREAD_KEYS:
            spoil(messages[1], *UNREAD_KEYS[i])
        rows.append({"id": f"row-{i}", "messages": messages})
    return rows


def _unread_key_source(folder, suffix):
    """The rows in ``suffix``'s format; in Parquet, ``messages`` is a struct with every key
    of ``UNREAD_KEYS``, null in every row but the one it spoils."""
    import pyarrow as pa

    rows = _unread_key_rows()
    path = folder / f"src{suffix}"
    folder.mkdir()
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return path
    message = pa.struct(
        [
            ("role", pa.string()),
            ("content", pa.string()),
            ("thinking", pa.string()),
            ("weight", pa.int64()),
            ("extra", pa.struct([("note", pa.string())])),
        ]
    )
    pq.write_table(
        pa.Table.from_pylist(rows, schema=pa.schema([("id", pa.string()), ("messages", pa.list_(message))])), path
    )
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_a_message_key_the_encoder_would_drop_stops_the_build_naming_row_and_key(kimi_dir, tmp_path, suffix):
    path = _unread_key_source(tmp_path / "src", suffix)
    with pytest.raises(BuildError) as error:
        build(_config(path, kimi_dir), tmp_path / "out")
    match = re.fullmatch(
        rf"{re.escape(str(path))}: (line|row) (\d+) \(source row (\d+), id row-(\d+)\): message 1 has the key "
        r"'(\w+)', which the kimi_k25 encoder does not read \(--skip-invalid skips such rows and records them\)",
        str(error.value),
    )
    index = int(match[3])
    assert int(match[2]) == index + (suffix == ".jsonl") and match[1] == ("line" if suffix == ".jsonl" else "row")
    assert int(match[4]) == index and match[5] == UNREAD_KEYS[index][0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_skip_invalid_records_each_message_key_the_encoder_would_drop(kimi_dir, tmp_path, suffix):
    """And the other rows, whose keys are null in Parquet, are the rows of a source
    without those keys: the same ``rows_sha256``."""
    manifest = build(
        _config(_unread_key_source(tmp_path / "src", suffix), kimi_dir, skip_invalid=True), tmp_path / "out"
    )
    skipped = {entry["index"]: (entry["id"], entry["reason"]) for entry in manifest["skipped_invalid"]}
    assert skipped == {
        i: (f"row-{i}", f"message 1 has the key {key!r}, which the kimi_k25 encoder does not read")
        for i, (key, _) in UNREAD_KEYS.items()
    }
    plain = tmp_path / "plain.jsonl"  # the same rows skipped for another reason, the others without the keys
    rows = _unread_key_rows(spoil=lambda message, key, value: message.update(role="narrator"))
    plain.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert (
        manifest["rows_sha256"] == build(_config(plain, kimi_dir, skip_invalid=True), tmp_path / "plain")["rows_sha256"]
    )


@pytest.mark.parametrize("workers", [1, 2])
def test_a_template_failure_in_the_pass_that_fills_the_store_stops_the_build(
    kimi_dir, tmp_path, monkeypatch, token_store, workers
):
    """A ``--rows all`` build of several bands fills the token store first; a checked
    conversation the template refuses is not stored, and stops the build, naming it, when
    the build reaches it in packing order."""
    import fixed_sft.build as build_module
    from fixed_sft.chat import TemplateMismatch
    from fixed_sft.encode import sampled
    from fixed_sft.order import permutation

    folder = tmp_path / "tok"
    shutil.copytree(kimi_dir, folder)
    template = folder / "chat_template.jinja"
    guard = "{%- for m in messages if m['content'] == 'BOOM' -%}{{ raise_exception('boom') }}{%- endfor -%}"
    template.write_text(guard + template.read_text())
    order = permutation(7, 300)
    bad = int(order[150:][sampled(order[150:], 2)][0])  # (sampled, from position 150 on)
    rows = [
        {
            "id": f"row-{i}",
            "messages": [{"role": "user", "content": "BOOM" if i == bad else f"hi {i}"}, GOOD["messages"][1]],
        }
        for i in range(300)
    ]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    monkeypatch.setattr(build_module, "BAND_BYTES", (tmp_path / "rows.jsonl").stat().st_size)  # (3 bands)
    config = _config(tmp_path / "rows.jsonl", folder, check_every=2, workers=workers, allow_unpinned_tokenizer=True)
    with pytest.raises(TemplateMismatch, match=rf"source row {bad} \(id row-{bad}\): the chat template refuses"):
        build(config, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    from fixed_sft.store import TokenStore

    (entry,) = token_store.glob("tokens/*")
    held = TokenStore(entry, 300).segment >= 0
    assert not held[bad] and held.sum() >= 300 - 128  # (all but the refused one and the rest of its chunk)


def _boom_tokenizer(kimi_dir: Path, tmp_path: Path) -> Path:
    """A copy of the Kimi tokenizer whose template refuses a message of content ``BOOM``."""
    folder = tmp_path / "tok"
    shutil.copytree(kimi_dir, folder)
    template = folder / "chat_template.jinja"
    guard = "{%- for m in messages if m['content'] == 'BOOM' -%}{{ raise_exception('boom') }}{%- endfor -%}"
    template.write_text(guard + template.read_text())
    return folder


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("kinds", [("invalid", "invalid"), ("refused", "refused"), ("refused", "invalid")])
def test_a_build_that_fills_the_store_stops_at_the_first_failure_in_packing_order(
    kimi_dir, tmp_path, monkeypatch, workers, kinds
):
    """Two failing rows (an invalid one, or one the template refuses, sampled for the check):
    ``a`` from packing position 10 on, ``b`` later in packing order but earlier in the
    source. A ``--rows all`` build that fills the store in source order stops at ``a``,
    with the error of a build without the store."""
    import dataclasses
    import re

    import fixed_sft.build as build_module
    from fixed_sft.chat import TemplateMismatch
    from fixed_sft.encode import sampled
    from fixed_sft.order import permutation

    order = permutation(7, 300).tolist()
    checked = [p for p in range(10, 300) if sampled(np.array([order[p]]), 2)[0]]
    a = order[checked[0]]
    b = order[next(p for p in checked[1:] if order[p] < a)]
    rows = [
        {"id": f"row-{i}", "messages": [{"role": "user", "content": f"hi {i}"}, GOOD["messages"][1]]}
        for i in range(300)
    ]
    for row, kind in ((rows[a], kinds[0]), (rows[b], kinds[1])):
        row["messages"][0] = (
            {"role": "robot", "content": "hi"} if kind == "invalid" else {"role": "user", "content": "BOOM"}
        )
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    monkeypatch.setattr(build_module, "BAND_BYTES", source.stat().st_size)  # (3 bands)
    config = _config(
        source, _boom_tokenizer(kimi_dir, tmp_path), check_every=2, workers=workers, allow_unpinned_tokenizer=True
    )
    with pytest.raises((InvalidSourceRow, TemplateMismatch)) as plain:
        build(dataclasses.replace(config, no_cache=True), tmp_path / "plain")
    assert re.search(rf"source row {a}\b", str(plain.value))
    with pytest.raises((InvalidSourceRow, TemplateMismatch)) as stored:
        build(config, tmp_path / "stored")
    assert (type(stored.value), str(stored.value)) == (type(plain.value), str(plain.value))


def test_a_stored_row_whose_check_fails_stops_the_build_before_a_later_invalid_one(kimi_dir, tmp_path):
    """A row stored unchecked (by a build that checks none), which a later build samples and
    the template refuses, comes from the store at once, its check to be settled later. An
    invalid row stored just after it in packing order must not stop the build first: the
    error is the refused row's, as without the store."""
    import dataclasses

    from fixed_sft.chat import TemplateMismatch
    from fixed_sft.encode import sampled
    from fixed_sft.order import permutation

    order = permutation(7, 300).tolist()
    position = next(p for p in range(10, 299) if sampled(np.array([order[p]]), 2)[0])
    bad, invalid = order[position], order[position + 1]
    rows = [
        {"id": f"row-{i}", "messages": [{"role": "user", "content": f"hi {i}"}, GOOD["messages"][1]]}
        for i in range(300)
    ]
    rows[bad]["messages"][0]["content"] = "BOOM"
    rows[invalid]["messages"][0] = {"role": "robot", "content": "hi"}
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = _config(source, _boom_tokenizer(kimi_dir, tmp_path), check_every=2, allow_unpinned_tokenizer=True)
    config = dataclasses.replace(config, cache_dir=str(tmp_path / "store"))
    build(dataclasses.replace(config, check_every=0, skip_invalid=True), tmp_path / "unchecked")  # (stores every row)
    with pytest.raises((InvalidSourceRow, TemplateMismatch)) as plain:
        build(dataclasses.replace(config, no_cache=True), tmp_path / "plain")
    assert isinstance(plain.value, TemplateMismatch) and f"source row {bad} " in str(plain.value)
    with pytest.raises((InvalidSourceRow, TemplateMismatch)) as stored:
        build(config, tmp_path / "stored")
    assert (type(stored.value), str(stored.value)) == (type(plain.value), str(plain.value))

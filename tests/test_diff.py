"""diff A B: the manifest fields, first differing row and token, and the text around it."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
import synthetic

from fixed_sft.build import BuildConfig, build
from fixed_sft.cli import main
from fixed_sft.diff import fields, first_token, read_row
from fixed_sft.inspect_rows import open_build


def _build(folder, rows, kimi_dir, name, **overrides):
    source = folder / f"{name}.jsonl"
    synthetic.write_jsonl(rows, source)
    values = dict(name="d", source=str(source), tokenizer=str(kimi_dir), rows=12, row_tokens=128, seed=4, workers=1)
    build(BuildConfig(**{**values, **overrides}), folder / name, progress=False)
    return folder / name


@pytest.fixture(scope="module")
def pair(tmp_path_factory, kimi_dir):
    """Two builds whose sources differ in one character of the conversation row 3 holds
    at its middle token."""
    folder = tmp_path_factory.mktemp("diff")
    rows = synthetic.conversations(60, seed=9)
    first = _build(folder, rows, kimi_dir, "a")
    segments = pq.read_table(first / "train.parquet").column("metadata").to_pylist()[3]["segments"]
    changed = json.loads(json.dumps(rows))
    reply = next(m for m in changed[segments[-1]["source_index"]]["messages"] if m["role"] == "assistant")
    reply["content"] = reply["content"][:-1] + ("X" if reply["content"][-1:] != "X" else "Y")
    return first, _build(folder, changed, kimi_dir, "b")


def _tokens(folder, k):
    row = pq.read_table(folder / "train.parquet").column("metadata").to_pylist()[k]
    return np.array(row["input_ids"]), np.array(row["loss_mask"]), row["segments"]


def test_the_first_differing_row_and_token_are_named(pair, kimi_dir, capsys):
    a, b = pair
    assert main(["diff", str(a), str(b), "--tokenizer", str(kimi_dir)]) == 1
    out = capsys.readouterr().out
    hashes = [json.loads((f / "manifest.json").read_text())["row_sha256"] for f in pair]
    number = next(k for k, (x, y) in enumerate(zip(*hashes)) if x != y)
    (ids_a, mask_a, segments_a), (ids_b, mask_b, _) = _tokens(a, number), _tokens(b, number)
    token = int(np.flatnonzero((ids_a != ids_b) | (mask_a != mask_b))[0])
    assert f"the first is row {number}" in out and f"row {number}, token {token}: first differing" in out
    at, holder = 0, None
    for segment in segments_a:
        at += segment["end"] - segment["start"]
        if token < at:
            holder = segment
            break
    assert f"  {a}: id {ids_a[token]}, mask {mask_a[token]} (source row {holder['source_index']}" in out
    assert f"  {b}: id {ids_b[token]}" in out
    assert "⟦" in out and "not decoded" not in out
    assert "manifest source.files.0.sha256:" in out and "manifest rows_sha256:" in out


def test_the_same_build_twice_is_the_same(pair, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(pair[0], copy)
    assert main(["diff", str(pair[0]), str(copy)]) == 0
    assert capsys.readouterr().out.startswith("same: ")


def test_builds_apart_only_in_their_boundaries_say_so(pair, tmp_path, kimi_dir, capsys):
    """The same rows with ``--emit-boundaries``: the row hashes differ (they cover each row's
    boundaries too), the ids and masks do not, and no token is named."""
    bounded = _build(tmp_path, synthetic.conversations(60, seed=9), kimi_dir, "a", emit_boundaries=True)
    capsys.readouterr()
    assert main(["diff", str(pair[0]), str(bounded)]) == 1
    out = capsys.readouterr().out
    assert "rows' ids and masks: the same in every row; one build's row hashes cover its boundaries too\n" in out
    assert "manifest params.emit_boundaries: absent | true\n" in out and ", token " not in out


@pytest.mark.parametrize("both", [False, True], ids=["one with boundaries", "both"])
def test_a_token_apart_is_found_whatever_the_boundaries(pair, tmp_path, kimi_dir, capsys, both):
    """A build with boundaries against one without or with them, of sources a token apart:
    the rows are compared by their ids and masks, and the first differing row and token
    are named."""
    assert main(["diff", str(pair[0]), str(pair[1])]) == 1
    named = next(line for line in capsys.readouterr().out.splitlines() if ", token " in line)
    rows = [[json.loads(line) for line in (f.parent / f"{f.name}.jsonl").read_text().splitlines()] for f in pair]
    first = _build(tmp_path, rows[0], kimi_dir, "a", emit_boundaries=True) if both else pair[0]
    bounded = _build(tmp_path, rows[1], kimi_dir, "b", emit_boundaries=True)
    capsys.readouterr()
    assert main(["diff", str(first), str(bounded)]) == 1
    out = capsys.readouterr().out
    assert "rows' ids and masks: 1 of 12 rows differ" in out and f"{named}\n" in out


def test_rows_of_the_same_tokens_from_other_conversations_are_named(pair, tmp_path, capsys):
    """A copy whose row 5 names another id in its segments (its tokens kept, the file's
    hash recorded): the row hashes agree, and the row whose provenance differs is named."""
    import pyarrow as pa

    from fixed_sft.hashes import sha256_file
    from fixed_sft.verify import verify

    copy = tmp_path / "copy"
    shutil.copytree(pair[0], copy)
    parquet = copy / "train.parquet"
    table = pq.read_table(parquet)
    rows = table.to_pylist()
    rows[5]["metadata"]["segments"][0]["id"] = "someone else"
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), parquet)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["parquet"].update(bytes=parquet.stat().st_size, sha256=sha256_file(parquet))
    (copy / "manifest.json").write_text(json.dumps(manifest, indent=1))
    assert verify(copy) == []
    capsys.readouterr()
    assert main(["diff", str(pair[0]), str(copy)]) == 1
    out = capsys.readouterr().out
    assert "row hashes" not in out and "row 5: the same tokens, other segments (source rows and ids)\n" in out
    assert f"  {copy}: source row " in out and "(someone else) tokens " in out
    assert "manifest parquet.sha256:" in out


def test_other_parameters_are_named_field_by_field(pair, tmp_path, kimi_dir, capsys):
    rows = synthetic.conversations(60, seed=9)
    other = _build(tmp_path, rows, kimi_dir, "a", seed=5)
    assert main(["diff", str(pair[0]), str(other)]) == 1
    out = capsys.readouterr().out
    assert "manifest params.seed: 4 | 5" in out
    assert "(not decoded:" in out or "⟦" in out  # without --tokenizer: decoded from the cache, or shown as ids
    assert "(not decoded:" not in out or ("(diff reads the Hugging Face cache alone)" in out and "inspect" not in out)


def test_a_reason_for_ids_not_decoded_is_given_once(pair, monkeypatch, capsys):
    import fixed_sft.diff as diff_module
    from fixed_sft.errors import BuildError

    def no_tokenizer(manifest, tokenizer, command):
        raise BuildError("the tokenizer files are not in the cache (a long reason)")

    monkeypatch.setattr(diff_module, "decoder", no_tokenizer)
    assert main(["diff", str(pair[0]), str(pair[1])]) == 1
    out = capsys.readouterr().out
    assert out.count("(not decoded: the tokenizer files are not in the cache (a long reason))") == 1
    assert out.count("(not decoded: as above)") == 1


def test_fields_compare_as_json():
    assert fields({"a": [1, {"b": True}]}, {"a": [1, {"b": 1}]}) == [("a",)]
    assert fields({"a": {"b": 1, "c": 2}}, {"a": {"b": 1}}) == [("a", "c")]
    assert fields({"a": 1}, {"a": 1}) == []


def test_a_key_with_dots_shows_both_values(pair, tmp_path, kimi_dir, capsys):
    """File names hold dots (``tiktoken.model``, ``README.md``): each side's value is shown."""
    other = _build(tmp_path, synthetic.conversations(60, seed=9), kimi_dir, "a", row_tokens=96)
    assert main(["diff", str(pair[0]), str(other)]) == 1
    out = capsys.readouterr().out
    bytes_a, bytes_b = (json.loads((f / "manifest.json").read_text())["parquet"]["bytes"] for f in (pair[0], other))
    assert f"manifest parquet.bytes: {bytes_a} | {bytes_b}" in out
    lines = [line for line in out.splitlines() if line.startswith("manifest card.files.README.md.")]
    assert lines and all("absent" not in line for line in lines)


@pytest.mark.parametrize("damage", ["token", "row hash", "truncated"])
def test_a_folder_that_does_not_match_its_manifest_is_refused(pair, tmp_path, capsys, damage):
    """Rows are compared by their hashes: a folder whose rows are not the ones its manifest
    hashes is refused, naming its first difference, never called the same."""
    copy = tmp_path / "copy"
    shutil.copytree(pair[0], copy)
    parquet, manifest = copy / "train.parquet", copy / "manifest.json"
    if damage == "token":
        table = pq.read_table(parquet)
        rows = table.to_pylist()
        rows[3]["metadata"]["input_ids"][5] += 1
        pq.write_table(type(table).from_pylist(rows, schema=table.schema), parquet)
    elif damage == "row hash":
        document = json.loads(manifest.read_text())
        document["row_sha256"][3] = "0" * 64
        manifest.write_text(json.dumps(document))
    else:
        parquet.write_bytes(parquet.read_bytes()[:3000])
    assert main(["diff", str(pair[0]), str(copy)]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert f"{copy} does not match its manifest" in captured.err


def test_a_row_that_is_a_prefix_differs_where_it_ends(pair):
    manifest = open_build(pair[0])
    row = read_row(pair[0], manifest, 0)
    shorter = type(row)(row.ids[:50], row.mask[:50], row.segments)
    assert first_token(row, shorter) == 50


def test_a_folder_that_is_not_a_build_is_one_line(pair, tmp_path, capsys):
    assert main(["diff", str(pair[0]), str(tmp_path / "absent")]) == 1
    assert capsys.readouterr().err.count("\n") == 1


def test_the_rules_as_doctests():
    import doctest

    import fixed_sft.diff

    assert doctest.testmod(fixed_sft.diff).failed == 0

"""``verify DIR --rebuild --rows SPEC``: chosen rows proven from the recorded inputs, re-encoding
only what they need; a forged row, segment or source row is named."""

from __future__ import annotations

import hashlib
import json
import re
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import synthetic

from fixed_sft.build import BuildConfig, build
from fixed_sft.cli import main
from fixed_sft.hashes import sha256_file
from fixed_sft.verify import verify

ROW_TOKENS = 256
BAD = ['{"id": "bad"}', "not json", '{"id": "empty", "messages": []}']  # at packing positions 0, 5 and 12 (seed 7)


def _jsonl(path):
    from fixed_sft.order import permutation

    lines = [json.dumps({"id": r["id"], "messages": r["messages"]}) for r in synthetic.conversations(60, seed=8)]
    for position, line in zip((0, 5, 12), BAD):
        lines[int(permutation(7, 60)[position])] = line
    path.write_text("\n".join(lines) + "\n")
    return path


def _parquet(folder):
    """Three files of small row groups (7 rows), one row invalid (no messages): the first in
    packing order (seed 7), so that row 0 is proven past it."""
    from fixed_sft.order import permutation

    rows = [{"id": r["id"], "messages": r["messages"]} for r in synthetic.conversations(60, seed=5)]
    rows[int(permutation(7, 60)[0])]["messages"] = []
    folder.mkdir()
    kind = pa.struct([("role", pa.string()), ("content", pa.string())])
    schema = pa.schema([("id", pa.string()), ("messages", pa.list_(kind))])
    for k in range(3):
        part = [
            {"id": r["id"], "messages": [{"role": m["role"], "content": m["content"]} for m in r["messages"]]}
            for r in rows[20 * k : 20 * (k + 1)]
        ]
        pq.write_table(pa.Table.from_pylist(part, schema=schema), folder / f"part-{k}.parquet", row_group_size=7)
    return folder


@pytest.fixture(scope="module")
def builds(tmp_path_factory, kimi_dir):
    """A JSONL build of 300 rows, some dropped (no supervised token after token 0), and a
    Parquet build of every row (``rows: all``), both skipping invalid rows, with many
    conversations split across rows."""
    root = tmp_path_factory.mktemp("spot")
    made = {}
    for kind, source, rows in (("jsonl", _jsonl(root / "rows.jsonl"), 300), ("parquet", _parquet(root / "pq"), None)):
        config = BuildConfig(
            name="spot",
            source=str(source),
            tokenizer=str(kimi_dir),
            rows=rows,
            row_tokens=ROW_TOKENS,
            seed=7,
            workers=1,
            skip_invalid=True,
        )
        manifest = build(config, root / kind)
        assert manifest["stats"]["invalid_rows_skipped"] == (len(BAD) if kind == "jsonl" else 1)
        assert manifest["stats"]["conversations_split"] > 10
        assert manifest["stats"]["rows_skipped"] > 0 or kind == "parquet"
        made[kind] = (root / kind, source, manifest)
    return made


def _spot(folder, source, kimi_dir, spec, *extra):
    return main(
        [
            "verify",
            str(folder),
            "--rebuild",
            "--source",
            str(source),
            "--tokenizer",
            str(kimi_dir),
            "--rows",
            spec,
            *extra,
        ]
    )


def _copy(builds, kind, tmp_path):
    folder, source, manifest = builds[kind]
    shutil.copytree(folder, tmp_path / "o")
    return tmp_path / "o", source, manifest


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_the_rows_of_a_good_build_are_proven(builds, kimi_dir, capsys, kind):
    folder, source, manifest = builds[kind]
    last = manifest["stats"]["rows"] - 1
    spec = f"0-3,17,20-21,{last}"
    capsys.readouterr()
    assert _spot(folder, source, kimi_dir, spec) == 0
    out = capsys.readouterr().out
    assert f"the spot check of {len([0, 1, 2, 3, 17, 20, 21, last])} rows from the recorded inputs proves them" in out
    for row in (0, 1, 2, 3, 17, 20, 21, last):
        assert f"  row {row}: same\n" in out
    assert "  source: same\n  tokenizer: same\n  loss_mask: same\n" in out and "differs" not in out
    assert "  not proven by a spot check: where a row after an unchecked one is cut," in out
    assert _spot(folder, source, kimi_dir, "sample:5") == 0
    assert capsys.readouterr().out.count(": same\n") == 4 + 5  # the inputs, then the 5 rows


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_every_row_checked_proves_the_whole_stream(builds, kimi_dir, kind):
    """From row 0 on, every cut and every dropped row is proven: the dropped rows counted
    are the manifest's (a build of a row count drops none after its last)."""
    from fixed_sft.spot import parse_rows, report, spot_check

    folder, source, manifest = builds[kind]
    result = spot_check(folder, parse_rows(f"0-{manifest['stats']['rows'] - 1}"), str(source), str(kimi_dir))
    assert result.same and not result.problems and not result.duplicates
    assert report(result)[1][-1] == (
        "  not proven by a spot check: the stats but rows_skipped and tail_tokens_dropped, template_check, "
        "source_mix, skipped_invalid outside the rows read; --rebuild without --rows proves them"
    )
    if kind == "jsonl":  # (of every row: dropped ones after the last row count too)
        assert result.dropped == manifest["stats"]["rows_skipped"] > 0


def _misstated(builds, kind: str, tmp_path, stat: str):
    """A copy of build ``kind`` whose manifest states one more ``stats[stat]``, which verify
    alone does not tell: its folder, source and original manifest."""
    folder, source, manifest = _copy(builds, kind, tmp_path)
    text = json.loads((folder / "manifest.json").read_text())
    text["stats"][stat] += 1
    (folder / "manifest.json").write_text(json.dumps(text, indent=1))
    assert verify(folder) == []
    return folder, source, manifest


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])  # (a row count; rows: all, to the stream's end)
def test_misstated_dropped_rows_are_named_when_every_row_is_checked(builds, kimi_dir, tmp_path, capsys, kind):
    folder, source, manifest = _misstated(builds, kind, tmp_path, "rows_skipped")
    capsys.readouterr()
    last = manifest["stats"]["rows"] - 1
    assert _spot(folder, source, kimi_dir, "3-7") == 0  # (a few rows: the count is not proven)
    assert _spot(folder, source, kimi_dir, f"0-{last}") == 1
    dropped = manifest["stats"]["rows_skipped"]
    assert (
        f"  row {last}: differs (the stream up to it drops {dropped} rows, stats.rows_skipped says {dropped + 1})"
        in capsys.readouterr().out
    )


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_misstated_tail_tokens_are_named_when_every_row_is_checked(builds, kimi_dir, tmp_path, capsys, kind):
    """The tokens dropped after the last row: where the last row's unit ends (a row
    count), or where the stream ends (rows: all), against stats.tail_tokens_dropped."""
    folder, source, manifest = _misstated(builds, kind, tmp_path, "tail_tokens_dropped")
    capsys.readouterr()
    assert _spot(folder, source, kimi_dir, f"0-{manifest['stats']['rows'] - 1}") == 1
    says = f"stats.tail_tokens_dropped says {manifest['stats']['tail_tokens_dropped'] + 1}"
    assert says in capsys.readouterr().out


def test_only_the_conversations_of_the_rows_are_encoded(builds, kimi_dir, monkeypatch):
    """One row holds a few conversations: only those (and the skipped rows between them,
    and before row 0) are read and encoded, and of a Parquet file only the row groups that hold them."""
    import fixed_sft.spot as spot

    folder, source, manifest = builds["parquet"]
    encoded, groups = [], []
    encode_rows, iter_batches = spot.encode_rows, pq.ParquetFile.iter_batches

    def counting(encoder, chunk):
        encoded.extend(chunk.rows.column("index").to_pylist())
        return encode_rows(encoder, chunk)

    def reading(self, *args, row_groups=None, **kwargs):
        groups.extend(row_groups)
        return iter_batches(self, *args, row_groups=row_groups, **kwargs)

    monkeypatch.setattr(spot, "encode_rows", counting)
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", reading)
    table = pq.read_table(folder / "train.parquet")
    segments = table.column("metadata").to_pylist()[20]["segments"]
    result = spot.spot_check(folder, spot.parse_rows("20"), str(source), str(kimi_dir))
    assert result.same
    held, skipped = {s["source_index"] for s in segments}, {row["index"] for row in manifest["skipped_invalid"]}
    assert held <= set(encoded) <= held | skipped  # (a skipped row between two of them is re-read, to prove it invalid)
    assert len(groups) <= len(encoded) < 9  # 9 row groups hold the 60 rows


def _forge(folder, change, check=True):
    """Apply ``change`` to the row dicts of train.parquet, write them with pyarrow, and
    re-record everything the manifest derives from the rows (their count too), so that
    verify finds nothing (``check``: asserted)."""
    from fixed_sft.hashes import row_digest

    parquet = folder / "train.parquet"
    table = pq.read_table(parquet)
    rows = table.to_pylist()
    change(rows)
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), parquet)
    manifest = json.loads((folder / "manifest.json").read_text())
    metadata = [row["metadata"] for row in rows]
    digests = [row_digest(np.array(m["input_ids"]), np.array(m["loss_mask"])) for m in metadata]
    named = [s["source_index"] for m in metadata for s in m["segments"]]
    runs = [len(list(group)) for group in _runs(named)]
    supervised = sum(sum(m["loss_mask"]) for m in metadata)
    manifest["row_sha256"] = [d.hex() for d in digests]
    manifest["rows_sha256"] = hashlib.sha256(b"".join(digests)).hexdigest()
    manifest["parquet"].update(bytes=parquet.stat().st_size, sha256=sha256_file(parquet))
    if manifest["params"]["rows"] != "all":
        manifest["params"]["rows"] = len(rows)
    tokens = sum(len(m["input_ids"]) for m in metadata)
    manifest["stats"].update(
        rows=len(rows),
        tokens=tokens,
        supervised_tokens=supervised,
        supervised_token_ratio=supervised / tokens if tokens else 0.0,
        trainable_tokens=sum(sum(m["loss_mask"][1:]) for m in metadata),
        conversations=len(runs),
        conversations_split=sum(n > 1 for n in runs),
    )
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))
    assert verify(folder) == [] or not check


def _runs(values):
    from itertools import groupby

    return (list(group) for _, group in groupby(values))


def _row_with_segments(folder, n):
    """The first row (after row 1) with at least ``n`` segments."""
    rows = pq.read_table(folder / "train.parquet").column("metadata").to_pylist()
    return next(k for k, row in enumerate(rows) if k > 1 and len(row["segments"]) >= n)


def test_a_forged_id_is_named(builds, kimi_dir, tmp_path, capsys):
    folder, source, _ = _copy(builds, "jsonl", tmp_path)

    def change(rows):
        rows[7]["metadata"]["input_ids"][40] += 1

    _forge(folder, change)
    capsys.readouterr()
    assert _spot(folder, source, kimi_dir, "6-8") == 1
    out = capsys.readouterr().out
    assert "does not prove them" in out and "  row 6: same\n" in out and "  row 8: same\n" in out
    assert "  row 7: differs (input_ids differ at position 40: " in out


def test_a_forged_mask_is_named(builds, kimi_dir, tmp_path, capsys):
    folder, source, _ = _copy(builds, "parquet", tmp_path)
    mask = pq.read_table(folder / "train.parquet").column("metadata").to_pylist()[5]["loss_mask"]
    p = next(p for p in range(1, ROW_TOKENS) if mask[p] == 0)

    def change(rows):
        rows[5]["metadata"]["loss_mask"][p] = 1

    _forge(folder, change)
    capsys.readouterr()
    assert _spot(folder, source, kimi_dir, "5") == 1
    assert f"  row 5: differs (loss_mask differ at position {p}: 1 stored, 0 re-encoded)" in capsys.readouterr().out


def test_a_row_out_of_the_packing_order_is_named(builds, kimi_dir, tmp_path, capsys):
    """A row of a build with another seed holds the right slices of the right units, in
    another order: the segments are named out of the seed's order."""
    folder, source, manifest = _copy(builds, "jsonl", tmp_path)
    config = BuildConfig(
        name="spot",
        source=str(source),
        tokenizer=str(kimi_dir),
        rows=None,
        row_tokens=ROW_TOKENS,
        seed=8,
        workers=1,
        skip_invalid=True,
    )
    build(config, tmp_path / "other")
    theirs = pq.read_table(tmp_path / "other" / "train.parquet").column("metadata").to_pylist()
    j = next(j for j, row in enumerate(theirs) if len(row["segments"]) >= 2)
    k = 9

    def change(rows):
        rows[k]["metadata"] = {**theirs[j], "row": k}

    _forge(folder, change)
    capsys.readouterr()
    assert _spot(folder, source, kimi_dir, str(k)) == 1
    out = capsys.readouterr().out
    assert f"  row {k}: differs (between segments 0 and 1: source row " in out
    assert re.search(r"(comes before source row \d+ \(position \d+\) in the packing order|comes between them)", out)


def test_two_rows_swapped_are_caught_by_a_spot_check_of_either(builds, kimi_dir, tmp_path, capsys):
    """Rows 4 and 9 swapped (their numbers kept), every manifest hash recomputed to match:
    plain verify finds nothing; a spot check of row 4 alone, or of row 9 alone, names it."""
    folder, source, _ = _copy(builds, "jsonl", tmp_path)

    def change(rows):
        rows[4]["metadata"], rows[9]["metadata"] = (
            {**rows[9]["metadata"], "row": 4},
            {**rows[4]["metadata"], "row": 9},
        )

    _forge(folder, change)
    for k in (4, 9):
        capsys.readouterr()
        assert _spot(folder, source, kimi_dir, str(k)) == 1
        assert f"  row {k}: differs (" in capsys.readouterr().out


def _drop(rows, k):
    """Row ``k`` taken out of the file, the rows after it renumbered."""
    del rows[k]
    for number, row in enumerate(rows):
        row["metadata"]["row"] = number


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_a_row_taken_out_is_caught_by_a_spot_check_beside_it(builds, kimi_dir, tmp_path, capsys, kind):
    """Row 5 taken out, the rows after it renumbered, every manifest hash and count
    recomputed: a check of the row before the gap, or of the one after it, names it (each
    row's place is proven against where the rows beside it begin and end in the file)."""
    folder, source, _ = _copy(builds, kind, tmp_path)
    _forge(folder, lambda rows: _drop(rows, 5))
    for k, says in ((4, "to row 5's start, as the file holds it: "), (5, "from row 4's end, as the file holds it: ")):
        capsys.readouterr()
        assert _spot(folder, source, kimi_dir, str(k)) == 1
        assert f"  row {k}: differs ({says}" in capsys.readouterr().out
    capsys.readouterr()
    assert _spot(folder, source, kimi_dir, "0-3") == 0  # (the rows before the gap are the build's)


@pytest.mark.parametrize("side", ["end", "start"])
def test_rows_taken_out_are_caught_when_the_row_beside_names_a_token_of_them(builds, kimi_dir, tmp_path, capsys, side):
    """Rows A + 1 to B taken out, where A ends as B does (else rows A to B - 1, where B
    begins as A does), in other conversations: that token of the row beside the gap renamed
    as the taken rows', in a segment of its own, so tokens and hashes still match. A check
    of the row on the other side of the gap names it: a last segment after another starts
    at its unit's token 0, a first one before another ends at its unit's end."""
    folder, source, _ = _copy(builds, "jsonl", tmp_path)
    table = pq.read_table(folder / "train.parquet").column("metadata").to_pylist()
    at = 0 if side == "start" else -1

    def token(row):
        return table[row]["input_ids"][at], table[row]["loss_mask"][at]

    def segment(row):
        return table[row]["segments"][at]

    a, b = next(
        (a, b)
        for a in range(1, len(table) - 2)
        for b in range(a + 1, len(table) - 1)
        if token(a) == token(b)
        and segment(a)["source_index"] != segment(b)["source_index"]
        and min(segment(r)["end"] - segment(r)["start"] for r in (a, b)) >= 2
    )

    def change(rows):
        if side != "start":  # row A ends with row B's last token
            taken, beside = rows[b]["metadata"]["segments"][-1], rows[a]["metadata"]["segments"]
            beside[-1] = {**beside[-1], "end": beside[-1]["end"] - 1}
            beside.append({**taken, "start": taken["end"] - 1})
            del rows[a + 1 : b + 1]
        else:  # row B begins with row A's first token
            taken, beside = rows[a]["metadata"]["segments"][0], rows[b]["metadata"]["segments"]
            beside[0] = {**beside[0], "start": beside[0]["start"] + 1}
            beside.insert(0, {**taken, "end": taken["start"] + 1})
            del rows[a:b]
        for number, row in enumerate(rows):
            row["metadata"]["row"] = number

    _forge(folder, change)
    capsys.readouterr()
    checked, named = (a - 1, a) if side == "start" else (a + 1, a)
    assert _spot(folder, source, kimi_dir, str(checked)) == 1
    out = capsys.readouterr().out
    if side == "end":
        says = f"from row {named}'s end, as the file holds it: row {named}'s last segment starts at token "
        says += f"{segment(b)['end'] - 1} of source row {segment(b)['source_index']}, but a conversation after "
        says += "another in a row starts at 0)"
    else:
        says = f"to row {named}'s start, as the file holds it: row {named}'s first segment ends at token "
        says += f"{segment(a)['start'] + 1} of source row {segment(a)['source_index']}, before its unit's end ("
    assert f"  row {checked}: differs ({says}" in out


def test_two_rows_swapped_are_caught_when_a_neighbour_is_forged_to_match(builds, kimi_dir, tmp_path, capsys):
    """Rows 5 and 6 swapped, and row 6's segments rewritten to begin where row 5 now ends:
    a check of row 5 alone still names it, from where row 4 ends."""
    folder, source, _ = _copy(builds, "jsonl", tmp_path)

    def change(rows):
        rows[5]["metadata"], rows[6]["metadata"] = (
            {**rows[6]["metadata"], "row": 5},
            {**rows[5]["metadata"], "row": 6},
        )
        last, segments = rows[5]["metadata"]["segments"][-1], rows[6]["metadata"]["segments"]
        size = segments[0]["end"] - segments[0]["start"]
        segments[0] = {**last, "start": last["end"], "end": last["end"] + size}

    _forge(folder, change)
    capsys.readouterr()
    assert _spot(folder, source, kimi_dir, "5") == 1
    assert "  row 5: differs (from row 4's end, as the file holds it: " in capsys.readouterr().out


def test_rows_cut_off_the_end_of_an_all_rows_build_are_caught(builds, kimi_dir, tmp_path, capsys):
    """A ``rows: "all"`` build with its last rows taken off, the counts recomputed: a check
    of its last row finds the source rows that follow it in the stream, which fill more rows."""
    folder, source, manifest = _copy(builds, "parquet", tmp_path)
    assert manifest["params"]["rows"] == "all"
    last = manifest["stats"]["rows"] - 1
    capsys.readouterr()
    assert _spot(folder, source, kimi_dir, f"{last - 1},{last}") == 0  # (the build's own tail is proven)

    def cut(rows):
        del rows[last - 3 :]

    _forge(folder, cut)
    capsys.readouterr()
    assert _spot(folder, source, kimi_dir, str(last - 4)) == 1
    assert f"  row {last - 4}: differs (to the stream's end: " in capsys.readouterr().out


def test_the_rows_between_two_checked_rows_in_one_conversation_are_counted(builds, kimi_dir, tmp_path, capsys):
    """Two checked rows inside one long conversation, a row between them taken out: the
    stream between them holds one row more than the file does."""
    folder, source, _ = _copy(builds, "jsonl", tmp_path)
    rows = pq.read_table(folder / "train.parquet").column("metadata").to_pylist()
    k = next(  # rows k to k + 3 inside one conversation
        k
        for k in range(1, len(rows) - 4)
        if len({s["source_index"] for r in rows[k : k + 4] for s in r["segments"]}) == 1
    )
    capsys.readouterr()
    assert _spot(folder, source, kimi_dir, f"{k},{k + 2}") == 0
    _forge(folder, lambda rows: _drop(rows, k + 1))
    capsys.readouterr()
    assert _spot(folder, source, kimi_dir, f"{k},{k + 2}") == 1
    assert f"  row {k + 2}: differs (" in capsys.readouterr().out


def test_a_row_without_segments_is_named_not_raised(builds, kimi_dir, tmp_path):
    """Through the API (the CLI's verify stops first): a checked row with no segments, and
    a later checked row that looks back to it."""
    import fixed_sft.spot as spot

    folder, source, _ = _copy(builds, "jsonl", tmp_path)
    table = pq.read_table(folder / "train.parquet")
    rows = table.to_pylist()
    rows[3]["metadata"]["segments"] = []
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), folder / "train.parquet")
    result = spot.spot_check(folder, spot.parse_rows("3,10"), str(source), str(kimi_dir))
    assert result.problems == {3: "it has no segments"}


def test_sample_k_is_rows_sample_k(builds, kimi_dir, capsys):
    folder, source, _ = builds["jsonl"]
    common = ["verify", str(folder), "--rebuild", "--source", str(source), "--tokenizer", str(kimi_dir)]
    capsys.readouterr()
    assert main([*common, "--sample", "3"]) == 0
    sampled = capsys.readouterr().out
    drawn = re.search(r"\(--rows (sample:3:[0-9]+) draws them again\)", sampled)
    assert drawn is not None and sampled.count(": same\n") >= 3
    assert main([*common, "--rows", drawn[1]]) == 0
    assert capsys.readouterr().out == sampled
    assert main([*common, "--sample", "3", "--rows", "0"]) == 2
    assert "give one" in capsys.readouterr().err
    assert main([*common, "--sample", "0"]) == 2
    assert "--sample is 0: check at least 1 row" in capsys.readouterr().err


def test_a_segments_id_and_cut_are_checked(builds, kimi_dir, tmp_path, capsys):
    folder, source, _ = _copy(builds, "jsonl", tmp_path)
    k = _row_with_segments(folder, 2)

    def change(rows):
        rows[k]["metadata"]["segments"][1]["id"] = "someone else"

    _forge(folder, change)
    capsys.readouterr()
    assert _spot(folder, source, kimi_dir, str(k)) == 1
    assert f"  row {k}: differs (segment 1 (source row " in capsys.readouterr().out

    folder = tmp_path / "cut"
    shutil.copytree(builds["jsonl"][0], folder)
    rows = pq.read_table(folder / "train.parquet").column("metadata").to_pylist()
    k = next(  # a row inside one long conversation, which the row after goes on with
        k
        for k in range(1, len(rows) - 1)
        if len(rows[k]["segments"]) == 1
        and rows[k]["segments"][0]["start"] > 0
        and rows[k + 1]["segments"][0]["source_index"] == rows[k]["segments"][0]["source_index"]
    )

    def move(rows):  # the cut one token later: the same span, the same ids
        segment = rows[k]["metadata"]["segments"][0]
        segment.update(start=segment["start"] + 1, end=segment["end"] + 1)

    _forge(folder, move)
    capsys.readouterr()
    assert _spot(folder, source, kimi_dir, f"{k - 1}-{k}") == 1
    out = capsys.readouterr().out
    assert f"  row {k - 1}: same\n" in out
    assert f"  row {k}: differs (from row {k - 1}'s end: 1 tokens of the stream lie between them" in out


def test_a_tampered_source_row_is_named(builds, kimi_dir, tmp_path, capsys):
    """A Parquet source file rewritten with one row's content changed: the file is not the
    recorded one, and the row that holds it is named."""
    folder, source, _ = builds["parquet"]
    rows = pq.read_table(folder / "train.parquet").column("metadata").to_pylist()
    index = rows[5]["segments"][0]["source_index"]
    copy = tmp_path / "pq"
    shutil.copytree(source, copy)
    path = copy / f"part-{index // 20}.parquet"
    table = pq.read_table(path)
    changed = table.to_pylist()
    for message in changed[index % 20]["messages"]:
        message["content"] = "Something else entirely. " + message["content"]
    pq.write_table(pa.Table.from_pylist(changed, schema=table.schema), path, row_group_size=7)
    capsys.readouterr()
    assert _spot(folder, copy, kimi_dir, "4-6") == 1
    out = capsys.readouterr().out
    assert "  source: differs (files[" in out and "  row 5: differs (input_ids differ at position " in out


def test_a_held_row_listed_as_skipped_is_named(builds, kimi_dir, tmp_path, capsys):
    """A manifest that lists as skipped a source row that a segment holds."""
    folder, source, manifest = _copy(builds, "jsonl", tmp_path)
    rows = pq.read_table(folder / "train.parquet").column("metadata").to_pylist()
    index = rows[4]["segments"][-1]["source_index"]
    text = json.loads((folder / "manifest.json").read_text())
    text["skipped_invalid"].append({"index": index, "id": None, "reason": "forged"})
    text["stats"]["invalid_rows_skipped"] += 1
    (folder / "manifest.json").write_text(json.dumps(text, indent=1))
    assert verify(folder) == []
    capsys.readouterr()
    assert _spot(folder, source, kimi_dir, "4") == 1
    last = len(rows[4]["segments"]) - 1
    assert f"  row 4: differs (segment {last} (source row {index}, " in (out := capsys.readouterr().out)
    assert f"): skipped_invalid lists source row {index})" in out


def test_a_skipped_rows_forged_id_is_named(builds, kimi_dir, tmp_path, capsys):
    """A skipped invalid row whose recorded id is not the one the source row has; verify alone
    does not tell, a spot check that reads that row does."""
    folder, source, manifest = _copy(builds, "jsonl", tmp_path)
    text = json.loads((folder / "manifest.json").read_text())
    entry = text["skipped_invalid"][0]
    entry["id"] = "forged"
    (folder / "manifest.json").write_text(json.dumps(text, indent=1))
    assert verify(folder) == []
    last = manifest["stats"]["rows"] - 1
    capsys.readouterr()
    assert _spot(folder, source, kimi_dir, f"0-{last}") == 1
    out = capsys.readouterr().out
    assert f"source row {entry['index']} is in skipped_invalid with id 'forged', but re-read its id is " in out


@pytest.mark.parametrize(
    "spec, says",
    [
        ("999", "--rows: row 999 is past the build's last row, "),
        ("3-1", "--rows '3-1': expected row numbers"),
        ("1,,2", "--rows '1,,2': expected row numbers"),
        ("x", "--rows 'x': expected row numbers"),
        ("", "--rows must not be empty"),
        ("sample:0", "--rows 'sample:0': expected sample:N"),
        ("sample:two", "--rows 'sample:two': expected sample:N"),
        ("9" * 5000, f"--rows '{'9' * 5000}': expected row numbers"),  # (int() refuses over 4,300 digits)
        ("sample:" + "9" * 5000, f"--rows 'sample:{'9' * 5000}': expected sample:N"),
    ],
)
def test_a_bad_spec_is_a_usage_error(builds, kimi_dir, capsys, spec, says):
    """Before any check: nothing is printed but the error."""
    folder, source, _ = builds["jsonl"]
    capsys.readouterr()
    assert _spot(folder, source, kimi_dir, spec) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"error: {says}") and len(err.strip().splitlines()) == 1 and out == ""


def test_rows_without_rebuild_is_a_usage_error(builds, capsys):
    capsys.readouterr()
    assert main(["verify", str(builds["jsonl"][0]), "--rows", "0"]) == 2
    err = capsys.readouterr().err
    assert "add --rebuild" in err and "--rows" in err and len(err.strip().splitlines()) == 1


def test_the_spec_chooses_rows_as_documented():
    """Ranges are inclusive; a sample is the rows of the N smallest keys of the documented
    splitmix64 rule with its seed (computed here in plain Python integers)."""
    from fixed_sft.spot import chosen_rows, parse_rows

    assert chosen_rows(parse_rows("17,0,100-103,2-3,3"), 200).tolist() == [0, 2, 3, 17, 100, 101, 102, 103]
    m = 2**64

    def mix(z):
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % m
        return z ^ (z >> 31)

    for seed, text in ((0, "sample:7:0"), (12345, "sample:7:12345")):
        keys = [mix((mix(seed) + (k + 1) * 0x9E3779B97F4A7C15) % m) for k in range(300)]
        assert chosen_rows(parse_rows(text), 300).tolist() == sorted(sorted(range(300), key=keys.__getitem__)[:7])
    assert chosen_rows(parse_rows("sample:50"), 20).tolist() == list(range(20))


def test_a_sample_without_a_seed_draws_one_at_random():
    """``sample:N`` draws its seed as the check starts, so that no one who edits a build
    knows which rows it checks; the seed drawn names the rows again."""
    from fixed_sft.spot import chosen_rows, parse_rows

    spec = parse_rows("sample:7")
    assert spec.seed is None and str(spec) == "sample:7"
    seeds = {spec.drawn().seed for _ in range(4)}
    assert len(seeds) == 4  # (the same 64-bit seed twice: about once in 2**62 runs)
    drawn = spec.drawn()
    assert str(drawn) == f"sample:7:{drawn.seed}" and parse_rows(str(drawn)) == drawn
    assert chosen_rows(drawn, 10_000).tolist() == chosen_rows(parse_rows(str(drawn)), 10_000).tolist()


CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_a_hugging_face_build_is_proven(deepseek_dir, tmp_path, capsys):
    """The any-model path (mask ``assistant``): each conversation re-encoded, and checked
    against the rendered template where the build checked it (every one here)."""
    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").symlink_to(deepseek_dir / "tokenizer.json")
    shutil.copy(deepseek_dir / "tokenizer_config.json", tokenizer)
    (tokenizer / "chat_template.jinja").write_text(CHATML, encoding="utf-8")
    source = synthetic.write_jsonl(synthetic.conversations(30, seed=2), tmp_path / "rows.jsonl")
    flags = ["--tokenizer", str(tokenizer), "--loss-mask-type", "assistant", "--check-every", "1", "--quiet"]
    args = ["--source", str(source), "--rows", "all", "--row-tokens", "128", "--allow-unpinned-tokenizer"]
    assert main([*args, *flags, "--out", str(tmp_path / "o"), "--workers", "1"]) == 0
    capsys.readouterr()
    command = ["verify", str(tmp_path / "o"), "--rebuild", "--source", str(source), "--tokenizer", str(tokenizer)]
    assert main([*command, "--rows", "0-4,30"]) == 0
    out = capsys.readouterr().out
    assert "proves them" in out and all(f"  row {k}: same\n" in out for k in (0, 1, 2, 3, 4, 30))


def test_a_repeated_id_is_named(builds, kimi_dir, tmp_path, capsys):
    """A row that holds a conversation whose id an earlier held one has (as a builder that
    does not skip duplicates would make it), with the source file, the segments' ids and the
    manifest made to agree: only the repeated id tells."""
    from fixed_sft.order import permutation, positions

    folder, source, _ = _copy(builds, "jsonl", tmp_path)
    rank = positions(permutation(7, 60))
    rows = pq.read_table(folder / "train.parquet").column("metadata").to_pylist()
    held = sorted({s["source_index"] for row in rows[:6] for s in row["segments"]}, key=lambda i: rank[i])
    first, later = held[0], held[-1]
    lines = source.read_text().splitlines()
    record, taken = json.loads(lines[later]), json.loads(lines[first])["id"]
    lines[later] = json.dumps({**record, "id": taken})
    copy = tmp_path / "rows.jsonl"
    copy.write_text("\n".join(lines) + "\n")

    def change(rows):
        for row in rows:
            for segment in row["metadata"]["segments"]:
                if segment["source_index"] == later:
                    segment["id"] = taken

    _forge(folder, change)
    text = json.loads((folder / "manifest.json").read_text())
    text["source"]["files"][0].update(bytes=copy.stat().st_size, sha256=sha256_file(copy))
    (folder / "manifest.json").write_text(json.dumps(text, indent=1))
    assert verify(folder) == []
    capsys.readouterr()
    assert _spot(folder, copy, kimi_dir, "0-5") == 1
    out = capsys.readouterr().out
    k = next(k for k, row in enumerate(rows) if later in {s["source_index"] for s in row["segments"]})
    assert "  source: same\n" in out
    assert f"  row {k}: differs (segment " in out
    assert f"source row {first}, earlier in the packing order, has its id {taken!r}, so a build skips this one" in out


def test_two_rows_swapped_are_caught_when_both_neighbours_name_them(builds, kimi_dir, tmp_path, capsys):
    """Two rows swapped, and the last segment of the row before each and the first of the
    row after each rewritten to meet it (their tokens left as they are: a row's hash does
    not cover its segments; rows of one segment, which a conversation fills, so that each
    still covers its row): a check of either swapped row names the row before it, whose
    tokens are not those its segment names."""
    folder, source, _ = _copy(builds, "jsonl", tmp_path)
    segments = _segments(folder)
    inside = [  # rows that start and end inside a conversation, with rows of one segment beside them
        k
        for k in range(1, len(segments) - 1)
        if segments[k][0]["start"] > 0
        and segments[k + 1][0]["source_index"] == segments[k][-1]["source_index"]
        and len(segments[k - 1]) == len(segments[k + 1]) == 1
    ]

    def size(segment):
        return segment["end"] - segment["start"]

    a, b = next(
        (a, b)
        for a in inside
        for b in inside
        if b > a + 2
        and segments[b][0]["start"] >= size(segments[a - 1][-1])
        and segments[a][0]["start"] >= size(segments[b - 1][-1])
    )

    def meet(rows, k, held):  # rows k - 1 and k + 1 rewritten to meet the segments ``held``
        first, last = held[0], held[-1]
        before, after = rows[k - 1]["metadata"]["segments"], rows[k + 1]["metadata"]["segments"]
        before[-1] = {**first, "start": first["start"] - size(before[-1]), "end": first["start"]}
        after[0] = {**last, "start": last["end"], "end": last["end"] + size(after[0])}

    def change(rows):
        rows[a]["metadata"], rows[b]["metadata"] = (
            {**rows[b]["metadata"], "row": a},
            {**rows[a]["metadata"], "row": b},
        )
        meet(rows, a, rows[a]["metadata"]["segments"])
        meet(rows, b, rows[b]["metadata"]["segments"])

    _forge(folder, change)
    for k in (a, b):
        capsys.readouterr()
        assert _spot(folder, source, kimi_dir, str(k)) == 1
        out = capsys.readouterr().out
        assert f"  row {k}: differs (from row {k - 1}'s end, as the file holds it: row {k - 1}'s tokens where" in out


@pytest.mark.parametrize("names", [True, False, "the rows from 0", "not a duplicate", "past the source"])
def test_a_valid_conversation_listed_as_a_duplicate_is_named(kimi_dir, tmp_path, capsys, names):
    """A build of a source with one conversation emptied, its manifest then pointed at the
    source with it whole and the skip's reason made a duplicate id: the conversation is cut
    out of the rows. Where the reason names the source row that used the id first, that row
    is read: its id is another, which a check of the rows beside names. Where it names none
    (as builds wrote it before), a check of every row, or of the rows from row 0 past it,
    reads every conversation before it, and names the duplicate without an earlier copy.
    A valid conversation listed for another reason, or as a duplicate of a row past the
    source's end, is named by a check of the rows beside it."""
    from fixed_sft.order import permutation

    order = permutation(7, 40)
    rows = [{"id": r["id"], "messages": r["messages"]} for r in synthetic.conversations(40, seed=4)]
    whole, emptied = tmp_path / "whole.jsonl", tmp_path / "emptied.jsonl"
    whole.write_text("".join(json.dumps(row) + "\n" for row in rows))
    rows[int(order[9])]["messages"] = []
    emptied.write_text("".join(json.dumps(row) + "\n" for row in rows))
    made = {}
    for name, source in (("whole", whole), ("emptied", emptied)):
        config = BuildConfig(
            name="dup", source=str(source), tokenizer=str(kimi_dir), rows=None, row_tokens=ROW_TOKENS, seed=7,
            workers=1, skip_invalid=True, no_card=True,
        )  # fmt: skip
        made[name] = build(config, tmp_path / name)
    manifest = json.loads((tmp_path / "emptied" / "manifest.json").read_text())
    (skipped,) = manifest["skipped_invalid"]
    assert skipped["index"] == int(order[9])
    skipped["reason"] = {
        True: f"duplicate id (first used by source row {int(order[3])})",
        "not a duplicate": "'messages' is missing",
        "past the source": "duplicate id (first used by source row 999)",
    }.get(names, "duplicate id")
    manifest["source"] = made["whole"]["source"]
    (tmp_path / "emptied" / "manifest.json").write_text(json.dumps(manifest, indent=1))
    assert verify(tmp_path / "emptied") == []
    segments = _segments(tmp_path / "emptied")
    k = next(k for k, row in enumerate(segments) if int(order[10]) in {s["source_index"] for s in row})
    capsys.readouterr()
    checked = {False: f"0-{manifest['stats']['rows'] - 1}", "the rows from 0": f"0-{k}"}.get(names, f"{k - 1}-{k}")
    assert _spot(tmp_path / "emptied", whole, kimi_dir, checked) == 1
    out = capsys.readouterr().out
    if names is True:
        says = f"as a duplicate of id 'synthetic_{int(order[9])}' first used by source row {int(order[3])}, whose id"
        assert says in out
    elif names in (False, "the rows from 0"):
        assert f"skipped_invalid lists source rows {int(order[9])} as duplicates, but no conversation before" in out
    else:
        says = f"source row {int(order[9])} is in skipped_invalid as {skipped['reason']!r}, but is a valid conversation"
        assert says in out


def test_a_folder_of_no_rows_is_named_not_raised(builds, kimi_dir, tmp_path, capsys):
    """A build's rows all taken out, every hash re-recorded: a build holds at least one row,
    so verify names it, and a spot check stops there."""
    folder, source, _ = _copy(builds, "parquet", tmp_path)
    _forge(folder, lambda rows: rows.clear(), check=False)
    assert verify(folder) == ["manifest.json: stats.rows is 0, but a build holds at least one row"]
    capsys.readouterr()
    assert _spot(folder, source, kimi_dir, "sample:1") == 1
    assert "MISMATCH manifest.json: stats.rows is 0" in capsys.readouterr().out


@pytest.mark.parametrize(("count", "spec"), [(10**12, "sample:3"), (10**12, "0-100000000000"), (-5, "0")])
def test_a_row_count_the_manifest_misstates_is_verifys_to_name(builds, kimi_dir, tmp_path, capsys, count, spec):
    """stats.rows edited: the rows asked for are not drawn from it (a sample of 10**12 rows
    would not fit in memory); verify names the manifest's problem, exit 1."""
    folder, source, _ = _copy(builds, "jsonl", tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["stats"]["rows"] = count
    (folder / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert _spot(folder, source, kimi_dir, spec) == 1
    captured = capsys.readouterr()
    assert re.match(r"MISMATCH \S*manifest.json: ", captured.out) and "Traceback" not in captured.err


def test_a_skipped_duplicate_is_proven_by_its_earlier_copy(kimi_dir, tmp_path):
    """A source row that repeats an earlier one (its id and messages) is skipped by the
    build; a check of every row reads both, and so proves the skip; so does a check of the
    rows around the skipped copy, which reads the copy its reason names. Where the reason
    names none (as builds wrote it before), that check does not prove the rows: it says
    the duplicate is not proven; the rows from row 0 past it prove it."""
    from fixed_sft.order import permutation
    from fixed_sft.spot import parse_rows, report, spot_check

    order = permutation(7, 40)
    lines = [json.dumps({"id": r["id"], "messages": r["messages"]}) for r in synthetic.conversations(40, seed=4)]
    lines[int(order[30])] = lines[int(order[1])]
    source = tmp_path / "rows.jsonl"
    source.write_text("\n".join(lines) + "\n")
    config = BuildConfig(
        name="dup", source=str(source), tokenizer=str(kimi_dir), rows=None, row_tokens=ROW_TOKENS, seed=7,
        workers=1, skip_invalid=True,
    )  # fmt: skip
    manifest = build(config, tmp_path / "o")
    assert [row["index"] for row in manifest["skipped_invalid"]] == [int(order[30])]
    last = manifest["stats"]["rows"] - 1
    result = spot_check(tmp_path / "o", parse_rows(f"0-{last}"), str(source), str(kimi_dir))
    assert result.same and result.duplicates == []
    rows = pq.read_table(tmp_path / "o" / "train.parquet").column("metadata").to_pylist()
    k = next(
        k
        for k, row in enumerate(rows)
        if (int(order[31]), 0) in {(s["source_index"], s["start"]) for s in row["segments"]}
    )
    result = spot_check(tmp_path / "o", parse_rows(f"{k - 1}-{k}"), str(source), str(kimi_dir))
    assert result.same and result.duplicates == []  # (the copy its reason names is read too)
    manifest["skipped_invalid"][0]["reason"] = "duplicate id"  # (names no earlier copy)
    (tmp_path / "o" / "manifest.json").write_text(json.dumps(manifest))
    result = spot_check(tmp_path / "o", parse_rows(f"{k - 1}-{k}"), str(source), str(kimi_dir))
    assert not result.same and result.duplicates == [int(order[30])] and result.problems == {}
    proven, lines = report(result)
    assert not proven and "does not prove them" in lines[0]
    assert f"  skipped as duplicate ids, not proven: source rows {int(order[30])} (their reasons name" in lines[-2]
    result = spot_check(tmp_path / "o", parse_rows(f"0-{k}"), str(source), str(kimi_dir))
    assert result.same and result.duplicates == []  # (every conversation before it read: its earlier copy too)


def _segments(folder):
    return [row["segments"] for row in pq.read_table(folder / "train.parquet").column("metadata").to_pylist()]


def _spot_forged(folder, source, kimi_dir, capsys, at: tuple[int, int], checked: int, **fields) -> str:
    """Segment ``at`` (row, segment) forged with ``fields`` (every hash re-recorded), then a
    spot check of row ``checked``, which fails: its output."""
    row, segment = at

    def change(rows):
        rows[row]["metadata"]["segments"][segment].update(**fields)

    _forge(folder, change)
    capsys.readouterr()
    assert _spot(folder, source, kimi_dir, str(checked)) == 1
    return capsys.readouterr().out


def test_a_segment_after_another_that_does_not_start_its_conversation_is_named(builds, kimi_dir, tmp_path, capsys):
    """A row's second segment moved one token on (the same length, so the segments still
    cover the row): a conversation after another in a row starts at its token 0."""
    folder, source, _ = _copy(builds, "jsonl", tmp_path)
    segments = _segments(folder)
    k = next(  # a row whose last segment starts a conversation that the next row goes on with
        k
        for k in range(1, len(segments) - 1)
        if len(segments[k]) >= 2 and segments[k + 1][0]["source_index"] == segments[k][-1]["source_index"]
    )
    last = len(segments[k]) - 1
    index, end = segments[k][last]["source_index"], segments[k][last]["end"]
    out = _spot_forged(folder, source, kimi_dir, capsys, (k, last), k, start=1, end=end + 1)
    assert (
        f"  row {k}: differs (segment {last} (source row {index}, tokens 1 to {end + 1}): starts at 1, "
        "but a conversation after another in a row starts at 0)"
    ) in out


def test_a_segment_that_ends_before_its_conversation_with_another_after_it_is_named(builds, kimi_dir, tmp_path, capsys):
    """A row's first segment, which starts inside its conversation, moved one token back:
    a segment another follows in its row ends at its conversation's end."""
    folder, source, _ = _copy(builds, "jsonl", tmp_path)
    segments = _segments(folder)
    k = next(k for k in range(1, len(segments)) if len(segments[k]) >= 2 and segments[k][0]["start"] > 0)
    first = segments[k][0]
    index, start, end = first["source_index"], first["start"], first["end"]
    out = _spot_forged(folder, source, kimi_dir, capsys, (k, 0), k, start=start - 1, end=end - 1)
    assert (
        f"  row {k}: differs (segment 0 (source row {index}, tokens {start - 1} to {end - 1}): ends before its "
        f"unit's end ({end}), but another segment follows it)"
    ) in out


def test_a_row_beside_that_ends_past_its_conversation_is_named(builds, kimi_dir, tmp_path, capsys):
    """The row before a checked one, as the file holds it, ends a token past its last
    conversation's unit (its last segment moved one token on): the checked row cannot
    follow a point the stream does not have."""
    folder, source, _ = _copy(builds, "jsonl", tmp_path)
    segments = _segments(folder)
    k = next(  # a row that starts a conversation: the row before ends at its last one's end
        k
        for k in range(2, len(segments))
        if segments[k][0]["start"] == 0 and segments[k][0]["source_index"] != segments[k - 1][-1]["source_index"]
    )
    last = segments[k - 1][-1]
    index, start, end = last["source_index"], last["start"], last["end"]
    out = _spot_forged(folder, source, kimi_dir, capsys, (k - 1, -1), k, start=start + 1, end=end + 1)
    assert (
        f"  row {k}: differs (from row {k - 1}'s end, as the file holds it: row {k - 1} ends at token {end + 1} "
        f"of source row {index}, whose unit holds {end} tokens)"
    ) in out


def test_a_segment_of_an_earlier_conversation_after_a_later_one_is_named(builds, kimi_dir, tmp_path, capsys):
    """A row's last segment, which starts a conversation, names instead one whole
    conversation of an earlier row (its id too): the second comes before the first in the
    packing order, with nothing between them to drop."""
    folder, source, _ = _copy(builds, "jsonl", tmp_path)
    segments = _segments(folder)
    whole = {  # conversations a row holds whole and not last: their units' lengths, by the row
        s["source_index"]: (k, s["id"], s["end"]) for k, row in enumerate(segments) for s in row[:-1] if s["start"] == 0
    }
    k, earlier = next(
        (k, w)
        for k in range(1, len(segments))
        if len(segments[k]) >= 2 and segments[k][-1]["start"] == 0
        for w, (j, _, length) in whole.items()
        if j < k and length >= segments[k][-1]["end"] and w != segments[k][-2]["source_index"]
    )
    _, row_id, _ = whole[earlier]
    later = segments[k][-2]["source_index"]
    last = len(segments[k]) - 1
    out = _spot_forged(folder, source, kimi_dir, capsys, (k, last), k, source_index=earlier, id=row_id)
    assert re.search(
        rf"  row {k}: differs \(between segments {last - 1} and {last}: source row {earlier} \(packing position "
        rf"\d+\) comes before source row {later} \(position \d+\) in the packing order\)",
        out,
    ), out

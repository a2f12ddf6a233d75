"""Rows read straight from the token store into their row groups (fixed_sft.direct) are the rows
packed one conversation at a time: the same tally, Parquet bytes, manifest and card; a repeated
id or a damaged stored conversation falls back to packing one conversation at a time."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
import synthetic
from hypothesis import given, settings
from hypothesis import strategies as st
from test_parallel import _files, _one_at_a_time, _stored, outcomes, packed_as_one_at_a_time

import fixed_sft.build as build_module
import fixed_sft.direct
import fixed_sft.output
import fixed_sft.store
from fixed_sft.build import BuildConfig, build
from fixed_sft.encode import Encoded
from fixed_sft.order import permutation
from fixed_sft.output import RowWriter
from fixed_sft.store import TokenStore

N = 200


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """200 valid conversations, each with an id of its own, in 2 Parquet files."""
    folder = tmp_path_factory.mktemp("direct") / "source"
    synthetic.write_parquet(synthetic.conversations(N, seed=5), folder, rows_per_file=100)
    return folder


@pytest.fixture
def read(monkeypatch) -> list[str]:
    """How each build's direct read ended: "packed", or "unsuited" where it fell back."""
    return outcomes(monkeypatch, fixed_sft.direct, fixed_sft.direct.Unsuited, "unsuited")


def _config(source: Path, kimi_dir: Path, **overrides) -> BuildConfig:
    values = dict(
        name="direct", source=str(source), tokenizer=str(kimi_dir), rows=None, row_tokens=256, seed=3, check_every=3
    )
    return BuildConfig(**{**values, **overrides})


CASES = {
    "all rows": {},
    "rows of 16 in groups of 2: conversations span groups": {"row_tokens": 16, "rows_per_group": 2},
    "rows of 64, rows skipped": {"row_tokens": 64},
    "some rows": {"rows": 40, "row_tokens": 1024},
    "boundaries": {"rows": 25, "emit_boundaries": True, "row_tokens": 2048},
    "rows longer than the stream's conversations, a row a group": {"rows": 3, "row_tokens": 20000},
    "no checks": {"check_every": 0},
}


@pytest.mark.parametrize("case", CASES)
def test_a_later_build_reads_its_rows_as_one_at_a_time_packs_them(
    case, corpus, kimi_dir, tmp_path, token_store, read, monkeypatch
) -> None:
    """A build of another seed than the one that filled the store encodes nothing and reads
    its rows straight from the store: the files of a build without the store."""
    overrides = dict(CASES[case])
    if "rows_per_group" in overrides:
        monkeypatch.setattr(fixed_sft.output, "ROWS_PER_GROUP", overrides.pop("rows_per_group"))
    cfg = _config(corpus, kimi_dir, **overrides)
    one = build(dataclasses.replace(cfg, no_cache=True), tmp_path / "one")
    if cfg.row_tokens == 64:
        assert one["stats"]["rows_skipped"] > 0
    build(dataclasses.replace(cfg, seed=cfg.seed + 1, rows=None, no_card=True), tmp_path / "filled")
    assert read == []  # (it encoded every conversation)
    assert build(cfg, tmp_path / "later") == one
    assert _files(tmp_path / "later") == _files(tmp_path / "one")
    assert read == ["packed"]


def test_a_repeated_id_falls_back_to_one_at_a_time(kimi_dir, tmp_path, token_store, read) -> None:
    rows = synthetic.conversations(60, seed=9)
    order = permutation(3, 60)
    rows[order[40]]["id"] = rows[order[7]]["id"]
    synthetic.write_parquet(rows, tmp_path / "source", rows_per_file=30)
    cfg = _config(tmp_path / "source", kimi_dir, row_tokens=128, skip_invalid=True)
    one = build(dataclasses.replace(cfg, no_cache=True), tmp_path / "one")
    assert one["stats"]["invalid_rows_skipped"] == 1
    build(dataclasses.replace(cfg, seed=4), tmp_path / "filled")
    assert build(cfg, tmp_path / "later") == one
    assert _files(tmp_path / "later") == _files(tmp_path / "one")
    assert read == ["unsuited"]


def test_a_damaged_stored_conversation_falls_back_and_is_encoded_again(
    corpus, kimi_dir, tmp_path, token_store, read
) -> None:
    cfg = _config(corpus, kimi_dir, no_card=True)
    build(dataclasses.replace(cfg, seed=4), tmp_path / "filled")
    segment = max(token_store.glob("tokens/*/*.seg"), key=lambda p: p.stat().st_size)
    data = bytearray(segment.read_bytes())
    data[-100] ^= 0xFF  # (a byte of the last conversation's ids or mask)
    segment.write_bytes(bytes(data))
    assert build(cfg, tmp_path / "again") == build(dataclasses.replace(cfg, no_cache=True), tmp_path / "one")
    assert _files(tmp_path / "again") == _files(tmp_path / "one")
    assert read == ["unsuited"]
    assert build(cfg, tmp_path / "mended") == build(dataclasses.replace(cfg, no_cache=True), tmp_path / "one2")
    assert read == ["unsuited", "packed"]  # (the conversation stored anew is found)


@pytest.mark.parametrize("rows", [None, 6])
def test_invalid_rows_skipped_are_read_directly_and_recorded(rows, kimi_dir, tmp_path, token_store, read) -> None:
    """A later build that skips invalid rows reads its rows straight from the store: the
    invalid conversations it holds are left out and recorded as packing one at a time
    records them (those before the last row's conversation, where rows are counted)."""
    rows_in = synthetic.conversations(40, seed=2)
    order = permutation(4, 40)
    for position in (0, 3, 17, 39):
        rows_in[order[position]]["messages"] = []
    synthetic.write_parquet(rows_in, tmp_path / "source", rows_per_file=40)
    cfg = _config(tmp_path / "source", kimi_dir, skip_invalid=True, rows=rows, row_tokens=512, seed=4)
    one = build(dataclasses.replace(cfg, no_cache=True), tmp_path / "one")
    assert 0 < one["stats"]["invalid_rows_skipped"] <= 4
    build(dataclasses.replace(cfg, seed=5, rows=None, no_card=True), tmp_path / "first")
    assert read == []
    assert build(cfg, tmp_path / "later") == one
    assert _files(tmp_path / "later") == _files(tmp_path / "one")
    assert read == ["packed"]


def test_an_invalid_row_without_skipping_ends_the_path_before_it(kimi_dir, tmp_path, token_store, read) -> None:
    """Without --skip-invalid, an invalid row that the rows reach stops the build, as one
    conversation at a time stops it; rows that fill before it are read directly."""
    rows_in = synthetic.conversations(40, seed=2)
    order = permutation(4, 40)
    rows_in[order[30]]["messages"] = []
    synthetic.write_parquet(rows_in, tmp_path / "source", rows_per_file=40)
    cfg = _config(tmp_path / "source", kimi_dir, row_tokens=512, seed=4)
    build(dataclasses.replace(cfg, seed=5, skip_invalid=True, no_card=True), tmp_path / "first")
    with pytest.raises(build_module.InvalidSourceRow, match=f"source row {order[30]}"):
        build(cfg, tmp_path / "every")
    few = dataclasses.replace(cfg, rows=3)
    assert build(few, tmp_path / "few") == build(dataclasses.replace(few, no_cache=True), tmp_path / "one")
    assert _files(tmp_path / "few") == _files(tmp_path / "one")
    assert read == ["packed"]


@settings(derandomize=True, max_examples=int(os.environ.get("FIXED_SFT_PACKING_EXAMPLES", "40")), deadline=None)
@given(data=st.data())
def test_reading_straight_from_the_store_is_packing_one_at_a_time(data) -> None:
    """On random streams of conversations (empty and unsupervised ones, invalid ones or
    none, ids repeated or not, rows of 1 token up, row groups of 1 row up), skipping
    invalid rows or not, reading rows straight from a real store entry, whether it gives
    all of the order or a prefix of it, gives the tally, statistics and Parquet bytes of
    packing one conversation at a time, or ends (``Unsuited``) at a repeated id that the
    rows read, or where the prefix fills too few rows."""
    n = data.draw(st.integers(1, 40))
    repeats, invalid, skip_invalid = (data.draw(st.booleans()) for _ in range(3))
    items = []
    for i in range(n):
        row_id = data.draw(st.sampled_from(["a", "b", None, f"own{i}"])) if repeats else f"own{i}"
        value = data.draw(st.sampled_from([None, "x", "y"]))
        if invalid and data.draw(st.integers(0, 3)) == 0:
            items.append(Encoded(i, row_id, None, None, f"bad {i}", False, value))
            continue
        mask = np.array(data.draw(st.lists(st.integers(0, 1), max_size=30)), np.uint8)
        items.append(Encoded(i, row_id, np.arange(len(mask), dtype=np.int32) + 5, mask, None, True, value))
    order = np.array(data.draw(st.permutations(range(n))), np.int64)
    wanted = data.draw(st.sampled_from([None, 1, 2, 5, 12]))
    check_every = data.draw(st.sampled_from([0, 1, 3]))
    shape = (data.draw(st.sampled_from([1, 2, 3, 7, 16])), 1, data.draw(st.booleans()))
    group_rows = data.draw(st.sampled_from([1, 2, 3, 128]))
    given = np.zeros(n, bool)  # (the store gives a prefix of the order, or all of it)
    given[order[: data.draw(st.sampled_from([n, data.draw(st.integers(0, n))]))]] = True
    with tempfile.TemporaryDirectory() as scratch, pytest.MonkeyPatch.context() as patch:
        folder = Path(scratch)
        store = _stored(items, folder / "entry")
        reach = fixed_sft.direct.reach(store, order, given, wanted, shape[0], skip_invalid)
        if reach is None:
            assert not given.all() or (not skip_invalid and any(item.invalid for item in items))
            return
        patch.setattr(fixed_sft.output, "ROWS_PER_GROUP", group_rows)
        one, direct = folder / "one.parquet", folder / "direct.parquet"
        expected, rows = _one_at_a_time(items, order, wanted, skip_invalid, check_every, shape, one)
        writer = RowWriter(direct, shape[2])
        try:
            packed = fixed_sft.direct.pack(store, order, wanted, shape, check_every, writer, lambda rows: None, reach)
        except fixed_sft.direct.Unsuited as error:
            writer.abort()
            named = [items[i].id for i in order[:reach].tolist() if items[i].id is not None and not items[i].invalid]
            # (only a repeated id ends it, every record being sound; or too few rows before ``reach``)
            assert len(set(named)) < len(named) or ("too few rows" in str(error) and reach < n)
            return
        writer.close()
        assert not isinstance(expected, str), expected  # (a repeated id or an invalid row the rows reach ends it)
        assert packed.rows == rows
        if not rows or (wanted is not None and rows < wanted):
            return  # (the build says there are too few)
        packed.parquet_sha256 = writer.sha256  # (as the build takes it)
        packed_as_one_at_a_time(packed, expected, shape[0], one)
        assert direct.read_bytes() == one.read_bytes()


def test_a_repeated_id_after_the_last_row_ends_it(tmp_path) -> None:
    """The conversations after the last row are read too: one of them that repeats an id
    is left out, or stops the build, as one conversation at a time finds it."""
    ones = np.ones(7, np.uint8)
    items = [Encoded(i, name, np.arange(7, dtype=np.int32), ones, None, True, None) for i, name in enumerate("aba")]
    items[2] = items[2]._replace(ids=np.arange(1, dtype=np.int32), mask=ones[:1])  # (in no row: the stream's tail)
    store, order = _stored(items, tmp_path / "entry"), np.arange(3)
    expected, _ = _one_at_a_time(items, order, None, False, 0, (8, 1, False), tmp_path / "one.parquet")
    assert "duplicate id (first used by source row 0)" in expected
    writer = RowWriter(tmp_path / "direct.parquet")
    with pytest.raises(fixed_sft.direct.Unsuited, match="source row 2"):
        fixed_sft.direct.pack(store, order, None, (8, 1, False), 0, writer, lambda rows: None)
    writer.abort()
    items[2] = items[2]._replace(id="c")
    store = _stored(items, tmp_path / "distinct")
    writer = RowWriter(tmp_path / "direct.parquet")
    packed = fixed_sft.direct.pack(store, order, None, (8, 1, False), 0, writer, lambda rows: None)
    writer.close()
    assert (packed.rows, packed.tail_tokens, packed.rows_per_conversation) == (2, 2, {0: 1, 1: 1})


def test_a_conversation_of_many_row_groups_is_copied_once(tmp_path, monkeypatch) -> None:
    """A conversation over many row groups is read once, whole, and each group copies its
    share of it: the tokens copied are the conversation's, not a group's worth each time."""
    mask = (np.arange(10_000) % 3 != 0).astype(np.uint8)
    items = [Encoded(0, "long", np.arange(10_000, dtype=np.int32), mask, None, True, None)]
    items.append(Encoded(1, "short", np.arange(5, dtype=np.int32), np.ones(5, np.uint8), None, True, None))
    store = _stored(items, tmp_path / "entry")
    monkeypatch.setattr(fixed_sft.output, "ROWS_PER_GROUP", 2)
    copied: list[int] = []
    place = fixed_sft.store._place
    monkeypatch.setattr(fixed_sft.store, "_place", lambda ids, *a: copied.append(len(ids)) or place(ids, *a))
    order = np.array([1, 0])
    writer = RowWriter(tmp_path / "direct.parquet")
    packed = fixed_sft.direct.pack(store, order, None, (8, 1, False), 0, writer, lambda rows: None)
    writer.close()
    assert packed.rows > 600 and sum(copied) <= 10_000 + 2 * 8
    expected, rows = _one_at_a_time(items, order, None, False, 0, (8, 1, False), tmp_path / "one.parquet")
    assert rows == packed.rows and expected.digests == packed.digests
    assert (tmp_path / "direct.parquet").read_bytes() == (tmp_path / "one.parquet").read_bytes()


def test_row_groups_after_a_skipped_row_go_to_arrow_uncopied(tmp_path, monkeypatch) -> None:
    """A skipped row leaves its row group short: the rows it lacks are read on their own,
    so that only that group is copied, and each later group is a view of the buffer read."""
    units = [np.zeros(7, np.uint8), *(np.ones(7, np.uint8) for _ in range(9))]  # (row 0 trains nothing)
    items = [Encoded(i, f"c{i}", np.arange(7, dtype=np.int32), m, None, True, None) for i, m in enumerate(units)]
    store, order = _stored(items, tmp_path / "entry"), np.arange(len(items))
    monkeypatch.setattr(fixed_sft.output, "ROWS_PER_GROUP", 2)
    viewed: list[bool] = []  # (per column of each row group: whether it went to Arrow as a view)
    joined = fixed_sft.output._joined

    def watched(parts: list[np.ndarray]) -> np.ndarray:
        out = joined(parts)
        viewed.append(bool(np.shares_memory(out, parts[0])))
        return out

    monkeypatch.setattr(fixed_sft.output, "_joined", watched)
    writer = RowWriter(tmp_path / "direct.parquet")
    packed = fixed_sft.direct.pack(store, order, None, (8, 1, False), 0, writer, lambda rows: None)
    writer.close()
    assert packed.rows == 9 and viewed == [False, False] + [True, True] * 3 + [True, True]
    expected, _ = _one_at_a_time(items, order, None, False, 0, (8, 1, False), tmp_path / "one.parquet")
    assert expected.digests == packed.digests
    assert (tmp_path / "direct.parquet").read_bytes() == (tmp_path / "one.parquet").read_bytes()


@pytest.mark.parametrize("damage", ["a token count out of its file", "a truncated segment"])
def test_a_damaged_record_is_not_trusted(damage, corpus, kimi_dir, tmp_path, token_store) -> None:
    """A record whose bytes would reach past its file's end (a count with a flipped high bit,
    or a file cut short) is not held: nothing is allocated for it, and it is encoded again."""
    cfg = _config(corpus, kimi_dir, no_card=True)
    build(dataclasses.replace(cfg, seed=4), tmp_path / "filled")
    segment = max(token_store.glob("tokens/*/*.seg"), key=lambda p: p.stat().st_size)
    data = bytearray(segment.read_bytes())
    if damage == "a truncated segment":
        del data[-200:]
    else:
        at = fixed_sft.store.HEADER_BYTES + fixed_sft.store.RECORD.fields["tokens"][1]  # (record 0's count)
        data[at + 4] ^= 0x80  # (bit 39: 2**39 tokens more)
    segment.write_bytes(bytes(data))
    assert build(cfg, tmp_path / "again") == build(dataclasses.replace(cfg, no_cache=True), tmp_path / "one")
    assert _files(tmp_path / "again") == _files(tmp_path / "one")


def test_how_far_the_store_gives_the_stream(tmp_path) -> None:
    """To the first conversation not given, or invalid where invalid rows are not skipped:
    all of it, or as far as fills the rows asked for (each valid conversation and its [EOS])."""
    ones = np.ones(5, np.uint8)
    items = [Encoded(i, f"c{i}", np.arange(5, dtype=np.int32), ones, None, True, None) for i in range(4)]
    items[2] = Encoded(2, "c2", None, None, "not a conversation", True, None)
    store, order, given = _stored(items, tmp_path / "entry"), np.arange(4), np.ones(4, bool)
    reach = fixed_sft.direct.reach
    assert [reach(store, order, given, rows, 6, False) for rows in (2, 3, None)] == [2, None, None]
    assert [reach(store, order, given, rows, 6, True) for rows in (2, 3, None)] == [4, 4, 4]
    assert reach(store, order[[0, 1, 3]], given, None, 6, False) == 3
    given[3] = False  # (the invalid conversation before it fills nothing)
    assert [reach(store, order, given, rows, 6, True) for rows in (2, 3, None)] == [3, None, None]
    given[1] = False
    assert reach(store, order, given, 1, 6, False) == 1 and reach(store, order, given, 2, 6, False) is None


def test_a_build_of_some_rows_reads_the_conversations_an_earlier_one_stored(
    corpus, kimi_dir, tmp_path, token_store, read, monkeypatch
) -> None:
    """The store holds only what a build of some rows encoded: a build of as many rows reads
    them straight from it, and starts no encoder; one that needs more packs one
    conversation at a time."""
    cfg = _config(corpus, kimi_dir, rows=30, row_tokens=1024, workers=2)
    build(cfg, tmp_path / "first")
    (entry,) = (token_store / "tokens").iterdir()
    assert 0 < int((TokenStore(entry, N).segment >= 0).sum()) < N  # (a prefix of the order)
    assert read == []
    one = build(dataclasses.replace(cfg, no_cache=True), tmp_path / "one")
    started: list[bool] = []
    start = build_module._Encoding.start
    monkeypatch.setattr(
        build_module._Encoding, "start", lambda self, *a, **k: started.append(True) or start(self, *a, **k)
    )
    assert build(cfg, tmp_path / "again") == one
    assert _files(tmp_path / "again") == _files(tmp_path / "one")
    assert read == ["packed"] and started == []
    every = dataclasses.replace(cfg, rows=None)
    assert build(every, tmp_path / "every") == build(dataclasses.replace(every, no_cache=True), tmp_path / "one-every")
    assert _files(tmp_path / "every") == _files(tmp_path / "one-every")
    assert read == ["packed"]  # (not tried: the store lacks the rest)


def test_rows_the_given_conversations_cannot_fill_end_it(tmp_path) -> None:
    """Conversations whose tokens would fill the rows, but whose rows are skipped (nothing
    supervised), before the first the store does not give: ``Unsuited``, nothing counted."""
    zeros = np.zeros(7, np.uint8)
    items = [Encoded(i, f"c{i}", np.arange(7, dtype=np.int32), zeros, None, True, None) for i in range(3)]
    items.append(Encoded(3, "c3", np.arange(7, dtype=np.int32), np.ones(7, np.uint8), None, True, None))
    store, order = _stored(items, tmp_path / "entry"), np.arange(4)
    given = np.array([True, True, True, False])
    assert fixed_sft.direct.reach(store, order, given, 2, 8, False) == 3
    writer = RowWriter(tmp_path / "direct.parquet")
    with pytest.raises(fixed_sft.direct.Unsuited, match="fill too few rows"):
        fixed_sft.direct.pack(store, order, 2, (8, 1, False), 0, writer, lambda rows: None, given=3)
    writer.abort()


def test_a_damaged_invalid_record_ends_it(tmp_path) -> None:
    """An invalid conversation is recorded by what the store holds of it, its digest checked:
    one whose bytes do not match ends this path, and is held no more."""
    ones = np.ones(7, np.uint8)
    items = [Encoded(i, f"c{i}", np.arange(7, dtype=np.int32), ones, None, True, None) for i in range(3)]
    items[1] = Encoded(1, "c1", None, None, "not a conversation", False, None)
    store, order = _stored(items, tmp_path / "entry"), np.arange(3)
    writer = RowWriter(tmp_path / "direct.parquet")
    packed = fixed_sft.direct.pack(store, order, None, (8, 1, False), 0, writer, lambda rows: None)
    writer.close()
    assert packed.skipped_invalid == [{"index": 1, "id": "c1", "reason": "not a conversation"}]
    (segment,) = (tmp_path / "entry").glob("*.seg")
    data = bytearray(segment.read_bytes())
    data[int(store.offset[1])] ^= 0xFF  # (the first byte of its metadata)
    segment.write_bytes(bytes(data))
    store = TokenStore(tmp_path / "entry", 3)
    writer = RowWriter(tmp_path / "again.parquet")
    with pytest.raises(fixed_sft.direct.Unsuited, match="source row 1: damaged"):
        fixed_sft.direct.pack(store, order, None, (8, 1, False), 0, writer, lambda rows: None)
    writer.abort()
    assert store.segment[1] < 0 and store.segment[[0, 2]].min() >= 0


def test_invalid_records_past_the_last_row_are_not_read(tmp_path) -> None:
    """Invalid conversations after the last row's last conversation are not recorded, as
    one conversation at a time never reaches them: their records are not read, so one
    damaged there does not end this path."""
    ones = np.ones(7, np.uint8)
    items = [Encoded(i, f"c{i}", np.arange(7, dtype=np.int32), ones, None, True, None) for i in range(4)]
    items[0] = Encoded(0, "c0", None, None, "first", False, None)
    items[3] = Encoded(3, "c3", None, None, "past the rows", False, None)
    store, order = _stored(items, tmp_path / "entry"), np.arange(4)
    (segment,) = (tmp_path / "entry").glob("*.seg")
    data = bytearray(segment.read_bytes())
    data[int(store.offset[3])] ^= 0xFF
    segment.write_bytes(bytes(data))
    store = TokenStore(tmp_path / "entry", 4)
    writer = RowWriter(tmp_path / "direct.parquet")
    packed = fixed_sft.direct.pack(store, order, 1, (8, 1, False), 0, writer, lambda rows: None)
    writer.close()
    assert packed.skipped_invalid == [{"index": 0, "id": "c0", "reason": "first"}]
    expected, _ = _one_at_a_time(items, order, 1, True, 0, (8, 1, False), tmp_path / "one.parquet")
    assert expected.skipped_invalid == packed.skipped_invalid and expected.digests == packed.digests
    assert store.segment[3] >= 0  # (not read: still held)

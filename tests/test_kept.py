"""The index a token store entry keeps (``fixed_sft.kept``): a later build of every row reads
it in place of the index pass, with the rows of a build without the store; a kept index
that is damaged, stale or not as the conversations are is never trusted."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import synthetic
import xxhash
from test_parallel import _stored

import fixed_sft.build as build_module
import fixed_sft.kept as kept
import fixed_sft.parallel
from fixed_sft.build import BuildConfig, build
from fixed_sft.encode import Encoded
from fixed_sft.order import permutation
from fixed_sft.output import PARTS_NAME
from fixed_sft.parallel import Indexed, Indexes, Stream
from fixed_sft.store import TokenStore

N = 200


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """200 conversations in 2 Parquet files; two invalid (no messages), and one whose id an earlier one has."""
    rows = synthetic.conversations(N, seed=5)
    rows[17]["messages"] = rows[120]["messages"] = []
    rows[90]["id"] = rows[30]["id"]
    folder = tmp_path_factory.mktemp("kept") / "source"
    synthetic.write_parquet(rows, folder, rows_per_file=100)
    return folder


@pytest.fixture
def forks(monkeypatch) -> dict[str, list]:
    """Builds of 2 workers that encode nothing pack in workers forked for it, as on 8 cores;
    each build's index passes (``parallel.stored``) and how its packing from the store
    ended ("packed", or "unheld" where it gave way)."""
    monkeypatch.setattr(build_module, "PARALLEL_PACKING_WORKERS", 2)
    monkeypatch.setattr(build_module, "STORED_PACKING_CORES", 2)
    monkeypatch.setattr(build_module, "STORED_PACKING_TOKENS", 1)
    monkeypatch.setattr(build_module, "usable_cores", lambda: 2)
    seen: dict[str, list] = {"index passes": [], "packed": []}
    stored, pack = fixed_sft.parallel.stored, fixed_sft.parallel.pack
    monkeypatch.setattr(fixed_sft.parallel, "stored", lambda *a: seen["index passes"].append(1) or stored(*a))

    def recorded(*args, **kwargs):
        try:
            result = pack(*args, **kwargs)
        except fixed_sft.parallel.Unheld:
            seen["packed"].append("unheld")
            raise
        seen["packed"].append("packed")
        return result

    monkeypatch.setattr(fixed_sft.parallel, "pack", recorded)
    return seen


def _config(source: Path, kimi_dir: Path, **overrides) -> BuildConfig:
    values = dict(name="kept", source=str(source), tokenizer=str(kimi_dir), rows=None, row_tokens=512)
    values |= dict(seed=3, workers=2, check_every=4, skip_invalid=True, no_card=True)
    return BuildConfig(**{**values, **overrides})


def _files(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def _index_files(token_store: Path) -> list[Path]:
    return sorted(token_store.glob("tokens/*/index-*.arrow"))


LATER = {
    "every row, another seed": ({"seed": 4}, []),
    "every row, boundaries": ({"row_tokens": 300, "emit_boundaries": True}, []),
    "half the rows": ({"seed": 4, "rows": 0.5}, []),
    "a few rows": ({"seed": 4, "rows": 0.1}, [1]),  # (under a fourth of the tokens: the index pass, its prefix)
}


@pytest.mark.parametrize("case", LATER)
def test_a_later_build_reads_the_index_the_store_keeps(case, corpus, kimi_dir, tmp_path, token_store, forks) -> None:
    """The first build (its fill indexed every row) keeps the index; a later build of all
    rows, or of rows that need a fourth of the source's tokens, reads nothing back to
    index (no index pass), and its rows, manifest and Parquet bytes are those of a build
    without the store. A build of fewer rows reads the prefix its rows need instead."""
    cfg = _config(corpus, kimi_dir)
    rows = build(cfg, tmp_path / "first")["stats"]["rows"]
    (index,) = _index_files(token_store)
    assert forks["index passes"] == []
    later, passes = LATER[case]
    if "rows" in later:
        later = {**later, "rows": int(rows * later["rows"])}
    other = dataclasses.replace(cfg, **later)
    expected = build(dataclasses.replace(other, no_cache=True, workers=1), tmp_path / "one")
    forks["packed"].clear()
    assert build(other, tmp_path / "later") == expected
    assert _files(tmp_path / "later") == _files(tmp_path / "one")
    assert forks == {"index passes": passes, "packed": ["packed"]}
    assert _index_files(token_store) == [index]


def test_an_index_pass_over_every_row_keeps_the_index(corpus, kimi_dir, tmp_path, token_store, forks) -> None:
    """Where the entry keeps no index (or one of other copies), a build that reads every row
    back to index them keeps their index, which the next build reads; the rows are the same."""
    cfg = _config(corpus, kimi_dir)
    build(cfg, tmp_path / "first")
    (index,) = _index_files(token_store)
    index.unlink()
    (index.parent / "index-0123.arrow").write_bytes(b"another copy's")
    expected = build(dataclasses.replace(cfg, seed=9, no_cache=True, workers=1), tmp_path / "one")
    for number in range(2):
        assert build(dataclasses.replace(cfg, seed=9), tmp_path / f"later-{number}") == expected
        assert _files(tmp_path / f"later-{number}") == _files(tmp_path / "one")
        assert _index_files(token_store) == [index]  # (the other removed)
    assert forks["index passes"] == [1]


@pytest.mark.parametrize("damage", ["a byte of the index", "its checksum", "cut short", "empty"])
def test_a_damaged_index_is_not_read(damage, corpus, kimi_dir, tmp_path, token_store, forks) -> None:
    cfg = _config(corpus, kimi_dir)
    build(cfg, tmp_path / "first")
    (index,) = _index_files(token_store)
    data = bytearray(index.read_bytes())
    if damage == "a byte of the index":
        data[len(data) // 2] ^= 0x01
    elif damage == "its checksum":
        data[-1] ^= 0x80
    else:
        data = data[: len(data) // 2] if damage == "cut short" else bytearray()
    index.write_bytes(bytes(data))
    expected = build(dataclasses.replace(cfg, seed=4, no_cache=True, workers=1), tmp_path / "one")
    assert build(dataclasses.replace(cfg, seed=4), tmp_path / "later") == expected
    assert forks["index passes"] == [1]  # (read back instead, and kept anew)
    assert _files(tmp_path / "later") == _files(tmp_path / "one")
    assert _index_files(token_store) == [index] and index.read_bytes() != bytes(data)


def test_a_conversation_damaged_under_a_kept_index_is_encoded_again(
    corpus, kimi_dir, tmp_path, token_store, forks
) -> None:
    """The kept index stands for the index pass, which checked every conversation: one whose
    bytes no longer match, found by the write pass, gives way (the build then packs in its
    own process, which encodes it again), and the index is forgotten."""
    cfg = _config(corpus, kimi_dir)
    build(cfg, tmp_path / "first")
    (index,) = _index_files(token_store)
    segment = max(token_store.glob("tokens/*/*.seg"), key=lambda p: p.stat().st_size)
    data = bytearray(segment.read_bytes())
    data[-100] ^= 0xFF  # (a byte of the last conversation's ids or mask)
    segment.write_bytes(bytes(data))
    expected = build(dataclasses.replace(cfg, seed=4, no_cache=True, workers=1), tmp_path / "one")
    forks["packed"].clear()
    assert build(dataclasses.replace(cfg, seed=4), tmp_path / "later") == expected
    assert _files(tmp_path / "later") == _files(tmp_path / "one")
    assert forks == {"index passes": [], "packed": ["unheld"]}
    assert not index.exists()


def _first_part_gives_way(state, task):
    """``parallel.write``, but the first part gives way (a row not as the index cut it)."""
    if Path(task.part).name == "00000000.parquet":
        raise fixed_sft.parallel.StoreChanged("row 0: the token store's conversations differ from their index")
    return _write(state, task)


_write = fixed_sft.parallel.write
_first_part_gives_way.__module__, _first_part_gives_way.__qualname__ = "fixed_sft.parallel", "write"  # (pickled)


def test_a_part_written_after_the_pass_gave_way_is_not_left(
    corpus, kimi_dir, tmp_path, token_store, forks, monkeypatch
) -> None:
    """Where the write pass gives way under a kept index, a worker may still be writing a
    part as the pass removes their folder (it is made here again, after the removal, with
    a part in it): the build packs in its own process, and leaves no part in its folder."""
    cfg = _config(corpus, kimi_dir, row_tokens=64)
    build(cfg, tmp_path / "first")
    expected = build(dataclasses.replace(cfg, seed=4, no_cache=True, workers=1), tmp_path / "one")
    forks["packed"].clear()
    rmtree = shutil.rmtree

    def late(path, *args, **kwargs):
        rmtree(path, *args, **kwargs)
        if Path(path).name == PARTS_NAME:
            Path(path).mkdir()
            (Path(path) / "00000003.parquet").write_bytes(b"PAR1")

    monkeypatch.setattr(fixed_sft.parallel.shutil, "rmtree", late)
    monkeypatch.setattr(fixed_sft.parallel, "write", _first_part_gives_way)  # (the workers fork after this)
    assert build(dataclasses.replace(cfg, seed=4), tmp_path / "later") == expected
    assert forks == {"index passes": [], "packed": ["unheld"]}
    assert _files(tmp_path / "later") == _files(tmp_path / "one")


def _items() -> list[Encoded]:
    rng = np.random.default_rng(3)
    items = []
    for i in range(12):
        if i == 5:
            items.append(Encoded(i, f"id{i}", None, None, "not a conversation", True, None))
            continue
        mask = (rng.random(int(rng.integers(0, 20))) < 0.6).astype(np.uint8)
        items.append(Encoded(i, f"id{i}", np.arange(len(mask), dtype=np.int32), mask, None, True, "ab"[i % 2]))
    items[7] = items[7]._replace(id="id2", source_value=None)
    return items


def test_the_kept_index_is_the_index_read_back(tmp_path) -> None:
    """What ``read`` gives is the stream that indexing the stored conversations gives (ids
    repeated, an invalid one, empty and unsupervised ones, a ``source`` value missing)."""
    items = _items()
    store = _stored(items, tmp_path / "entry")
    kept.keep(store, Indexed.of(items))
    order = permutation(2, len(items))
    read = kept.read(store, order)
    assert read is not None
    blocks = read.stream()
    assert blocks is not None and not isinstance(blocks, Stream)  # (an id repeated: blocks)
    expected = Indexes(order)
    expected.add(np.arange(len(items)), Indexed.of(items))
    for got, want in zip(list(blocks), list(expected.stream()), strict=True):  # type: ignore[arg-type]
        got, want = got.indexed, want.indexed
        assert (got.ids, got.values, got.invalid) == (want.ids, want.values, want.invalid)
        for name in ("tokens", "counts", "begins", "ends"):
            assert getattr(got, name).tolist() == getattr(want, name).tolist(), name


def test_an_index_of_other_copies_or_other_tokens_is_not_read(tmp_path) -> None:
    """The index is named by the digests of the copies the store holds: once it holds
    another copy of a row (one that passed the check since), it reads no index; nor one
    whose tokens are not the records', nor where it does not hold every row."""
    items = _items()
    items[3] = items[3]._replace(checked=False)
    store = _stored(items, tmp_path / "entry")
    whole = Indexed.of(items)
    order = np.arange(len(items))
    kept.keep(store, whole._replace(tokens=whole.tokens + 1))
    assert kept.read(store, order) is None
    kept.keep(store, whole)
    assert kept.read(store, order) is not None
    before = kept.key(store)
    store.add(items[3]._replace(checked=True))
    store.close()
    again = TokenStore(store.folder, len(items))
    assert before is not None and kept.key(again) not in (None, before)
    assert kept.read(again, order) is None
    missing = TokenStore(store.folder, len(items) + 1)  # (a row it does not hold)
    assert kept.key(missing) is None and kept.read(missing, np.arange(len(items) + 1)) is None


def test_an_index_that_is_not_a_regular_file_is_not_read(tmp_path) -> None:
    """The index is opened as the segments are: a FIFO in its place (which would block) or
    a link (to a good index, or to a file without end) is not read."""
    items = _items()
    store = _stored(items, tmp_path / "entry")
    order = np.arange(len(items))
    kept.keep(store, Indexed.of(items))
    (index,) = store.folder.glob("index-*.arrow")
    good = tmp_path / "good.arrow"
    index.rename(good)
    signal.alarm(20)  # (a read that blocks fails the test)
    try:
        os.mkfifo(index)
        assert kept.read(store, order) is None
        index.unlink()
        index.symlink_to(good)
        assert kept.read(store, order) is None
        index.unlink()
        good.rename(index)
        assert kept.read(store, order) is not None
    finally:
        signal.alarm(0)


def _checked(body: bytes) -> bytes:
    return body + xxhash.xxh3_128(body).digest()


def test_an_index_of_another_shape_is_not_read_whatever_its_checksum(tmp_path) -> None:
    """A file whose checksum matches but whose body is not an index as ``_encode`` writes
    it (another schema, string offsets out of their buffer, a footer damaged) is not read,
    and reading it raises nothing."""
    items = _items()
    store = _stored(items, tmp_path / "entry")
    order = np.arange(len(items))
    kept.keep(store, Indexed.of(items))
    (index,) = store.folder.glob("index-*.arrow")
    body = index.read_bytes()[:-16]
    assert kept.read(store, order) is not None
    # another schema: ids as numbers
    batch = pa.ipc.open_file(pa.py_buffer(body)).get_batch(0)
    ids = pa.array(np.arange(len(items)), pa.int64())
    other = pa.RecordBatch.from_arrays([batch.column(0), ids, *batch.columns[2:]], names=batch.schema.names)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, other.schema) as writer:
        writer.write_batch(other)
    index.write_bytes(_checked(sink.getvalue().to_pybytes()))
    assert kept.read(store, order) is None
    # string offsets out of their buffer (uncompressed: the offset is in the file as written)
    column = batch.column(1)
    offsets = np.frombuffer(column.buffers()[1], np.int64).copy()
    offsets[3] = 1 << 30
    broken = pa.Array.from_buffers(pa.large_string(), len(column), [None, pa.py_buffer(offsets), column.buffers()[2]])
    other = pa.RecordBatch.from_arrays([batch.column(0), broken, *batch.columns[2:]], schema=kept.SCHEMA)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, kept.SCHEMA) as writer:
        writer.write_batch(other)
    index.write_bytes(_checked(sink.getvalue().to_pybytes()))
    assert kept.read(store, order) is None
    # each byte of the footer flipped in turn, the checksum made anew
    footer = len(body) - 6 - int.from_bytes(body[-10:-6], "little")
    for at in range(footer, len(body)):
        damaged = bytearray(body)
        damaged[at] ^= 0xFF
        index.write_bytes(_checked(bytes(damaged)))
        kept.read(store, order)  # (None, or an index as sound as the checks make it: never an error)


def test_an_index_with_other_invalid_reasons_is_not_read(tmp_path) -> None:
    """An invalid row's id and reason are those of its record (the write pass reads no
    invalid row to check them)."""
    items = _items()
    store = _stored(items, tmp_path / "entry")
    whole = Indexed.of(items)
    order = np.arange(len(items))
    for field, value in (("invalid", "another reason"), ("ids", "another id")):
        changed = list(getattr(whole, field))
        changed[5] = value  # (row 5 is invalid)
        kept.keep(store, whole._replace(**{field: changed}))
        assert kept.read(store, order) is None, field
    kept.keep(store, whole)
    assert kept.read(store, order) is not None


def test_an_index_that_fails_to_be_written_leaves_nothing(tmp_path, monkeypatch) -> None:
    """Keeping the index is an optimisation: where it cannot be written (no room, say, as
    its draft is put in place, or as it is made), ``keep`` raises nothing, and leaves
    neither its draft nor an index."""
    items = _items()
    store = _stored(items, tmp_path / "entry")
    before = sorted(path.name for path in store.folder.iterdir())

    def no_room(*args):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(kept.os, "replace", no_room)
        kept.keep(store, Indexed.of(items))
    assert sorted(path.name for path in store.folder.iterdir()) == before

    def fails(indexed):
        raise pa.ArrowInvalid("offset overflow")

    monkeypatch.setattr(kept, "_encode", fails)
    kept.keep(store, Indexed.of(items))
    assert sorted(path.name for path in store.folder.iterdir()) == before


def _another(whole: Indexed, field: str) -> Indexed:
    """``whole`` with its supervised runs cut short by a token (where longer than one),
    or a valid conversation's id or ``source`` value another."""
    if field == "runs":
        return whole._replace(ends=np.where(whole.ends - whole.begins > 1, whole.ends - 1, whole.ends))
    changed = list(getattr(whole, field))
    changed[next(k for k, tokens in enumerate(whole.tokens.tolist()) if tokens > 0)] = "another"
    return whole._replace(**{field: changed})


@pytest.mark.parametrize("field", ["runs", "values", "ids"])
def test_an_index_not_as_the_conversations_are_gives_way(field, corpus, kimi_dir, tmp_path, token_store, forks):
    """An index kept whole, of the store's copies, whose supervised runs, ``source`` values
    or ids are not theirs (not one a build writes): the write pass finds a row or a
    conversation not as the index says, so the build gives way, packs in its own process
    and forgets the index. The rows, manifest and card are those of a build without the
    store (the values decide the card's source mix, the ids which repeat)."""
    cfg = _config(corpus, kimi_dir, no_card=False)
    build(cfg, tmp_path / "first")
    (entry,) = token_store.glob("tokens/*")
    store = TokenStore(entry, N)
    read = kept.read(store, np.arange(N))
    assert read is not None
    whole = read.by_source()
    assert whole is not None
    kept.keep(store, _another(whole, field))
    (index,) = _index_files(token_store)
    store.close()
    expected = build(dataclasses.replace(cfg, seed=4, no_cache=True, workers=1), tmp_path / "one")
    forks["packed"].clear()
    assert build(dataclasses.replace(cfg, seed=4), tmp_path / "later") == expected
    assert _files(tmp_path / "later") == _files(tmp_path / "one")
    assert forks == {"index passes": [], "packed": ["unheld"]}
    assert not index.exists()  # (forgotten)


def test_an_index_larger_than_its_conversations_allow_is_not_read(tmp_path, monkeypatch) -> None:
    """A file larger than an index of the store's conversations can be (a metadata's bytes
    each, a run per 2 tokens) is refused by its size, unread. A good index is read whole,
    once."""
    items = _items()
    store = _stored(items, tmp_path / "entry")
    order = np.arange(len(items))
    kept.keep(store, Indexed.of(items))
    (index,) = store.folder.glob("index-*.arrow")
    good = index.read_bytes()
    asked: list[int] = []
    real = kept.open_regular

    def counted(path, follow_links=True):
        opened = real(path, follow_links)
        read = opened.read
        opened.read = lambda size=-1: asked.append(size) or read(size)  # type: ignore[method-assign]
        return opened

    monkeypatch.setattr(kept, "open_regular", counted)
    assert kept.read(store, order) is not None and asked == [len(good)]
    asked.clear()
    with open(index, "r+b") as f:
        f.truncate(1 << 40)  # (sparse: reading it would ask for a terabyte)
    assert kept.read(store, order) is None and asked == []


def test_an_index_whose_runs_are_out_of_order_or_past_the_tokens_is_not_read(tmp_path) -> None:
    """A conversation's supervised runs are in order, apart and within its tokens (its
    [EOS] is never supervised), as ``cuts.runs`` finds them (packing's prefix sums take
    them so)."""
    items = [Encoded(0, "a", np.arange(6, dtype=np.int32), np.array([1, 0, 1, 1, 0, 1], np.uint8), None, True)]
    store = _stored(items, tmp_path / "entry")
    whole = Indexed.of(items)
    assert whole.begins.tolist() == [0, 2, 5] and whole.ends.tolist() == [1, 4, 6]
    for begins, ends in (
        ([2, 0, 5], [4, 1, 6]),
        ([0, 1, 5], [1, 4, 6]),
        ([0, 0, 5], [1, 4, 6]),
        ([0, 2, 5], [1, 4, 7]),
    ):
        kept.keep(store, whole._replace(begins=np.array(begins, np.int32), ends=np.array(ends, np.int32)))
        assert kept.read(store, np.arange(1)) is None, (begins, ends)
    kept.keep(store, whole)
    assert kept.read(store, np.arange(1)) is not None


def test_without_the_code_s_sources_no_index_is_kept_or_read(tmp_path, monkeypatch) -> None:
    """The index is named by the bytes of the code that reads it: where they cannot be read
    (a package installed without its sources), none is kept or read, and nothing fails."""
    items = _items()
    store = _stored(items, tmp_path / "entry")
    monkeypatch.setattr(kept, "CODE_MODULES", ("no-such-module.py",))
    kept._code.cache_clear()
    try:
        kept.keep(store, Indexed.of(items))
        assert kept.key(store) is None and kept.read(store, np.arange(len(items))) is None
        assert list(store.folder.glob("index-*")) == []
        kept.forget(store)
    finally:
        kept._code.cache_clear()

"""Bounded memory whatever the conversations' sizes: chunks cut by bytes and by what the
rows still want, rows over the bound refused naming them, Parquet pages bounded.
(Rules only: no timed or memory figures; benchmarks/bench_memory.py measures those.)"""

from __future__ import annotations

import ctypes
import io
import json
import re
from concurrent.futures import Future, ProcessPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import synthetic

from fixed_sft import bands as bands_module
from fixed_sft import build as build_module
from fixed_sft import encode as encode_module
from fixed_sft import source as source_module
from fixed_sft.bands import read_band, value_bytes
from fixed_sft.build import BuildConfig, InvalidSourceRow, build
from fixed_sft.conversation import InvalidRow
from fixed_sft.memory import give_back_free
from fixed_sft.order import permutation
from fixed_sft.pages import largest_page, page_sizes
from fixed_sft.records import records
from fixed_sft.source import SourceError, open_source


def _config(path, kimi_dir, **overrides) -> BuildConfig:
    values = dict(
        name="memory",
        source=str(path),
        tokenizer=str(kimi_dir),
        rows=1,
        row_tokens=512,
        seed=3,
        workers=1,
        check_every=4,
        no_card=True,
    )
    values.update(overrides)
    return BuildConfig(**values)


def _conversation(k: int, size: int) -> dict:
    """A conversation whose assistant reply is ``size`` bytes of ASCII text."""
    words = " ".join(f"word{(k * 7 + j) % 97}" for j in range(size // 6 + 1))
    return {
        "id": f"big_{k}",
        "source": "test/big",
        "messages": [{"role": "user", "content": f"question {k}"}, {"role": "assistant", "content": words[:size]}],
    }


def _used(out) -> list[int]:
    metadata = pq.read_table(out / "train.parquet").column("metadata").to_pylist()
    return sorted({s["source_index"] for row in metadata for s in row["segments"]})


# --- sizes -------------------------------------------------------------------------------


def test_value_bytes_counts_the_strings_and_widths_of_each_row():
    message = pa.struct([("content", pa.string()), ("role", pa.string())])
    messages = pa.array(
        [
            [{"content": "hello", "role": "user"}],
            None,
            [],
            [{"content": None, "role": "assistant"}, {"content": "xy", "role": "user"}],
        ],
        pa.list_(message),
    )
    assert value_bytes(messages).tolist() == [9, 0, 0, 15]
    assert value_bytes(messages.slice(1)).tolist() == [0, 0, 15]
    assert value_bytes(pa.chunked_array([messages.slice(0, 1), messages.slice(3)])).tolist() == [9, 15]
    large = messages.cast(pa.large_list(pa.struct([("content", pa.large_string()), ("role", pa.string())])))
    assert value_bytes(large).tolist() == [9, 0, 0, 15]
    assert value_bytes(pa.array(["ab", None, "cde"], pa.string_view())).tolist() == [2, 0, 3]
    assert value_bytes(pa.array(["ab", "ab", "c"]).dictionary_encode()).tolist() == [2, 2, 1]
    assert value_bytes(pa.array([7, None, 9], pa.int64())).tolist() == [8, 0, 8]
    assert value_bytes(pa.array([[1, 2], None], pa.list_(pa.int32(), 2))).tolist() == [8, 0]


# --- chunks cut by bytes -----------------------------------------------------------------


@pytest.fixture
def sized_jsonl(tmp_path):
    """60 JSONL rows of 100 to 5,000 bytes."""
    rng = np.random.default_rng(0)
    rows = [_conversation(k, int(rng.integers(100, 5000))) for k in range(60)]
    return synthetic.write_jsonl(rows, tmp_path / "sized.jsonl")


def test_chunks_are_cut_by_bytes_and_rows(sized_jsonl):
    src = open_source(str(sized_jsonl))
    rank = np.random.default_rng(1).permutation(src.num_rows)
    chunks = list(read_band(src, rank, 0, src.num_rows).chunks(7, max_bytes=12_000))
    sizes = [chunk.column("bytes").to_pylist() for chunk in chunks]
    lines = sized_jsonl.read_bytes().split(b"\n")
    for chunk, chunk_sizes in zip(chunks, sizes):
        assert chunk_sizes == [len(lines[i]) for i in chunk.column("index").to_pylist()]  # a line's bytes
    assert all(len(s) <= 7 and (sum(s) <= 12_000 or len(s) == 1) for s in sizes)
    # greedy: the next row would have taken the chunk past a bound
    assert all(len(s) == 7 or sum(s) + nxt[0] > 12_000 for s, nxt in zip(sizes, sizes[1:]))
    got = [index for chunk in chunks for index in chunk.column("index").to_pylist()]
    assert got == np.argsort(rank).tolist()  # every row once, in packing order


def test_a_row_larger_than_a_chunk_goes_alone(sized_jsonl):
    src = open_source(str(sized_jsonl))
    chunks = list(read_band(src, np.arange(src.num_rows), 0, src.num_rows).chunks(128, max_bytes=50))
    assert [chunk.num_rows for chunk in chunks] == [1] * src.num_rows


def test_chunk_rows_are_asked_as_each_chunk_is_cut(sized_jsonl):
    src = open_source(str(sized_jsonl))
    wanted = iter([3, 1, 0, 5] + [100] * 10)
    chunks = list(read_band(src, np.arange(src.num_rows), 0, 20).chunks(lambda: next(wanted)))
    assert [chunk.num_rows for chunk in chunks] == [3, 1, 1, 5, 10]  # at least one row


def test_a_band_lets_go_of_each_file_once_its_rows_are_in_chunks(tmp_path):
    for k in range(2):
        synthetic.write_jsonl([_conversation(10 * k + j, 200) for j in range(10)], tmp_path / f"{k}.jsonl")
    src = open_source(str(tmp_path))
    band = read_band(src, np.arange(20), 0, 20)  # the first file's rows come first
    released = []
    for _ in band.chunks(5):
        released.append([part is None for part in band.parts])
    assert released == [[False, False], [True, False], [True, False], [True, True]]


# --- rows over the bound -----------------------------------------------------------------


def test_jsonl_lines_over_the_bound_are_dropped_as_they_are_read(tmp_path, monkeypatch):
    monkeypatch.setattr(bands_module, "MAX_CONVERSATION_BYTES", 200)
    good = json.dumps(_conversation(0, 50)).encode()
    at_bound = good[:-1] + b" " * (200 - len(good)) + b"}"
    path = tmp_path / "rows.jsonl"
    path.write_bytes(
        b"\xef\xbb\xbf"
        + at_bound
        + b"\n"
        + at_bound[:-1]
        + b" }\n"
        + b"x" * 3_000_000
        + b"\n"
        + good
        + b"\n"
        + at_bound[:-1]
        + b" }"
    )
    src = open_source(str(path))
    assert src.num_rows == 5
    chunk = next(read_band(src, np.arange(5), 0, 5).chunks(10))
    assert chunk.column("bytes").to_pylist() == [200, 201, 3_000_000, len(good), 201]
    assert chunk.column("dropped").to_pylist() == [False, True, True, False, True]
    assert [len(line) for line in chunk.column("line").to_pylist()] == [201, 0, 0, len(good) + 1, 0]
    got = records(chunk)
    assert [r["id"] for _, r in got if isinstance(r, dict)] == ["big_0", "big_0"]
    assert [r.reason for _, r in got if isinstance(r, InvalidRow)] == [
        "the row is 201 bytes, over the 200-byte limit on one conversation "
        "(MAX_CONVERSATION_BYTES, which bounds a build's memory)",
        "the row is 3,000,000 bytes, over the 200-byte limit on one conversation "
        "(MAX_CONVERSATION_BYTES, which bounds a build's memory)",
        "the row is 201 bytes, over the 200-byte limit on one conversation "
        "(MAX_CONVERSATION_BYTES, which bounds a build's memory)",
    ]


def test_parquet_rows_over_the_bound_are_dropped_and_keep_their_id(tmp_path, monkeypatch):
    monkeypatch.setattr(bands_module, "MAX_CONVERSATION_BYTES", 2_000)
    rows = [_conversation(k, size) for k, size in enumerate([100, 5_000, 1_900, 300])]
    rows[3]["id"] = "i" * 5_000  # over the bound by its id: not kept
    synthetic.write_parquet(rows, tmp_path / "rows.parquet")
    src = open_source(str(tmp_path / "rows.parquet"))
    chunk = next(read_band(src, np.arange(4), 0, 4).chunks(10))
    assert chunk.column("dropped").to_pylist() == [False, True, False, True]
    assert chunk.column("messages").null_count == 2
    got = [record for _, record in records(chunk)]
    assert isinstance(got[0], dict) and isinstance(got[2], dict)
    assert (got[1].row_id, got[3].row_id) == ("big_1", None)
    assert re.fullmatch(r"the row is 5,\d{3} bytes, over the 2,000-byte limit .*", got[1].reason)


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_a_conversation_over_the_bound_stops_the_build_naming_it(kimi_dir, tmp_path, monkeypatch, suffix):
    """Without --skip-invalid: the file, row, source row and id, and the bound. With it:
    recorded, and the build goes on with the same rows as when that row is invalid
    for another reason."""
    monkeypatch.setattr(bands_module, "MAX_CONVERSATION_BYTES", 20_000)
    rows = synthetic.conversations(40, seed=4)
    huge = int(permutation(3, 40)[0])  # packed first
    rows[huge] = _conversation(huge, 30_000)
    path = tmp_path / f"src.{suffix}"
    synthetic.write_jsonl(rows, path) if suffix == "jsonl" else synthetic.write_parquet(rows, path)
    with pytest.raises(InvalidSourceRow) as error:
        build(_config(path, kimi_dir, rows=2), tmp_path / "stopped")
    place = f"line {huge + 1}" if suffix == "jsonl" else f"row {huge}"
    named = "" if suffix == "jsonl" else f", id big_{huge}"  # (a JSONL line that large is not parsed: no id read)
    assert str(error.value).startswith(f"{path}: {place} (source row {huge}{named}): the row is 30,")
    assert "over the 20,000-byte limit on one conversation" in str(error.value)
    manifest = build(_config(path, kimi_dir, rows=2, skip_invalid=True), tmp_path / "skipped")
    assert [(s["index"], s["reason"][:14]) for s in manifest["skipped_invalid"]] == [(huge, "the row is 30,")]
    assert huge not in _used(tmp_path / "skipped")
    rows[huge] = _conversation(huge, 100)
    rows[huge]["messages"][1]["role"] = "narrator"
    other = tmp_path / f"other.{suffix}"
    synthetic.write_jsonl(rows, other) if suffix == "jsonl" else synthetic.write_parquet(rows, other)
    assert (
        build(_config(other, kimi_dir, rows=2, skip_invalid=True), tmp_path / "other")["rows_sha256"]
        == manifest["rows_sha256"]
    )


def test_workers_refuse_the_rows_the_reader_dropped(kimi_dir, tmp_path, monkeypatch):
    """Which rows are over the bound is decided where they are read, and travels with
    the chunk: workers refuse the same rows, and the rows are the same."""
    monkeypatch.setattr(bands_module, "MAX_CONVERSATION_BYTES", 20_000)
    rows = synthetic.conversations(40, seed=4)
    big = [int(i) for i in permutation(3, 40)[:6:2]]
    for k in big:
        rows[k] = _conversation(k, 30_000)
    path = synthetic.write_jsonl(rows, tmp_path / "src.jsonl")
    one = build(_config(path, kimi_dir, rows=6, skip_invalid=True), tmp_path / "one")
    two = build(_config(path, kimi_dir, rows=6, skip_invalid=True, workers=2), tmp_path / "two")
    assert sorted(s["index"] for s in one["skipped_invalid"]) == sorted(big)
    assert [s["index"] for s in two["skipped_invalid"]] == [s["index"] for s in one["skipped_invalid"]]
    assert all(s["reason"].startswith("the row is 30,") for s in two["skipped_invalid"])
    assert two["rows_sha256"] == one["rows_sha256"]


# --- what a build encodes ----------------------------------------------------------------


@pytest.fixture
def big_source(tmp_path):
    """20 conversations of 60 KB (about 15,000 tokens each): one fills a 512-token row."""
    return synthetic.write_jsonl([_conversation(k, 60_000) for k in range(20)], tmp_path / "big.jsonl")


def test_a_build_that_needs_one_conversation_has_one_encoded(kimi_dir, tmp_path, monkeypatch, big_source):
    decoded, encoded = [], []
    original_records, original_conversation = encode_module.records, encode_module.conversation
    monkeypatch.setattr(
        encode_module, "records", lambda chunk: decoded.append(chunk.num_rows) or original_records(chunk)
    )
    monkeypatch.setattr(
        encode_module, "conversation", lambda record, schema: encoded.append(1) or original_conversation(record, schema)
    )
    manifest = build(_config(big_source, kimi_dir), tmp_path / "one")
    assert manifest["stats"]["conversations"] == 1 and decoded == [1] and len(encoded) == 1


def test_workers_get_one_conversation_when_the_build_needs_one(kimi_dir, tmp_path, monkeypatch, big_source):
    """Two workers, a build that one conversation fills: one chunk of one row is sent."""
    sent = []
    submit = ProcessPoolExecutor.submit

    def recording(self, fn, *args, **kwargs):
        if args and args[0] is encode_module._encode_in_worker:  # (submitted as engine._run(fn, *task))
            sent.append(args[1].rows.num_rows)
        return submit(self, fn, *args, **kwargs)

    monkeypatch.setattr(ProcessPoolExecutor, "submit", recording)
    manifest = build(_config(big_source, kimi_dir, workers=2), tmp_path / "two")
    assert manifest["stats"]["conversations"] == 1 and sent == [1]
    assert manifest == build(_config(big_source, kimi_dir), tmp_path / "one")


def test_a_build_cuts_chunks_by_bytes_and_keeps_its_rows(kimi_dir, tmp_path, monkeypatch):
    """Chunks of at most CHUNK_BYTES (or one larger row): the same build as with chunks of
    CHUNK_ROWS rows, at 1 and 2 workers."""
    rng = np.random.default_rng(5)
    rows = [_conversation(k, int(rng.integers(500, 12_000))) for k in range(200)]
    path = synthetic.write_jsonl(rows, tmp_path / "src.jsonl")
    config = _config(path, kimi_dir, rows=40, row_tokens=1024)
    expected = build(config, tmp_path / "rows")
    cut = []
    chunks = build_module._chunks

    def recording(*args):
        for chunk in chunks(*args):
            cut.append(chunk.column("bytes").to_pylist())
            yield chunk

    monkeypatch.setattr(build_module, "CHUNK_BYTES", 20_000)
    monkeypatch.setattr(build_module, "_chunks", recording)
    for workers in (1, 2):
        cut.clear()
        assert (
            build(  # (without the token store, which holds the first build's rows)
                _config(path, kimi_dir, rows=40, row_tokens=1024, workers=workers, no_cache=True),
                tmp_path / f"w{workers}",
            )
            == expected
        )
        assert len(cut) > 5 and all(sum(sizes) <= 20_000 or len(sizes) == 1 for sizes in cut)


def test_chunks_in_flight_to_workers_are_bounded_in_bytes(monkeypatch):
    """A chunk is sent only while those in flight, with it, hold at most IN_FLIGHT_BYTES
    (or it is the only one): two chunks at the bound, one larger alone."""
    events = []

    kinds = (np.int64, bool, np.int32, np.uint8)
    empty = encode_module.EncodedChunk([], [], [], *(np.zeros(0, kind) for kind in kinds), {})

    class Pool:
        def submit(self, run, fn, chunk):
            first = chunk.rows.column("k")[0].as_py()
            events.append(("sent", first))
            future = Future()
            future.set_result([])
            future.result = lambda: events.append(("done", first)) or empty
            return future

    from fixed_sft.engine import ProcessPool

    engine = ProcessPool.__new__(ProcessPool)
    engine.workers, engine._pool, engine._started = 8, Pool(), Future()
    engine._started.set_result(None)
    encoders = encode_module.Encoders.__new__(encode_module.Encoders)
    encoders.check_every, encoders.engine = 0, engine
    monkeypatch.setattr(encode_module, "IN_FLIGHT_BYTES", 3_000)
    chunks = [
        pa.table({"x": pa.array([b"a" * size], pa.binary()), "k": [k]})
        for k, size in enumerate([1_000, 1_000, 1_000, 2_500, 100, 100, 5_000, 100])
    ]
    sizes = [chunk.nbytes for chunk in chunks]
    list(encoders.encode(chunks, lambda: float("inf")))
    in_flight, most = set(), []
    for event, k in events:
        in_flight.add(k) if event == "sent" else in_flight.discard(k)
        most.append(sum(sizes[j] for j in in_flight))
    assert [k for e, k in events if e == "sent"] == list(range(8))
    assert max(total for total in most if total < sizes[6]) <= 3_000  # two chunks of 1,000 at once, not three
    assert most[events.index(("sent", 1))] == sizes[0] + sizes[1] and most[events.index(("sent", 2))] < 3_000
    assert events[events.index(("sent", 6)) - 1] == ("done", 5)  # the 5,000-byte chunk went alone
    assert events[events.index(("sent", 6)) + 1] == ("done", 6)


# --- Parquet pages -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"data_page_version": "2.0"},
        {"compression": "zstd", "data_page_size": 4096},
        {"use_dictionary": False, "write_statistics": False},
        {"compression": "none", "write_page_index": True, "row_group_size": 70},
        {"compression": "gzip", "write_page_checksum": True, "write_batch_size": 16},
    ],
)
def test_page_headers_are_walked_to_the_end_of_each_column_chunk(options):
    table = synthetic._to_table(synthetic.conversations(300, seed=6))
    buffer = io.BytesIO()
    pq.write_table(table, buffer, **options)
    meta = pq.ParquetFile(buffer).metadata
    for group in range(meta.num_row_groups):
        for column in range(meta.num_columns):
            chunk = meta.row_group(group).column(column)
            start = (chunk.dictionary_page_offset if chunk.has_dictionary_page else None) or chunk.data_page_offset
            pages = list(page_sizes(buffer, start, chunk.total_compressed_size))
            assert sum(h + c for h, _, c in pages) == chunk.total_compressed_size
            assert sum(h + u for h, u, _ in pages) == chunk.total_uncompressed_size
            assert largest_page(buffer, start, chunk.total_compressed_size) == max(u for _, u, _ in pages)
    assert largest_page(io.BytesIO(b"\x15\x00" * 8), 0, 16) is None  # not a page header


@pytest.mark.parametrize(
    "header",
    [
        b"\x19\xf7" + b"\xff" * 8 + b"\x10",  # field 1: a list claiming 2**60 doubles in a few bytes
        b"\x19" + b"\x19" * 4000 + b"\x00" * 8,  # lists nested 4,000 deep
    ],
    ids=["huge list", "deep nesting"],
)
def test_a_hostile_page_header_is_damage_at_once(header):
    """A page header is read with the bounds of ``thrift.Reader``: a list longer than its
    bytes, or nesting past its depth, is a damaged header (``ValueError``), never a walk
    of 2**60 elements or a RecursionError."""
    with pytest.raises(ValueError):
        list(page_sizes(io.BytesIO(header), 0, len(header)))
    assert largest_page(io.BytesIO(header), 0, len(header)) is None


def test_a_parquet_page_over_the_bound_stops_the_build_when_the_source_is_opened(kimi_dir, tmp_path, monkeypatch):
    """pyarrow's writer puts up to 1,024 values in a page: 40 conversations of 60 KB make a
    page of 2.4 MB, which a reader decodes whole. Written in pages of about 1 MB, they are read."""
    monkeypatch.setattr(source_module, "MAX_PAGE_BYTES", 2 << 20)
    table = synthetic._to_table([_conversation(k, 60_000) for k in range(40)])
    pq.write_table(table, tmp_path / "big-pages.parquet")
    message = (
        f"{tmp_path / 'big-pages.parquet'}: row group 0, column messages.list.element.content: a page of "
        r"2,\d{3},\d{3} bytes, over the 2,097,152 bytes \(MAX_PAGE_BYTES\) a build decodes at once"
    )
    with pytest.raises(SourceError, match=message):
        open_source(str(tmp_path / "big-pages.parquet"))
    with pytest.raises(SourceError, match=message):
        build(_config(tmp_path / "big-pages.parquet", kimi_dir), tmp_path / "out")
    pq.write_table(table, tmp_path / "small-pages.parquet", write_batch_size=1)
    src = open_source(str(tmp_path / "small-pages.parquet"))
    assert 60_000 <= src.page_bytes < 2 << 20
    rows = synthetic.conversations(40, seed=2)
    rows[0]["source"] = "s" * (3 << 20)  # a page of 3 MiB in a column the build does not read
    synthetic.write_parquet(rows, tmp_path / "other-column.parquet")
    assert pq.ParquetFile(tmp_path / "other-column.parquet").metadata.row_group(0).column(3).path_in_schema == "source"
    assert open_source(str(tmp_path / "other-column.parquet")).page_bytes < 2 << 20


def test_a_source_of_large_pages_is_read_a_file_at_a_time(tmp_path, monkeypatch):
    threads = []
    pool = bands_module.ThreadPoolExecutor
    monkeypatch.setattr(bands_module, "ThreadPoolExecutor", lambda n: threads.append(n) or pool(n))
    rows = synthetic.conversations(40, seed=2)
    synthetic.write_parquet(rows, tmp_path / "src", rows_per_file=10)
    src = open_source(str(tmp_path / "src"))
    read_band(src, np.arange(40), 0, 40)
    monkeypatch.setattr(bands_module, "SHARED_PAGE_BYTES", src.page_bytes - 1)
    read_band(src, np.arange(40), 0, 40)
    assert threads == [2, 1]


def test_parquet_batches_are_sized_by_bytes(tmp_path, monkeypatch):
    """A row group of 40 rows of about 60 KB, read in batches of about 200 KB: 3 rows."""
    monkeypatch.setattr(bands_module, "READ_BATCH_BYTES", 200_000)
    pq.write_table(
        synthetic._to_table([_conversation(k, 60_000) for k in range(40)]),
        tmp_path / "rows.parquet",
        write_batch_size=1,
    )
    batches = [
        len(local) for local, _ in bands_module._read_parquet(tmp_path / "rows.parquet", np.ones(40, bool), False)
    ]
    assert batches == [3] * 13 + [1]


def _heap_kib() -> int:
    """This process's resident private memory in its main heap, from /proc."""
    kib, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if not fields[0].endswith(":"):
                inside = fields[-1] == "[heap]"
            elif inside and fields[0] == "Private_Dirty:":
                kib += int(fields[1])
    return kib


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "malloc_trim"), reason="the C library is not glibc")
def test_free_memory_under_a_held_block_goes_back_to_the_system():
    # 32 MB of 64 KiB blocks in the heap, then one held above them: freeing the rest
    # leaves them resident (the heap's top cannot shrink) until they are given back
    blocks = [ctypes.create_string_buffer(64 << 10) for _ in range(512)]
    held = ctypes.create_string_buffer(64 << 10)
    del blocks
    before = _heap_kib()
    give_back_free()
    assert before - _heap_kib() > 16 << 10
    assert held.raw == bytes(64 << 10)


def test_free_memory_goes_back_between_steps_only_where_asked(monkeypatch):
    """``give_back_between`` gives free memory back in a worker of many (``give_back_often``), else not."""
    from fixed_sft import memory

    given: list[bool] = []
    monkeypatch.setattr(memory, "give_back_free", lambda: given.append(True))
    monkeypatch.setattr(memory, "_often", False)
    memory.give_back_between()
    memory.give_back_often(True)
    memory.give_back_between()
    memory.give_back_often(False)
    memory.give_back_between()
    assert given == [True]

"""Rows -> one Parquet file, written a row group at a time, and read back a row group at a time
(format: data/README.md)."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import arrow
from .hashes import AppendedHash
from .pack import Row
from .plots import PLOT_NAMES

FORMAT = "fixed-sft/2"  # the format of the folder: its Parquet schema and manifest (data/README.md)
BOUNDARIES_FORMAT = "fixed-sft/3"  # the same with each row's boundaries (``--emit-boundaries``)
FORMATS = ("fixed-sft/1", FORMAT, BOUNDARIES_FORMAT)  # the formats of folders a new build may replace
PARQUET_NAME = "train.parquet"
PARTS_NAME = f".{PARQUET_NAME}.parts"  # in a build's temporary folder: its rows' Parquet parts (fixed_sft.parallel)
MANIFEST_NAME = "manifest.json"
CARD_NAME = "README.md"  # the dataset card (fixed_sft.card), and its plots (fixed_sft.plots)
CARD_FILES = (CARD_NAME, *PLOT_NAMES)
ROWS_PER_GROUP = 128
# Row groups handed to the writer's thread and not yet written hold at most this many tokens (or
# are one group): with 4 queued, a later build from the store took 3.6 s against 4.4 s with 1.
QUEUED_VALUES = 1 << 22
# A row group holds at most this many tokens: fewer rows than ROWS_PER_GROUP where rows are
# longer than 65536 tokens, so that a reader decodes a bounded amount at once.
GROUP_VALUES = 1 << 23
WRITE_BATCH_VALUES = 1 << 20  # values per encoding batch: a row group's column in few pages (~10% less CPU)
# Every column is zstd-compressed, none dictionary-encoded. The token ids are split into their
# 4 byte planes first (BYTE_STREAM_SPLIT; readers: Arrow >= 17, polars): their high bytes are
# nearly constant. On 42M tokens, against a dictionary: 20% less writer CPU, files 3% larger.
ENCODINGS = {"metadata.input_ids.list.element": "BYTE_STREAM_SPLIT"}

SEGMENT = pa.struct([("source_index", pa.int64()), ("id", pa.string()), ("start", pa.int32()), ("end", pa.int32())])
MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
# Every row's ``messages``: one message with string content, so that miles, which reads a
# row's ``messages`` as its prompt, finds the list of messages it requires when the
# checkpoint has a processor. The row's tokens are in ``metadata``, which miles passes on.
PROMPT = [{"role": "user", "content": ""}]
METADATA = [
    ("input_ids", pa.list_(pa.int32())),
    ("loss_mask", pa.list_(pa.uint8())),
    ("row", pa.int64()),
    ("segments", pa.list_(SEGMENT)),
]
SCHEMA = pa.schema([("messages", pa.list_(MESSAGE)), ("metadata", pa.struct(METADATA))])
# With boundaries: ``metadata.cu_seqlens`` after the segments, 0 then the end of each segment
# in the row (``hashes.boundaries``), as flash-attn's varlen functions take them.
BOUNDARIES_SCHEMA = pa.schema(
    [("messages", pa.list_(MESSAGE)), ("metadata", pa.struct([*METADATA, ("cu_seqlens", pa.list_(pa.int32()))]))]
)


def schema(boundaries: bool) -> pa.Schema:
    """The Parquet schema of a build, with boundaries or without."""
    return BOUNDARIES_SCHEMA if boundaries else SCHEMA


def format_of(boundaries: bool) -> str:
    """The format of a build, with boundaries (``fixed-sft/3``) or without (``fixed-sft/2``)."""
    return BOUNDARIES_FORMAT if boundaries else FORMAT


class WriteFailed(OSError):
    """A file of the build could not be written (out of space, say); the message names it."""


@contextmanager
def naming(path: Path) -> Iterator[None]:
    """An ``OSError`` in the block becomes a ``WriteFailed`` naming ``path`` (pyarrow's
    errors, and those of a Python file's ``write``, name no file)."""
    try:
        yield
    except OSError as error:
        reason = os.strerror(error.errno) if error.errno else str(error)
        raise WriteFailed(f"cannot write {path}: {reason}") from None


def rows_per_group(row_tokens: int) -> int:
    """Rows in a row group: ``ROWS_PER_GROUP``, fewer where that would hold over ``GROUP_VALUES`` tokens."""
    return min(ROWS_PER_GROUP, max(1, GROUP_VALUES // row_tokens))


def parquet_writer(path: Path, boundaries: bool) -> pq.ParquetWriter:
    """A writer of a build's Parquet file (or of a part of it: ``write_part``)."""
    with naming(path):
        return pq.ParquetWriter(
            path,
            schema(boundaries),
            compression="zstd",
            use_dictionary=False,
            column_encoding=ENCODINGS,
            write_statistics=False,
            write_batch_size=WRITE_BATCH_VALUES,
        )


def rows_table(rows: list[Row], first: int, boundaries: bool) -> pa.Table:
    """One row group: ``rows``, numbered from ``first`` (the ``row`` column)."""
    table_schema = schema(boundaries)
    width = len(rows[0].ids)
    offsets = arrow.numbers(np.arange(len(rows) + 1) * width, pa.int32())
    ids = pa.ListArray.from_arrays(offsets, arrow.numbers(_joined([r.ids for r in rows]), pa.int32()))
    mask = pa.ListArray.from_arrays(offsets, arrow.numbers(_joined([r.mask for r in rows]), pa.uint8()))
    numbers = arrow.numbers(np.arange(first, first + len(rows)), pa.int64())
    parts = [segment for row in rows for segment in row.segments]
    segment = pa.StructArray.from_arrays(
        [
            arrow.numbers([s.index for s in parts], pa.int64()),
            arrow.strings([s.id for s in parts]),
            arrow.numbers([s.start for s in parts], pa.int32()),
            arrow.numbers([s.end for s in parts], pa.int32()),
        ],
        fields=list(SEGMENT),
    )
    counts = arrow.numbers(_starts([len(row.segments) for row in rows]), pa.int32())
    fields = [ids, mask, numbers, pa.ListArray.from_arrays(counts, segment)]
    if boundaries:
        bounds = [row.cu_seqlens for row in rows]
        starts = arrow.numbers(_starts([len(b) for b in bounds]), pa.int32())
        fields.append(pa.ListArray.from_arrays(starts, arrow.numbers(np.concatenate(bounds), pa.int32())))
    metadata = pa.StructArray.from_arrays(fields, fields=list(table_schema.field("metadata").type))
    return pa.Table.from_arrays([_prompts(len(rows)), metadata], schema=table_schema)


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    """``parts`` (1-d, of one dtype) end to end: a view where each follows the one before
    in one buffer (a packed row group's rows), else a copy.

    >>> stream = np.arange(6)
    >>> joined = _joined([stream[:2], stream[2:4], stream[4:]])
    >>> joined.tolist(), np.shares_memory(joined, stream), np.shares_memory(_joined([stream[:2], stream[4:]]), stream)
    ([0, 1, 2, 3, 4, 5], True, False)
    """
    base = parts[0].base
    if isinstance(base, np.ndarray) and base.flags.c_contiguous and base.dtype == parts[0].dtype:
        start = parts[0].__array_interface__["data"][0]
        at = start
        for part in parts:
            if part.base is not base or part.__array_interface__["data"][0] != at or not part.flags.c_contiguous:
                break
            at += part.nbytes
        else:
            offset = (start - base.__array_interface__["data"][0]) // base.itemsize
            return base.reshape(-1)[offset : offset + (at - start) // base.itemsize]
    return np.concatenate(parts)


def _starts(lengths: list[int]) -> np.ndarray:
    """The offsets of lists of ``lengths``: 0, then each one's end."""
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])


@lru_cache(maxsize=2)
def _prompts(count: int) -> pa.Array:
    """``count`` rows' ``messages``: each ``PROMPT`` (one array for every full row group:
    an Arrow array does not change)."""
    (message,) = PROMPT
    each = [[message[name] for _ in range(count)] for name in ("role", "content")]
    structs = pa.StructArray.from_arrays([arrow.strings(values) for values in each], fields=list(MESSAGE))
    return pa.ListArray.from_arrays(arrow.numbers(np.arange(count + 1), pa.int32()), structs)


def write_part(path: Path, rows: Iterable[Row], first: int, boundaries: bool) -> int:
    """``rows`` (numbered from ``first``) as a Parquet file of row groups of
    ``rows_per_group`` rows (the last may hold fewer), written as ``RowWriter`` writes those
    row groups: ``fixed_sft.stitch`` joins such files into the file ``RowWriter`` would have
    written, where only the last part ends with a shorter group. Only a row group's rows
    are held at a time; returns how many rows it wrote."""
    writer = parquet_writer(path, boundaries)
    group: list[Row] = []
    written = first
    with naming(path):
        try:
            for row in rows:
                group.append(row)
                if len(group) == rows_per_group(len(row.ids)):
                    writer.write_table(rows_table(group, written, boundaries))
                    written, group = written + len(group), []
            if group:
                writer.write_table(rows_table(group, written, boundaries))
                written += len(group)
        finally:
            writer.close()
    return written - first


class RowWriter:
    """Appends rows to one Parquet file, a row group (``rows_per_group``) at a time. Row
    groups are compressed and written by a background thread (pyarrow releases the GIL),
    at most ``QUEUED_VALUES`` tokens behind the caller; none is written after one that failed.
    The caller's thread hashes each group once written: the writer's thread is a later
    build's slowest stage, the caller's waits on it.
    With ``boundaries``, each row's ``metadata.cu_seqlens`` is written too."""

    def __init__(self, path: Path, boundaries: bool = False):
        self.path = path
        self.boundaries = boundaries
        self._writer = parquet_writer(path, boundaries)
        self._hash = AppendedHash(path)  # (its bytes hashed as each group is written, by ``_wait``)
        self.sha256: str | None = None  # the file's, once closed
        self._pending: list[Row] = []
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="parquet")
        self._writing: deque[Future] = deque()
        self._failed = False
        self.rows = 0

    def write(self, row: Row) -> None:
        self._pending.append(row)
        self.rows += 1
        if len(self._pending) >= rows_per_group(len(row.ids)):
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        table = rows_table(self._pending, self.rows - len(self._pending), self.boundaries)
        self._wait(max(1, QUEUED_VALUES // (len(self._pending) * len(self._pending[0].ids))) - 1)
        self._writing.append(self._thread.submit(self._write_group, table))
        self._pending = []

    def _write_group(self, table: pa.Table) -> int:
        """Write ``table``; the file's size then (where its bytes are final)."""
        if self._failed:
            return 0  # (the error is raised by the group that failed)
        try:
            self._writer.write_table(table)
            return os.stat(self.path).st_size
        except BaseException:
            self._failed = True
            raise

    def _wait(self, queued: int = 0) -> None:
        """Wait until at most ``queued`` row groups are still to be written."""
        while len(self._writing) > queued:
            with naming(self.path):
                self._hash.update(self._writing[0].result())
            self._writing.popleft()

    def abort(self) -> None:
        """Stop writing after an error: the file is left incomplete (the build discards it).
        The writer is closed in its own thread, once the row group it may be writing ends:
        closing it under a write crashes the process (SIGSEGV, seen when a signal stopped a
        build), and a join that a signal interrupts may take the running thread for ended
        (Python 3.11's ``Thread.join``). Groups not started write nothing; a signal while
        waiting is raised once the writer is closed."""
        self._failed = True  # (a group that starts now writes nothing)
        try:
            closed = self._thread.submit(self._close_quietly)
        except RuntimeError:  # (shut down: by ``close``, once every write had ended, or by an earlier abort)
            self._close_quietly()
            return
        self._thread.shutdown(wait=False)
        interrupted: BaseException | None = None
        while not closed.done():
            try:
                wait([closed])
            except BaseException as error:  # (a signal's exception: the write must still end first)
                interrupted = interrupted or error
        if interrupted is not None:
            raise interrupted

    def _close_quietly(self) -> None:
        try:
            self._writer.close()
        except (OSError, pa.ArrowException):
            pass

    def close(self) -> None:
        """Write the last row group and the footer, and flush the file to disk."""
        self._flush()
        self._wait()
        self._thread.shutdown()
        with naming(self.path):
            self._writer.close()
            with self.path.open("rb+") as f:
                os.fsync(f.fileno())
            self.sha256 = self._hash.hexdigest()


class NullValue(ValueError):
    """A null where the format has a value; the message names the row."""


def first_null(array: pa.Array) -> int | None:
    """The index of ``array``'s first null, or ``None``."""
    if not array.null_count:
        return None
    import pyarrow.compute as pc  # (here: its import, ~30 ms, is not on a later build's path)

    nulls = arrow.to_numpy(pc.is_null(array))
    return int(np.argmax(nulls))


def tokens(metadata: pa.StructArray, first: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ids, mask, offsets)`` of rows ``metadata`` (a ``metadata`` column, whose first
    row is row ``first`` of its file): their flat ids and mask, and row offsets into them
    from 0; ``NullValue`` naming the row for a null row or value (which the format never
    holds, and which NumPy would turn into a number)."""
    if (row := first_null(metadata)) is not None:
        raise NullValue(f"row {first + row}: metadata is null")
    ids = metadata.field("input_ids")
    mask = metadata.field("loss_mask")
    for name, column in (("input_ids", ids), ("loss_mask", mask)):
        if (row := first_null(column)) is not None:
            raise NullValue(f"row {first + row}: {name} is null")
        if (value := first_null(column.flatten())) is not None:
            starts = arrow.to_numpy(column.offsets) - column.offsets[0].as_py()
            row = int(np.searchsorted(starts, value, side="right")) - 1
            raise NullValue(f"row {first + row}: a value in {name} is null")
    offsets = arrow.to_numpy(ids.offsets)
    if not np.array_equal(offsets, arrow.to_numpy(mask.offsets)):
        raise ValueError("input_ids and loss_mask rows differ in length")
    flat_ids = arrow.to_numpy(ids.flatten())
    flat_mask = arrow.to_numpy(mask.flatten())
    return flat_ids, flat_mask, (offsets - offsets[0]).astype(np.int64)


def read_rows(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ids, mask, offsets)`` (see ``tokens``) of every row of a built Parquet file,
    read a row group at a time. (verify reads a file from anyone with ``reader``.)"""
    parts, first = [], 0
    with pq.ParquetFile(path) as file:
        for group in range(file.num_row_groups):
            metadata = file.read_row_group(group, columns=["metadata"]).column("metadata").combine_chunks()
            parts.append(tokens(metadata, first))
            first += len(metadata)
    if not parts:
        return np.zeros(0, np.int32), np.zeros(0, np.uint8), np.zeros(1, np.int64)
    ends = np.cumsum([0] + [len(ids) for ids, _, _ in parts])
    offsets = np.concatenate([[0]] + [o[1:] + end for (_, _, o), end in zip(parts, ends)])
    return (
        np.concatenate([ids for ids, _, _ in parts]),
        np.concatenate([mask for _, mask, _ in parts]),
        offsets.astype(np.int64),
    )

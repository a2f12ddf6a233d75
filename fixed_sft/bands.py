"""A source's rows, read as Arrow data: a band of the packing order, chosen rows, or one file's rows.

Rows are read in *bands*: one pass over the files keeps just the rows whose packing
position falls in ``[lo, hi)`` (as Arrow data), so memory holds one band, not the source.
A row over ``MAX_CONVERSATION_BYTES`` has its data dropped as it is read; ``fixed_sft.records``
decodes the rows read into records.
"""

from __future__ import annotations

import codecs
import math
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import arrow
from .source import COLUMNS, SOURCE_COLUMN, Source, SourceError, Stamp, changed, check_stamp, unreadable

READ_BATCH_ROWS = 4096
# Parquet rows are decoded in batches of at most this many bytes (by the row group's bytes per
# row), and column chunks read from the file in pieces of PARQUET_BUFFER_BYTES, not whole: not
# pre-buffered (pyarrow's default), which reads every column chunk of the row groups asked for
# into memory first, from Arrow's own pool: a whole file of one row group (a 300 MB file of
# normal rows: 170 MiB held while each band is read). Decoding a batch holds several times its
# bytes at once (Arrow's string builders, the rows taken from it): reading 80,000 conversations
# of one row group peaked at 278-297 MB of resident memory in batches of 16 MiB, 164-172 in
# batches of 4 MiB, in 0.55-0.61 CPU-s rather than 0.63-0.71.
READ_BATCH_BYTES = 4 << 20
# A worker that fills the store reads its row group in batches of this many bytes: its memory
# counts once per worker (16 workers, row groups of 6.8 MB: each 10 MB less at its peak, in as much CPU).
FILL_BATCH_BYTES = 1 << 20
PARQUET_BUFFER_BYTES = 1 << 20
# The largest source row a build encodes: a JSONL line's bytes, or the bytes of a Parquet row's
# strings (with its other values' widths). A larger row is an invalid row, named by ``records``
# (its data is dropped as it is read, so it costs no more than its read). A build holds a
# conversation several times over while it encodes it (source bytes, its text as Python holds it:
# up to 4 bytes a character, ids, the template check's rendering), in the build process and in
# each of up to two workers that encode one at once: at 8 MiB, builds of such conversations stay
# under 1 GiB with 1 or 2 workers (benchmarks/bench_memory.py). 8 MiB is about 2 million tokens of
# English, twice the longest row a build makes (fixed_sft.params.MAX_ROW_TOKENS).
MAX_CONVERSATION_BYTES = 8 << 20
_ID_BYTES_NAMED = 1024  # an over-bound Parquet row keeps its id, to be named by it, up to this size
_SKIP_BYTES = 1 << 20  # an over-bound JSONL line is read past in pieces of this size
READ_THREADS = 2  # more reader threads raise the peak memory with the source size
SHARED_PAGE_BYTES = 16 << 20  # a source whose pages may be larger is read a file at a time
# A reader returns freed decode memory to the OS after decoding this many bytes: at most this
# much is held per reader, and returning it less often saves page faults when it is reused.
RELEASE_BYTES = 64 << 20


def file_bytes(source: Source) -> list[int]:
    """Uncompressed bytes of each source file, from Parquet metadata or file sizes."""
    sizes = []
    for path in source.files:
        if path.suffix == ".parquet":
            meta = pq.ParquetFile(path).metadata
            sizes.append(sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups)))
        else:
            sizes.append(path.stat().st_size)
    return sizes


def bytes_per_row(source: Source) -> float:
    """Uncompressed bytes per source row, from Parquet metadata or file sizes."""
    return sum(file_bytes(source)) / max(source.num_rows, 1)


def band_bytes(budget: float, sizes: list[int]) -> float:
    """The bytes of rows a band may hold so that reading it holds at most ``budget``
    bytes: ``read_band`` holds the band's rows as read, then sorts one file's rows at a
    time through two more copies of them (combined, then taken in packing order). A
    band's rows are spread over the files as the source's bytes are (the packing order is
    a uniform permutation), so the largest file's share ``s`` of ``sizes`` costs ``2 * s``
    of the band again: a band holds ``budget / (1 + 2 * s)`` (a third of it for a
    source of one file, more for many files of even sizes)."""
    total = sum(sizes)
    share = max(sizes) / total if total > 0 else 1.0
    return budget / (1 + 2 * share)


@dataclass
class Band:
    """The rows of one band: one table per source file holding its rows of the band
    sorted by packing position; ``positions[k]`` are those positions for ``parts[k]``.
    Each table's ``bytes`` and ``dropped`` columns are its rows' sizes and whether their
    data was dropped (``read_band``)."""

    parts: list[pa.Table | None]
    positions: list[np.ndarray]

    @property
    def num_rows(self) -> int:
        return sum(map(len, self.positions))

    def _part(self, k: int) -> pa.Table:
        """Part ``k``, which ``chunks`` has not let go of yet."""
        part = self.parts[k]
        # chunks() lets go of a part only once its last row is in a chunk, and a band is cut once
        assert part is not None
        return part

    def chunks(self, rows: int | Callable[[], int], max_bytes: float = math.inf) -> Iterator[pa.Table]:
        """Consecutive chunks in packing order, each its own compact copy: a chunk's rows
        are one slice of each part, interleaved by a single take. A chunk holds ``rows``
        rows (a callable: asked as each chunk is cut), or fewer where more would hold more
        than ``max_bytes`` bytes of rows, and at least one row. A row whose data was
        dropped when it was read (over ``MAX_CONVERSATION_BYTES``) weighs nothing.
        The band lets go of each part once its last row is in a chunk (the part becomes
        ``None``), so that a chunk being encoded is not also held in its band."""
        # positions are distinct (the order is a permutation), so [lo, hi) holds exactly a chunk
        if not self.parts:
            return
        everything = np.concatenate(self.positions)
        by_position = np.argsort(everything, kind="stable")
        ordered = everything[by_position]
        parts = range(len(self.parts))
        sizes = np.concatenate([arrow.to_numpy(self._part(k).column("bytes")) for k in parts])[by_position]
        dropped = np.concatenate([arrow.to_numpy(self._part(k).column("dropped")) for k in parts])[by_position]
        ends = np.cumsum(np.where(dropped, 0, sizes))
        start = 0
        while start < len(ordered):
            count = rows() if callable(rows) else rows
            before = ends[start - 1] if start else 0
            fit = int(np.searchsorted(ends, before + max_bytes, side="right"))  # rows [start, fit) fit in max_bytes
            stop = min(len(ordered), start + max(1, count), max(start + 1, fit))
            lo, hi = ordered[start], ordered[stop - 1] + 1
            pieces, keys = [], []
            for k, positions in enumerate(self.positions):
                a, b = np.searchsorted(positions, (lo, hi)).tolist()
                if b > a:
                    pieces.append(self._part(k).slice(a, b - a))
                    keys.append(positions[a:b])
                if len(positions) and positions[-1] < hi:
                    self.parts[k] = None
            interleave = np.argsort(np.concatenate(keys), kind="stable")
            joined = pa.concat_tables(pieces, promote_options="permissive")
            chunk = joined.take(arrow.numbers(interleave, pa.int64())).combine_chunks()
            del pieces
            yield chunk
            del chunk
            start = stop


def read_band(source: Source, rank: np.ndarray, lo: int, hi: int, skip: np.ndarray | None = None) -> Band:
    """The rows whose packing position ``rank[i]`` is in ``[lo, hi)`` (but not those that
    ``skip[i]`` marks), read from the files in parallel threads (pyarrow decodes without the GIL).

    Columns: ``messages`` and, where the file has them, ``id`` (as text), ``tools`` and a string
    ``source`` for Parquet sources, or ``line`` (the raw bytes) for JSONL sources; then ``bytes`` (the row's
    size), ``dropped`` (true for a row over ``MAX_CONVERSATION_BYTES``, whose data is
    dropped as it is read, so that no band holds it) and ``index`` (the global row
    index). ``records`` decodes them."""
    if skip is None:
        return _read_selected(source, rank, lambda start, count: _within(rank[start : start + count], lo, hi))
    return _read_selected(
        source, rank, lambda start, count: _within(rank[start : start + count], lo, hi) & ~skip[start : start + count]
    )


def _within(positions: np.ndarray, lo: int, hi: int) -> np.ndarray:
    return (positions >= lo) & (positions < hi)


def read_rows(source: Source, rank: np.ndarray, indices: np.ndarray) -> Band:
    """The rows of global ``indices`` (any set), read as ``read_band`` reads a band: of a
    Parquet file only the row groups that hold one, of a JSONL file only their lines kept."""
    wanted = np.zeros(source.num_rows, bool)
    wanted[indices] = True
    return _read_selected(source, rank, lambda start, count: wanted[start : start + count])


def _read_selected(source: Source, rank: np.ndarray, select: Callable[[int, int], np.ndarray]) -> Band:
    """``read_band`` of the rows that ``select`` keeps: given a file's first global row and
    its row count, which of its rows to read."""

    def read_file(file: FileRead) -> tuple[list[pa.Table], np.ndarray] | None:
        positions = rank[file.start : file.start + file.rows]
        inside = select(file.start, file.rows)
        if not inside.any():
            return None
        tables, kept = [], []
        for local, table in _read_file(file.path, inside, file.source_column, stamp=file.stamp):
            tables.append(table.append_column("index", arrow.numbers(local + file.start, pa.int64())))
            kept.append(positions[local])
        return tables, np.concatenate(kept)

    threads = 1 if source.page_bytes > SHARED_PAGE_BYTES else READ_THREADS  # (large pages: decoded one at a time)
    with ThreadPoolExecutor(min(len(source.files), os.cpu_count() or 1, threads)) as pool:
        found = [part for part in pool.map(read_file, file_reads(source)) if part]
    memory = pa.default_memory_pool()
    memory.release_unused()  # the freed decode buffers, before the copies (larger blocks) are allocated
    parts, positions = [], []
    while found:  # one file at a time, so sorting copies at most one file's rows at once
        tables, kept = found.pop(0)
        contiguous = pa.concat_tables(tables).combine_chunks()
        del tables
        memory.release_unused()  # (the rows as read, before their sorted copy is allocated)
        by_position = np.argsort(kept, kind="stable")
        parts.append(contiguous.take(arrow.numbers(by_position, pa.int64())))
        positions.append(kept[by_position])
        del contiguous
        memory.release_unused()
    return Band(parts, positions)


class FileRead(NamedTuple):
    """A file of a source, as a reader takes it: its path, its first row's global index, its
    rows, whether its ``source`` column is read (JSONL: read with the line), and its
    ``Stamp`` as the source was opened (``_read_file``'s ``stamp``)."""

    path: Path
    start: int
    rows: int
    source_column: bool
    stamp: Stamp


def file_reads(source: Source) -> list[FileRead]:
    """Each file of ``source``, as a reader takes it, in order."""
    columns = source.source_columns or (False,) * len(source.files)
    starts = np.concatenate(([0], np.cumsum(source.row_counts)[:-1])).tolist()
    return list(map(FileRead, source.files, starts, source.row_counts, columns, source.stamps))


def _read_file(
    path: Path,
    inside: np.ndarray,
    source_column: bool,
    batch_bytes: int | None = None,
    stamp: Stamp | None = None,
) -> Iterator[tuple[np.ndarray, pa.Table]]:
    """``_read_parquet`` or ``_read_jsonl``, by the file's suffix. With ``stamp`` (its
    ``Stamp`` as the source was opened), a batch is given only where the file is unchanged
    once it is read (``changed`` otherwise): rows of other bytes than those the store's
    key hashed are never encoded, nor stored under that key."""
    batches = (
        _read_parquet(path, inside, source_column, batch_bytes)
        if path.suffix == ".parquet"
        else _read_jsonl(path, inside, batch_bytes)
    )
    return batches if stamp is None else _unchanged(path, stamp, batches)


def _unchanged(
    path: Path, stamp: Stamp, batches: Iterator[tuple[np.ndarray, pa.Table]]
) -> Iterator[tuple[np.ndarray, pa.Table]]:
    for batch in batches:
        check_stamp(path, stamp)
        yield batch


def _read_parquet(
    path: Path, inside: np.ndarray, source_column: bool, batch_bytes: int | None = None
) -> Iterator[tuple[np.ndarray, pa.Table]]:
    """``(local indices, rows)`` of the wanted rows (with the ``source`` column where
    ``source_column``: ``Source.source_columns``), streamed in record batches of at most
    ``batch_bytes`` (default ``READ_BATCH_BYTES``; by the row group's bytes per row) from column chunks read in
    pieces (not pre-buffered), so that memory holds one batch of the file, whatever its
    row-group and row sizes; a row over ``MAX_CONVERSATION_BYTES`` is dropped from the batch (``_bounded``)."""
    try:
        file = pq.ParquetFile(path, buffer_size=PARQUET_BUFFER_BYTES, pre_buffer=False)
        names = file.schema_arrow.names
        columns = [c for c in COLUMNS if c in names]
        if source_column:
            columns.append(SOURCE_COLUMN)
        first = decoded = 0
        for group in range(file.num_row_groups):
            meta = file.metadata.row_group(group)
            if inside[first : first + meta.num_rows].any():
                start = first
                per_row = meta.total_byte_size / max(meta.num_rows, 1)
                batch_rows = max(1, min(READ_BATCH_ROWS, int((batch_bytes or READ_BATCH_BYTES) / max(per_row, 1.0))))
                for batch in file.iter_batches(
                    batch_size=batch_rows, row_groups=[group], columns=columns, use_threads=False
                ):
                    wanted = np.flatnonzero(inside[start : start + batch.num_rows])
                    if len(wanted):
                        table = pa.Table.from_batches([batch])
                        # ids are text in every file, whatever type this one stores (cast before
                        # ``take``, which has no kernel for string_view)
                        for name in ("id", SOURCE_COLUMN):
                            if name in columns:
                                where = table.column_names.index(name)
                                table = table.set_column(where, name, table.column(name).cast(pa.string()))
                        yield start + wanted, _bounded(table, wanted)
                        del table
                    start += batch.num_rows
                    del batch  # (before the next batch is decoded)
                decoded += meta.total_byte_size
                if decoded >= RELEASE_BYTES:  # give freed decode buffers back to the OS
                    pa.default_memory_pool().release_unused()
                    decoded = 0
            first += meta.num_rows
    except (pa.ArrowException, OSError, ValueError) as error:
        raise SourceError(f"{path}: cannot read Parquet ({error})") from None


def _bounded(table: pa.Table, wanted: np.ndarray) -> pa.Table:
    """Rows ``wanted`` of a decoded batch, with their sizes as a ``bytes`` column; a row
    over ``MAX_CONVERSATION_BYTES`` is ``dropped``: null ``messages`` (and a null ``id``
    where the id itself is over ``_ID_BYTES_NAMED``), its data never copied from the batch."""
    values = {name: value_bytes(table.column(name))[wanted] for name in table.column_names if name != SOURCE_COLUMN}
    sizes = np.sum(list(values.values()), axis=0, dtype=np.int64) if values else np.zeros(len(wanted), np.int64)
    over = sizes > MAX_CONVERSATION_BYTES
    columns = {}
    for name in table.column_names:
        drop = over & (values[name] > _ID_BYTES_NAMED) if name == "id" else over
        columns[name] = table.column(name).take(arrow.numbers(wanted, pa.int64(), valid=~drop))
    return pa.table({**columns, "bytes": arrow.numbers(sizes, pa.int64()), "dropped": arrow.numbers(over, pa.bool_())})


def value_bytes(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Bytes of each value of ``values`` (int64): the lengths of the strings and binaries
    it holds and the widths of its other fixed-width values, summed through lists and
    structs; a null is 0. A value of a type outside these (a map, a union) counts as an
    even share of the array's buffers."""
    import pyarrow.compute as pc  # (here: its import, ~30 ms, is not on a later build's path)

    if isinstance(values, pa.ChunkedArray):
        return np.concatenate([np.zeros(0, np.int64), *map(value_bytes, values.chunks)])
    if isinstance(values, pa.ExtensionArray):  # (Arrow's JSON type, say: its text)
        return value_bytes(values.storage)
    kind, count = values.type, len(values)
    if pa.types.is_dictionary(kind):
        return value_bytes(values.dictionary_decode())
    if pa.types.is_string_view(kind) or pa.types.is_binary_view(kind):
        values = values.cast(pa.large_string() if pa.types.is_string_view(kind) else pa.large_binary())
        kind = values.type
    if (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_fixed_size_binary(kind)
    ):
        lengths = pc.binary_length(values)
        return arrow.to_numpy(pc.coalesce(lengths, arrow.numbers([0], lengths.type)[0])).astype(np.int64)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        inner = value_bytes(pc.list_flatten(values))  # null lists hold nothing; slicing is taken care of
        parents = arrow.to_numpy(pc.list_parent_indices(values))
        return np.bincount(parents, weights=inner, minlength=count).astype(np.int64)
    if pa.types.is_struct(kind):
        sizes = np.zeros(count, np.int64)
        for field in values.flatten():  # sliced, and null where the struct is
            sizes += value_bytes(field)
        return sizes
    try:
        width = max(kind.bit_width // 8, 1)
    except ValueError:  # not fixed-width
        return np.full(count, values.nbytes // max(count, 1), np.int64)
    return np.where(arrow.to_numpy(values.is_null()), 0, width).astype(np.int64)


def _lines(f: BinaryIO, limit: int) -> Iterator[tuple[bytes | None, int]]:
    """``(line, size)`` for each line of ``f``: its bytes with their ``\\n`` (``None`` when
    it is over ``limit`` bytes, its bytes then read a piece at a time and dropped) and its
    size without the ``\\n``."""
    while line := f.readline(limit + 2):
        if line.endswith(b"\n"):
            size = len(line) - 1
        elif len(line) <= limit + 1:  # the last line, without \n
            size = len(line)
        else:  # more than limit + 1 bytes before the \n or the end
            size = len(line)
            while piece := f.readline(_SKIP_BYTES):
                if piece.endswith(b"\n"):
                    size += len(piece) - 1
                    break
                size += len(piece)
        yield (line if size <= limit else None), size


def _read_jsonl(
    path: Path, inside: np.ndarray, batch_bytes: int | None = None
) -> Iterator[tuple[np.ndarray, pa.Table]]:
    """``(local indices, raw lines)`` of the wanted rows, with their sizes as a ``bytes``
    column, in batches of about ``batch_bytes``; a UTF-8 byte-order mark that starts the
    file is not part of its first line, and a line over ``MAX_CONVERSATION_BYTES`` is read a
    piece at a time and ``dropped`` (kept empty). A batch's lines are gathered in one buffer
    that becomes the Arrow data as it is, not copied."""
    local: list[int] = []
    offsets, sizes, dropped = [0], list[int](), list[bool]()
    data = bytearray()
    batches = 0

    def batch() -> tuple[np.ndarray, pa.Table]:
        lines = pa.Array.from_buffers(
            pa.large_binary(), len(local), [None, pa.py_buffer(np.array(offsets, np.int64)), pa.py_buffer(data)]
        )
        sized = {"bytes": arrow.numbers(sizes, pa.int64()), "dropped": arrow.numbers(dropped, pa.bool_())}
        return np.array(local, dtype=np.int64), pa.table({"line": lines, **sized})

    try:
        with path.open("rb") as f:
            if f.read(len(codecs.BOM_UTF8)) != codecs.BOM_UTF8:
                f.seek(0)
            for n, (line, size) in enumerate(_lines(f, MAX_CONVERSATION_BYTES)):
                if n == len(inside):
                    raise changed(path)
                if inside[n]:
                    local.append(n)
                    if line is not None:
                        data += line
                    offsets.append(len(data))
                    sizes.append(size)
                    dropped.append(line is None)
                    if len(data) >= (batch_bytes or READ_BATCH_BYTES):
                        yield batch()
                        batches += 1
                        local, offsets, sizes, dropped, data = [], [0], [], [], bytearray()
    except OSError as error:
        raise unreadable(path, error) from None
    if local or not batches:
        yield batch()


def read_file_rows(
    path: Path,
    start: int,
    inside: np.ndarray,
    source_column: bool,
    batch_bytes: int | None = None,
    stamp: Stamp | None = None,
) -> Iterator[pa.Table]:
    """The rows of one source file that ``inside`` marks (its first row is source row
    ``start``), in batches of at most ``batch_bytes``, with the columns of ``read_band``
    (``source_column``: its ``Source.source_columns``): memory holds a batch, whatever the
    file's size. ``stamp``: ``_read_file``'s."""
    for local, table in _read_file(path, inside, source_column, batch_bytes, stamp):
        if table.num_rows:
            yield table.append_column("index", arrow.numbers(local + start, pa.int64()))


def row_groups(path: Path, rows: int) -> list[int]:
    """Where the row groups of a source file of ``rows`` rows end (a JSONL file: one group)."""
    if path.suffix != ".parquet":
        return [rows]
    try:
        meta = pq.ParquetFile(path).metadata
    except (pa.ArrowException, OSError) as error:
        raise SourceError(f"{path}: cannot read Parquet ({error})") from None
    return np.cumsum([meta.row_group(g).num_rows for g in range(meta.num_row_groups)], dtype=np.int64).tolist()


def too_large(size: int) -> str:
    """The reason a row of ``size`` bytes, over ``MAX_CONVERSATION_BYTES``, is invalid."""
    return (
        f"the row is {size:,} bytes, over the {MAX_CONVERSATION_BYTES:,}-byte limit on one conversation "
        "(MAX_CONVERSATION_BYTES, which bounds a build's memory)"
    )

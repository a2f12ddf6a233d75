"""A ``train.parquet`` from anyone -> its rows, a row group at a time, decoded only where its
footer and page headers agree with the rows its manifest lists (format: data/README.md).

A small file can claim to hold billions of values (one row of 400M zeros compresses to 3 kB),
so before pyarrow decodes a page:

- the footer is at most what a file of the manifest's rows needs (``FOOTER_BYTES``), its
  Parquet schema is the format's exactly (each column's physical and logical type and
  levels), no column chunk lies in another file or outside this one, and the row groups'
  row counts add up to the file's;
- in every row group, each column of ids, mask values or segments holds at most one row's
  worth of values more than its rows hold (``row_tokens`` each: a longer row is then still
  named, a bomb is not read), each numeric column chunk's uncompressed size is what that many
  values take, and what the columns read would take decoded is at most ``DECODE_BYTES``;
- just before a row group is decoded, its page headers are read: the pages must fill each
  column chunk exactly, hold the values and uncompressed bytes the footer says, and each be
  at most ``PAGE_BYTES`` (so the footer cannot understate them).

A disagreement is ``Refused``, naming the file and row group, and nothing more is decoded.
Rows past the manifest's are not decoded (``groups``' ``limit``); the file's row count is the
footer's. The loss mask is read as its stored 32-bit values: pyarrow casts a stored 257 to
the ``uint8`` 1, so the footer pyarrow is given has the mask's ``UINT_8`` annotation removed.
Strings are read as dictionaries, so one long dictionary entry is not copied per value.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import thrift
from .hashes import open_regular
from .output import GROUP_VALUES, schema, tokens
from .pages import HEADER_BYTES
from .stitch import footer_bytes

MAGIC = b"PAR1"
PAGE_BYTES = 64 << 20  # the most a page may hold, compressed or not (a build's pages hold a few MiB)
DECODE_BYTES = 256 << 20  # the most a row group's columns may take decoded, by WIDTH (a build's: 2 * 8 * GROUP_VALUES)
FOOTER_BYTES = 32 << 20  # the largest footer read (a build's takes ~830 B per row group of 128 rows) ...
FOOTER_BASE, FOOTER_PER_ROW = 64 << 10, 4 << 10  # ... and at most this much for a file of so many rows
STRINGS = ("messages.list.element.role", "messages.list.element.content", "metadata.segments.list.element.id")
TOKENS = ("metadata.input_ids.list.element", "metadata.loss_mask.list.element")
MASK = TOKENS[1]
SEGMENTS = tuple(f"metadata.segments.list.element.{key}" for key in ("source_index", "id", "start", "end"))
BOUNDARIES = "metadata.cu_seqlens.list.element"  # (a build with boundaries: one more per row than its segments)
# Bytes a decoded value takes (its value, and its levels and offsets); a string's own bytes
# are counted from its column chunk's size.
WIDTH = {"metadata.row": 8 + 4, "metadata.segments.list.element.source_index": 8 + 4}
NUMERIC_CHUNK_BYTES = 32  # the most bytes a numeric value takes in a column chunk, uncompressed
_SCHEMA_FIELD, _ROW_GROUPS = 2, 4  # FileMetaData's fields
_DATA, _DICTIONARY, _DATA_V2 = 0, 2, 3  # PageType


class Refused(ValueError):
    """The file's footer or page headers disagree with the rows it must hold; the message
    is the whole problem, naming the file."""


ARROW_SCHEMA = b"ARROW:schema"  # the only key-value metadata a build's file holds: pyarrow's copy of its schema


class SchemaDiffers(ValueError):
    """The file's schema is not the format's; the message says where."""


@dataclass
class Group:
    """A row group, decoded: rows ``first`` to ``first + rows - 1`` of the file."""

    number: int
    first: int
    rows: int
    table: pa.Table

    def column(self, name: str) -> pa.Array:
        return self.table.column(name).combine_chunks()

    def tokens(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``output.tokens`` of its rows: the mask as stored (int32, so 257 is not 1)."""
        return tokens(self.column("metadata"), self.first)


@cache
def _format_footer(boundaries: bool = False) -> bytes:
    """The footer a build writes for a file of no rows (with boundaries, or without)."""
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_batches([], schema(boundaries)), sink)  # (empty_table imports pandas)
    data = sink.getvalue().to_pybytes()
    return data[-8 - int.from_bytes(data[-8:-4], "little") : -8]


@cache
def _format_elements(boundaries: bool = False) -> tuple:
    """The Parquet schema elements of the format's schema, for comparison (``_comparable``)."""
    return tuple(_comparable(e) for e in _schema(_format_footer(boundaries))[1])


@cache
def _format_leaves(boundaries: bool = False) -> tuple[str, ...]:
    """The format's leaf columns, in order, as paths (``metadata.input_ids.list.element``)."""
    footer = _format_footer(boundaries)
    leaves = pq.ParquetFile(pa.BufferReader(MAGIC + footer + len(footer).to_bytes(4, "little") + MAGIC)).schema
    return tuple(leaves.column(n).path for n in range(len(leaves)))


def _schema(footer: bytes) -> tuple[tuple[int, int], list]:
    """The ``(start, end)`` of the schema's bytes in ``footer`` (a FileMetaData), and its elements."""
    reader = thrift.Reader(footer)
    for field, kind, start, end in reader.spans():  # (stopped at the schema, which writers put second)
        if field == _SCHEMA_FIELD and kind == thrift.LIST:
            _, elements = thrift.Reader(footer, start).value(thrift.LIST)
            return (start, end), elements
    raise ValueError("the footer has no schema")


# The fields of a row group, of its column chunks and of their metadata that pyarrow reads
# the values by. pyarrow checks some others (a column's size statistics) only as a column's
# metadata is asked for, where an error aborts the process (pyarrow 26): it is given none.
_READ_FIELDS = (
    {1, 2, 3, 5, 6, 7},  # RowGroup: columns, sizes, rows, offset, ordinal
    {1, 2, 3},  # ColumnChunk: file path, offset, metadata
    {1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 13},  # ColumnMetaData: type to sizes, page offsets, encoding stats
)
_ENCRYPTED = {8, 9}  # ColumnChunk: its key, or its metadata encrypted (refused: not read)


def bare_footer(footer: bytes, schema: list | None = None) -> bytes:
    """A Parquet footer (a FileMetaData) whose row groups hold only ``_READ_FIELDS``, with the
    elements ``schema`` in place of its own where given; the rest as it is, copied. ``ValueError``:
    not a Thrift struct, or a column chunk is encrypted."""
    fields: thrift.Fields = []
    for field, kind, start, end in thrift.Reader(footer).spans():
        value: thrift.Value = kind == thrift.TRUE if kind in (thrift.TRUE, thrift.FALSE) else None
        if field == _SCHEMA_FIELD and kind == thrift.LIST and schema is not None:
            value = (thrift.STRUCT, schema)
        elif field == _ROW_GROUPS and kind == thrift.LIST:
            value = _bare_list(footer, start, end, 0)
        elif value is None:
            value = thrift.Written(footer[start:end])
        fields.append((field, kind, value))
    return thrift.write_struct(fields)


def _bare_list(data: bytes, start: int, end: int, level: int) -> thrift.Written:
    """The list of structs at ``data[start:end]`` (row groups: ``level`` 0; column chunks: 1),
    each with only its ``_READ_FIELDS``; a list of another type as it is."""
    reader = thrift.Reader(data, start)
    element, size = reader.list_header()
    if element != thrift.STRUCT:
        return thrift.Written(data[start:end])
    items = []
    for _ in range(size):
        item, reader.pos = _bare_struct(data, reader.pos, level)
        items.append(item)
    return thrift.Written(thrift.write_value(thrift.LIST, (thrift.STRUCT, items)))


def _bare_struct(data: bytes, pos: int, level: int) -> tuple[thrift.Written, int]:
    """The row group (``level`` 0), column chunk (1) or column metadata (2) at ``pos`` with
    only its ``_READ_FIELDS``, and where it ends."""
    reader, kept = thrift.Reader(data, pos), []
    for field, kind, start, end in reader.spans():
        if level == 1 and field in _ENCRYPTED:
            raise ValueError("a column chunk is encrypted")
        if field not in _READ_FIELDS[level]:
            continue
        value: thrift.Value
        if kind in (thrift.TRUE, thrift.FALSE):
            value = kind == thrift.TRUE
        elif (level, field, kind) == (0, 1, thrift.LIST):
            value = _bare_list(data, start, end, 1)
        elif (level, field, kind) == (1, 3, thrift.STRUCT):
            value, _ = _bare_struct(data, start, 2)
        else:
            value = thrift.Written(data[start:end])
        kept.append((field, kind, value))
    return thrift.Written(thrift.write_struct(kept)), reader.pos


def bare_metadata(path: Path) -> pq.FileMetaData:
    """The metadata of the Parquet file ``path`` from its footer made bare (``bare_footer``):
    asking it for a column's metadata cannot abort the process. ``ValueError`` where the
    file has no footer; ``pyarrow.ArrowException`` where pyarrow cannot read it."""
    status = path.stat()
    return _bare_metadata(path, (status.st_size, status.st_mtime_ns, status.st_ctime_ns, status.st_ino))


@lru_cache(maxsize=64)
def _bare_metadata(path: Path, stamp: tuple[int, ...]) -> pq.FileMetaData:
    """``bare_metadata`` of the file as it is at ``stamp`` (size, times, inode: as
    ``source.Stamp``); a build reads a file's footer once a band."""
    footer = bare_footer(footer_bytes(path)[0])
    return pq.ParquetFile(pa.BufferReader(MAGIC + footer + len(footer).to_bytes(4, "little") + MAGIC)).metadata


def _comparable(element: list) -> tuple:
    """A schema element without its field id (9), which says nothing of the values."""
    return tuple((f, k, v) for f, k, v in element if f != 9)


class _Spliced(io.RawIOBase):
    """The file's bytes up to ``end``, followed by ``tail``."""

    def __init__(self, file: io.BufferedReader, end: int, tail: bytes):
        self._file, self._end, self._tail, self._pos = file, end, tail, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._end + len(self._tail)}[whence]
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer) -> int:
        view, n = memoryview(buffer).cast("B"), 0
        while n < len(view) and self._pos < self._end:  # (pyarrow takes a short read for the end of the file)
            self._file.seek(self._pos)
            got = self._file.readinto(view[n : n + self._end - self._pos])
            if not got:
                break
            n, self._pos = n + got, self._pos + got
        if self._pos >= self._end:
            part = self._tail[self._pos - self._end : self._pos - self._end + len(view) - n]
            view[n : n + len(part)] = part
            n, self._pos = n + len(part), self._pos + len(part)
        return n


class RowFile:
    """A Parquet file whose footer is checked (see the module docstring), opened to read
    its row groups. ``rows``: the file's row count, from its footer. With ``boundaries``
    (its manifest's ``params.emit_boundaries``), the schema is the one with ``metadata.cu_seqlens``."""

    def __init__(self, path: Path, rows: int, row_tokens: int, boundaries: bool = False):
        self.path = Path(path)
        self.boundaries = boundaries
        opened = open_regular(self.path)
        if opened is None:
            raise self._refuse("not a file")
        self._file = opened
        try:
            self._open(rows, row_tokens)
        except BaseException:
            self._file.close()
            raise

    def __enter__(self) -> RowFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()

    def _refuse(self, problem: str) -> Refused:
        return Refused(f"{self.path}: {problem}")

    def _open(self, rows: int, row_tokens: int) -> None:
        f, self.row_tokens = self._file, row_tokens
        size = os.fstat(f.fileno()).st_size
        if size < 12:
            raise ValueError("not a Parquet file (too short)")
        f.seek(size - 8)
        tail = f.read(8)
        f.seek(0)
        if tail[4:] != MAGIC or f.read(4) != MAGIC:
            raise ValueError(f"not a Parquet file (no {MAGIC.decode()} at its start and end)")
        length = int.from_bytes(tail[:4], "little")
        limit = min(FOOTER_BYTES, FOOTER_BASE + FOOTER_PER_ROW * rows)
        if length > size - 12:
            raise ValueError(f"its footer's length ({length}) is more than the file holds")
        if length > limit:
            raise self._refuse(
                f"its footer is {length} bytes, more than the {limit} a file of {rows} rows needs; not read"
            )
        self._data_end = size - 8 - length
        f.seek(self._data_end)
        footer = f.read(length)
        self.arrow_schema = pq.read_schema(pa.BufferReader(MAGIC + footer + tail))
        if not self.arrow_schema.equals(schema(self.boundaries), check_metadata=False):
            raise SchemaDiffers(
                f"schema differs from the format's ({', '.join(f'{f.name!r}: {f.type}' for f in self.arrow_schema)})"
            )
        _, elements = _schema(footer)
        self._check_schema(elements)
        # The footer pyarrow reads: the mask's column without its UINT_8 annotation, so
        # its values read as the INT32s stored; bare (``bare_footer``).
        leaves = [n for n, e in enumerate(elements) if thrift.get(e, 5) is None]
        mask = leaves[_format_leaves(self.boundaries).index(MASK)]
        elements[mask] = [(f, k, v) for f, k, v in elements[mask] if f not in (6, 10)]
        spliced = bare_footer(footer, elements)
        source = _Spliced(f, self._data_end, spliced + len(spliced).to_bytes(4, "little") + MAGIC)
        self._parquet = pq.ParquetFile(source, buffer_size=1 << 20, pre_buffer=False, read_dictionary=list(STRINGS))
        self.metadata = self._parquet.metadata
        foreign = [key for key in self.metadata.metadata or {} if key != ARROW_SCHEMA]
        foreign += list(self.arrow_schema.metadata or {})  # (those stored inside ``ARROW:schema``)
        if foreign:  # (``datasets`` takes its features from a ``huggingface`` key, pandas its index from ``pandas``)
            shown = foreign[0].decode(errors="replace")
            raise SchemaDiffers(
                f"its key-value metadata holds {shown!r}, which a build does not write, but loaders read"
            )
        self.rows = self.metadata.num_rows
        self._firsts = self._check_groups(row_tokens)

    def _check_schema(self, elements: list) -> None:
        got, want = [_comparable(e) for e in elements], _format_elements(self.boundaries)
        names = _paths(want)
        for n, (here, there) in enumerate(zip(got[1:], want[1:]), 1):
            if here != there:
                said, wanted = _describe(here), _describe(there)
                if said == wanted:  # (a difference the description leaves out: the name, say)
                    said, wanted = _fields_apart(here, there)
                at = names[n]
                raise SchemaDiffers(f"its Parquet schema differs from the format's at {at} ({said}, not {wanted})")
        if len(got) != len(want):
            raise SchemaDiffers(f"its Parquet schema has {len(got)} elements, the format's {len(want)}")

    def _check_groups(self, row_tokens: int) -> list[int]:
        """The first row of each row group, once the footer's counts and sizes of every
        row group are what its rows need (else ``Refused``)."""
        meta, firsts, first = self.metadata, [], 0
        paths = _format_leaves(self.boundaries)
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            rows = group.num_rows
            if rows < 0:
                raise self._refuse(f"row group {g} has {rows} rows")
            if group.num_columns != len(paths):
                raise self._refuse(f"row group {g} has {group.num_columns} columns, the format {len(paths)}; not read")
            firsts.append(first)
            where = f"row group {g} (rows {first} to {first + rows - 1})"
            decoded = 0
            for j, path in enumerate(paths):
                chunk = group.column(j)
                at = f"row group {g}, column {_name(path)}"
                if chunk.file_path:
                    raise self._refuse(f"{at}: stored in another file ({chunk.file_path!r}); not read")
                if rows == 0 and chunk.num_values == 0:
                    continue  # (an empty row group: pyarrow writes one for an empty table, and reads nothing of it)
                start = _chunk_start(chunk)
                if not (4 <= start and 0 <= chunk.total_compressed_size <= self._data_end - start):
                    raise self._refuse(f"{at}: lies outside the file's data; not read")
                values = chunk.num_values
                if path in TOKENS or path in SEGMENTS or path == BOUNDARIES:
                    most = (rows + 1) * (row_tokens + (path == BOUNDARIES))
                    if values > most:
                        raise self._refuse(
                            f"{where} holds {values} {_name(path)} values, more "
                            f"than its {rows} rows of {row_tokens} tokens and one more row; not decoded"
                        )
                elif path == "metadata.row" and values != rows:
                    raise self._refuse(f"{where} holds {values} metadata.row values for {rows} rows; not decoded")
                if path in STRINGS:
                    decoded += values * 8 + chunk.total_uncompressed_size
                else:
                    if chunk.total_uncompressed_size > values * NUMERIC_CHUNK_BYTES + (1 << 20):
                        raise self._refuse(
                            f"{at}: {chunk.total_uncompressed_size} bytes uncompressed, more than "
                            f"its {values} values take; not decoded"
                        )
                    decoded += values * WIDTH.get(path, 8)
            if decoded > DECODE_BYTES:
                raise self._refuse(
                    f"{where} would take about {decoded >> 20} MiB decoded, more than the "
                    f"{DECODE_BYTES >> 20} MiB read at once (a build's row groups hold at most "
                    f"{GROUP_VALUES} tokens); not decoded"
                )
            first += rows
        if first != self.rows:
            raise self._refuse(f"its row groups hold {first} rows, its footer says {self.rows}; not decoded")
        return firsts

    def _check_pages(self, g: int, columns: list[int]) -> None:
        """Raise ``Refused`` unless the pages of row group ``g``'s ``columns`` are what the
        footer says (see the module docstring)."""
        group, paths = self.metadata.row_group(g), _format_leaves(self.boundaries)
        for j in columns:
            chunk, at = group.column(j), f"row group {g}, column {_name(paths[j])}"
            pos = start = _chunk_start(chunk)
            end = start + chunk.total_compressed_size
            values = uncompressed = 0
            while pos < end:
                header, size = self._page_header(pos, end, at)
                kind, raw, packed = (thrift.get(header, n) for n in (1, 2, 3))
                if not (
                    isinstance(raw, int)
                    and isinstance(packed, int)
                    and 0 <= raw <= PAGE_BYTES
                    and 0 <= packed <= PAGE_BYTES
                ):
                    raise self._refuse(
                        f"{at}: a page of {raw} bytes ({packed} compressed), more than the "
                        f"{PAGE_BYTES} a page may hold; not decoded"
                    )
                if kind == _DICTIONARY and pos != start:
                    raise self._refuse(f"{at}: a dictionary page after its first; not decoded")
                if kind in (_DATA, _DATA_V2):
                    page = thrift.get(header, 5 if kind == _DATA else 8) or []
                    count = thrift.get(page, 1)
                    values += count if isinstance(count, int) and count >= 0 else PAGE_BYTES
                uncompressed += size + raw
                pos += size + packed
            if pos != end:
                raise self._refuse(f"{at}: its pages run past its column chunk; not decoded")
            if values != chunk.num_values:
                raise self._refuse(
                    f"{at}: its pages hold {values} values, the footer says {chunk.num_values}; not decoded"
                )
            if uncompressed != chunk.total_uncompressed_size:
                raise self._refuse(
                    f"{at}: its pages take {uncompressed} bytes "
                    f"uncompressed, the footer says {chunk.total_uncompressed_size}; not decoded"
                )

    def _page_header(self, pos: int, end: int, at: str) -> tuple[list, int]:
        """The page header at ``pos`` (read by ``thrift``) and its size in bytes."""
        try:
            return thrift.read_struct(self._file, pos, end, HEADER_BYTES)
        except ValueError:
            raise self._refuse(f"{at}: a damaged page header; not decoded") from None

    def groups(self, columns: list[str], limit: int | None = None, only: np.ndarray | None = None) -> Iterator[Group]:
        """The row groups that hold rows before row ``limit`` (all when ``None``), and with
        ``only`` (sorted row numbers) just those that hold one of them, each with
        ``columns`` (leaf paths of the format's schema) decoded once its pages are checked."""
        paths = _format_leaves(self.boundaries)
        indices = [paths.index(c) for c in columns]
        for g, first in enumerate(self._firsts):
            if limit is not None and first >= limit:
                return
            if only is not None:
                end = first + self.metadata.row_group(g).num_rows
                if np.searchsorted(only, first) == np.searchsorted(only, end):  # none of them in [first, end)
                    continue
            self._check_pages(g, indices)
            table = self._parquet.read_row_group(g, columns=columns, use_threads=False)
            yield Group(g, first, table.num_rows, table)

    def group_of(self, row: int, columns: list[str]) -> Group:
        """The row group holding row ``row`` (``0 <= row < rows``) alone, with ``columns``
        decoded once its pages are checked (as ``groups``)."""
        if not 0 <= row < self.rows:
            raise IndexError(f"row {row} is not in the file's {self.rows} rows")
        g = int(np.searchsorted(self._firsts, row, side="right")) - 1
        while self.metadata.row_group(g).num_rows == 0:  # (an empty group starts where the next does)
            g += 1
        paths = _format_leaves(self.boundaries)
        self._check_pages(g, [paths.index(c) for c in columns])
        table = self._parquet.read_row_group(g, columns=columns, use_threads=False)
        return Group(g, self._firsts[g], table.num_rows, table)


def _name(path: str) -> str:
    """A leaf column's name as the format's schema spells it (``metadata.input_ids``)."""
    return path.replace(".list.element", "")


def _chunk_start(chunk: pq.ColumnChunkMetaData) -> int:
    if chunk.has_dictionary_page and chunk.dictionary_page_offset:
        return chunk.dictionary_page_offset
    return chunk.data_page_offset


def _paths(elements: tuple) -> list[str]:
    """Each schema element's path (the root's: empty)."""
    paths: list[str] = []
    stack: list[list] = []  # [path, children not yet seen] of the groups open
    for element in elements:
        fields = {f: v for f, _, v in element}
        while stack and stack[-1][1] == 0:
            stack.pop()
        parent = stack[-1][0] if stack else None
        if stack:
            stack[-1][1] -= 1
        name = fields.get(4, b"").decode(errors="replace")
        path = "" if parent is None else f"{parent}.{name}" if parent else name
        paths.append(path)
        if fields.get(5):
            stack.append([path, fields[5]])
    return paths


TYPES = ("BOOLEAN", "INT32", "INT64", "INT96", "FLOAT", "DOUBLE", "BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY")
REPETITIONS = ("required", "optional", "repeated")


def _describe(element: tuple) -> str:
    fields = {f: v for f, _, v in element}
    parts = [REPETITIONS[fields[3]] if fields.get(3) in range(3) else f"repetition {fields.get(3)}"]
    if 1 in fields:
        parts.append(TYPES[fields[1]] if fields[1] in range(len(TYPES)) else f"type {fields[1]}")
    if 5 in fields:
        parts.append(f"group of {fields[5]}")
    if 6 in fields:
        parts.append(f"converted type {fields[6]}")
    if 10 in fields:
        parts.append(f"logical type {_logical(fields[10])}")
    return " ".join(parts)


ELEMENT_FIELDS = {1: "type", 2: "type_length", 3: "repetition", 4: "name", 5: "num_children", 6: "converted_type"}
ELEMENT_FIELDS |= {7: "scale", 8: "precision", 10: "logical_type"}


def _fields_apart(here: tuple, there: tuple) -> tuple[str, str]:
    """The fields in which two schema elements differ, as each has them (``missing``: without it)."""
    a, b = ({f: v for f, _, v in e} for e in (here, there))
    apart = [f for f in sorted(a.keys() | b.keys()) if a.get(f) != b.get(f)]

    def shown(fields: dict, f: int) -> str:
        value = fields.get(f, "missing")
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        return f"{ELEMENT_FIELDS.get(f, f'field {f}')} {text!r}"

    return ", ".join(shown(a, f) for f in apart), ", ".join(shown(b, f) for f in apart)


def _logical(union: list) -> str:
    names = {
        1: "STRING",
        2: "MAP",
        3: "LIST",
        4: "ENUM",
        5: "DECIMAL",
        6: "DATE",
        7: "TIME",
        8: "TIMESTAMP",
        10: "INT",
        11: "NULL",
        12: "JSON",
        13: "BSON",
        14: "UUID",
        15: "FLOAT16",
    }
    if not union:
        return "none"
    field, _, value = union[0]
    if field == 10:  # IntType: bitWidth (1), isSigned (2)
        return f"INT({thrift.get(value, 1)}, {'signed' if thrift.get(value, 2) else 'unsigned'})"
    return names.get(field, f"#{field}")

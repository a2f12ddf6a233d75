"""A row as read -> its record: a dict, or the ``InvalidRow`` it is.

A JSONL line is parsed as strict JSON (an object that repeats a key is refused); a
Parquet row is taken as pyarrow gives it (a string that is not UTF-8 is refused), but for
values of Arrow's JSON type (``arrow.json``, which ``datasets`` writes for a field whose
type varies by row), each parsed as a JSONL line's values are, as ``datasets`` reads them. A row
whose data was dropped as it was read (over ``fixed_sft.bands.MAX_CONVERSATION_BYTES``) is
invalid, named by its id where it kept one.
"""

from __future__ import annotations

import codecs
import json
import sys
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from .bands import too_large
from .conversation import InvalidRow
from .fields import STRICT_JSON, DuplicateKey


def records(chunk: pa.Table) -> list[tuple[int, dict | InvalidRow]]:
    """``(row index, record)`` pairs of a chunk; a record is the row as a dict, or an
    ``InvalidRow`` when the row cannot even be decoded or its data was dropped as it was
    read (over ``MAX_CONVERSATION_BYTES``)."""
    indices = chunk.column("index").to_pylist()
    sizes = chunk.column("bytes").to_pylist()
    dropped = chunk.column("dropped").to_pylist()
    if "line" in chunk.column_names:
        column = chunk.column("line")
        lines = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()  # (one chunk: not copied)
        # large_binary: int64 offsets into one data buffer
        _, offsets, data = lines.buffers()
        offsets = np.frombuffer(offsets, np.int64)[lines.offset : lines.offset + len(lines) + 1].tolist()
        data = memoryview(data or b"")
        decoded = [
            InvalidRow(too_large(size)) if drop else _parse_json_line(data[a:b])
            for size, drop, a, b in zip(sizes, dropped, offsets, offsets[1:])
        ]
        return list(zip(indices, decoded))
    rows = chunk.drop_columns(["index", "bytes", "dropped"])
    try:
        decoded = rows.to_pylist()
    except (ValueError, OverflowError):  # a string that is not UTF-8, or a date Python has not: find the row(s)
        decoded = [_parquet_row(rows.slice(k, 1)) for k in range(len(indices))]
    paths = [(field.name, *path) for field in rows.schema for path in json_paths(field.type)]
    if paths:
        decoded = [_with_json_parsed(record, paths) for record in decoded]
    for k, (size, drop) in enumerate(zip(sizes, dropped)):
        if drop:
            record = decoded[k]
            row_id = record.get("id") if isinstance(record, dict) else None
            decoded[k] = InvalidRow(too_large(size), None if row_id is None else str(row_id))
    return list(zip(indices, decoded))


ITEMS = None  # a path's step into each item of a list


def json_paths(kind: pa.DataType) -> list[tuple[str | None, ...]]:
    """Where values of Arrow's JSON type lie in values of ``kind``: the paths to them, each
    a field name or ``ITEMS`` (every item of a list) per step.

    >>> json_paths(pa.list_(pa.struct([("role", pa.string()), ("content", pa.json_())])))
    [(None, 'content')]
    """
    if isinstance(kind, pa.BaseExtensionType):
        return [()] if kind.extension_name == "arrow.json" else json_paths(kind.storage_type)
    if pa.types.is_struct(kind):
        return [(kind.field(k).name, *path) for k in range(kind.num_fields) for path in json_paths(kind.field(k).type)]
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return [(ITEMS, *path) for path in json_paths(kind.value_type)]
    return []


def _with_json_parsed(record: dict | InvalidRow, paths: list[tuple[str | None, ...]]) -> dict | InvalidRow:
    """``record`` with the JSON text at each of ``paths`` parsed (a null stays null), or the
    ``InvalidRow`` a text that is not strict JSON makes it."""
    if isinstance(record, InvalidRow):
        return record
    try:
        for path in paths:
            _parse_at(record, path)
    except DuplicateKey as error:
        return InvalidRow(f"a JSON value repeats the key {error.key!r} in an object", _id_of(record))
    except (ValueError, RecursionError) as error:
        return InvalidRow(f"a JSON value is not readable JSON ({type(error).__name__})", _id_of(record))
    return record


def _parse_at(holder: Any, path: tuple[str | None, ...]) -> None:
    """Parse, in place, the JSON texts that ``path`` leads to from ``holder`` (a dict or a
    list, as ``to_pylist`` gives a struct or a list)."""
    step, rest = path[0], path[1:]
    keys: Iterable[Any] = range(len(holder)) if step is ITEMS else [step]
    for key in keys:
        value = holder[key]
        if value is None:
            continue
        if rest:
            _parse_at(value, rest)
        else:
            holder[key] = STRICT_JSON.decode(value)


def _id_of(record: dict) -> str | None:
    row_id = record.get("id")
    return None if row_id is None else str(row_id)


def _parquet_row(row: pa.Table) -> dict | InvalidRow:
    """One Parquet row's record, or the ``InvalidRow`` a string that is not UTF-8 makes it
    (such a ``source`` value counts as none: the source mix reads strings alone), or a
    value Python cannot hold (a date past year 9999, which is no JSON value either)."""
    try:
        return row.to_pylist()[0]
    except UnicodeDecodeError as error:
        if "source" in row.column_names:
            return _parquet_row(row.drop_columns(["source"]))
        return InvalidRow(f"invalid UTF-8 at byte {error.start} of a string", _row_id(row))
    except (OverflowError, ValueError) as error:
        return InvalidRow(
            f"holds a value out of Python's range ({type(error).__name__}), not a JSON value", _row_id(row)
        )


def _row_id(row: pa.Table) -> str | None:
    """A one-row table's id, where it has one that reads (else the bad value is the id)."""
    try:
        row_id = row.column("id")[0].as_py() if "id" in row.column_names else None
    except (OverflowError, ValueError):
        return None
    return None if row_id is None else str(row_id)


def _parse_json_line(line: memoryview) -> dict | InvalidRow:
    """A JSONL line's record, decoded straight from its Arrow bytes (a view: no Python
    ``bytes`` copy of the line), or the ``InvalidRow`` it is: not UTF-8, not JSON, not an
    object, or an object (at any depth) that repeats a key, which readers resolve
    differently (Python's json keeps the last value, pyarrow's reader refuses the line)."""
    try:
        text = codecs.utf_8_decode(line, "strict", True)[0]
    except UnicodeDecodeError as error:
        return InvalidRow(f"invalid UTF-8 at byte {error.start}")
    try:
        record = STRICT_JSON.decode(text)  # (the hook adds ~7%)
    except DuplicateKey as error:
        return InvalidRow(f"the JSON repeats the key {error.key!r} in an object")
    except json.JSONDecodeError as error:
        if not text.strip():
            return InvalidRow("a blank line, not JSON")
        return InvalidRow(f"not JSON ({error.msg} at char {error.pos})")
    except ValueError as error:  # e.g. an integer past Python's digit limit
        if "integer string conversion" in str(error):
            return InvalidRow(f"not readable JSON (an integer of more than {sys.get_int_max_str_digits()} digits)")
        return InvalidRow(f"not readable JSON ({error})")
    except RecursionError:
        return InvalidRow("JSON nested too deeply to read")
    return record if isinstance(record, dict) else InvalidRow("not a JSON object")

"""Thrift's compact protocol, which Parquet writes its footer and page headers in: read and
written back as nested values, so that a reader can check them before pyarrow decodes a page.

A struct reads as a list of ``(field id, type, value)``; a list or set as ``(element type,
[values])``; a map as ``(key type, value type, [(key, value)])``; a binary as ``bytes``; a
double as its 8 raw bytes; a bool as ``True``/``False``; other numbers as ``int``. Writing
such a value back gives the bytes it was read from (a field's id written as the delta from
the previous one where it fits, as every writer does). Reading stops at ``MAX_DEPTH`` levels
of nesting and raises ``ValueError`` for bytes that end early or hold an unknown type.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, BinaryIO

Value = Any  # an int, bool, bytes, a struct's field list or a container's tuple (module docstring)
Fields = list[tuple[int, int, Value]]

STOP, TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(13)
MAX_DEPTH = 32


class Reader:
    """Values read from ``data`` starting at ``pos``."""

    def __init__(self, data: bytes | memoryview, pos: int = 0):
        self.data = memoryview(data)
        self.pos = pos

    def _byte(self) -> int:
        if self.pos >= len(self.data):
            raise ValueError("Thrift value ends early")
        self.pos += 1
        return self.data[self.pos - 1]

    def varint(self) -> int:
        shift = result = 0
        while True:
            byte = self._byte()
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                return result
            shift += 7
            if shift > 63:
                raise ValueError("Thrift varint longer than 10 bytes")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def _bytes(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError("Thrift value ends early")
        self.pos += n
        return bytes(self.data[self.pos - n : self.pos])

    def value(self, kind: int, depth: int = 0) -> Value:
        if depth > MAX_DEPTH:
            raise ValueError(f"Thrift value nested more than {MAX_DEPTH} deep")
        if kind in (TRUE, FALSE):  # (a field's bool is in its type; an element's is a byte)
            return self._byte() == TRUE
        if kind == BYTE:
            return self._byte()
        if kind in (I16, I32, I64):
            return self.zigzag()
        if kind == DOUBLE:
            return self._bytes(8)
        if kind == BINARY:
            return self._bytes(self.varint())
        if kind in (LIST, SET):
            element, size = self.list_header()
            return element, [self.value(element, depth + 1) for _ in range(size)]
        if kind == MAP:
            size = self.varint()
            self._check_size(size)
            types = self._byte() if size else 0
            key, value = types >> 4, types & 0x0F
            return key, value, [(self.value(key, depth + 1), self.value(value, depth + 1)) for _ in range(size)]
        if kind == STRUCT:
            return self.struct(depth + 1)
        raise ValueError(f"unknown Thrift type {kind}")

    def list_header(self) -> tuple[int, int]:
        """A list's (or set's) element type and size, read from its header."""
        header = self._byte()
        size, element = header >> 4, header & 0x0F
        if size == 15:
            size = self.varint()
        self._check_size(size)
        return element, size

    def _check_size(self, size: int) -> None:
        if size > len(self.data) - self.pos:  # every element takes a byte at least
            raise ValueError("Thrift container larger than its bytes")

    def struct(self, depth: int = 0) -> Fields:
        fields: Fields = []
        last = 0
        while True:
            header = self._byte()
            kind = header & 0x0F
            if kind == STOP:
                return fields
            delta = header >> 4
            last = last + delta if delta else self.zigzag()
            value = (kind == TRUE) if kind in (TRUE, FALSE) else self.value(kind, depth)
            fields.append((last, kind, value))

    def spans(self) -> Iterator[tuple[int, int, int, int]]:
        """The fields of the struct that starts here, each skipped: ``(id, type, start,
        end)``, where ``start:end`` are its value's bytes (empty for a bool)."""
        last = 0
        while True:
            header = self._byte()
            kind = header & 0x0F
            if kind == STOP:
                return
            delta = header >> 4
            last = last + delta if delta else self.zigzag()
            start = self.pos
            if kind not in (TRUE, FALSE):
                self.skip(kind)
            yield last, kind, start, self.pos

    def skip(self, kind: int, depth: int = 0) -> None:
        """Read past a value of type ``kind`` without keeping it."""
        if depth > MAX_DEPTH:
            raise ValueError(f"Thrift value nested more than {MAX_DEPTH} deep")
        if kind in (TRUE, FALSE, BYTE):
            self._byte()
        elif kind in (I16, I32, I64):
            self.varint()
        elif kind in (DOUBLE, BINARY):
            n = 8 if kind == DOUBLE else self.varint()
            if self.pos + n > len(self.data):
                raise ValueError("Thrift value ends early")
            self.pos += n
        elif kind in (LIST, SET, MAP):
            kinds: tuple[int, ...]
            if kind == MAP:
                size = self.varint()
                types = self._byte() if size else 0
                kinds = (types >> 4, types & 0x0F)
            else:
                header = self._byte()
                size, kinds = header >> 4, (header & 0x0F,)
                if size == 15:
                    size = self.varint()
            self._check_size(size)
            for _ in range(size):
                for element in kinds:
                    self.skip(element, depth + 1)
        elif kind == STRUCT:
            while (header := self._byte()) & 0x0F != STOP:
                if not header >> 4:
                    self.zigzag()
                if header & 0x0F not in (TRUE, FALSE):
                    self.skip(header & 0x0F, depth + 1)
        else:
            raise ValueError(f"unknown Thrift type {kind}")


class Written(bytes):
    """A value written already (a struct by ``write_struct``, or a value's bytes as read):
    written again as these bytes."""


def write_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        if n < 0x80:
            out.append(n)
            return bytes(out)
        out.append((n & 0x7F) | 0x80)
        n >>= 7


def _zigzag(n: int) -> bytes:
    return write_varint((n << 1) ^ (n >> 63))


def write_value(kind: int, value: Value) -> bytes:
    if isinstance(value, Written):
        return bytes(value)
    if kind in (TRUE, FALSE):
        return bytes([TRUE if value else FALSE])
    if kind == BYTE:
        return bytes([value])
    if kind in (I16, I32, I64):
        return _zigzag(value)
    if kind == DOUBLE:
        return bytes(value)
    if kind == BINARY:
        return write_varint(len(value)) + bytes(value)
    if kind in (LIST, SET):
        element, items = value
        header = (
            bytes([len(items) << 4 | element])
            if len(items) < 15
            else bytes([0xF0 | element]) + write_varint(len(items))
        )
        return header + b"".join(write_value(element, item) for item in items)
    if kind == MAP:
        key, val, items = value
        if not items:
            return write_varint(0)
        return (
            write_varint(len(items))
            + bytes([key << 4 | val])
            + b"".join(write_value(key, k) + write_value(val, v) for k, v in items)
        )
    if kind == STRUCT:
        return write_struct(value)
    raise ValueError(f"unknown Thrift type {kind}")


def write_struct(fields: Fields) -> bytes:
    out, last = bytearray(), 0
    for field, kind, value in fields:
        if kind in (TRUE, FALSE):
            kind = TRUE if value else FALSE
        delta = field - last
        out += bytes([delta << 4 | kind]) if 0 < delta <= 15 else bytes([kind]) + _zigzag(field)
        if kind not in (TRUE, FALSE):
            out += write_value(kind, value)
        last = field
    return bytes(out + b"\x00")


def get(fields: Fields, field: int, default: Value = None) -> Value:
    """The value of ``field`` in a struct read by ``Reader.struct``, or ``default``."""
    return next((value for number, _, value in fields if number == field), default)


def read_struct(f: BinaryIO, pos: int, end: int, most: int) -> tuple[Fields, int]:
    """The struct at ``pos`` of ``f`` (as ``Reader.struct``) and its size in bytes, reading
    at most ``most`` bytes and never past ``end``; ``ValueError`` when it is damaged or
    larger. Reads start small and grow, as a page header is usually a few dozen bytes."""
    window = 4096
    while True:
        f.seek(pos)
        data = f.read(min(window, end - pos))
        reader = Reader(data)
        try:
            return reader.struct(), reader.pos
        except ValueError:
            if len(data) == min(window, end - pos) and window < most and len(data) < end - pos:
                window = min(window * 16, most)
                continue
            raise

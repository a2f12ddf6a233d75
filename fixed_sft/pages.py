"""The sizes of a Parquet column chunk's pages, read from their headers.

A Parquet reader decompresses and decodes a whole page before it gives any value from
it, and a page holds at least one value: pyarrow's writer starts a new page only between
write batches (1,024 values by default), so a file of large conversations can hold pages
of hundreds of MB whatever batch size the reader asks for. The page sizes are not in the
file's footer; each page starts with a header (Thrift compact protocol) whose fields 2
and 3 are the page's uncompressed and compressed sizes, and the next page follows its
compressed bytes. ``page_sizes`` walks those headers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

_I32 = 5
_STRUCT = 12


class _Compact:
    """Reads values of the Thrift compact protocol from a binary file."""

    def __init__(self, f: BinaryIO):
        self.f = f

    def byte(self) -> int:
        b = self.f.read(1)
        if not b:
            raise ValueError("the page header ends early")
        return b[0]

    def varint(self) -> int:
        value = shift = 0
        while True:
            b = self.byte()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise ValueError("a varint of more than 64 bits")

    def zigzag(self) -> int:
        value = self.varint()
        return (value >> 1) ^ -(value & 1)

    def struct(self, depth: int = 0) -> dict[int, int]:
        """A struct's i32 fields by id; fields of other types are read past."""
        if depth > 16:
            raise ValueError("structs nested too deeply")
        fields: dict[int, int] = {}
        field = 0
        while head := self.byte():
            kind, delta = head & 0x0F, head >> 4
            field = field + delta if delta else self.zigzag()
            if kind == _I32:
                fields[field] = self.zigzag()
            else:
                self.skip(kind, depth)
        return fields

    def skip(self, kind: int, depth: int, element: bool = False) -> None:
        """Read past a value of type ``kind`` (a bool is in its field header, except as a
        list element)."""
        if kind in (1, 2):
            if element:
                self.byte()
        elif kind == 3:
            self.byte()
        elif kind in (4, 5, 6):
            self.varint()
        elif kind == 7:
            self.f.seek(8, 1)
        elif kind == 8:
            self.f.seek(self.varint(), 1)
        elif kind in (9, 10):
            head = self.byte()
            size = head >> 4 if head >> 4 != 15 else self.varint()
            for _ in range(size):
                self.skip(head & 0x0F, depth, element=True)
        elif kind == 11:
            size = self.varint()
            if size:
                types = self.byte()
                for _ in range(size):
                    self.skip(types >> 4, depth, element=True)
                    self.skip(types & 0x0F, depth, element=True)
        elif kind == _STRUCT:
            self.struct(depth + 1)
        else:
            raise ValueError(f"unknown Thrift type {kind}")


def page_sizes(f: BinaryIO, start: int, length: int) -> Iterator[tuple[int, int, int]]:
    """``(header bytes, uncompressed bytes, compressed bytes)`` of each page of the column
    chunk whose pages (dictionary page first) fill ``length`` bytes of ``f`` from
    ``start``; ``ValueError`` for a header that cannot be read."""
    reader = _Compact(f)
    position, end = start, start + length
    while position < end:
        f.seek(position)
        header = reader.struct()
        uncompressed, compressed = header.get(2), header.get(3)
        if uncompressed is None or compressed is None or uncompressed < 0 or compressed < 0:
            raise ValueError("a page header without its sizes")
        yield f.tell() - position, uncompressed, compressed
        position = f.tell() + compressed


def largest_page(f: BinaryIO, start: int, length: int) -> int | None:
    """The largest uncompressed page of that column chunk (``page_sizes``); ``None`` when
    a header cannot be read (the Parquet reader then reports the damage itself)."""
    try:
        return max((size for _, size, _ in page_sizes(f, start, length)), default=0)
    except (ValueError, OSError):
        return None

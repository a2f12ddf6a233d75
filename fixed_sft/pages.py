"""The sizes of a Parquet column chunk's pages, read from their headers.

A Parquet reader decompresses and decodes a whole page before it gives any value from
it, and a page holds at least one value: pyarrow's writer starts a new page only between
write batches (1,024 values by default), so a file of large conversations can hold pages
of hundreds of MB whatever batch size the reader asks for. The page sizes are not in the
file's footer; each page starts with a header (Thrift compact protocol) whose fields 2
and 3 are the page's uncompressed and compressed sizes, and the next page follows its
compressed bytes. ``page_sizes`` walks those headers, each read by ``thrift`` (bounded:
a header that claims more elements than its bytes hold, or nests too deep, is damage).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

from . import thrift

HEADER_BYTES = 1 << 20  # the largest page header read (a header is usually a few dozen bytes)


def page_sizes(f: BinaryIO, start: int, length: int) -> Iterator[tuple[int, int, int]]:
    """``(header bytes, uncompressed bytes, compressed bytes)`` of each page of the column
    chunk whose pages (dictionary page first) fill ``length`` bytes of ``f`` from
    ``start``; ``ValueError`` for a header that cannot be read."""
    position, end = start, start + length
    while position < end:
        header, size = thrift.read_struct(f, position, end, HEADER_BYTES)
        uncompressed, compressed = thrift.get(header, 2), thrift.get(header, 3)
        if not (isinstance(uncompressed, int) and isinstance(compressed, int) and uncompressed >= 0 <= compressed):
            raise ValueError("a page header without its sizes")
        yield size, uncompressed, compressed
        position += size + compressed


def largest_page(f: BinaryIO, start: int, length: int) -> int | None:
    """The largest uncompressed page of that column chunk (``page_sizes``); ``None`` when
    a header cannot be read (the Parquet reader then reports the damage itself)."""
    try:
        return max((size for _, size, _ in page_sizes(f, start, length)), default=0)
    except (ValueError, OSError):
        return None

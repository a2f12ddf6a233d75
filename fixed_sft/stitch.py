"""Parquet files of whole row groups -> one Parquet file, joined by their bytes.

A Parquet file is ``PAR1``, its column chunks, then its footer (a Thrift ``FileMetaData``),
the footer's length and ``PAR1``. Pages hold no file offsets; the footer does (each column
chunk's page offsets, each row group's ``file_offset`` and ``ordinal``). Joining parts
copies each part's column chunks after the last, shifts their offsets by where they land,
and writes the first part's footer with every part's row groups and the total row count.
Parts written by one ``pyarrow`` writer with the same settings and schema, whole row
groups each, so join into the bytes that writer gives when it writes the row groups into
one file (``tests/test_stitch.py``).
"""

from __future__ import annotations

import errno
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from . import thrift
from .hashes import AppendedHash
from .thrift import Fields

MAGIC = b"PAR1"
# FileMetaData: 3 num_rows, 4 row_groups. RowGroup: 1 columns, 5 file_offset, 7 ordinal.
# ColumnChunk: 2 file_offset (deprecated: recent pyarrow writes 0, which stays 0; older wrote an
# offset), 3 meta_data, 4 offset_index_offset, 6 column_index_offset. ColumnMetaData: 9
# data_page_offset, 10 index_page_offset, 11 dictionary_page_offset, 14 bloom_filter_offset.
CHUNK_OFFSETS = {2, 4, 6}
COLUMN_OFFSETS = {9, 10, 11, 14}
MAX_FOOTER = 64 << 20
WAITING_PARTS = 4  # parts handed to the stitcher's thread and not yet known joined, at most
COPY_UNSUPPORTED = {errno.ENOSYS, errno.EXDEV, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF}


def footer_bytes(path: Path) -> tuple[bytes, int]:
    """A Parquet file's footer (its Thrift ``FileMetaData``, as stored) and where it starts;
    ``ValueError`` where the file has none."""
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(max(0, size - 8))
        tail = f.read(8)
        length = int.from_bytes(tail[:4], "little")
        if size < 12 or tail[4:] != MAGIC or not 0 < length <= min(MAX_FOOTER, size - 12):
            raise ValueError("not a Parquet file")
        start = size - 8 - length
        f.seek(start)
        return f.read(length), start


def footer(path: Path) -> tuple[Fields, int]:
    """A Parquet file's ``FileMetaData`` and where it starts."""
    try:
        data, start = footer_bytes(path)
    except ValueError:
        raise ValueError(f"{path}: not a Parquet file") from None
    return thrift.Reader(data).struct(), start


def _shifted(fields: Fields, offsets: set[int], delta: int) -> Fields:
    """``fields`` with the nonzero offsets among ``offsets`` moved ``delta`` bytes later."""
    return [(field, kind, value + delta if field in offsets and value else value) for field, kind, value in fields]


def _row_group(fields: Fields, delta: int, ordinal: int) -> Fields:
    """A row group's metadata moved ``delta`` bytes later in the file, as row group ``ordinal``."""
    moved: Fields = []
    for field, kind, value in fields:
        if field == 1:  # its column chunks
            element, chunks = value
            value = (
                element,
                [
                    [
                        (f, k, _shifted(v, COLUMN_OFFSETS, delta) if f == 3 else v)
                        for f, k, v in _shifted(chunk, CHUNK_OFFSETS, delta)
                    ]
                    for chunk in chunks
                ],
            )
        elif field == 5:
            value += delta
        elif field == 7:
            value = ordinal
        moved.append((field, kind, value))
    return moved


def _copy_part(part: Path, target: int, offset: int, size: int) -> None:
    """Copy ``size`` bytes of ``part`` from after its magic to byte ``offset`` of the open file
    ``target`` (in the kernel where the file system can, else through this process), then
    remove the part."""
    with part.open("rb") as f:
        source, position = f.fileno(), len(MAGIC)
        try:
            while size > 0:
                copied = os.copy_file_range(source, target, size, position, offset)
                if copied == 0:
                    break
                size, position, offset = size - copied, position + copied, offset + copied
        except (AttributeError, OSError) as error:  # (no copy_file_range, or not between these files)
            if isinstance(error, OSError) and error.errno not in COPY_UNSUPPORTED:
                raise
        while size > 0:
            data = os.pread(source, min(size, 1 << 20), position)
            if not data:
                raise ValueError(f"{part}: ended early")
            view = memoryview(data)
            while view:
                written = os.pwrite(target, view, offset)
                view, offset = view[written:], offset + written
            size, position = size - len(data), position + len(data)
    part.unlink()


class Stitcher:
    """Appends Parquet parts to ``path`` in order (``append``); ``close`` writes the footer.
    A thread of its own joins the parts in order, one at a time: it copies a part's column
    chunks to where the last part's end (the kernel copies, without the GIL), removes the
    part and hashes the file up to there. At most ``WAITING_PARTS`` parts wait for it."""

    def __init__(self, path: Path):
        self.path = path
        self._file = path.open("wb")
        self._file.write(MAGIC)
        self._file.flush()
        self._end = len(MAGIC)  # where the next part's column chunks land
        self._hash = AppendedHash(path)
        self._joining = ThreadPoolExecutor(1, thread_name_prefix="stitch")
        self._waiting: deque[Future] = deque()  # the parts handed to the thread, not yet known joined
        self.sha256: str | None = None  # the file's, once closed
        self._first: Fields | None = None
        self._groups: list[thrift.Written] = []
        self._rows = 0

    def append(self, part: Path, found: tuple[Fields, int] | None = None) -> None:
        """Have ``part``'s column chunks copied to the end of the file, and the part then
        removed; keep its row groups. ``found``: its ``footer``, where the process that
        wrote it has read it already. A part that could not be joined is raised here, by
        an append soon after it, or by ``close``."""
        meta, start = footer(part) if found is None else found
        delta = self._end - len(MAGIC)
        for group in thrift.get(meta, 4, (thrift.STRUCT, []))[1]:
            # (written now, while the workers write the next parts, rather than in ``close``)
            self._groups.append(thrift.Written(thrift.write_struct(_row_group(group, delta, len(self._groups)))))
        self._rows += thrift.get(meta, 3, 0)
        self._first = self._first or meta
        size = start - len(MAGIC)
        self._waiting.append(self._joining.submit(self._join, part, self._end, size))
        self._end += size
        while len(self._waiting) > WAITING_PARTS:
            self._waiting.popleft().result()

    def _join(self, part: Path, offset: int, size: int) -> None:
        """Copy ``part`` to ``offset`` (where the parts before it end), remove it, and hash
        the file up to its end."""
        _copy_part(part, self._file.fileno(), offset, size)
        self._hash.update(offset + size)

    def close(self) -> None:
        """Write the joined footer, and flush the file to disk (at least one part was appended)."""
        assert self._first is not None
        while self._waiting:
            self._waiting.popleft().result()
        self._joining.shutdown()
        meta = [
            (field, kind, self._rows if field == 3 else (thrift.STRUCT, self._groups) if field == 4 else value)
            for field, kind, value in self._first
        ]
        data = thrift.write_struct(meta)
        self._file.seek(self._end)
        self._file.write(data + len(data).to_bytes(4, "little") + MAGIC)
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self.sha256 = self._hash.hexdigest()

    def abort(self) -> None:
        """Close the file, incomplete (the build discards it), once the part being joined is."""
        self._joining.shutdown(cancel_futures=True)
        self._file.close()

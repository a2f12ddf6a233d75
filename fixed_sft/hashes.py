"""SHA-256 of files and of row content.

Row hash: ``sha256(ids as int32 little-endian bytes || mask as uint8 bytes)``; in a build
with boundaries (``fixed-sft/3``), ``sha256(ids as int32 LE || mask as uint8 || cu_seqlens as
int32 LE)``, where ``cu_seqlens`` is 0 then the end of each segment in the row (``boundaries``).
The ids and mask are ``row_tokens`` values each, so the boundaries' bytes are the rest.
``rows_sha256``: ``sha256`` of the concatenated 32-byte row digests, in row order.
Both depend on the row content alone, not on how Parquet encodes it.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import io
import json
import os
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

STALE_SECONDS = 24 * 3600  # a temporary file this old is a killed writer's (``write_checked_json``)


def row_digest(ids: np.ndarray, mask: np.ndarray, cu_seqlens: np.ndarray | None = None) -> bytes:
    """The 32-byte row hash: sha256 of int32-LE ids followed by uint8 mask, and then, for a
    build with boundaries, by its int32-LE ``cu_seqlens``."""
    digest = hashlib.sha256(np.ascontiguousarray(ids, dtype="<i4").data)
    digest.update(np.ascontiguousarray(mask, dtype=np.uint8).data)
    if cu_seqlens is not None:
        digest.update(np.ascontiguousarray(cu_seqlens, dtype="<i4").data)
    return digest.digest()


def boundaries(lengths: np.ndarray | list[int]) -> np.ndarray:
    """A row's ``cu_seqlens`` from its segments' lengths (``end - start``, in order): 0, then
    the end of each segment in the row, so the last is the row's length (int32)."""
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int32)


def rows_digest(row_digests: list[bytes]) -> str:
    """``rows_sha256``: sha256 over the row digests in order."""
    return hashlib.sha256(b"".join(row_digests)).hexdigest()


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    with Path(path).open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_checked_json(path: Path, body: object) -> None:
    """Keep ``body`` (JSON) at ``path`` with the sha256 of its canonical text (``read_checked_json``),
    written whole under a temporary name, then renamed; a file that cannot be written is left out.
    A temporary name beside it a day old is a killed writer's: removed."""
    document = {"body": body, "sha256": _json_digest(body)}
    draft: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_drafts(path.parent)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=".tmp-", delete=False) as f:
            draft = Path(f.name)
            json.dump(document, f)
        os.replace(draft, path)
    except OSError:
        if draft is not None:
            draft.unlink(missing_ok=True)


def _remove_stale_drafts(folder: Path) -> None:
    """Remove the temporary files (``.tmp-``) in ``folder`` last written ``STALE_SECONDS`` ago or more."""
    now = time.time()
    for entry in os.scandir(folder):
        if entry.name.startswith(".tmp-"):
            with contextlib.suppress(OSError):  # (gone, or another's to keep)
                if now - entry.stat(follow_symlinks=False).st_mtime >= STALE_SECONDS:
                    os.unlink(entry.path)


def open_regular(path: Path, follow_links: bool = True) -> io.BufferedReader | None:
    """``path`` opened to read where it is a regular file (``follow_links``: or a link to
    one), else ``None``. It is opened without blocking: a plain ``open`` of a FIFO waits for
    a writer forever."""
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow_links else getattr(os, "O_NOFOLLOW", 0))
    fd = os.open(path, flags)  # (reads of a regular file ignore O_NONBLOCK)
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    if not regular:  # (before ``fdopen``, which refuses a folder naming its descriptor, not the path)
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def read_checked_json(path: Path) -> object:
    """The body ``write_checked_json`` kept at ``path``; ``None`` where there is no such file,
    or its body does not match its sha256.

    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = Path(folder) / "kept.json"
    ...     write_checked_json(path, {"ids": [1, 2]})
    ...     kept = read_checked_json(path)
    ...     _ = path.write_text(path.read_text().replace("2]", "3]"))
    ...     kept, read_checked_json(path)
    ({'ids': [1, 2]}, None)
    """
    try:
        opened = open_regular(path)  # (a FIFO put in its place would block the build)
        if opened is None:
            return None
        with opened:
            document = json.loads(opened.read())
        body = document["body"]
        return body if document["sha256"] == _json_digest(body) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _json_digest(body: object) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _sync_file_range() -> Any:
    """Linux's ``sync_file_range`` from the C library, or ``None`` where there is none."""
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError, TypeError):  # (no such function; no C library to open)
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_SYNC_FILE_RANGE = _sync_file_range()
SYNC_FILE_RANGE_WRITE = 2  # start writing the range's dirty pages to disk, without waiting for them


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Have the system start writing ``length`` bytes of the file ``fd`` from ``offset`` to
    disk, and return at once, so that a later ``fsync`` waits for little (on Linux; a no-op
    elsewhere, and where the call fails: the ``fsync`` still makes the bytes durable)."""
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, offset, length, SYNC_FILE_RANGE_WRITE)


class AppendedHash:
    """The sha256 of a file that its writer only appends to, hashed as it grows: ``update``
    hashes the bytes written since the last call (read back while the system still holds
    them) and starts their writeback to disk (``start_writeback``: the writer's closing
    ``fsync`` then waits for little), ``hexdigest`` the rest, so the finished file is not
    read again.

    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile() as f:
    ...     hashed = AppendedHash(Path(f.name))
    ...     _ = f.write(b"row groups"); f.flush(); hashed.update()
    ...     _ = f.write(b", then a footer"); f.flush(); hashed.update(until=4)  # (hashed already)
    ...     hashed.size, hashed.hexdigest() == sha256_file(Path(f.name)) and hashed.size == 25
    (10, True)
    """

    def __init__(self, path: Path):
        self.path = path
        self.size = 0
        self._digest = hashlib.sha256()

    def update(self, until: int | None = None) -> None:
        """Hash what the file holds past what was hashed (up to byte ``until``, where given)."""
        if until is not None and until <= self.size:
            return
        with self.path.open("rb") as f:
            f.seek(start := self.size)
            while block := f.read(1 << 22 if until is None else min(1 << 22, until - self.size)):
                self._digest.update(block)
                self.size += len(block)
            if self.size > start:
                start_writeback(f.fileno(), start, self.size - start)

    def hexdigest(self) -> str:
        """The whole file's hex sha256."""
        self.update()
        return self._digest.hexdigest()

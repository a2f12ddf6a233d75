"""SHA-256 of files and of row content.

Row hash: ``sha256(ids as int32 little-endian bytes || mask as uint8 bytes)``.
``rows_sha256``: ``sha256`` of the concatenated 32-byte row digests, in row order.
Both depend on the row content alone, not on how Parquet encodes it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np


def row_digest(ids: np.ndarray, mask: np.ndarray) -> bytes:
    """The 32-byte row hash: sha256 of int32-LE ids followed by uint8 mask."""
    digest = hashlib.sha256(np.ascontiguousarray(ids, dtype="<i4").data)
    digest.update(np.ascontiguousarray(mask, dtype=np.uint8).data)
    return digest.digest()


def rows_digest(row_digests: list[bytes]) -> str:
    """``rows_sha256``: sha256 over the row digests in order."""
    return hashlib.sha256(b"".join(row_digests)).hexdigest()


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    with Path(path).open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()

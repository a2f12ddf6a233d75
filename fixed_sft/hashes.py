"""SHA-256 of files and of row content, and the Hugging Face cache's own file digests.

Row hash: ``sha256(ids as int32 little-endian bytes || mask as uint8 bytes)``.
``rows_sha256``: ``sha256`` of the concatenated 32-byte row digests, in row order.
Both depend on the row content alone, not on how Parquet encodes it.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Sequence

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


def cached_blob(path: Path) -> Path | None:
    """The blob a file of the Hugging Face cache holds its bytes in, or ``None`` for a file
    outside the cache: a snapshot file ``REPO/snapshots/COMMIT/NAME`` links to
    ``REPO/blobs/ETAG`` (itself maybe a link into a store shared by repos)."""
    path = Path(path)
    snapshots = next((folder for folder in path.parents if folder.name == "snapshots"), None)
    if snapshots is None or not path.is_symlink():
        return None
    blob = Path(os.path.normpath(path.parent / os.readlink(path)))
    return blob if blob.parent.resolve() == (snapshots.parent / "blobs").resolve() else None


def cache_damage(path: Path, sha256: str) -> str | None:
    """How a file of the Hugging Face cache whose sha256 is ``sha256`` differs from what
    the Hub says it holds, or ``None`` (also for a file outside the cache). The etag that
    names its blob is the file's sha256 when Git LFS stores it, else its Git blob sha1."""
    blob = cached_blob(path)
    if blob is None:
        return None
    if re.fullmatch("[0-9a-f]{64}", blob.name):
        found = sha256
    elif re.fullmatch("[0-9a-f]{40}", blob.name):
        from huggingface_hub.utils.sha import git_hash

        found = git_hash(blob.read_bytes())  # the Hub keeps files over 10 MB in LFS, so this one is small
    else:
        return None
    if found == blob.name:
        return None
    stored = blob.resolve()
    delete = f"{blob} and {stored}" if stored != blob else f"{blob}"
    return (f"{path} is damaged in the Hugging Face cache: the Hub's digest of it is {blob.name}, its bytes give "
            f"{found}; delete {delete} and run again to download it anew")


def first_cache_damage(paths: Sequence[Path], sha256s: Sequence[str] | None = None) -> str | None:
    """``cache_damage`` of the first damaged file among ``paths`` that the cache holds;
    their sha256s are ``sha256s``, or are computed (for an error that damage may explain)."""
    for k, path in enumerate(paths):
        if cached_blob(path) is not None:
            damage = cache_damage(path, sha256_file(path) if sha256s is None else sha256s[k])
            if damage:
                return damage
    return None

"""Hugging Face Hub access: files at a revision, through the Hub's cache, and damage in that cache.

Files come from huggingface_hub at a pinned revision, into its cache (``HF_HUB_OFFLINE``
reads the cache alone). The cache names each file's blob by the Hub's digest of the file:
its sha256 when Git LFS stores it, else its Git blob sha1. A cached file whose bytes give
another digest is damaged, and is named with the blob to delete.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from .hashes import sha256_file


class HubUnreachable(Exception):
    """Neither the Hub nor its cache can give the files asked for (the message says which)."""


def is_hub_id(name: str) -> bool:
    """Whether ``name`` not found locally reads as a Hub id (``owner/name``) rather than a path."""
    return "/" in name and not name.startswith((".", "/"))


@contextmanager
def offline() -> Iterator[None]:
    """huggingface_hub serves files from its cache alone meanwhile, as with ``HF_HUB_OFFLINE=1``."""
    from huggingface_hub import constants

    before = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before


def download_dataset(repo_id: str, revision: str, patterns: Sequence[str]) -> tuple[Path, str]:
    """The snapshot folder of a Hub dataset's files that match ``patterns`` at ``revision``,
    and the commit it holds (cached; honours HF_HUB_OFFLINE)."""
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(repo_id, repo_type="dataset", revision=revision, allow_patterns=list(patterns)))
    except Exception as error:  # network, offline mode, missing revision: all end the same way
        raise _unreachable("dataset", repo_id, revision, error) from None
    return folder, snapshot_commit(folder, revision)


def download_files(what: str, repo_id: str, revision: str, names: Sequence[str]) -> tuple[Path, str]:
    """The folder of a Hub model repo's files ``names`` at ``revision``, and the commit it
    resolved to (cached; honours HF_HUB_OFFLINE); ``what`` names the files in an error."""
    from huggingface_hub import hf_hub_download

    paths: list[Path] = []
    try:
        for name in names:
            paths.append(Path(hf_hub_download(repo_id, name, revision=revision)))
    except Exception as error:  # network, offline mode, missing revision: all end the same way
        raise _unreachable(what, repo_id, revision, error, names[len(paths)]) from None
    return paths[0].parent, snapshot_commit(paths[0].parent, revision)


def download_present(
    what: str, repo_id: str, revision: str, required: Sequence[str], optional: Sequence[str]
) -> tuple[Path, str, list[str]]:
    """``download_files`` of ``required`` and of those of ``optional`` that the repo has at
    ``revision``: the folder, the commit and the names of the files it holds. Offline, an
    optional file counts as absent only where the cache knows the Hub lacks it."""
    from huggingface_hub import _CACHED_NO_EXIST, hf_hub_download, try_to_load_from_cache
    from huggingface_hub.errors import LocalEntryNotFoundError, RemoteEntryNotFoundError

    paths: dict[str, Path] = {}
    name = None
    try:
        for name in (*required, *optional):
            try:
                path = Path(hf_hub_download(repo_id, name, revision=revision))
            except RemoteEntryNotFoundError:
                if name in required:
                    raise
                continue
            except LocalEntryNotFoundError:
                if name in required or try_to_load_from_cache(repo_id, name, revision=revision) is not _CACHED_NO_EXIST:
                    raise
                continue
            if path.is_file():
                paths[name] = path
    except Exception as error:  # network, offline mode, missing revision: all end the same way
        raise _unreachable(what, repo_id, revision, error, name) from None
    if not paths:
        raise HubUnreachable(f"{what} {repo_id}@{revision} has none of {', '.join((*required, *optional))}")
    folder = next(iter(paths.values())).parent
    return folder, snapshot_commit(folder, revision), list(paths)


def download_folder(what: str, repo_id: str, revision: str, folder: str, suffix: str) -> list[str]:
    """``download_present`` of the files in ``folder`` of a Hub model repo at ``revision``
    whose names end with ``suffix``, as the Hub lists the repo's files (the names,
    ``folder/NAME``). Where the Hub cannot list them (offline, or unreachable: one request,
    not retried), none are fetched, with a warning: the cache's copies, if any, are what
    a build finds, as ``AutoTokenizer`` finds them."""
    from huggingface_hub import model_info
    from huggingface_hub.errors import HTTPError

    try:
        listed = [
            sibling.rfilename for sibling in model_info(repo_id, revision=revision, expand=["siblings"]).siblings or []
        ]
    except (HTTPError, OSError, ValueError) as error:  # (offline mode is an OSError; a page not JSON, a ValueError)
        print(
            f"warning: cannot list the {what} of {repo_id}@{revision} ({type(error).__name__}): those cached are used",
            file=sys.stderr,
        )
        return []
    names = sorted(name for name in listed if name.startswith(f"{folder}/") and name.endswith(suffix))
    return download_present(what, repo_id, revision, names, ())[2] if names else []


def _unreachable(what: str, repo_id: str, revision: str, error: Exception, name: str | None = None) -> HubUnreachable:
    """The one-line error for files the Hub and its cache cannot give (huggingface_hub's
    own message, which spans lines, joined into one; for a file neither has, a short one),
    naming the file ``name`` it failed at.

    >>> str(_unreachable("dataset", "o/n", "main", OSError("no network\\nPlease check")))
    'cannot get dataset o/n@main from the Hugging Face Hub or its cache (OSError: no network Please check)'
    >>> str(_unreachable("tokenizer", "o/n", "main", OSError("offline"), "tokenizer.json"))
    'cannot get tokenizer o/n@main from the Hugging Face Hub or its cache (tokenizer.json: OSError: offline)'
    >>> from huggingface_hub.errors import LocalEntryNotFoundError
    >>> str(_unreachable("tokenizer", "o/n", "main", LocalEntryNotFoundError("An error ... long"), "a.model"))[-56:]
    '(a.model: not in the cache, and the Hub was not reached)'
    >>> missing = LocalEntryNotFoundError("An error ... long")
    >>> missing.__cause__ = OSError("offline mode is enabled")
    >>> str(_unreachable("tokenizer", "o/n", "main", missing, "a.model"))[-65:]
    '(a.model: not in the cache, and OSError: offline mode is enabled)'
    """
    from huggingface_hub.errors import LocalEntryNotFoundError

    said = " ".join(str(error).split())
    if isinstance(error, LocalEntryNotFoundError):  # (its text: a paragraph on checking the connection)
        cause = error.__cause__  # (why the Hub gave none: offline, unreachable, or its answer)
        said = f"{type(cause).__name__}: {' '.join(str(cause).split())}" if cause else "the Hub was not reached"
        return HubUnreachable(
            f"cannot get {what} {repo_id}@{revision} from the Hugging Face Hub or its cache "
            f"({f'{name}: ' if name else ''}not in the cache, and {said})"
        )
    return HubUnreachable(
        f"cannot get {what} {repo_id}@{revision} from the Hugging Face Hub or its cache "
        f"({f'{name}: ' if name else ''}{type(error).__name__}: {said})"
    )


def snapshot_commit(folder: Path, revision: str) -> str:
    """The commit a Hub cache snapshot (``.../snapshots/COMMIT``) holds, whichever
    ``revision`` (branch, tag or commit) found it; else ``revision``."""
    from huggingface_hub.file_download import REGEX_COMMIT_HASH

    is_commit = folder.parent.name == "snapshots" and REGEX_COMMIT_HASH.fullmatch(folder.name)
    return folder.name if is_commit else revision


def cached_blob(path: Path) -> Path | None:
    """The blob a file of the Hugging Face cache holds its bytes in, or ``None`` for a file
    outside the cache: a snapshot file ``REPO/snapshots/COMMIT/NAME`` links to
    ``REPO/blobs/ETAG`` (itself maybe a link into a store shared by repos). (huggingface_hub's
    ``scan_cache_dir`` finds the same blob, one link followed, but it scans the whole cache,
    and leaves out a repo in which any link is broken.)"""
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
    from huggingface_hub.file_download import REGEX_COMMIT_HASH, REGEX_SHA256
    from huggingface_hub.utils.sha import git_hash

    if REGEX_SHA256.fullmatch(blob.name):
        found = sha256
    elif REGEX_COMMIT_HASH.fullmatch(blob.name):  # (a Git object id, as a commit's)
        found = git_hash(blob.read_bytes())  # the Hub keeps files over 10 MB in LFS, so this one is small
    else:
        return None
    if found == blob.name:
        return None
    stored = blob.resolve()
    delete = f"{blob} and {stored}" if stored != blob else f"{blob}"
    return (
        f"{path} is damaged in the Hugging Face cache: the Hub's digest of it is {blob.name}, its bytes give "
        f"{found}; delete {delete} and run again to download it anew"
    )


def raise_cache_damage(
    paths: Sequence[Path], error: Callable[[str], Exception], sha256s: Sequence[str] | None = None
) -> None:
    """Raise ``error(message)`` naming the first file among ``paths`` that is damaged in the
    Hugging Face cache (``cache_damage``), if one is. Given the files' ``sha256s``, this
    refuses bytes that read well but are not the Hub's; without them (they are computed),
    it explains an error that reading the files gave better than that error does: a
    damaged file reads badly, or not at all."""
    for k, path in enumerate(paths):
        if (blob := cached_blob(path)) is not None:
            try:
                damage = cache_damage(path, sha256_file(path) if sha256s is None else sha256s[k])
            except OSError as unreadable:  # its blob is gone or unreadable: that is the damage
                damage = (
                    f"{path} is damaged in the Hugging Face cache: {unreadable.strerror or unreadable}; "
                    f"delete {blob} and run again to download it anew"
                )
            if damage:
                raise error(damage) from None

"""A verified build -> a Hugging Face Hub dataset repo, uploaded in one commit.

The folder must verify first (``verify``). The commit adds ``manifest.json``,
``train.parquet`` and the card files the manifest records (``card.files``), nothing else of
the folder, and each must be what was verified:

- the manifest and the card files are sent as bytes read once, the manifest's before and
  after ``verify``, each card file's hashing to the manifest's sha256;
- ``train.parquet`` is sent from its path (as Xet uploads take it), hashing to the
  manifest's sha256, its ``source.Stamp`` the one taken before ``verify`` until the commit
  is made (a change while it uploads fails the push, naming the commit to check).

A missing repo is created as a dataset repo (``private`` applies only then, and a public
repo is refused when it was asked for). A repo holding any file but ``.gitattributes``
(``README.md`` too) is refused unless ``force``; with it, those files stay beside the
build, but for the card's files a build lacks, which the commit deletes: the repo's card
is always the build's, or none. The commit names the repo state it was checked against
(``parent_commit``), so a push that meanwhile changed it is refused by the Hub. Any error
of the Hub or the network is one line naming the repo (``PushError``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import BuildError, UsageError
from .manifest import Manifest, read
from .output import CARD_FILES, MANIFEST_NAME, PARQUET_NAME
from .source import stamp_if_any
from .verify import MANIFEST_BYTES, verify

KEPT = {".gitattributes"}  # files a repo may hold and still take a build without --force
_REPO = re.compile(r"[\w.-]+/[\w.-]+")


class PushError(BuildError):
    """The Hub or the network refused the push; the message names the repo."""


@dataclass
class Pushed:
    """The commit that a push made, and the files it added and deleted."""

    repo: str
    url: str
    commit: str
    files: list[str]
    deleted: list[str]  # an earlier build's card files, which this one lacks


def push(folder: str | Path, repo: str, private: bool = False, force: bool = False, api: Any = None) -> Pushed:
    """Upload build ``folder`` to the Hub dataset repo ``repo`` (``OWNER/NAME``) in one
    commit (the rules of the module docstring); ``api``: an ``HfApi`` (by default one for
    ``HF_ENDPOINT`` and the saved token)."""
    folder = Path(folder)
    if not _REPO.fullmatch(repo):
        raise UsageError(f"--repo {repo!r} is not OWNER/NAME")
    before = _manifest_bytes(folder)
    parquet = folder / PARQUET_NAME  # (sent from its path, which Xet uploads take; an open file's would not)
    verified = stamp_if_any(parquet)
    problems = verify(folder)
    if problems:
        raise BuildError(f"{folder} does not verify, so it is not pushed: {problems[0]}")
    manifest_bytes = _manifest_bytes(folder)
    if manifest_bytes != before:
        raise BuildError(f"{folder / MANIFEST_NAME} changed while it was verified; not pushed")
    manifest = read(_loads(manifest_bytes))
    card = manifest.card.files if manifest.card is not None else {}
    expected = {PARQUET_NAME: manifest.parquet.sha256} | {
        name: card[name].sha256 for name in CARD_FILES if name in card
    }
    names = [MANIFEST_NAME, *expected]
    from huggingface_hub import CommitOperationAdd, HfApi

    api = api if api is not None else HfApi()
    try:
        operations = [CommitOperationAdd(MANIFEST_NAME, manifest_bytes), CommitOperationAdd(PARQUET_NAME, str(parquet))]
        operations += [CommitOperationAdd(name, (folder / name).read_bytes()) for name in names[2:]]
    except (OSError, ValueError) as error:
        raise BuildError(f"{folder}: cannot read the files to push ({error})") from None
    for operation in operations[1:]:
        if operation.upload_info.sha256.hex() != expected[operation.path_in_repo]:
            raise BuildError(f"{folder / operation.path_in_repo} changed since it was verified; not pushed")
    if stamp_if_any(parquet) != verified:
        raise BuildError(f"{parquet} changed since it was verified; not pushed")
    commit, url, deleted = _commit(api, repo, manifest, operations, private, force)
    if stamp_if_any(parquet) != verified:
        raise PushError(
            f"push to {repo}: {parquet} changed while it was uploaded; commit {commit} may hold other rows: "
            "push again, or check the repo with verify"
        )
    return Pushed(repo, url, commit, names, deleted)


def _commit(
    api: Any, repo: str, manifest: Manifest, operations: list, private: bool, force: bool
) -> tuple[str, str, list[str]]:
    """Create ``repo`` where missing, check what it holds (module docstring), and commit
    ``operations`` to it, deleting the card files the build lacks: the commit's id, the
    repo's url and the files deleted."""
    from huggingface_hub import CommitOperationDelete

    names = {operation.path_in_repo for operation in operations}
    try:
        url = api.create_repo(repo, repo_type="dataset", private=private, exist_ok=True)
        info = api.dataset_info(repo)
        if private and not info.private:
            raise PushError(f"push to {repo}: the repo exists and is public; --private applies to a new repo only")
        files = {s.rfilename for s in info.siblings or []}
        held = sorted(files - KEPT)
        if held and not force:
            shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
            raise PushError(
                f"push to {repo}: the repo already holds {shown}; add --force to push anyway (the build's files "
                "replace those of their names, the others stay)"
            )
        stale = [CommitOperationDelete(name) for name in CARD_FILES if name in files and name not in names]
        stats = manifest.stats
        commit = api.create_commit(
            repo,
            [*operations, *stale],
            commit_message=f"fixed-sft build {manifest.name}: {stats.rows} rows x {manifest.params.row_tokens} tokens",
            commit_description=f"rows_sha256 {manifest.rows_sha256}",
            repo_type="dataset",
            parent_commit=info.sha,
        )
    except PushError:
        raise
    except Exception as error:  # the Hub's and the network's errors are many classes
        raise PushError(f"push to {repo}: {describe(error)}") from None
    return commit.oid, str(url), [operation.path_in_repo for operation in stale]


def describe(error: BaseException) -> str:
    """One line for a Hub or network error: the HTTP status and the Hub's message, or
    the error's kind and first line."""
    response = getattr(error, "response", None)
    status = getattr(response, "status_code", None)
    if isinstance(status, int):
        if status in (401, 403):
            return (
                f"not authorized (HTTP {status}); log in with `hf auth login` or set HF_TOKEN "
                "to a token that may write to it"
            )
        message = getattr(error, "server_message", None) or _first_line(error)
        return f"HTTP {status}: {message}"
    return f"{type(error).__name__}: {_first_line(error)}"


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else "no message"


def _manifest_bytes(folder: Path) -> bytes:
    """The manifest's bytes, at most ``MANIFEST_BYTES`` of them (``verify`` refuses a larger one)."""
    try:
        with (folder / MANIFEST_NAME).open("rb") as f:
            return f.read(MANIFEST_BYTES + 1)
    except OSError:
        return b""  # (verify names the problem)


def _loads(data: bytes) -> Any:
    from .fields import loads

    return loads(data.decode("utf-8"))

"""The output folder's transaction: a build is written beside its target, then renamed into place.

A build writes into ``.NAME.tmp-PID`` beside the target ``NAME`` and renames it into
place once complete, moving a previous build aside to ``.NAME.old-PID`` first; so the
target is either absent or a complete build. An exclusive lock on ``.NAME.lock`` keeps a
second build out, and the next build cleans up what a killed one left. A rebuild builds
into a scratch folder of its own in the system's temporary folder, locked the same way.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Self

from filelock import FileLock, Timeout

from .errors import BuildError, UsageError
from .exits import removed_on_exit
from .output import CARD_FILES, FORMATS, MANIFEST_NAME, PARQUET_NAME, PARTS_NAME, naming
from .source import non_unicode

# what a build, and a build's temporary folder, may hold: the rows, the manifest, and the
# dataset card with its plots (fixed_sft.card; none with --no-card)
BUILD_FILES = (PARQUET_NAME, MANIFEST_NAME, *CARD_FILES)
# and, while the workers write the rows (fixed_sft.parallel), a folder of Parquet parts
PART_FILE = re.compile(r"\d{8}\.parquet")


def not_build_files(folder: Path, parts: bool = False) -> str | None:
    """``None`` when ``folder`` is a folder (not a link) holding only regular files (not
    links, not folders) of the names the format gives, and with ``parts`` (a build's
    temporary folder) its folder of Parquet parts; else what it is or holds instead."""
    try:
        if folder.is_symlink():
            return "it is a symbolic link"
        entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
    except NotADirectoryError:
        return "it is not a folder"
    except OSError as error:
        return f"it cannot be listed ({error.strerror or error})"
    for entry in entries:
        if parts and entry.name == PARTS_NAME and entry.is_dir(follow_symlinks=False):
            inside = [e for e in os.scandir(entry.path) if not (PART_FILE.fullmatch(e.name) and _regular(e))]
            if inside:
                return f"its {PARTS_NAME} holds {inside[0].name}"
            continue
        if entry.name not in BUILD_FILES:
            return f"it holds {entry.name}"
        if not entry.is_file(follow_symlinks=False):
            kind = (
                "a symbolic link"
                if entry.is_symlink()
                else "a folder"
                if entry.is_dir(follow_symlinks=False)
                else "not a regular file"
            )
            return f"its {entry.name} is {kind}"
    return None


def not_a_build(path: Path) -> str | None:
    """``None`` when ``path`` is a previous build: a folder holding only regular files the
    format names (``not_build_files``), one of them a fixed-sft manifest; else why not."""
    if path.is_dir() and not os.path.lexists(path / MANIFEST_NAME):  # (first: quick, as for each parent of a target)
        return f"it has no {MANIFEST_NAME}"
    why = not_build_files(path)
    if why is not None:
        return why
    from .verify import read_manifest  # (bounded, strict: the folder may be anyone's)

    try:
        manifest = read_manifest(path / MANIFEST_NAME)
    except (OSError, ValueError):
        return f"its {MANIFEST_NAME} cannot be read as JSON"
    if not (isinstance(manifest, dict) and manifest.get("format") in FORMATS):
        return f"its {MANIFEST_NAME} is not a {' or '.join(FORMATS)} manifest"
    return None


def is_build(path: Path) -> bool:
    """A folder holding only regular files the format names, one a fixed-sft manifest."""
    return not_a_build(path) is None


def new_file(out: Path) -> None:
    """``UsageError`` unless ``out`` may be written as a new file (``writing_new``): nothing
    is there, its folder exists, takes the name of the folder it is written in first, and
    no build holds it (which would no longer be one)."""
    if os.path.lexists(out):
        raise UsageError(f"{out} exists; choose another output file or remove it")
    if not out.parent.is_dir():
        raise UsageError(f"{out.parent}: no such folder")
    if len(os.fsencode(_draft_prefix(out))) + 8 > _longest_name(out.parent):  # (mkdtemp adds 8 characters)
        raise UsageError(f"output {out}: its name is too long for the folder beside it; choose another output file")
    parent = out.parent.resolve()
    if (inside := next((f for f in (parent, *parent.parents) if is_build(f)), None)) is not None:
        raise UsageError(
            f"{out} is inside the build {inside}, which would no longer be one; choose another output file"
        )


@contextmanager
def writing_new(out: Path) -> Iterator[Path]:
    """The path to write the new file ``out`` at (``new_file``): in a folder of its own beside
    ``out`` (``.NAME.tmp-`` and a random part: no other process's), removed on exit. Once
    the block ends, the complete file is linked into place, never replacing a file that
    appeared there meanwhile; a block that fails leaves nothing at ``out``. A process killed
    meanwhile leaves that folder, hidden."""
    new_file(out)
    with naming(out):
        tmp = Path(tempfile.mkdtemp(prefix=_draft_prefix(out), dir=out.parent))
    with removed_on_exit(tmp):
        try:
            part = tmp / out.name
            yield part
            with naming(out), part.open("rb+") as f:
                os.fsync(f.fileno())
            try:
                os.link(part, out)
            except FileExistsError:
                raise UsageError(f"{out} appeared meanwhile; it was left as it is") from None
            except OSError:  # a file system without hard links
                if os.path.lexists(out):
                    raise UsageError(f"{out} appeared meanwhile; it was left as it is") from None
                os.rename(part, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _draft_prefix(out: Path) -> str:
    """The start of the name of the folder a new file ``out`` is written in first (``writing_new``)."""
    return f".{out.name}.tmp-"


def _not_replaceable(out: Path) -> str | None:
    """``None`` when a build may replace ``out`` (a previous build, or an empty folder);
    else why not."""
    try:
        if out.is_dir() and not out.is_symlink() and not any(out.iterdir()):
            return None
    except OSError:
        pass
    return not_a_build(out)


def check_target(out: Path, source: str, cache: Path | None = None) -> None:
    """A target must be absent, an empty folder, or a previous build, and lie neither
    inside a build (which would then no longer be one) nor inside a source folder, nor
    be the current folder or hold it (which a build would move away from under its
    shell), nor a mount point (which no rename replaces), nor hold the token store
    ``cache`` (which would write into it); ``out`` is a resolved path."""
    if _is_mount(out):
        raise UsageError(f"output {out} is a mount point, which a build cannot replace; choose a folder inside it")
    if cache is not None and Path(os.path.realpath(cache)).is_relative_to(out):
        raise UsageError(f"the token store {cache} is inside the output {out}; choose another --cache-dir or --out")
    here = _current_folder()
    if here is not None and (out == here or out in here.parents):
        which = "the current folder" if out == here else "a folder that holds the current one"
        raise UsageError(f"output {out} is {which}; choose another --out")
    if out.exists() and (why := _not_replaceable(out)) is not None:
        raise UsageError(f"output {out} exists and is not a previous build ({why}); choose another --out")
    inside = next((folder for folder in out.parents if is_build(folder)), None)
    if inside is not None:
        raise UsageError(f"output {out} is inside the build {inside}; choose another --out")
    if Path(source).is_dir() and out.is_relative_to(Path(source).resolve()):
        raise UsageError(f"output {out} is inside the source folder {source}; choose another --out")


MOUNTINFO = Path("/proc/self/mountinfo")  # this process's mounts, each point's path octal-escaped


def _is_mount(path: Path) -> bool:
    """Whether ``path`` (resolved) is a mount point: another device's root, or any mount
    this process's ``MOUNTINFO`` lists there (a bind mount of the same device)."""
    if os.path.ismount(path):
        return True
    try:
        with open(MOUNTINFO, "rb") as listed:
            points = [line.split(b" ")[4] for line in listed if line.count(b" ") >= 4]
    except OSError:
        return False
    unescaped = (re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]), point) for point in points)
    return os.fsencode(path) in set(unescaped)


def _current_folder() -> Path | None:
    """This process's current folder; ``None`` where it was removed."""
    try:
        return Path.cwd()
    except OSError:
        return None


def _regular(entry: os.DirEntry) -> bool:
    return entry.is_file(follow_symlinks=False)


def remove_build_folder(folder: Path) -> None:
    """Delete what a build wrote in ``folder``: its regular files of the names the format
    gives and its Parquet parts, then the folder once empty. Anything else (put there by
    someone else) stays, and so does the folder; a folder already gone is no error."""
    remove_parts(folder)
    for name in BUILD_FILES:
        with suppress(OSError):
            if stat.S_ISREG((folder / name).lstat().st_mode):
                (folder / name).unlink()
    with suppress(OSError):
        folder.rmdir()


def remove_parts(folder: Path) -> None:
    """Delete the Parquet parts a build wrote in ``folder`` (``output.PARTS_NAME``), and their
    folder once empty."""
    with suppress(OSError):
        for entry in os.scandir(folder / PARTS_NAME):
            if PART_FILE.fullmatch(entry.name) and _regular(entry):
                os.unlink(entry.path)
    with suppress(OSError):
        (folder / PARTS_NAME).rmdir()


def file_lock(path: Path) -> FileLock:
    """An exclusive lock on the file ``path``, taken without waiting: entering it raises
    ``filelock.Timeout`` when another holds it, another ``OSError`` when it cannot be
    taken. The file is created when absent and left in place; it is never truncated, and
    a symbolic link of that name is refused, not followed (filelock >= 4.2.1 opens it
    with ``O_NOFOLLOW`` and without ``O_TRUNC``, and locks it with ``flock``)."""
    return FileLock(path, timeout=0, fallback_to_soft=False)  # (a file system without flock: an error)


class _Lock:
    """An exclusive, non-blocking lock on building into ``out``: ``.NAME.lock`` beside it."""

    def __init__(self, out: Path):
        self.out = out
        self.path = out.parent / f".{out.name}.lock"
        self.lock = file_lock(self.path)

    def __enter__(self) -> Self:
        try:
            self.lock.acquire()
        except Timeout:
            if not os.path.lexists(self.path):  # (filelock reads a failed create, as /proc gives, as contention)
                raise UsageError(f"cannot lock {self.path}: it cannot be created; choose another --out") from None
            raise BuildError(f"another build is writing {self.out}") from None
        except OSError as error:
            why = (
                "it is a symbolic link, which a build never follows"
                if self.path.is_symlink()
                else (error.strerror or error)
            )
            raise UsageError(f"cannot lock {self.path}: {why}; choose another --out") from None
        return self

    def __exit__(self, *exc) -> None:
        self.lock.release()


@contextmanager
def transaction(out: Path, source: str, cache: Path | None = None) -> Iterator[Path]:
    """An empty temporary folder beside ``out`` to build into, renamed to ``out`` once the
    block ends without an error (``_publish``) and deleted however it ends. First ``out``
    is resolved (a link to a build is rebuilt where it points) and checked
    (``check_target``; ``source`` and the token store ``cache`` are the build's), its lock taken (``_Lock``), and what a
    killed build into it left cleaned up (``_recover``)."""
    try:
        resolved = Path(out).resolve()  # a link to a build is rebuilt where it points
    except RuntimeError:  # a loop of links, before Python 3.13
        resolved = None
    if resolved is None or resolved.is_symlink():  # (from 3.13, resolve leaves a loop's link unresolved)
        raise UsageError(f"output {out} is a loop of symbolic links; choose another --out")
    out = resolved
    if (shown := non_unicode(out)) is not None:
        raise UsageError(
            f"output {shown}: the path is not valid UTF-8, which pyarrow cannot write; choose another --out"
        )
    check_target(out, source, cache)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"cannot create {out.parent}: {error.strerror or error}; choose another --out") from None
    tmp = draft(out)
    with _Lock(out):
        check_target(out, source, cache)
        _recover(out)
        with removed_on_exit(tmp):  # (by a second Ctrl-C, which exits at once)
            tmp.mkdir()
            try:
                yield tmp
                _publish(tmp, out)
            finally:
                remove_build_folder(tmp)


def draft(out: Path, advice: str = "choose another --out") -> Path:
    """The temporary folder ``.NAME.tmp-PID`` beside ``out`` that this process writes it in
    (as long as ``.NAME.old-PID``, longer than the lock); ``UsageError`` ending with
    ``advice`` where the file system takes no name that long."""
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    if len(os.fsencode(tmp.name)) > _longest_name(out.parent):
        raise UsageError(f"output {out}: its name is too long for the folder {tmp.name} beside it; {advice}")
    return tmp


def _longest_name(folder: Path) -> int:
    """The longest file name ``folder``'s file system takes, in bytes (255 where it does not say)."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _recover(out: Path) -> None:
    """Clean up after a build into ``out`` that was killed: put back the previous build
    that was moved aside last but not yet replaced, and delete temporary and old folders.
    Such a folder holds only a build's files; one holding anything else stops the build
    (``UsageError`` naming it) before anything is moved or deleted."""
    own = re.compile(rf"\.{re.escape(out.name)}\.(tmp|old)-\d+")  # not another target's, such as ``.NAME.old-x.tmp-1``
    # (glob finds nothing, rather than failing, in a folder that cannot be listed)
    leftovers = sorted(p for p in out.parent.glob(glob.escape(f".{out.name}.") + "*") if own.fullmatch(p.name))
    for leftover in leftovers:
        if (why := not_build_files(leftover, parts=True)) is not None:
            raise UsageError(
                f"{leftover}, named as a killed build's temporary folder, is not one ({why}); "
                "move it away and build again"
            )
    if not out.exists():  # (the build moved aside last: one whose removal failed may lie there from before)
        moved = [p for p in leftovers if p.name.startswith(f".{out.name}.old-") and is_build(p)]
        previous = max(moved, key=_moved_at, default=None)
        if previous is not None:
            previous.rename(out)
    for stale in leftovers:
        remove_build_folder(stale)


def _moved_at(folder: Path) -> int:
    """When ``folder`` was last renamed, in ns (its inode's change time)."""
    return folder.lstat().st_ctime_ns


def _publish(tmp: Path, out: Path) -> None:
    """Move the complete build ``tmp`` to ``out``, replacing a previous build or an empty
    folder. An ``out`` that came to hold anything else while the build ran is put back
    as it was, and the build stops (``BuildError``) without publishing."""
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        out.rename(old)
        if (why := _not_replaceable(old)) is not None:
            old.rename(out)
            raise BuildError(
                f"output {out} changed during the build and is no longer a previous build ({why}); "
                "it was left as it is and nothing was published"
            )
    tmp.rename(out)
    remove_build_folder(old)


SCRATCH_PREFIX = "fixed-sft-rebuild-"
REBUILT = "rebuilt"  # the build's folder in the scratch folder
_SCRATCH_LOCKS = (".lock", ".lock.new", f".{REBUILT}.lock")
_SCRATCH_BUILDS = re.compile(rf"{REBUILT}|\.{REBUILT}\.(tmp|old)-\d+")  # the build and its temporary folders


@contextmanager
def scratch_folder() -> Iterator[Path]:
    """A new folder for the rebuilt rows in the temporary folder, deleted afterwards. While
    in use it holds a locked ``.lock`` (locked before it gets that name), so the folders
    that killed rebuilds left, whose ``.lock`` no process holds, are deleted first (by
    ``_remove_scratch``: only what a rebuild writes). Locks are ``file_lock``'s."""
    for stale in Path(tempfile.gettempdir()).glob(SCRATCH_PREFIX + "*"):
        lock = stale / ".lock"
        try:
            if not stat.S_ISREG(lock.lstat().st_mode):  # (taking it would create it in a folder being made)
                continue
            with file_lock(lock):
                _remove_scratch(stale)
        except OSError:  # in use, being created, or another user's
            pass
    folder = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
    try:
        with file_lock(folder / ".lock.new"):
            (folder / ".lock.new").rename(folder / ".lock")
            yield folder
    finally:
        _remove_scratch(folder)


def _remove_scratch(folder: Path) -> None:
    """Delete the scratch folder ``folder`` if it holds only what a rebuild writes there
    (``_a_rebuilds``); else leave it all as it is (it holds someone else's files)."""
    try:
        if folder.is_symlink():
            return
        entries = list(os.scandir(folder))
    except OSError:
        return
    if not all(map(_a_rebuilds, entries)):
        return
    for entry in entries:
        if entry.name in _SCRATCH_LOCKS:
            with suppress(OSError):
                os.unlink(entry.path)
        else:
            remove_build_folder(Path(entry.path))
    with suppress(OSError):
        folder.rmdir()


def _a_rebuilds(entry: os.DirEntry) -> bool:
    """Whether a scratch folder's ``entry`` is what a rebuild writes: a lock (a regular
    file), or the build or one of its temporary folders, holding only a build's files."""
    if entry.name in _SCRATCH_LOCKS:
        return entry.is_file(follow_symlinks=False)
    return _SCRATCH_BUILDS.fullmatch(entry.name) is not None and not_build_files(Path(entry.path), parts=True) is None

"""The build: source -> order -> encode -> pack -> Parquet + manifest.

Rows whose mask is all 0 are dropped (the stream goes on after them); the build stops
after ``rows`` kept rows, or, with ``rows=None``, packs the whole source and drops the
final partial row. Output is written to a temporary folder beside the target and
renamed into place only after ``manifest.json``, written last, is complete.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
from collections import Counter
from contextlib import contextmanager
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from . import __version__
from .chat import MASK_TYPES
from .encode import Encoded, EncoderConfig, Encoders
from .hashes import first_cache_damage, row_digest, rows_digest, sha256_file
from .order import permutation, positions
from .output import FORMAT, MANIFEST_NAME, PARQUET_NAME, RowWriter
from .pack import Packer
from .source import (Source, SourceError, bytes_per_row, non_unicode, open_source, read_band, system_allocator,
                     unreadable)
from .specs import ResolvedTokenizer, resolve_tokenizer
from .tokenizer import eos_id

ORDER_RULE = "splitmix64-key-v1"
# A chunk (what one worker encodes at a time) holds at most CHUNK_ROWS rows and CHUNK_BYTES bytes
# of rows (one row, however large, within MAX_CONVERSATION_BYTES), and no more rows than the
# build still wants; a band (what one pass over the source keeps) holds BAND_BYTES of rows at most.
CHUNK_ROWS = 128
CHUNK_BYTES = 8 << 20
BAND_BYTES = 256 << 20
MAX_ROW_TOKENS = 1 << 20
MAX_WORKERS = 1024


class UsageError(Exception):
    """Bad parameters (exit code 2)."""


class BuildError(Exception):
    """The build cannot finish (exit code 1)."""


class InvalidSourceRow(BuildError):
    """A source row that is not a valid conversation stopped the build: ``problem`` names
    it and says why, the message also how to skip such rows."""

    def __init__(self, problem: str):
        super().__init__(f"{problem} (--skip-invalid skips such rows and records them)")
        self.problem = problem


@dataclass
class BuildConfig:
    """A build's parameters (the CLI's flags; defaults: the default build's)."""

    name: str
    source: str
    source_revision: str | None = None
    source_license: str | None = None
    source_files: tuple[str, ...] | None = None  # globs choosing the source's files (None: all)
    tokenizer: str = "kimi-k2.6"
    tokenizer_revision: str | None = None
    loss_mask_type: str = "kimi_k25"
    rows: int | None = 6400  # None: pack the whole source
    row_tokens: int = 8192
    seed: int = 42
    workers: int = 1
    check_every: int = 64
    skip_invalid: bool = False
    allow_unpinned_tokenizer: bool = False
    expected_tokenizer: str | None = None  # the spec a tokenizer folder must match
    source_rows: int | None = None  # the row count the source must have, when known

    def validate(self, label: Callable[[str], str] = lambda key: "--" + key.replace("_", "-")) -> None:
        """Raise ``UsageError`` for a parameter outside its range, calling it by
        ``label(key)`` (by default the flag that sets it)."""
        if not 2 <= self.row_tokens <= MAX_ROW_TOKENS:
            raise UsageError(f"{label('row_tokens')} must be between 2 and {MAX_ROW_TOKENS}, got {self.row_tokens}")
        if self.rows is not None and self.rows < 1:
            raise UsageError(f"{label('rows')} must be a positive number or 'all', got {self.rows}")
        if not 0 <= self.seed < 2**64:
            raise UsageError(f"{label('seed')} must be between 0 and 2**64 - 1, got {self.seed}")
        if self.loss_mask_type not in MASK_TYPES:
            raise UsageError(f"unknown {label('loss_mask_type')} {self.loss_mask_type!r} "
                             f"(known: {', '.join(MASK_TYPES)})")
        if not 1 <= self.workers <= MAX_WORKERS:
            raise UsageError(f"{label('workers')} must be between 1 and {MAX_WORKERS}, got {self.workers}")
        if self.check_every < 0:
            raise UsageError(f"{label('check_every')} must be non-negative, got {self.check_every}")
        if self.source_files is not None and not (self.source_files and all(self.source_files)):
            raise UsageError(f"{label('source_files')} must not be empty")


def is_build(path: Path) -> bool:
    """A folder holding only a fixed-sft manifest (and its Parquet file)."""
    try:
        manifest = json.loads((path / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    names = {p.name for p in path.iterdir()}
    return isinstance(manifest, dict) and manifest.get("format") == FORMAT and names <= {MANIFEST_NAME, PARQUET_NAME}


def check_target(out: Path, source: str) -> None:
    """A target must be absent, an empty folder, or a previous build, and lie neither
    inside a build (which would then no longer be one) nor inside a source folder
    (``out`` is a resolved path)."""
    if out.exists() and not (out.is_dir() and (is_build(out) or not any(out.iterdir()))):
        raise UsageError(f"output {out} exists and is not a previous build; choose another --out")
    inside = next((folder for folder in out.parents if is_build(folder)), None)
    if inside is not None:
        raise UsageError(f"output {out} is inside the build {inside}; choose another --out")
    if Path(source).is_dir() and out.is_relative_to(Path(source).resolve()):
        raise UsageError(f"output {out} is inside the source folder {source}; choose another --out")


def code_version() -> dict:
    """The builder's version: package version, format, ``code_sha256`` (sha256 over each
    ``fixed_sft/*.py`` file's name and bytes, in name order: exact wherever the code
    came from) and, in a git checkout, the commit and whether the package differs from it."""
    package = Path(__file__).parent
    digest = hashlib.sha256()
    for path in sorted(package.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    version = {"fixed_sft": __version__, "format": FORMAT, "code_sha256": digest.hexdigest()}
    try:
        git = ["git", "--no-optional-locks", "-C", str(package)]
        top = subprocess.run([*git, "rev-parse", "--show-toplevel", "HEAD"], capture_output=True, text=True, timeout=5)
        changed = subprocess.run([*git, "status", "--porcelain", "--", "."], capture_output=True, text=True, timeout=5)
        toplevel, _, head = top.stdout.strip().partition("\n")
        # only this project's own checkout, not a repository the package happens to be installed in
        if top.returncode == 0 and changed.returncode == 0 and Path(toplevel) == package.resolve().parent:
            version["git_commit"] = head
            version["git_dirty"] = bool(changed.stdout.strip())
    except (OSError, subprocess.TimeoutExpired):
        pass
    return version


def _chunks(source: Source, rank: np.ndarray, band_rows: Callable[[], int],
            chunk_rows: Callable[[], int]) -> Iterator[tuple[int, pa.Table]]:
    """``(first position, rows)`` chunks in packing order, read a band at a time;
    ``band_rows`` sizes each band when it is reached, and ``chunk_rows`` each chunk when it
    is cut (in bytes, a chunk holds at most ``CHUNK_BYTES``, or one row)."""
    lo = 0
    while lo < source.num_rows:
        hi = min(source.num_rows, lo + max(1, band_rows()))
        first = lo
        for chunk in read_band(source, rank, lo, hi).chunks(chunk_rows, CHUNK_BYTES):
            yield first, chunk
            first += chunk.num_rows
        lo = hi


class _Lock:
    """An exclusive, non-blocking lock on building into ``out``."""

    def __init__(self, out: Path):
        self.out = out
        self.path = out.parent / f".{out.name}.lock"

    def __enter__(self) -> "_Lock":
        try:
            self.file = self.path.open("w")
        except OSError as error:
            raise UsageError(f"cannot write {self.path}: {error.strerror or error}; choose another --out") from None
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.file.close()
            raise BuildError(f"another build is writing {self.out}") from None
        return self

    def __exit__(self, *exc) -> None:
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()


def build(config: BuildConfig, out: Path, progress: bool = False) -> dict:
    """Build ``config`` into folder ``out``; return the manifest."""
    config.validate()
    try:
        resolved = Path(out).resolve()  # a link to a build is rebuilt where it points
    except RuntimeError:  # a loop of links, before Python 3.13
        resolved = None
    if resolved is None or resolved.is_symlink():  # (from 3.13, resolve leaves a loop's link unresolved)
        raise UsageError(f"output {out} is a loop of symbolic links; choose another --out")
    out = resolved
    if (shown := non_unicode(out)) is not None:
        raise UsageError(f"output {shown}: the path is not valid UTF-8, which pyarrow cannot write; choose another --out")
    check_target(out, config.source)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"cannot create {out.parent}: {error.strerror or error}; choose another --out") from None
    with _Lock(out), system_allocator():
        check_target(out, config.source)
        _recover(out)
        tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
        tmp.mkdir()
        try:
            manifest = _build_into(config, tmp, progress)
            _publish(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def _recover(out: Path) -> None:
    """Clean up after a build into ``out`` that was killed: put back a previous build
    that was moved aside but not yet replaced, and delete temporary and old folders."""
    own = re.compile(rf"\.{re.escape(out.name)}\.(tmp|old)-\d+")  # not another target's, such as ``.NAME.old-x.tmp-1``
    # (glob finds nothing, rather than failing, in a folder that cannot be listed)
    leftovers = sorted(p for p in out.parent.glob(glob.escape(f".{out.name}.") + "*") if own.fullmatch(p.name))
    if not out.exists():
        previous = next((p for p in leftovers if p.name.startswith(f".{out.name}.old-") and is_build(p)), None)
        if previous is not None:
            previous.rename(out)
    for stale in leftovers:
        shutil.rmtree(stale, ignore_errors=True)


def _publish(tmp: Path, out: Path) -> None:
    """Move the complete build ``tmp`` to ``out``, replacing a previous build."""
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)


@dataclass
class _Tally:
    """What the manifest says about the stream: rows kept and skipped, their hashes,
    and the conversations they hold."""

    row_tokens: int
    digests: list[bytes] = field(default_factory=list)
    rows_per_conversation: Counter = field(default_factory=Counter)
    skipped_invalid: list[dict] = field(default_factory=list)
    seen_ids: dict[str, int] = field(default_factory=dict)
    supervised: int = 0
    rows_skipped: int = 0
    conversations_encoded: int = 0
    tokens_encoded: int = 0
    template_checked: int = 0
    tail_tokens: int = 0

    def stats(self) -> dict:
        tokens = len(self.digests) * self.row_tokens
        return {
            "rows": len(self.digests),
            "tokens": tokens,
            "supervised_tokens": self.supervised,
            "supervised_token_ratio": self.supervised / tokens if tokens else 0.0,
            "padding_tokens": 0,
            "conversations": len(self.rows_per_conversation),
            "conversations_split": sum(1 for n in self.rows_per_conversation.values() if n > 1),
            "rows_skipped": self.rows_skipped,
            "tail_tokens_dropped": self.tail_tokens,
            "invalid_rows_skipped": len(self.skipped_invalid),
        }


def _valid(stream: Iterator[Encoded], source: Source, skip_invalid: bool, tally: _Tally) -> Iterator[Encoded]:
    """The stream's valid conversations. An invalid one, or one whose id an earlier one
    used, stops the build naming its file and row, or with ``skip_invalid`` is recorded
    in ``tally`` and left out."""
    for item in stream:
        reason = item.invalid
        if reason is None and item.id is not None and item.id in tally.seen_ids:
            reason = f"duplicate id (first used by source row {tally.seen_ids[item.id]})"
        if reason is None:
            if item.id is not None:
                tally.seen_ids[item.id] = item.index
            yield item
        elif skip_invalid:
            tally.skipped_invalid.append({"index": item.index, "id": item.id, "reason": reason})
        else:
            path, row = source.locate(item.index)
            place = f"line {row + 1}" if path.suffix == ".jsonl" else f"row {row}"
            where = f"{path}: {place} (source row {item.index}, id {item.id})"
            raise InvalidSourceRow(f"{where}: {reason}")


def _pack(conversations: Iterator[Encoded], rows: int | None, packer: Packer, writer: RowWriter, tally: _Tally,
          bar: tqdm) -> None:
    """Feed conversations to the packer and write kept rows until ``rows`` (``None``: all)."""
    for item in conversations:
        tally.conversations_encoded += 1
        tally.tokens_encoded += len(item.ids) + 1
        tally.template_checked += item.checked
        for row in packer.add(item.index, item.id, item.ids, item.mask):
            supervised = row.supervised
            if not supervised:
                tally.rows_skipped += 1
                continue
            writer.write(row)
            tally.digests.append(row_digest(row.ids, row.mask))
            tally.supervised += supervised
            tally.rows_per_conversation.update(s.index for s in row.segments)
            bar.update()
            if writer.rows == rows:
                tally.tail_tokens = len(item.ids) + 1 - row.segments[-1].end
                return
    tally.tail_tokens = packer.filled


@contextmanager
def _cancelling_pool() -> Iterator[ThreadPoolExecutor]:
    """One background thread; on an error, its queued tasks are dropped, not run."""
    pool = ThreadPoolExecutor(1)
    try:
        yield pool
    except BaseException:
        pool.shutdown(cancel_futures=True)
        raise
    pool.shutdown()


def _build_into(config: BuildConfig, folder: Path, progress: bool) -> dict:
    """Build ``config`` into the empty folder ``folder``, manifest last; return the manifest."""
    tokenizer = resolve_tokenizer(
        config.tokenizer,
        config.tokenizer_revision,
        expected=config.expected_tokenizer,
        allow_unpinned=config.allow_unpinned_tokenizer,
    )
    if tokenizer.loss_mask_type not in (None, config.loss_mask_type):
        raise UsageError(
            f"tokenizer {tokenizer.name} goes with loss mask {tokenizer.loss_mask_type}, not {config.loss_mask_type}"
        )
    encoder_config = EncoderConfig(tokenizer.directory, {name: f["sha256"] for name, f in tokenizer.files.items()},
                                   config.loss_mask_type, tokenizer.template_kwargs)
    with Encoders(encoder_config, config.workers, config.check_every) as encoders, _cancelling_pool() as hashing:
        source = open_source(config.source, config.source_revision, config.source_license, config.source_files)
        if config.source_rows is not None and source.num_rows != config.source_rows:
            raise _explained(BuildError(f"source {source.name} has {source.num_rows} rows; {config.name} expects "
                                        f"{config.source_rows}"), source)
        source_hashes = [hashing.submit(sha256_file, path) for path in source.files]
        rank = positions(permutation(config.seed, source.num_rows))
        packer = Packer(config.row_tokens, eos_id(tokenizer.directory))
        writer = RowWriter(folder / PARQUET_NAME)
        tally = _Tally(config.row_tokens)
        bytes_row = bytes_per_row(source)

        def wanted() -> float:
            """Conversations the rows still to fill need, plus a fifth: their tokens over
            the tokens per conversation so far (before any, a token per 4 source bytes);
            without a row count, all."""
            if config.rows is None:
                return math.inf
            tokens_left = (config.rows - writer.rows) * config.row_tokens - packer.filled
            encoded = tally.conversations_encoded
            per_conversation = tally.tokens_encoded / encoded if encoded else bytes_row / 4
            return 1.2 * tokens_left / max(per_conversation, 1.0)

        def chunk_rows() -> int:
            """Rows in the next chunk: ``CHUNK_ROWS``, or the conversations wanted where
            fewer (so that a build that needs one does not have 128 encoded)."""
            return max(1, math.ceil(min(CHUNK_ROWS, wanted())))

        def band_rows() -> int:
            """Rows in the next band: those wanted and a chunk more (``CHUNK_ROWS`` rows, or
            as many as ``CHUNK_BYTES`` holds at the source's average size), within the band
            memory budget; ``_chunks`` reads at least one."""
            per_row = max(bytes_row, 1.0)
            return int(min(BAND_BYTES / per_row, wanted() + min(CHUNK_ROWS, CHUNK_BYTES / per_row)))

        stream = encoders.encode(_chunks(source, rank, band_rows, chunk_rows), wanted)
        try:
            with tqdm(total=config.rows, unit="row", disable=not progress, desc=config.name) as bar:
                _pack(_valid(stream, source, config.skip_invalid, tally), config.rows, packer, writer, tally, bar)
            writer.close()  # (inside: a signal while the last row group is written still waits for its thread)
        except (SourceError, InvalidSourceRow) as error:
            writer.abort()
            raise _explained(error, source) from None
        except BaseException:
            writer.abort()
            raise
        finally:
            stream.close()
        if writer.rows == 0 or (config.rows is not None and writer.rows < config.rows):
            needed = f"--rows is {config.rows}" if config.rows is not None else "a build needs at least one"
            raise BuildError(
                f"the source fills only {writer.rows} rows of {config.row_tokens} tokens with supervised tokens; {needed}"
            )
        source_files = _source_files(source, source_hashes)
    manifest = _manifest(config, source, source_files, tokenizer, tally, folder / PARQUET_NAME)
    _write_manifest(folder / MANIFEST_NAME, manifest)
    return manifest


def _source_files(source: Source, hashes: list[Future]) -> list[dict]:
    """The manifest's ``source.files``, from the files' hashes; a ``SourceError`` for a
    file that went away or changed since the source was opened (so the rows, the counts
    and the hashes are all of the same bytes), a ``BuildError`` for one damaged in the
    Hugging Face cache (bytes that read well, but are not the Hub's)."""
    try:
        digests = [digest.result() for digest in hashes]
    except OSError as error:
        source.check_unchanged()  # a file that went away is named as changed
        raise unreadable(Path(error.filename), error) from None
    source.check_unchanged()
    damage = first_cache_damage(source.files, digests)
    if damage:
        raise BuildError(damage)
    return [
        {"path": path.relative_to(source.root).as_posix(), "bytes": size, "sha256": digest}
        for path, (size, _), digest in zip(source.files, source.stamps, digests)
    ]


def _explained(error: Exception, source: Source) -> Exception:
    """``error``, or a ``BuildError`` naming a source file damaged in the Hugging Face
    cache, which explains it better (a damaged file reads badly, or not at all)."""
    damage = first_cache_damage(source.files)
    return BuildError(damage) if damage else error


def _manifest(config: BuildConfig, source: Source, source_files: list[dict], tokenizer: ResolvedTokenizer,
              tally: _Tally, parquet: Path) -> dict:
    """``manifest.json`` of a finished build (keys: data/README.md)."""
    return {
        "format": FORMAT,
        "name": config.name,
        "code_version": code_version(),
        "params": {
            "rows": config.rows if config.rows is not None else "all",
            "row_tokens": config.row_tokens,
            "seed": config.seed,
            "order": ORDER_RULE,
            "loss_mask_type": config.loss_mask_type,
            "skip_invalid": config.skip_invalid,
        },
        "source": {
            "name": source.name,
            "revision": source.revision,
            "license": source.license,
            "file_patterns": list(source.patterns) if source.patterns is not None else None,
            "rows": source.num_rows,
            "files": source_files,
        },
        "tokenizer": tokenizer.manifest(),
        "loss_mask": {"type": config.loss_mask_type, "template_kwargs": tokenizer.template_kwargs},
        "template_check": {"every": config.check_every, "checked": tally.template_checked},
        "stats": tally.stats(),
        "skipped_invalid": tally.skipped_invalid,
        "parquet": {"path": PARQUET_NAME, "bytes": parquet.stat().st_size, "sha256": sha256_file(parquet)},
        "rows_sha256": rows_digest(tally.digests),
        "row_sha256": [d.hex() for d in tally.digests],
    }


def _write_manifest(path: Path, manifest: dict) -> None:
    with path.open("w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())

"""The build: source -> order -> encode -> pack -> Parquet + manifest.

Rows with no supervised token after token 0 are dropped (the stream goes on after them); the build stops
after ``rows`` kept rows, or, with ``rows=None``, packs the whole source and drops the
final partial row. Output is written to a temporary folder beside the target and
renamed into place only after ``manifest.json``, written last, is complete (``folder``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import ExitStack, closing, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np
import pyarrow as pa

from . import __version__, direct, kept, parallel
from .bands import Band, band_bytes, file_bytes, file_reads, read_band, read_file_rows, read_rows
from .chat import MASK_TYPES as KIMI_MASK_TYPES
from .chat import ChatEncoder, read_probes
from .encode import IN_FLIGHT_BYTES, Chunk, Encoded, EncoderConfig, Encoders, encode_rows, start_fork_server
from .encoding import Encoder, TemplateMismatch
from .engine import MANY_WORKERS, ProcessPool, forked, usable_cores
from .errors import BuildError, UsageError
from .fill import CheckTask, FreshTask, check_apart, fill, fill_tasks, fresh, ready_to_check
from .folder import remove_parts, transaction
from .hashes import row_digest, rows_digest, sha256_file
from .hf_chat import MASK_TYPES as HF_MASK_TYPES
from .hub import is_hub_id, raise_cache_damage
from .manifest import (
    PARQUET,
    CodeVersion,
    LossMask,
    Manifest,
    Params,
    ParquetFile,
    SkippedRow,
    SourceFile,
    SourceRecord,
    SourceShare,
    Stats,
    TemplateCheck,
)
from .memory import give_back_often, map_large_allocations, system_allocator
from .order import permutation, positions
from .output import MANIFEST_NAME, PARQUET_NAME, RowWriter, format_of, naming
from .pack import Packer, Row, Unit
from .params import RECORDED, BuildConfig, to_json
from .plots import Inputs, Plotter
from .source import Source, SourceError, open_source, unreadable
from .specs import BUILDS, HF, ResolvedTokenizer, build_spec, resolve_tokenizer
from .store import StoreMismatch, TokenStore, default_dir, probes_path, same_encoding, store_key
from .tokenizer import bpe_version, default_bpe, fast_bpe_installed

ORDER_RULE = "splitmix64-key-v1"
# A chunk (what one worker encodes at a time) holds at most CHUNK_ROWS rows and CHUNK_BYTES bytes
# of rows (one row, however large, within MAX_CONVERSATION_BYTES), and no more rows than the
# build still wants. A band (what one pass over the source keeps) holds as many rows as reading it
# holds within BAND_BYTES, with the copies that sort them (fixed_sft.bands.band_bytes), or within
# LARGE_BAND_BYTES where the source's rows are large (over LARGE_ROW_BYTES on average: chunks are
# then cut by bytes, and each conversation in flight is held several times over by its worker). A
# band is read while the workers encode the chunks before it. BAND_BYTES keeps the default build
# to one band (its first band: about 1.2 x 6,400 x 8,192 tokens x 4 bytes, 240 MiB, from 6 files
# of even sizes: 288 MiB fit). A build of every row from a source of more than one band reads
# no bands where the token store is on: it fills the store in one pass (``_fill``).
CHUNK_ROWS = 128
CHUNK_BYTES = 8 << 20
# A first build's chunks that the workers encode, store and index (``_pack_fresh``) hold up to
# FRESH_CHUNK_ROWS rows: each costs this process about a millisecond whatever its rows, so short
# rows go in larger chunks (on 16 cores, 1,024 rows took 6.3 s where 128 took 8.2-8.4 s, short
# dialogs); and at most a 2 x workers-th of IN_FLIGHT_BYTES, so that every worker has one.
FRESH_CHUNK_ROWS = 1024
BAND_BYTES = 384 << 20
LARGE_BAND_BYTES = 128 << 20
LARGE_ROW_BYTES = CHUNK_BYTES // CHUNK_ROWS
# Packing from the store in the workers (fixed_sft.parallel) reads each conversation twice, so it
# pays from this many workers; fewer pack in the build's process: straight from the store where it
# gives the conversations the rows need, valid (fixed_sft.direct), else one conversation at a time
# (benchmarks/README.md: with 2 workers on 2 cores a later build took 4.72 s against 3.31 s with 1).
PARALLEL_PACKING_WORKERS = 4
# A build that encodes nothing packs in workers forked from its process (``_Encoding.packers``)
# where its rows hold this many tokens, with at least STORED_PACKING_CORES workers and cores; else
# in its own process, which keeps 2 cores busy (its thread and the Parquet writer's). On the
# 16-core machine a later build of 40,000 conversations (42M tokens) at 16 workers took 1.12-1.19 s
# so, against 1.76-2.34 s in its own process and 1.57-1.61 s in workers from the fork server, which
# wait for its encoder (bench_store.py, 2 rounds). Fewer cores than 8 were not measured.
STORED_PACKING_TOKENS = 1 << 24
FORKS_PACKERS = sys.platform == "linux"  # (a fork beside threads: sound on Linux, not with macOS's frameworks)
STORED_PACKING_CORES = 8
# A build of some rows reads the index the store keeps where its rows need at least a
# fourth of the source's tokens (decoding it whole: 0.9 s at 1M rows), else the index pass
KEPT_INDEX_SHARE = 4
# With this many workers, a build whose template probes are kept fills the store without the
# template renderer in its workers (its import took 1.2-2.9 s on the 16-core machine, while every
# worker waited): a checker per CHECKED_BY workers, at least 2, checks the sampled rows (fixed_sft.fill).
# Each checker imports the renderer (2.6 s there), so they are as few as keep up with the fill: at 16
# workers, 256,000 Tulu-like conversations, 3 checkers built in 7.19-9.11 s, 4 in 7.63-9.13 s and
# 2 in 7.98-9.91 s (3 rounds, alternating; 3 was the fastest in each).
CHECKS_APART_WORKERS = 8
CHECKED_BY = 5
CHECKS_APART_EVERY = 16  # and where at most 1 row in this many is checked (the rows given back stay few)
CHECKS_WAITING_BYTES = 32 << 20  # the most source bytes of rows given back that wait for a checker
# Packing in this process takes conversations a block at a time (``_block``): at most this many,
# and this many tokens (or one conversation), so that the per-row work is done once per block.
BLOCK_UNITS = 1024
BLOCK_TOKENS = 1 << 20
MAX_SOURCE_VALUES = 1000  # the most ``source`` values a source mix lists (the manifest stays small)


class InvalidSourceRow(BuildError):
    """A source row that is not a valid conversation stopped the build: ``problem`` names
    it and says why, the message also how to skip such rows."""

    def __init__(self, problem: str):
        super().__init__(f"{problem} (--skip-invalid skips such rows and records them)")
        self.problem = problem


GIT_TRIES = 3  # times a build asks git for its commit before it records none


class Bar(Protocol):
    """A progress bar, as a build moves it (tqdm's)."""

    def update(self, n: int = 1) -> None: ...

    def reset(self, total: float | None = None) -> None: ...


class _Silent:
    """The bar of a ``--quiet`` build, which shows nothing: tqdm is not imported (~25 ms
    of a build's start)."""

    def update(self, n: int = 1) -> None:
        pass

    def reset(self, total: float | None = None) -> None:
        pass

    def __enter__(self) -> _Silent:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _bar(shown: bool, **options: Any) -> Any:
    """A tqdm bar with ``options``, shown on a terminal only; a silent one where not ``shown``."""
    if not shown:
        return _Silent()
    from tqdm import tqdm

    return tqdm(disable=None, **options)


def code_version(boundaries: bool = False) -> dict:
    """The builder's version: package version, format (of a build ``boundaries`` says: with
    them or without), ``code_sha256`` (sha256 over each
    ``fixed_sft/*.py`` file's name and bytes, in name order: exact wherever the code
    came from) and, in a git checkout, the commit and whether the package differs from it."""
    package = Path(__file__).parent
    digest = hashlib.sha256()
    for path in sorted(package.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    version: dict[str, str | bool] = {
        "fixed_sft": __version__,
        "format": format_of(boundaries),
        "code_sha256": digest.hexdigest(),
    }
    git = ["git", "--no-optional-locks", "-C", str(package)]
    ask = partial(subprocess.run, capture_output=True, text=True, timeout=5)
    for _ in range(GIT_TRIES):  # (git may fail for a moment on a busy machine: two builds then differ)
        try:
            top, changed = (
                ask([*git, "rev-parse", "--show-toplevel", "HEAD"]),
                ask([*git, "status", "--porcelain", "--", "."]),
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if "not a git repository" in top.stderr:
            break
        if top.returncode == 0 and changed.returncode == 0:
            toplevel, _, head = top.stdout.strip().partition("\n")
            # only this project's own checkout, not a repository the package happens to be installed in
            if Path(toplevel) == package.resolve().parent:
                version["git_commit"] = head
                version["git_dirty"] = bool(changed.stdout.strip())
            break
    return version


def _chunks(
    source: Source,
    rank: np.ndarray,
    band_rows: Callable[[], int],
    chunk_rows: Callable[[], int],
    skip: np.ndarray | None = None,
    chunk_bytes: int | None = None,
) -> Iterator[pa.Table]:
    """Chunks of source rows in packing order, read a band at a time; ``band_rows`` sizes
    each band when it is reached, and ``chunk_rows`` each chunk when it is cut (in bytes, a
    chunk holds at most ``chunk_bytes``, default ``CHUNK_BYTES``, or one row). With ``skip``
    (the source rows the token store gives), the rows it marks are not read."""
    lo = 0
    while lo < source.num_rows:
        hi = min(source.num_rows, lo + max(1, band_rows()))
        band = read_band(source, rank, lo, hi) if skip is None else read_band(source, rank, lo, hi, skip)
        yield from band.chunks(chunk_rows, CHUNK_BYTES if chunk_bytes is None else chunk_bytes)
        lo = hi


def _fill(
    store: TokenStore,
    encoding: _Encoding,
    source: Source,
    order: np.ndarray,
    large_rows: bool,
    tokenized: Bar,
    reach: int | None = None,
) -> parallel.Indexes | None:
    """Encode into ``store`` every source row it does not hold, in one pass over the source,
    the sampled ones checked too (``encode.sampled``): so that a build of all rows then
    takes them from the store in packing order, rather than read the source once per band.
    The pass runs where the conversations are encoded, a task per row group
    (``fixed_sft.fill``). Where the source has fewer row groups than workers, or its rows
    are large (``large_rows``: a worker reading its own would hold a batch of them while it
    encodes, and the conversations in flight would grow with the workers), this process
    reads it and the workers encode its chunks (``_streamed``). Invalid rows are stored as
    such, and a conversation whose check fails is not: the build stops at the first of
    either in packing order, as without the store. A stored conversation encoded again to
    check it must be its stored copy (``StoreMismatch``). With ``reach``, only the rows at
    packing positions before it. Returns the index of what the fill tasks stored
    (``parallel.Indexes``; ``None`` where this process read the source)."""
    held, check = store.plan(encoding.check_every)
    wanted = ~(held & ~check)
    if reach is not None:
        wanted[order[reach:]] = False
    tokenized.update(int(np.count_nonzero(~wanted)))
    if not wanted.any():
        return None
    indexes = None
    again = order[(check & wanted)[order]]  # (held, encoded again to check them: in packing order)
    before = (list(store.segments), store.segment[again], store.slot[again])
    tasks = list(fill_tasks(source, wanted, encoding.check_every, (CHUNK_ROWS, CHUNK_BYTES), store.folder))
    if large_rows or len(tasks) < encoding.workers:
        _streamed(store, encoding, source, wanted, tokenized)
    else:
        indexes = parallel.Indexes(order) if wanted.all() else None  # (else it cannot cover them all)
        encoders, checkers = encoding.start(), None
        encoding.encoded = True
        checks: list[tuple[Future, int]] = []  # each check and the source bytes of its rows
        if encoding.checks_apart and encoding.check_every:  # (fixed_sft.fill)
            checkers = encoding.checkers()
            tasks = [task._replace(check_every=0, apart=encoding.check_every) for task in tasks]
        with closing(encoders.run(fill, tasks)) as done:
            for filled in done:
                tokenized.update(filled.conversations)
                if indexes is not None:
                    for rows, indexed in filled.indexed:
                        indexes.add(rows, indexed)
                if checkers is not None and filled.sampled:
                    checked = checkers.submit(check_apart, CheckTask(filled.sampled, str(store.folder)))
                    checks.append((checked, filled.sampled_bytes))
                    # the rows given back wait here, up to CHECKS_WAITING_BYTES (not a count of checks:
                    # while the checkers start, importing their renderer, that held the fill back)
                    while True:
                        running = [(check, size) for check, size in checks if not check.done()]
                        if len(running) <= 1 or sum(size for _, size in running) <= CHECKS_WAITING_BYTES:
                            break
                        wait([check for check, _ in running], return_when=FIRST_COMPLETED)
                if not filled.writable:  # (the rest is read by bands)
                    store.turn_off(f"cannot write segments in {store.folder}")
                    break
        for checked, _ in checks:
            if indexes is not None:
                for rows, indexed in checked.result().indexed:
                    indexes.add(rows, indexed)
        if not all(checked.result().writable for checked, _ in checks):
            store.turn_off(f"cannot write segments in {store.folder}")
    store.refresh()
    store.compare(again, before)  # (a copy unlike its encoding now stops the build, as without the fill)
    return indexes


def _streamed(store: TokenStore, encoding: _Encoding, source: Source, wanted: np.ndarray, tokenized: Bar) -> None:
    """The rows ``wanted`` marks, read here in source order, encoded by the workers a chunk
    (``CHUNK_ROWS``, at most ``CHUNK_BYTES``) at a time, and stored, until one fails its
    template check (reached later in packing order, where it stops the build)."""

    def chunks() -> Iterator[pa.Table]:
        for path, start, count, source_column, stamp in file_reads(source):
            for batch in read_file_rows(path, start, wanted[start : start + count], source_column, stamp=stamp):
                yield from Band([batch], [np.arange(batch.num_rows)]).chunks(CHUNK_ROWS, CHUNK_BYTES)

    try:
        with closing(encoding.encode(chunks(), lambda: math.inf)) as encoded:
            for item in encoded:
                store.add(item)
                tokenized.update()
                if not store.writable:
                    return
    except TemplateMismatch:
        return


def build(config: BuildConfig, out: Path, progress: bool = False) -> dict:
    """Build ``config`` into folder ``out``; return the manifest."""
    config.validate()
    cache = None if config.no_cache else _cache_root(config)
    with transaction(out, config.source, cache) as folder, system_allocator():
        manifest = _build_into(config, folder, progress)
    return manifest


@dataclass
class _Tally(parallel.Packed):
    """What the manifest says about the stream (``parallel.Packed``), counted one
    conversation at a time: with the ids seen so far and the units of the row being filled."""

    row_tokens: int = 0
    seen_ids: dict[str, int] = field(default_factory=dict)
    # for the source mix and the card: the units taken and not yet in finished rows (source
    # row -> ids without the separator, ``source`` value)
    units: dict[int, tuple[int, str | None]] = field(default_factory=dict)
    pending: int = 0  # tokens taken for the packer, not yet given to it

    def settle(self, row: Row, kept: bool) -> None:
        """Count a finished row for the card (before ``rows_per_conversation`` has it): its
        supervised tokens, and each conversation it holds first, by its source's value;
        then forget the units no later row holds (all but its last segment's)."""
        if kept:
            self.row_supervised.append(int(np.count_nonzero(row.mask)))
            for segment in row.segments:
                length, value = self.units[segment.index]
                share = self.mix.setdefault(value, [0, 0])
                if segment.index not in self.rows_per_conversation:
                    self.conversation_tokens.append(length)
                    share[0] += 1
                share[1] += segment.end - segment.start
        for segment in row.segments[:-1]:  # (units that end in this row)
            del self.units[segment.index]

    def take(self, packed: parallel.Packed) -> None:
        """Count what ``fixed_sft.parallel`` packed."""
        for name in parallel.Packed.__dataclass_fields__:
            setattr(self, name, getattr(packed, name))

    def source_mix(self) -> list[SourceShare] | None:
        """The manifest's ``source_mix``: per ``source`` value (``None`` last), or ``None``
        when no kept conversation's source row has one, or they have more than
        ``MAX_SOURCE_VALUES`` (a column of ids, say, rather than of subsets)."""
        if all(value is None for value in self.mix) or len(self.mix) > MAX_SOURCE_VALUES:
            return None
        order = sorted(self.mix, key=lambda value: (value is None, value or ""))
        return [SourceShare(value, *self.mix[value]) for value in order]

    def ratio(self, rows: int) -> float:
        """The supervised token ratio of ``rows`` kept rows."""
        tokens = rows * self.row_tokens
        return self.supervised / tokens if tokens else 0.0

    def plot_inputs(self, rows: int) -> Inputs:
        """What the card's plots show of ``rows`` kept rows (``card.plot_inputs``): known once
        the rows are cut, before they are written and hashed."""
        from .card import Figures, plot_inputs

        figures = Figures(self.row_supervised, self.conversation_tokens)
        return plot_inputs(self.source_mix(), self.row_tokens, self.ratio(rows), figures)

    def stats(self) -> dict:
        tokens = len(self.digests) * self.row_tokens
        return {
            "rows": len(self.digests),
            "tokens": tokens,
            "supervised_tokens": self.supervised,
            "supervised_token_ratio": self.ratio(len(self.digests)),
            "trainable_tokens": self.trainable,
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
        reason = parallel.left_out(item.source_index, item.id, item.invalid, tally.seen_ids)
        if reason is None:
            yield item
        elif skip_invalid:
            tally.skipped_invalid.append({"index": item.source_index, "id": item.id, "reason": reason})
        else:
            raise _invalid_row(source, item.source_index, item.id, reason)


def _invalid_row(source: Source, index: int, row_id: str | None, reason: str) -> InvalidSourceRow:
    """The error that names an invalid row's file and row (source row ``index``, and its id
    where it has one read), and says why."""
    path, row = source.locate(index)
    place = f"line {row + 1}" if path.suffix == ".jsonl" else f"row {row}"
    named = "" if row_id is None else f", id {row_id}"
    return InvalidSourceRow(f"{path}: {place} (source row {index}{named}): {reason}")


def _pack(
    conversations: Iterator[Encoded],
    rows: int | None,
    packer: Packer,
    writer: RowWriter,
    tally: _Tally,
    bar: Bar,
    tokenized: Bar,
    boundaries: bool = False,
) -> None:
    """Feed conversations to the packer a block at a time (``_block``) and write kept rows
    until ``rows`` (``None``: all); ``tokenized`` counts the conversations, ``bar`` the rows;
    with ``boundaries``, each row's hash covers its ``cu_seqlens``."""
    conversations = iter(conversations)
    while block := _block(conversations, rows, packer, writer, tally):
        tokenized.update(len(block))
        tally.pending = 0
        for row in packer.add_many(block):
            trainable = row.trainable
            if not trainable:
                tally.rows_skipped += 1
                tally.settle(row, kept=False)
                continue
            writer.write(row)
            tally.settle(row, kept=True)
            tally.digests.append(row_digest(row.ids, row.mask, row.cu_seqlens if boundaries else None))
            tally.supervised += trainable + int(row.mask[0])
            tally.trainable += trainable
            tally.rows_per_conversation.update(s.index for s in row.segments)
            bar.update()
            if writer.rows == rows:
                last = row.segments[-1]
                tally.tail_tokens = tally.units[last.index][0] + 1 - last.end
                return
    tally.tail_tokens = packer.filled


def _block(
    conversations: Iterator[Encoded], rows: int | None, packer: Packer, writer: RowWriter, tally: _Tally
) -> list[Unit]:
    """The next conversations for the packer, counted in ``tally``: up to ``BLOCK_UNITS`` of
    them and ``BLOCK_TOKENS`` tokens (or one conversation), and none after one whose tokens,
    with the packer's, could fill the ``rows`` still to write: the stream is read no further
    than one conversation at a time reads it."""
    room = math.inf if rows is None else (rows - writer.rows) * packer.row_tokens - packer.filled
    block: list[Unit] = []
    for item in conversations:
        ids, mask = item.ids, item.mask
        assert ids is not None and mask is not None  # _valid passes on only valid conversations
        tally.conversations_encoded += 1
        tally.tokens_encoded += len(ids) + 1
        tally.pending += len(ids) + 1
        tally.template_checked += item.checked
        tally.units[item.source_index] = (len(ids), item.source_value)
        block.append((item.source_index, item.id, ids, mask))
        if len(block) >= BLOCK_UNITS or tally.pending >= min(room, BLOCK_TOKENS):
            break
    return block


def _pack_stored(
    config: BuildConfig,
    store: TokenStore,
    order: np.ndarray,
    held: np.ndarray,
    setup: tuple[int, _Encoding],
    source: Source,
    folder: Path,
    bar: Bar,
    tallied: Callable[[parallel.Packed], None] | None = None,
    indexes: parallel.Indexes | None = None,
) -> parallel.Packed | None:
    """Pack from the store in the workers (``fixed_sft.parallel``), where the store gives
    (``held``) the conversations the rows need and the build has started at least
    ``PARALLEL_PACKING_WORKERS`` workers: to encode, or, where it encodes nothing, to pack
    many tokens (``_packs_stored_apart``). Else, or where the store holds one of
    them damaged, ``None``: the build packs in its own process (``fixed_sft.direct``, else
    one conversation at a time). An invalid conversation that stops the build raises its
    error here. The index pass is stood for by the index of every source row that the
    fill just made (``indexes``), else by the one the store keeps (``fixed_sft.kept``);
    the store keeps the one either gives, or an index pass over every row."""
    separator_id, encoding = setup
    if encoding.workers < PARALLEL_PACKING_WORKERS:
        return None  # (too few to pay)
    started = encoding.encoders is not None  # (to encode)
    if not started and not _packs_stored_apart(config, store):
        return None  # (rows too few to fork workers for)
    if parallel.reachable(store, order, held, config.row_tokens) < (config.rows or math.inf):
        return None

    # The index the store keeps (of every row: read whole) stands for the index pass (which
    # stops at the rows asked), where the rows need a good part of the source. It is read
    # before the workers fork: 16 forks beside it made it 4x slower.
    tokens = int(np.maximum(store.tokens, 0).sum()) + len(store.tokens)
    large = config.rows is None or config.rows * config.row_tokens * KEPT_INDEX_SHARE >= tokens
    read = kept.read(store, order) if held.all() and indexes is None and large else None
    run = encoding.fresh(config.rows, config.row_tokens).run if started else encoding.packers()
    with _cancelling_pool() as keeper:  # (the index kept while the rows are written: ``kept.keep`` raises nothing)
        checked = True
        blocks = None
        if indexes is not None and held.all():
            whole = indexes.by_source()
            if whole is not None:
                keeper.submit(kept.keep, store, whole)
            blocks = indexes.stream()
        elif read is not None:
            blocks, checked = read.stream(), False
        read_back: list[parallel.Indexed] = []
        if blocks is None:
            blocks = parallel.stored(store, order, held, config.rows, config.row_tokens, run, encoding.workers)
            blocks = _kept_whole(blocks, read_back, store, order, keeper)
        running = (separator_id, run)
        out = folder / PARQUET_NAME
        packed = _pack_blocks(config, store, order, blocks, running, source, out, bar, tallied, checked)
        if packed is None and not checked:
            kept.forget(store)  # (it gave way to a conversation not as it indexes it)
    return packed


def _kept_whole(
    blocks: Iterator[parallel.Block],
    read: list[parallel.Indexed],
    store: TokenStore,
    order: np.ndarray,
    keeper: ThreadPoolExecutor,
) -> Iterator[parallel.Block]:
    """``blocks`` of the index pass, each one's index kept in ``read``; where they were every
    source row's, the store keeps their index (``fixed_sft.kept``, by ``keeper``)."""
    try:
        for block in blocks:
            read.append(block.indexed)
            yield block
    finally:
        blocks.close()  # type: ignore[attr-defined]  # (a generator: ``parallel.stored``)
    if sum(len(indexed.tokens) for indexed in read) == len(order):
        indexes = parallel.Indexes(order)
        start = 0
        for indexed in read:
            indexes.add(order[start : start + len(indexed.tokens)], indexed)
            start += len(indexed.tokens)
        read.clear()  # (held in the index now)
        whole = indexes.by_source()
        if whole is not None:
            keeper.submit(kept.keep, store, whole)


def _pack_fresh(
    config: BuildConfig,
    store: TokenStore,
    order: np.ndarray,
    reading: tuple[Callable[[Callable[[], float]], Iterator[pa.Table]], Callable[..., float]],
    setup: tuple[int, _Encoding],
    source: Source,
    folder: Path,
    bars: tuple[Bar, Bar],
    tallied: Callable[[parallel.Packed], None] | None = None,
) -> parallel.Packed | None:
    """Pack a first build of some rows in the workers (``fixed_sft.parallel``), with at least
    ``PARALLEL_PACKING_WORKERS`` of them: each chunk of the packing order is encoded, stored
    and indexed in a worker (``fixed_sft.fill.fresh``), while this process reads the next;
    the rows are then cut, and written from the store. ``reading``: the chunks, sized by a
    function of the conversations still needed, and that function of ``parallel.Fed``.
    ``None`` with fewer workers, or where a worker cannot write into the store: the build
    packs in its own process (``fixed_sft.direct`` where the store now holds the
    conversations the rows need, else one at a time). An invalid conversation that stops the build
    raises its error here."""
    separator_id, encoding = setup
    if encoding.workers < PARALLEL_PACKING_WORKERS or not store.writable:
        return None
    tokenized, bar = bars
    chunks, needed = reading
    fed = parallel.Fed()
    wanted = partial(needed, fed)  # (conversations still needed, as the stream is indexed)
    tasks = (FreshTask(Chunk(rows, config.check_every), str(store.folder)) for rows in chunks(wanted))

    def blocks() -> Iterator[parallel.Block]:
        """The tasks' blocks; once they are taken, the store is read again (the tasks' segments)."""
        encoders = encoding.start()
        encoding.encoded = True
        done = encoders.run_chunks(fresh, tasks, lambda task: task.chunk, wanted)
        try:
            for result in done:
                if not result.writable:
                    raise parallel.Unheld(f"cannot write segments in {store.folder}")
                tokenized.update(len(result.block.indexed.tokens))
                yield result.block
        finally:
            done.close()
            store.refresh()

    def run(fn: Callable[[Any, Any], Any], tasks: Iterable[Any]) -> Iterator[Any]:
        # (asked for once the blocks are taken: the encoding is over)
        return encoding.fresh(config.rows, config.row_tokens).run(fn, tasks)

    running = (separator_id, run)
    out = folder / PARQUET_NAME
    return _pack_blocks(config, store, order, blocks(), running, source, out, bar, tallied, fed=fed)


def _pack_blocks(
    config: BuildConfig,
    store: TokenStore,
    order: np.ndarray,
    blocks: Iterator[parallel.Block] | parallel.Stream,
    setup: tuple[int, parallel.Run],
    source: Source,
    out: Path,
    bar: Bar,
    tallied: Callable[[parallel.Packed], None] | None = None,
    checked: bool = True,
    fed: parallel.Fed | None = None,
) -> parallel.Packed | None:
    """``parallel.pack`` of the stream's ``blocks`` into ``out``; ``setup``: the separator's
    id and where tasks run; ``tallied``: given what was packed once the rows are cut;
    ``checked``: whether the blocks come from reading the conversations (``parallel.pack``).
    ``None`` where the store does not hold what the rows need (the build packs in this
    process); an invalid conversation that stops the build raises its error here."""
    separator_id, run = setup
    shape = (config.row_tokens, separator_id, config.emit_boundaries)
    try:
        packed, stop = parallel.pack(
            store,
            order,
            blocks,
            config.rows,
            config.skip_invalid,
            config.check_every,
            shape,
            run,
            out,
            bar.update,
            fed,
            tallied,
            checked,
        )
    except parallel.Unheld:
        out.unlink(missing_ok=True)
        bar.reset()
        return None
    if stop is not None:
        raise _invalid_row(source, stop.source_index, stop.id, stop.reason)
    return packed


@contextmanager
def _cancelling_pool(threads: int = 1) -> Iterator[ThreadPoolExecutor]:
    """Background threads; on an error, their queued tasks are dropped, not run (and on
    Ctrl-C or SIGTERM, the running ones are not waited for)."""
    pool = ThreadPoolExecutor(threads)
    try:
        yield pool
    except BaseException as error:
        pool.shutdown(wait=isinstance(error, Exception), cancel_futures=True)
        raise
    pool.shutdown()


def hash_threads(files: int) -> int:
    """Threads that hash a source's ``files`` at once: one a file, at most one a core (sha256
    releases the GIL; a first build with the store waits for the hashes before it reads)."""
    return max(1, min(files, usable_cores()))


def template_kwargs(config: BuildConfig, tokenizer: ResolvedTokenizer) -> dict:
    """The chat template variables of a build: its own (``--template-kwargs``), else its tokenizer spec's."""
    return tokenizer.template_kwargs if config.template_kwargs is None else config.template_kwargs


class EncoderSetup(NamedTuple):
    """A build's tokenizer as resolved, the encoder's configuration, and the separator
    (the token after each conversation) as text and id."""

    tokenizer: ResolvedTokenizer
    encoder: EncoderConfig
    separator: str
    separator_id: int
    loaded: Encoder | None = None


def encoder_setup(config: BuildConfig, load: bool = False) -> EncoderSetup:
    """Resolve ``config``'s tokenizer and the encoder it builds with (with ``load``, loaded
    in this process, once); ``UsageError`` for a loss mask that is not the tokenizer's (or its
    spec's), or a separator not in its vocabulary."""
    tokenizer = resolve_tokenizer(
        config.tokenizer,
        config.tokenizer_revision,
        expected=config.expected_tokenizer,
        allow_unpinned=config.allow_unpinned_tokenizer,
        trust_remote_code=config.trust_remote_code,
    )
    if tokenizer.loss_mask_type not in (None, config.loss_mask_type):
        raise UsageError(
            f"tokenizer {tokenizer.name} goes with loss mask {tokenizer.loss_mask_type}, not {config.loss_mask_type}: "
            f"pass --loss-mask-type {tokenizer.loss_mask_type}"
        )
    masks = HF_MASK_TYPES if tokenizer.family == HF else KIMI_MASK_TYPES
    if config.loss_mask_type not in masks:
        kind = "a Hugging Face tokenizer" if tokenizer.family == HF else "the Kimi tokenizer"
        raise UsageError(f"loss mask {config.loss_mask_type} is not one for {kind}: pass --loss-mask-type {masks[0]}")
    bpe = config.bpe or default_bpe()
    if bpe == "gigatoken" and not fast_bpe_installed():
        raise UsageError("--bpe gigatoken: gigatoken is not installed (pip install gigatoken)")
    encoder_config = EncoderConfig(
        tokenizer.directory,
        {name: f["sha256"] for name, f in tokenizer.files.items()},
        config.loss_mask_type,
        template_kwargs(config, tokenizer),
        tokenizer.family,
        config.trust_remote_code,
        bpe,
        tokenizer.declarations,
    )
    if not config.no_cache and tokenizer.family != HF:  # (the probes' outcome kept in the store's folder)
        encoder_config = replace(encoder_config, probes=str(probes_path(_cache_root(config), encoder_config)))
    loaded = encoder_config.load() if load else None
    kimi = loaded.tokenizer if isinstance(loaded, ChatEncoder) else None
    return EncoderSetup(tokenizer, encoder_config, *encoder_config.separator(config.separator, kimi), loaded)


class _Encoding:
    """A build's ``Encoders``, started when first needed (``start``), inside ``stack``: with a
    token store that gives the first conversations, only once one is not in it."""

    def __init__(self, stack: ExitStack, config: EncoderConfig, workers: int, check_every: int):
        self.stack, self.config, self.workers, self.check_every = stack, config, workers, check_every
        self.encoders: Encoders | None = None
        self.encoded = False  # whether the encoders have been given conversations to encode
        self._checkers: list[Encoders] = []
        self.loaded: Encoder | None = None
        self.checks_apart = False  # whether the store's fill checks the sampled rows apart (``start``)
        self._forked: ProcessPool | None = None  # (``packers``)

    def start(self, checks_apart: bool = False, renderer: bool = True) -> Encoders:
        """The encoders, started now unless they are; with ``checks_apart`` (or not
        ``renderer``), workers without the template renderer (``fixed_sft.fill``), where none
        has started yet."""
        if self.encoders is None:
            self.checks_apart = checks_apart
            encoders = Encoders(self.config, self.workers, self.check_every, renderer=renderer and not checks_apart)
            self.encoders = self.stack.enter_context(encoders)
        return self.encoders

    def fresh(self, rows: int | None, row_tokens: int) -> Encoders:
        """The workers that pack and write ``rows`` rows (``None``: all; ``fixed_sft.parallel``):
        those started, unless they have encoded and the rows give each worker a part to
        write (``parallel.PART_VALUES`` tokens); those then end, with the checkers, and as
        many start anew, without the renderer. A worker that has encoded holds 20-25 MB
        of its own that writing does not need (the server's pages it wrote to, its freed
        heap); a new one shares them with the server. 16 workers on 2 cores, 80,000
        conversations: the tree's peak as the rows are written 1063-1141 -> 873-939 MiB."""
        many = rows is None or rows * row_tokens >= self.workers * parallel.PART_VALUES
        if self.encoded and self.workers > 1 and many:
            for encoders in (self.encoders, *self._checkers):
                if encoders is not None:
                    encoders.__exit__(None, None, None)  # (the stack's exit later finds them ended)
            self.encoders, self._checkers, self.encoded = None, [], False
        return self.start(renderer=False)

    def packers(self) -> parallel.Run:
        """Where a build that encodes nothing packs from the store (``fixed_sft.parallel``):
        ``workers`` processes forked from this one now (``engine.forked``), which hold its
        store and order and load nothing; they end with the build."""
        many = self.workers >= MANY_WORKERS
        pool = self._forked = self.stack.enter_context(forked(self.workers, partial(_packer_setup, many)))
        return lambda fn, tasks: pool.map(fn, ((task,) for task in tasks))

    def forks_done(self) -> None:
        """Return once the workers forked from this process (``packers``) have all started:
        a module a thread imports as a worker forks would stay half imported there."""
        if self._forked is not None:
            self._forked.started()

    def checkers(self) -> Encoders:
        """Workers of their own that check the sampled rows (``fixed_sft.fill``): one per
        ``CHECKED_BY`` workers, at least 2."""
        checkers = self.stack.enter_context(
            Encoders(self.config, max(2, self.workers // CHECKED_BY), self.check_every, renderer=False)
        )
        self._checkers.append(checkers)
        for _ in range(checkers.workers):  # (each readies itself now, while the first rows are read)
            checkers.submit(ready_to_check, None)
        return checkers

    def encode(self, chunks: Iterator[pa.Table], wanted: Callable[[], float]) -> Generator[Encoded, None, None]:
        """``Encoders.encode``, the encoders started when the first conversation is asked for."""
        encoders = self.start()
        self.encoded = True
        yield from encoders.encode(chunks, wanted)

    def one(self, source: Source, rank: np.ndarray, index: int, check_every: int | None = None) -> Encoded:
        """Source row ``index``, read and encoded in this process (a row the store held
        damaged), checked as ``check_every`` (default: the build's) samples it."""
        if self.loaded is None:
            self.loaded = self.config.load()
        rows = next(read_rows(source, rank, np.array([index])).chunks(1))
        every = self.check_every if check_every is None else check_every
        return next(encode_rows(self.loaded, Chunk(rows, every)))


def _open_store(config: BuildConfig, encoder: EncoderConfig, hashes: list[Future], rows: int) -> TokenStore | None:
    """The token store's entry for this source and encoder (``None`` with ``--no-cache``, or
    where a source file cannot be hashed: the build names that error when it ends)."""
    if config.no_cache:
        return None
    try:
        digests = [digest.result() for digest in hashes]
    except OSError:
        return None
    return TokenStore.open(_cache_root(config), store_key(digests, encoder), rows)


def _cache_root(config: BuildConfig) -> Path:
    """The token store's folder: ``--cache-dir``, else ``store.default_dir()``."""
    return Path(config.cache_dir) if config.cache_dir else default_dir()


def _fills_apart(config: BuildConfig, encoder: EncoderConfig) -> bool:
    """Whether ``config``, where it fills the store (every row, workers enough to pack),
    checks the sampled rows apart (``fixed_sft.fill``): then its workers' fork server starts
    as the build does, without the template renderer, whether or not the store then holds
    every row already (on 16 cores, the workers started 0.6-1 s later when the fork server
    started with them; one that forks no worker costs its imports, ~0.8 CPU-s on 2 cores)."""
    return (
        config.rows is None
        and config.workers >= max(PARALLEL_PACKING_WORKERS, CHECKS_APART_WORKERS)
        and config.check_every >= CHECKS_APART_EVERY
        and _probes_kept(encoder)
    )


def _packs_stored_apart(config: BuildConfig, store: TokenStore) -> bool:
    """Whether a build that encodes nothing (the store gives every conversation it needs)
    forks workers to pack (on Linux: ``FORKS_PACKERS``): with ``STORED_PACKING_CORES`` of
    them and as many cores, where its rows hold at least ``STORED_PACKING_TOKENS`` tokens
    (all rows: the store's)."""
    cores = min(config.workers, usable_cores())
    if config.rows is not None:
        tokens = config.rows * config.row_tokens
    else:
        tokens = int(np.maximum(store.tokens, 0).sum()) + len(store.tokens)  # (each with its separator)
    enough = cores >= max(PARALLEL_PACKING_WORKERS, STORED_PACKING_CORES) and tokens >= STORED_PACKING_TOKENS
    return enough and FORKS_PACKERS


def _packer_setup(many: bool) -> None:
    """A packing worker's allocators, set as an encoding worker's are (``encode._worker_setup``)."""
    map_large_allocations()
    give_back_often(many)


def _probes_kept(encoder: EncoderConfig) -> bool:
    """Whether the Kimi probes' outcome for ``encoder`` is kept (``fixed_sft.chat.read_probes``)."""
    return encoder.probes is not None and read_probes(Path(encoder.probes)) is not None


def _build_into(config: BuildConfig, folder: Path, progress: bool) -> dict:
    """Build ``config`` into the empty folder ``folder``, manifest last; return the manifest.
    The card's plots are drawn by a process started now (``plots.Plotter``)."""
    with nullcontext() if config.no_card else Plotter(config.workers >= MANY_WORKERS) as plotter:
        return _build_with(config, folder, progress, plotter)


def _build_with(config: BuildConfig, folder: Path, progress: bool, plotter: Plotter | None) -> dict:
    """``_build_into``, the card's plots drawn by ``plotter``."""
    tokenizer, encoder_config, separator, separator_id, _ = encoder_setup(config)
    with ExitStack() as stack:
        encoding = _Encoding(stack, encoder_config, config.workers, config.check_every)
        if config.no_cache:
            encoding.start()  # (at once, beside reading the source)
        elif _fills_apart(config, encoder_config):
            start_fork_server(encoder_config, renderer=False)  # (it imports while the source is opened and hashed)
        source = open_source(config.source, config.source_revision, config.source_license, config.source_files)
        hashing = stack.enter_context(_cancelling_pool(hash_threads(len(source.files))))
        if config.source_rows is not None and source.num_rows != config.source_rows:
            raise_cache_damage(source.files, BuildError)  # a damaged cached file explains the count better
            raise BuildError(
                f"source {source.name} has {source.num_rows} rows; {config.name} expects {config.source_rows}"
            )
        source_hashes = [hashing.submit(sha256_file, path) for path in source.files]
        code = hashing.submit(code_version, config.emit_boundaries)  # (git's answers meanwhile, in a checkout)
        order = permutation(config.seed, source.num_rows)
        rank = positions(order)
        sizes = file_bytes(source)
        bytes_row = sum(sizes) / max(source.num_rows, 1)
        band_budget = band_bytes(BAND_BYTES, sizes)
        if bytes_row > LARGE_ROW_BYTES:
            band_budget = band_bytes(LARGE_BAND_BYTES, sizes)
        store = _open_store(config, encoder_config, source_hashes, source.num_rows)
        skip = None
        if store is not None:
            stack.callback(store.close)
            skip = store.given(config.check_every)
        # A build of every row from a source of more than one band, or with workers enough to pack,
        # fills the store first, in one pass over the source, then takes its conversations from it
        # in packing order. With a row count, workers enough to pack settle the template checks of
        # stored conversations so (stored unchecked), where the store holds the rows' conversations.
        packing = config.workers >= PARALLEL_PACKING_WORKERS
        fill = store is not None and config.rows is None and (source.num_rows * bytes_row > band_budget or packing)
        reach = None
        if store is not None and config.rows is not None and packing and skip is not None and not skip.all():
            reach = parallel.checks_reach(store, order, skip, config.row_tokens, config.rows)
            fill = reach is not None
        # Conversations are to be encoded: the encoders start at once, beside the reading; unless the
        # store gives what the rows need, which this process then reads (they start where it gives way).
        reads_directly = (
            store is not None
            and skip is not None
            and config.workers < PARALLEL_PACKING_WORKERS
            and direct.reach(store, order, skip, config.rows, config.row_tokens, config.skip_invalid) is not None
        )
        if (skip is None or not skip.all()) and not reads_directly:
            apart = fill and config.workers >= CHECKS_APART_WORKERS and config.check_every >= CHECKS_APART_EVERY
            encoding.start(checks_apart=apart and _probes_kept(encoder_config))
            if plotter is not None:
                plotter.encodes()
        else:  # (nothing to encode: the build is soon at its plots)
            if plotter is not None:
                plotter.load()
        packer = Packer(config.row_tokens, separator_id)
        tally = _Tally(row_tokens=config.row_tokens)

        def needed(packed: int, conversations: int, tokens: int) -> float:
            """Conversations the rows still to fill need, plus a fifth, where ``packed``
            tokens are in rows so far, of ``tokens`` in ``conversations`` encoded: the
            tokens left over the tokens per conversation so far (before any, a token per
            4 source bytes); without a row count, all."""
            if config.rows is None:
                return math.inf
            per_conversation = tokens / conversations if conversations else bytes_row / 4
            return 1.2 * (config.rows * config.row_tokens - packed) / max(per_conversation, 1.0)

        def wanted() -> float:
            """``needed`` as one conversation at a time has packed so far."""
            packed = len(tally.digests) * config.row_tokens + packer.filled + tally.pending
            return needed(packed, tally.conversations_encoded, tally.tokens_encoded)

        def chunk_rows(wanted: Callable[[], float] = wanted, most: int = CHUNK_ROWS) -> int:
            """Rows in the next chunk: ``most``, or the conversations wanted where fewer
            (so that a build that needs one does not have 128 encoded)."""
            return max(1, math.ceil(min(most, wanted())))

        def band_rows(wanted: Callable[[], float] = wanted) -> int:
            """Rows in the next band: those wanted and a chunk more (``CHUNK_ROWS`` rows, or
            as many as ``CHUNK_BYTES`` holds at the source's average size), within the band
            memory budget (of large rows: with their read copies); ``_chunks`` reads at least one."""
            per_row = max(bytes_row, 1.0)
            return int(min(band_budget / per_row, wanted() + min(CHUNK_ROWS, CHUNK_BYTES / per_row)))

        def fed_wanted(fed: parallel.Fed) -> float:
            """``needed`` as the workers have indexed the stream so far (``_pack_fresh``)."""
            return needed(fed.tokens, fed.conversations, fed.tokens)

        def fed_chunks(wanted: Callable[[], float]) -> Iterator[pa.Table]:
            """The chunks of the packing order, sized by ``wanted`` (``_pack_fresh``)."""
            fresh_bytes = max(LARGE_ROW_BYTES, IN_FLIGHT_BYTES // (2 * config.workers))
            rows = partial(chunk_rows, wanted, FRESH_CHUNK_ROWS)
            return _chunks(source, rank, partial(band_rows, wanted), rows, chunk_bytes=fresh_bytes)

        def tallied(packed: parallel.Packed) -> None:
            """Have the card's plots of what the workers packed drawn while they write the
            rows, and what writes its header imported meanwhile."""
            if plotter is not None:
                encoding.forks_done()  # (before any import here; the rows are written once they have)
                from .card import import_soon

                counted = _Tally(row_tokens=config.row_tokens)
                counted.take(packed)
                plotter.start(counted.plot_inputs(packed.rows))
                import_soon()

        def read_directly(bar: Bar) -> parallel.Packed | None:
            """Pack in this process, reading the rows straight from the store (``fixed_sft.direct``),
            where it gives the conversations the rows need (``direct.reach``); ``None``
            where it cannot (nothing is then left written): the build packs one conversation
            at a time."""
            assert store is not None and skip is not None
            given = direct.reach(store, order, skip, config.rows, config.row_tokens, config.skip_invalid)
            if given is None:
                return None
            writer = RowWriter(folder / PARQUET_NAME, config.emit_boundaries)
            shape = (config.row_tokens, separator_id, config.emit_boundaries)
            try:
                packed = direct.pack(store, order, config.rows, shape, config.check_every, writer, bar.update, given)
                tallied(packed)  # (the plots drawn while the last rows are written)
                writer.close()
            except direct.Unsuited:
                writer.abort()
                (folder / PARQUET_NAME).unlink(missing_ok=True)
                bar.reset()
                return None
            except BaseException:
                writer.abort()
                raise
            packed.parquet_sha256 = writer.sha256
            return packed

        def streamed(skip: np.ndarray | None, tokenized: Bar, bar: Bar) -> int:
            """Pack one conversation at a time, in packing order: those ``skip`` marks from the
            store, the others read and encoded; the rows written."""
            writer = RowWriter(folder / PARQUET_NAME, config.emit_boundaries)
            stream = encoding.encode(_chunks(source, rank, band_rows, chunk_rows, skip), wanted)
            merged = None
            try:
                if store is not None:
                    merged = store.stream(order, stream, config.check_every, partial(encoding.one, source, rank))
                valid = _valid(stream if merged is None else iter(merged), source, config.skip_invalid, tally)
                try:
                    _pack(valid, config.rows, packer, writer, tally, bar, tokenized, config.emit_boundaries)
                except InvalidSourceRow:
                    if merged is not None:
                        merged.finish()  # (a stored conversation before it whose check fails stops the build first)
                    raise
                if merged is not None:
                    merged.finish()  # (the checks of stored conversations, before the rows count)
                if plotter is not None:
                    plotter.start(tally.plot_inputs(len(tally.digests)))  # (drawn while the last rows are written)
                writer.close()  # (here: a signal while the last row group is written still waits for its thread)
                tally.parquet_sha256 = writer.sha256
            except BaseException:
                writer.abort()
                raise
            finally:
                (stream if merged is None else merged).close()
            return writer.rows

        # Large rows, or bands read while an earlier one is held (the first band's estimate over the
        # budget): the build's large buffers are each a mapping from now on, in this process (at a
        # cost in page faults: a one-band build keeps glibc's reuse of its freed blocks).
        if bytes_row > LARGE_ROW_BYTES or (not fill and min(source.num_rows, wanted()) * bytes_row > band_budget):
            map_large_allocations()
        every = source.num_rows if config.rows is None else None
        try:
            with (
                _bar(progress, total=every, unit="conv", desc="tokenize", position=0) as tokenized,
                _bar(progress, total=config.rows, unit="row", desc=f"write {config.name}", position=1) as bar,
            ):
                indexes = None
                if fill:
                    assert store is not None
                    large_rows = encoding.workers > 1 and bytes_row > LARGE_ROW_BYTES
                    indexes = _fill(store, encoding, source, order, large_rows, tokenized, reach)
                    skip = store.given(config.check_every)
                    tokenized = _Silent()  # (counted as filled)
                packed = None
                if store is not None and skip is not None:
                    setup = (separator_id, encoding)
                    packed = _pack_stored(config, store, order, skip, setup, source, folder, bar, tallied, indexes)
                elif store is not None and config.rows is not None:
                    setup = (separator_id, encoding)
                    reading = (fed_chunks, fed_wanted)
                    bars = (tokenized, bar)
                    packed = _pack_fresh(config, store, order, reading, setup, source, folder, bars, tallied)
                    if packed is None:  # (what its workers stored before one could not is held now)
                        skip = store.given(config.check_every)
                if packed is None and store is not None and skip is not None:
                    packed = read_directly(bar)
                    if packed is None:  # (a damaged conversation it found is no longer held)
                        skip = store.given(config.check_every)
                if packed is None:
                    written = streamed(skip, tokenized, bar)
                else:
                    tally.take(packed)
                    tokenized.update(packed.conversations_encoded)
                    written = packed.rows
        except (SourceError, InvalidSourceRow):
            raise_cache_damage(source.files, BuildError)  # a damaged cached file explains the error better
            raise
        if written == 0 or (config.rows is not None and written < config.rows):
            asked = (
                f"--rows is {config.rows} (--rows all builds every row it fills)"
                if config.rows is not None
                else "a build needs at least one"
            )
            filled = f"the source fills only {written} rows of {config.row_tokens} tokens"
            skipped = len(tally.skipped_invalid)
            invalid = f" ({skipped} source rows skipped as invalid, of {source.num_rows})" if skipped else ""
            raise BuildError(f"{filled} with supervised tokens{invalid}; {asked}")
        if config.check_every and not tally.template_checked:
            _check_first(encoding, source, rank, tally, store)
        source_files = recorded_files(source, source_hashes)
    remove_parts(folder)  # (a part a worker still wrote as its pass gave way: the workers have ended)
    bpe_used = bpe_version(encoder_config.bpe) if tokenizer.family != HF else None
    version = CodeVersion(**code.result(), bpe=bpe_used)
    manifest = _manifest(config, source, source_files, tokenizer, tally, folder / PARQUET_NAME, separator, version)
    if not config.no_card:
        from .card import Figures, card_license, write_card

        license = card_license(config.card_license, manifest.source.license)
        figures = Figures(tally.row_supervised, tally.conversation_tokens)
        manifest.card = write_card(folder, manifest, figures, license, upstream(config, source), plotter)
    document = manifest.to_json()
    _write_manifest(folder / MANIFEST_NAME, document)
    return document


def _check_first(
    encoding: _Encoding, source: Source, rank: np.ndarray, tally: _Tally, store: TokenStore | None
) -> None:
    """Check the first conversation the rows hold against the rendered template, for a
    build whose stream took none that ``encode.sampled`` picks (a build of a few rows):
    every build with ``--check-every`` checks one at least. A copy in the store that passed
    the check counts; else it is encoded again and checked, and must be the stored copy
    (``StoreMismatch``). A failure stops the build."""
    first = next(iter(tally.rows_per_conversation))
    stored = store.lookup(first) if store is not None else None
    if stored is None or not stored.checked:
        item = encoding.one(source, rank, first, check_every=1)
        if store is not None and stored is not None and not same_encoding(stored, item):
            raise StoreMismatch.of(first, store.folder)
        if store is not None:
            store.add(item)
    tally.template_checked = 1


def upstream(config: BuildConfig, source: Source) -> str | None:
    """The Hub dataset a build's source rows come from: the source itself when it is a Hub
    download, else the named build's own source (a Hub id), where the local source is a
    copy of it: at its revision (``--source-revision``, as README's offline build gives
    it), or of its row count. Any other local source claims no upstream."""
    if source.revision is not None and not Path(source.name).exists() and is_hub_id(source.name):
        return source.name
    if (BUILDS / f"{config.name}.json").is_file():
        spec = build_spec(config.name)
        named = spec["source"]
        copy = config.source_revision == spec.get("source_revision") or source.num_rows == spec.get("source_rows")
        return named if copy and is_hub_id(named) and not Path(named).exists() else None
    return None


def recorded_files(source: Source, hashes: list[Future]) -> list[dict]:
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
    raise_cache_damage(source.files, BuildError, digests)
    return [
        {"path": path.relative_to(source.root).as_posix(), "bytes": size, "sha256": digest}
        for path, size, digest in zip(source.files, (stamp.bytes for stamp in source.stamps), digests)
    ]


def source_record(source: Source, files: list[dict]) -> SourceRecord:
    """The manifest's ``source`` of ``source``, whose files are ``files`` (``recorded_files``)."""
    return SourceRecord(
        name=source.name,
        revision=source.revision,
        license=source.license,
        file_patterns=list(source.patterns) if source.patterns is not None else None,
        rows=source.num_rows,
        files=[SourceFile(**file) for file in files],
    )


def _manifest(
    config: BuildConfig,
    source: Source,
    source_files: list[dict],
    tokenizer: ResolvedTokenizer,
    tally: _Tally,
    parquet: Path,
    separator: str,
    version: CodeVersion,
) -> Manifest:
    """``manifest.json`` of a finished build (keys: data/README.md); ``separator``: the
    token after each conversation, as resolved (the eos token when none was named);
    ``version``: the code's (``code_version``, and the Kimi tokenizer's BPE)."""
    return Manifest(
        format=format_of(config.emit_boundaries),  # type: ignore[arg-type]  # (one of manifest.Format)
        name=config.name,
        code_version=version,
        params=Params(
            order=ORDER_RULE,
            **{
                name: to_json(name, getattr(config, name))
                for name, path in RECORDED.items()
                if path.startswith("params.") and name != "separator"
            },
            separator=separator,
        ),
        source=source_record(source, source_files),
        tokenizer=tokenizer.manifest(),
        loss_mask=LossMask(type=config.loss_mask_type, template_kwargs=template_kwargs(config, tokenizer)),
        template_check=TemplateCheck(every=config.check_every, checked=tally.template_checked, sample="source_row"),
        stats=Stats(**tally.stats()),
        source_mix=tally.source_mix(),
        skipped_invalid=[SkippedRow(**row) for row in tally.skipped_invalid],
        parquet=ParquetFile(
            path=PARQUET, bytes=parquet.stat().st_size, sha256=tally.parquet_sha256 or sha256_file(parquet)
        ),
        rows_sha256=rows_digest(tally.digests),
        row_sha256=[d.hex() for d in tally.digests],
    )


def _write_manifest(path: Path, manifest: dict) -> None:
    with naming(path), path.open("w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, allow_nan=False)  # (standard JSON, which verify reads)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())

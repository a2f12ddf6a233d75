"""Filling the token store where the conversations are encoded: a task encodes rows and stores them.

A build that takes every row of a source larger than a band fills the store first, in one
pass over the source. Its tasks are cut by row group (a JSONL file is one task): each reads
the rows the store lacks from its group, a batch at a time, encodes them (those
``encode.sampled`` picks also through the template) and writes them as segments of its
own. The build's process only hands out tasks, so the pass runs in as many workers as
there are row groups. Each task gives back the index of what it stored
(``parallel.Indexes``), so that packing need not read it back.

With many workers (``build.CHECKS_APART_WORKERS``) and the template's probes kept
(``fixed_sft.chat.read_probes``), the workers do not import the template renderer: they
store the rows that are not sampled and give back the sampled ones as they read them,
which a few processes of their own encode and check (``check_apart``), storing them once
checked. So a row whose check fails is not stored, as when its worker checks it.

A first build of some rows, with workers enough to pack (``fixed_sft.parallel``), gives them
its chunks as it reads them, in packing order (``FreshTask``): each is encoded, stored and
indexed where it is encoded, so that only its index comes back; the rows are then cut and
written from the store.

An invalid row is stored as such. A conversation whose template check fails is not stored,
nor is the rest of its chunk: the build reaches them later, in packing order, and stops at
the first failure there, as it would without the store.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from . import arrow
from .bands import FILL_BATCH_BYTES, Band, file_reads, read_file_rows, row_groups
from .encode import Chunk, Encoded, Record, encode_records, encode_rows, release_after, sampled
from .encode import ready_to_check as ready
from .encoding import Encoder, TemplateMismatch
from .memory import give_back_between, give_back_free
from .parallel import Block, Indexed
from .records import records
from .source import Source, Stamp
from .store import SegmentWriter


class FillTask(NamedTuple):
    """Source rows ``start + local`` of file ``path`` (of ``rows`` rows), all in one row
    group; encoded in chunks of at most ``chunk_rows`` rows and
    ``chunk_bytes`` bytes (or one row), as a build's; stored into the entry ``folder``.
    With ``apart``, the rows ``sampled`` by it are given back, to be checked apart, instead of stored."""

    path: str
    start: int
    rows: int
    local: np.ndarray
    check_every: int
    chunk_rows: int
    chunk_bytes: int
    folder: str
    apart: int = 0
    source_column: bool = False  # whether the file's ``source`` column is read (``Source.source_columns``)
    stamp: Stamp | None = None  # the file's ``Source.stamps``: rows read after it changed are not stored


class Filled(NamedTuple):
    """What a task did: the conversations it encoded, whether it could write them
    (``SegmentWriter.writable``), the rows it gives back to be checked apart, and the index
    of those it stored (``parallel.Indexes``: a part per chunk)."""

    conversations: int
    writable: bool
    sampled: list[Record] = []
    sampled_bytes: int = 0  # the source bytes of those rows
    indexed: list[tuple[np.ndarray, Indexed]] = []


def _indexed(items: list[Encoded]) -> tuple[np.ndarray, Indexed]:
    """Source rows and index of stored conversations (an index part of ``Filled``)."""
    return np.array([item.source_index for item in items], np.int64), Indexed.of(items)


class CheckTask(NamedTuple):
    """Rows read by a ``FillTask`` (``Filled.sampled``), to be encoded, checked and stored
    into the entry ``folder``."""

    rows: list[Record]
    folder: str


def fill_tasks(
    source: Source, wanted: np.ndarray, check_every: int, chunks: tuple[int, int], folder: Path
) -> Iterator[FillTask]:
    """The tasks that store the source rows ``wanted`` marks, in source order: one per row
    group holding one; ``chunks``: their ``chunk_rows`` and ``chunk_bytes``."""
    for file in file_reads(source):
        local = np.flatnonzero(wanted[file.start : file.start + file.rows])
        if len(local):
            ends = np.asarray(row_groups(file.path, file.rows))
            groups = np.searchsorted(ends, local, side="right")  # each row's row group
            cuts = np.flatnonzero(np.diff(groups)) + 1
            for part in np.split(local, cuts):
                yield FillTask(
                    str(file.path),
                    file.start,
                    file.rows,
                    part,
                    check_every,
                    *chunks,
                    str(folder),
                    source_column=file.source_column,
                    stamp=file.stamp,
                )


def fill(encoder: Encoder, task: FillTask) -> Filled:
    """Read, encode and store a task's rows (module docstring)."""
    inside = np.zeros(task.rows, bool)
    inside[task.local] = True
    with SegmentWriter(Path(task.folder), quiet=True) as writer:  # (the build's process says it once)
        conversations = apart_bytes = 0
        apart: list[Record] = []
        index = []
        batches = read_file_rows(Path(task.path), task.start, inside, task.source_column, FILL_BATCH_BYTES, task.stamp)
        for batch in batches:
            for rows in Band([batch], [np.arange(batch.num_rows)]).chunks(task.chunk_rows, task.chunk_bytes):
                picked = set()
                if task.apart:
                    chosen = sampled(arrow.to_numpy(rows.column("index")), task.apart)
                    given_rows = rows.filter(arrow.numbers(chosen, pa.bool_()))
                    given = records(given_rows)
                    picked = {index for index, _ in given}
                    apart += given
                    apart_bytes += sum(given_rows.column("bytes").to_pylist())
                stored: list[Encoded] = []
                try:
                    for item in encode_rows(encoder, Chunk(rows, task.check_every)):
                        if item.source_index not in picked:  # (a row given back is stored by its check)
                            writer.add(item)
                            stored.append(item)
                        conversations += 1
                except TemplateMismatch:
                    pass  # (reached in packing order, where it stops the build)
                if not writer.writable:
                    return Filled(conversations, False)
                if stored:
                    index.append(_indexed(stored))
            del batch
            give_back_between()  # (a batch's freed memory, with many workers)
        writer.flush()
        give_back_free()  # (what the task freed, fragmented under what the next allocates: 20-40 MB)
        return Filled(conversations, writer.writable, apart, apart_bytes, index)


def ready_to_check(encoder: Encoder, _: None) -> None:
    """``fixed_sft.encode.ready_to_check`` in a checker, as a task."""
    ready(encoder)


def check_apart(encoder: Encoder, task: CheckTask) -> Filled:
    """Encode, check and store rows given back by a ``FillTask``: up to the first whose
    check fails (reached in packing order, where it stops the build)."""
    with SegmentWriter(Path(task.folder), quiet=True) as writer:
        stored: list[Encoded] = []
        try:
            for item in encode_records(encoder, task.rows, itertools.repeat(True)):
                writer.add(item)
                stored.append(item)
        except TemplateMismatch:
            pass
        writer.flush()
        return Filled(len(task.rows), writer.writable, indexed=[_indexed(stored)] if stored else [])


class FreshTask(NamedTuple):
    """A chunk of the packing order, to be encoded and stored into the entry ``folder``."""

    chunk: Chunk
    folder: str


class Fresh(NamedTuple):
    """What a ``FreshTask`` did: its conversations' index (the ``mismatch`` that ends it, if
    any), and whether it could store them (``SegmentWriter.writable``)."""

    block: Block
    writable: bool


def fresh(encoder: Encoder, task: FreshTask) -> Fresh:
    """Encode a chunk, store it as a segment of its own, and index it: up to the first
    conversation whose template check fails."""
    with SegmentWriter(Path(task.folder), quiet=True) as writer:  # (the build's process says it once)
        items: list[Encoded] = []
        mismatch = None
        try:
            for item in encode_rows(encoder, task.chunk):
                writer.add(item)
                items.append(item)
        except TemplateMismatch as error:
            mismatch = error
        writer.flush()
        release_after(task.chunk.rows)
        return Fresh(Block(Indexed.of(items), mismatch), writer.writable)

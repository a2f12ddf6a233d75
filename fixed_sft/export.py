"""A verified build -> one Parquet file in another trainer's packed layout (TRL, Megatron-Bridge).

Each exported row is one build row, in order, with the same ids; its conversation
boundaries are the row's segments (data/README.md), so a trainer that attends within a
boundary sees each conversation on its own, positions restarting at 0 for each segment
(a conversation continued from the row before restarts too, as TRL's ``bfd_split`` does
for a split sequence). Such a trainer never trains the first token of a segment (there
is nothing before it to predict it from), so the trained tokens are the supervised
tokens that do not start a segment: the build's ``trainable_tokens`` less any supervised
token that starts a conversation inside a row (none with the ``kimi_k25`` mask, whose
conversations start with a role header).

- ``trl``: ``input_ids``, ``labels`` (the id where the mask is 1, else -100; aligned
  with ``input_ids``: the model shifts them) and ``seq_lengths`` (the segments'
  lengths), as TRL's ``pack_dataset`` writes and its ``DataCollatorForLanguageModeling``
  reads with ``padding_free=True``.
- ``megatron-bridge``: ``input_ids`` (int32), ``loss_mask`` (int8) and ``seq_start_id``
  (int32, the segments' starts), as ``GPTSFTPackedParquetDataset`` reads. Its collate
  function trains label ``input_ids[t + 1]`` where ``loss_mask[t]`` is 1, within a
  segment, so ``loss_mask[t]`` is the build's mask at ``t + 1``, and 0 at a segment's
  last token.

The folder must verify first (``verify``), each row read must still hash to its manifest
entry, and the file must be the one verified, its ``source.Stamp`` unchanged from before
``verify`` to the end of the read (a fixed-sft/2 row's hash does not cover its
segments). The file is written a row group at a time into a temporary folder beside
``OUT`` and linked into place only once complete; an existing ``OUT`` is refused, and so
is one inside a build (which would then no longer be one).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .errors import BuildError, UsageError
from .folder import new_file, writing_new
from .hashes import boundaries, row_digest
from .manifest import Manifest, read
from .output import MANIFEST_NAME, PARQUET_NAME, naming
from .reader import RowFile
from .source import stamp_if_any
from .verify import described, read_manifest, verify

IGNORE_INDEX = -100  # a label that trains nothing (PyTorch's cross-entropy default, which TRL pads with)

TRL_SCHEMA = pa.schema(
    [
        ("input_ids", pa.list_(pa.int32())),
        ("labels", pa.list_(pa.int32())),
        ("seq_lengths", pa.list_(pa.int32())),
    ]
)
MEGATRON_SCHEMA = pa.schema(
    [
        ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("seq_start_id", pa.list_(pa.int32())),
    ]
)
COLUMNS = [  # what an export reads of a build
    "metadata.input_ids.list.element",
    "metadata.loss_mask.list.element",
    "metadata.segments.list.element.start",
    "metadata.segments.list.element.end",
]


def trl_row(ids: np.ndarray, mask: np.ndarray, lengths: np.ndarray) -> dict[str, np.ndarray]:
    """A build row (``ids``, ``mask``, and its segments' ``lengths``) as TRL's packed row:
    ``labels`` is the id where the mask is 1 and -100 elsewhere."""
    labels = np.where(mask == 1, ids, IGNORE_INDEX)
    return {"input_ids": ids, "labels": labels, "seq_lengths": lengths}


def megatron_row(ids: np.ndarray, mask: np.ndarray, lengths: np.ndarray) -> dict[str, np.ndarray]:
    """A build row as Megatron-Bridge's packed row: ``seq_start_id`` the segments' starts,
    and ``loss_mask[t]`` the mask of token ``t + 1``, 0 at each segment's last token
    (whose next token is not in its segment)."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    shifted = np.zeros(len(mask), np.int8)
    shifted[:-1] = mask[1:]
    shifted[np.cumsum(lengths) - 1] = 0
    return {"input_ids": ids, "loss_mask": shifted, "seq_start_id": starts}


def trained(mask: np.ndarray, lengths: np.ndarray) -> int:
    """How many of a row's tokens a trainer that attends within its segments trains: the
    supervised ones that do not start a segment."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return int(np.count_nonzero(mask)) - int(np.count_nonzero(mask[starts]))


@dataclass(frozen=True)
class Target:
    """A trainer's layout: its schema, and the conversion of one row."""

    name: str
    schema: pa.Schema
    convert: Callable[[np.ndarray, np.ndarray, np.ndarray], dict[str, np.ndarray]]


TARGETS = {
    "trl": Target("trl", TRL_SCHEMA, trl_row),
    "megatron-bridge": Target("megatron-bridge", MEGATRON_SCHEMA, megatron_row),
}


@dataclass
class Exported:
    """What an export wrote: rows, conversation pieces (segments) and trained tokens."""

    path: Path
    rows: int
    segments: int
    trained_tokens: int
    trainable_tokens: int


def _rows(folder: Path, manifest: Manifest, expected: list[bytes]) -> Iterator[list[tuple]]:
    """The build's rows, a row group at a time: ``(ids, mask, lengths)`` of each, once
    it hashes to its manifest entry (else ``BuildError``: the file changed since verified)."""
    try:
        yield from _read(folder, manifest, expected)
    except (ValueError, OSError, pa.ArrowException) as error:  # (the reader's refusals are ValueErrors)
        raise BuildError(f"{folder / PARQUET_NAME}: changed since it was verified ({described(error)})") from None


def _read(folder: Path, manifest: Manifest, expected: list[bytes]) -> Iterator[list[tuple]]:
    bounded = manifest.params.emit_boundaries
    with RowFile(folder / PARQUET_NAME, len(expected), manifest.params.row_tokens, bounded) as rows:
        for group in rows.groups(COLUMNS, limit=len(expected)):
            ids, mask, offsets = group.tokens()
            segments = pc.struct_field(group.column("metadata"), "segments")
            spans = segments.flatten()
            ends = pc.struct_field(spans, "end").to_numpy(zero_copy_only=False).astype(np.int64)
            starts = pc.struct_field(spans, "start").to_numpy(zero_copy_only=False).astype(np.int64)
            bounds = segments.offsets.to_numpy() - segments.offsets[0].as_py()
            batch = []
            for n in range(group.rows):
                row = group.first + n
                lo, hi = offsets[n], offsets[n + 1]
                row_ids, row_mask = ids[lo:hi].astype(np.int32), mask[lo:hi].astype(np.uint8)
                lengths = (ends - starts)[bounds[n] : bounds[n + 1]].astype(np.int32)
                cu = boundaries(lengths) if bounded else None  # (verified to be the stored ones)
                if row >= len(expected) or row_digest(row_ids, row_mask, cu) != expected[row]:
                    raise BuildError(f"{folder / PARQUET_NAME}: row {row} changed since it was verified")
                batch.append((row_ids, row_mask, lengths))
            yield batch


def _table(target: Target, batch: list[tuple]) -> pa.Table:
    """Rows ``batch`` converted, as a table of ``target``'s schema (each column one list array)."""
    converted = [target.convert(*row) for row in batch]
    columns = []
    for field in target.schema:
        parts = [row[field.name] for row in converted]
        offsets = np.concatenate([[0], np.cumsum([len(part) for part in parts])]).astype(np.int32)
        values = pa.array(np.concatenate(parts), field.type.value_type)  # (a safe cast where a dtype is wider)
        columns.append(pa.ListArray.from_arrays(pa.array(offsets), values))
    return pa.Table.from_arrays(columns, schema=target.schema)


def export(folder: str | Path, to: str, out: str | Path) -> Exported:
    """Write build ``folder`` as ``to``'s (a ``TARGETS`` key) packed Parquet file ``out``
    (see the module docstring). ``UsageError`` for an unknown target or an ``out`` that
    exists; ``BuildError`` for a folder that does not verify."""
    folder, out = Path(folder), Path(out)
    if to not in TARGETS:
        raise UsageError(f"unknown export target {to!r}; choose one of {', '.join(TARGETS)}")
    target = TARGETS[to]
    new_file(out)  # (usage errors before the folder is verified)
    parquet = folder / PARQUET_NAME
    verified = stamp_if_any(
        parquet
    )  # (before verify reads it: unchanged after the export's read, it was the file verified)
    problems = verify(folder)
    if problems:
        raise BuildError(f"{folder} does not verify, so it is not exported: {problems[0]}")
    manifest = read(read_manifest(folder / MANIFEST_NAME))
    expected = [bytes.fromhex(h) for h in manifest.row_sha256]
    provenance = {
        "export": target.name,
        "name": manifest.name,
        "format": manifest.format,
        "rows_sha256": manifest.rows_sha256,
        "parquet_sha256": manifest.parquet.sha256,
    }
    schema = target.schema.with_metadata({"fixed_sft": json.dumps(provenance, sort_keys=True)})
    rows = segments = trained_tokens = 0
    with writing_new(out) as part, naming(part):
        with pq.ParquetWriter(part, schema, compression="zstd") as writer:
            for batch in _rows(folder, manifest, expected):
                writer.write_table(_table(target, batch))
                rows += len(batch)
                segments += sum(len(lengths) for *_, lengths in batch)
                trained_tokens += sum(trained(mask, lengths) for _, mask, lengths in batch)
        if stamp_if_any(parquet) != verified or rows != len(expected):  # (its segments: in no fixed-sft/2 hash)
            raise BuildError(f"{parquet}: changed since it was verified")
    return Exported(out, rows, segments, trained_tokens, manifest.stats.trainable_tokens)

"""miles on fixed-sft rows: a rollout function and a data source (docs/miles.md).

A row's tokens are in its ``metadata`` column (``input_ids``, ``loss_mask``); its
``messages`` column is one placeholder message, so that miles' own ``Dataset`` finds the
list of messages it requires when the checkpoint has a processor. The recipe trains with
``--input-key messages --metadata-key metadata --rollout-function-path
pretokenized_sft_rollout.generate_rollout --loss-type sft_loss`` (this file importable
on PYTHONPATH; it needs pyarrow and numpy only). Large sets add ``--data-source-path
pretokenized_sft_rollout.ParquetRowSource``, which reads the Parquet a row group at a
time instead of holding every row as Python lists.

Rule for a sample: ``tokens`` are the row's ids; the response runs from the first
supervised token to the end of the row, but starts at token 1 at the earliest, since
miles scores response token ``p`` from the logit at ``p - 1``; ``loss_mask`` is the
row's mask over the response; ``reward`` is 0. Checked against miles commit 78527b91
(``miles/utils/data.py``, ``miles/rollout/data_source.py``,
``miles/ray/rollout/train_data_conversion.py``).

Segment mode (``--data-source-path pretokenized_sft_rollout.ParquetSegmentSource``): one
sample per conversation segment of a row (``metadata.segments``), by the same rule applied
to the segment's tokens, all of a row's samples in one group and sharing its
``rollout_id``, so miles gives each its own ``cu_seqlens`` entry (attention and positions
stay inside a conversation) and still counts and averages the row as one rollout. A segment
with no supervised token after its own first token trains nothing and is left out. Only for
the Megatron backend with ``--use-dynamic-batch-size`` (docs/miles.md says why).
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

try:  # inside miles; elsewhere the module still imports, and the data source says what it needs
    from miles.rollout.data_source import DataSource
    from miles.utils.types import Sample
except ImportError:
    DataSource, Sample = object, None  # type: ignore[assignment,misc]

logger = logging.getLogger(__name__)

PROMPT = [{"role": "user", "content": ""}]  # every row's ``messages`` (data/README.md)
GROUP_ROWS = 128  # the most rows a build writes in a row group (fixed_sft.output.ROWS_PER_GROUP)


def response(ids: list[int], mask: list[int]) -> tuple[int, list[int]]:
    """``(response_length, loss_mask)`` of a row: from its first supervised token, at
    token 1 at the earliest, to its end.

    >>> response([5, 6, 7, 8], [0, 0, 1, 0])
    (2, [1, 0])
    >>> response([5, 6, 7, 8], [1, 0, 1, 0])
    (3, [0, 1, 0])
    """
    if len(ids) != len(mask):
        raise ValueError(f"fixed-sft row has {len(ids)} ids but {len(mask)} mask values")
    if 1 not in mask[1:]:
        raise ValueError("fixed-sft row has no supervised token after token 0: nothing to train")
    first = max(mask.index(1), 1)
    return len(ids) - first, mask[first:]


def segment_responses(mask: list[int], lengths: list[int]) -> list[tuple[int, int, int, int, list[int]]]:
    """``(segment, start, end, response_length, loss_mask)`` of each segment of a row that
    trains, in order: segment ``k``, of ``lengths[k]`` tokens from where the ones before it
    end, its response by ``response``'s rule over its own mask (so its first token is never
    trained); a segment with no supervised token after its first is left out.

    >>> segment_responses([0, 1, 0, 0, 1, 1, 1, 0], [1, 2, 5])
    [(2, 3, 8, 4, [1, 1, 1, 0])]
    """
    if sum(lengths) != len(mask):
        raise ValueError(f"fixed-sft row's segments cover {sum(lengths)} tokens, not its {len(mask)}")
    spans, start = [], 0
    for k, length in enumerate(lengths):
        end = start + length
        part = mask[start:end]
        if 1 in part[1:]:
            first = max(part.index(1), 1)
            spans.append((k, start, end, length - first, part[first:]))
        start = end
    return spans


def apply_row(sample: Any) -> None:
    """Set ``tokens``, ``response_length``, ``loss_mask`` and ``reward`` of a sample miles'
    ``Dataset`` made from a row (its ids and mask in ``sample.metadata``); a sample that
    already has tokens (``ParquetRowSource`` makes them ready) is left as it is."""
    if sample.tokens:
        return
    row = sample.metadata
    if not isinstance(row, dict) or "input_ids" not in row or "loss_mask" not in row:
        raise ValueError(
            f"sample.metadata is not a fixed-sft row (a {type(row).__name__}): train on fixed-sft/2 Parquet "
            "with --input-key messages --metadata-key metadata and the rollout global dataset on"
        )
    ids, mask = list(row["input_ids"]), list(row["loss_mask"])
    sample.response_length, sample.loss_mask = response(ids, mask)
    sample.tokens = ids
    sample.reward = 0
    del row["input_ids"], row["loss_mask"]  # held once: the sample is miles' own copy


def one_row(group: list[Any]) -> bool:
    """Whether ``group`` is the samples of one row in segment mode: ready, and sharing one
    ``rollout_id`` (``ParquetSegmentSource``)."""
    rollout_ids = {getattr(sample, "rollout_id", None) for sample in group}
    return len(rollout_ids) == 1 and None not in rollout_ids and all(sample.tokens for sample in group)


def check_group_size(n_samples_per_prompt: int) -> None:
    """A row trains once a step: miles copies each prompt ``--n-samples-per-prompt`` times."""
    if n_samples_per_prompt != 1:
        raise ValueError(
            f"a group holds {n_samples_per_prompt} copies of one row, which would train it "
            f"{n_samples_per_prompt} times a step: pass --n-samples-per-prompt 1"
        )


def check_whole_steps(args: Any) -> None:
    """miles trains a rollout's groups in whole steps of ``--global-batch-size`` and drops the
    rest (miles ``78527b91``: ``postprocess_rollout_data`` in
    ``miles/ray/rollout/rollout_data_conversion.py``, ``build_dp_schedule`` in
    ``miles/utils/dp_schedule.py``), while the data source has moved past them: a
    ``--rollout-batch-size`` that is not a multiple of it leaves rows untrained. (With
    ``--use-dynamic-global-batch-size`` miles cuts to its data-parallel size instead.
    ``--allow-partial-train-step`` trains the rest as a smaller step only where it holds a
    sample per data-parallel rank: refused too.)"""
    rollouts, step = getattr(args, "rollout_batch_size", None), getattr(args, "global_batch_size", None)
    if getattr(args, "use_dynamic_global_batch_size", False) or not rollouts or not step or rollouts % step == 0:
        return
    partial = (
        " (--allow-partial-train-step trains them only where they hold a sample per data-parallel rank, "
        "which a rollout cannot see)"
        if getattr(args, "allow_partial_train_step", False)
        else ""
    )
    raise ValueError(
        f"--rollout-batch-size {rollouts} is not a multiple of --global-batch-size {step}: miles would drop "
        f"{rollouts % step} rows of each rollout untrained{partial}"
    )


def generate_rollout(args: Any, rollout_id: int, data_buffer: Any, evaluation: bool = False) -> list[list[Any]]:
    """Take ``args.rollout_batch_size`` groups of one sample each and fill each from its row."""
    if evaluation:
        raise ValueError("pretokenized SFT rollout has no evaluation mode: give miles its own --eval-function-path")
    check_whole_steps(args)
    groups = data_buffer.get_samples(args.rollout_batch_size)
    for group in groups:
        if not one_row(group):
            check_group_size(len(group))
        for sample in group:
            apply_row(sample)
    return groups


class ParquetRowSource(DataSource):
    """A miles data source (``--data-source-path pretokenized_sft_rollout.ParquetRowSource``)
    that reads ``--prompt-data`` (a ``train.parquet``, or the build folder holding it) a
    row group at a time and yields samples ready to train, one per group.

    Order: epoch ``e`` visits the row groups in the order ``random.Random(seed +
    e).shuffle`` puts them in, and the rows of group ``g`` in the order
    ``random.Random(f"{seed}/{e}/{g}").shuffle`` puts them in (``seed`` is
    ``--rollout-seed``); without ``--rollout-shuffle``, rows come in file order. The
    build already packs conversations in a seeded random order, so rows need no shuffle
    across groups. Memory: one row group is held at a time. ``save`` and ``load`` keep the
    position, so a resumed run continues at the next sample.
    """

    per_segment = False  # (``ParquetSegmentSource``: one sample per conversation segment)

    def __init__(self, args: Any):
        if Sample is None:
            raise ImportError("ParquetRowSource runs inside miles: miles.rollout.data_source is not importable")
        check_group_size(args.n_samples_per_prompt)
        if self.per_segment:
            check_segment_backend(args)
        if not getattr(args, "rollout_global_dataset", True):
            # (miles 78527b91 saves and loads a data source only with it: rollout_manager.py,
            # RolloutManager.save; placement_group.py)
            raise ValueError(
                f"{type(self).__name__} needs miles' rollout dataset on: without it (--disable-rollout-global-"
                "dataset) miles neither saves nor loads its position, so a resumed run would start at row 0"
            )
        self.args = args
        path = Path(args.prompt_data)
        self.path = path / "train.parquet" if path.is_dir() else path
        self.file = pq.ParquetFile(self.path)
        metadata = self.file.metadata
        self.group_rows = np.array([metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)])
        self.group_starts = np.concatenate([[0], np.cumsum(self.group_rows)])  # file row of each group's first
        self.rows = int(self.group_starts[-1])
        if not self.rows:
            raise ValueError(f"{self.path}: no rows")
        self.row_tokens = check_rows_file(self.path, self.file, self.rows, self.per_segment)
        self.dataset = range(self.rows)  # miles counts rollouts per epoch as len(dataset) // rollout_batch_size
        self.shuffle = bool(args.rollout_shuffle)
        self.seed = int(args.rollout_seed)
        self._lock = threading.Lock()  # miles' train_async saves while the next batch is being taken
        self.epoch_id = 0  # the state miles' own data source keeps, under the same names
        self.sample_offset = 0  # samples of this epoch already given
        self.sample_group_index = 0
        self.sample_index = 0
        self._epoch: tuple[int, list[int], np.ndarray] | None = None  # epoch, its group order, their cumulative rows
        self._held: tuple[tuple[int, int], np.ndarray, np.ndarray, np.ndarray, list[int], Any] | None = None

    def _groups(self) -> tuple[list[int], np.ndarray]:
        """This epoch's row groups in order, and the samples given before each."""
        if self._epoch is None or self._epoch[0] != self.epoch_id:
            groups = list(range(len(self.group_rows)))
            if self.shuffle:
                random.Random(self.seed + self.epoch_id).shuffle(groups)
            before = np.concatenate([[0], np.cumsum(self.group_rows[groups])])
            self._epoch = (self.epoch_id, groups, before)
        return self._epoch[1], self._epoch[2]

    def _group(self, g: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int], Any]:
        """Row group ``g``'s flat ids, flat mask, row offsets, this epoch's row order, and its
        rows' segments (a list array of ``{start, end, ...}``)."""
        if self._held is None or self._held[0] != (self.epoch_id, g):
            rows = self.file.read_row_group(g, columns=["metadata"]).column("metadata").combine_chunks()
            ids, mask = rows.field("input_ids"), rows.field("loss_mask")
            check_group(self.path, int(self.group_starts[g]), rows, self.row_tokens, self.per_segment)
            order = list(range(len(rows)))
            if self.shuffle:
                random.Random(f"{self.seed}/{self.epoch_id}/{g}").shuffle(order)
            self._held = (
                (self.epoch_id, g),
                ids.values.to_numpy(),
                mask.values.to_numpy(),
                ids.offsets.to_numpy(),
                order,
                rows.field("segments") if self.per_segment else None,
            )
        return self._held[1:]

    def _row(self, position: int) -> tuple[list[int], list[int], int]:
        """The ids, mask and file row number of the epoch's ``position``-th sample."""
        ids, mask, row, _ = self._row_and_segments(position)
        return ids, mask, row

    def _row_and_segments(self, position: int) -> tuple[list[int], list[int], int, list[int]]:
        """``_row``'s, and in segment mode the lengths of the row's segments (else none)."""
        groups, before = self._groups()
        n = int(np.searchsorted(before, position, side="right")) - 1
        g = groups[n]
        ids, mask, offsets, order, segments = self._group(g)
        k = order[position - int(before[n])]
        lo, hi = offsets[k], offsets[k + 1]
        lengths = [s["end"] - s["start"] for s in segments[k].as_py()] if segments is not None else []
        return ids[lo:hi].tolist(), mask[lo:hi].tolist(), int(self.group_starts[g]) + k, lengths

    def get_samples(self, num_samples: int) -> list[list[Any]]:
        if self.per_segment:
            return self._segment_groups(num_samples)
        groups = []
        with self._lock:  # a save waits for the whole batch, so it never holds half of one
            for _ in range(num_samples):
                if self.sample_offset == self.rows:
                    self.epoch_id, self.sample_offset = self.epoch_id + 1, 0
                ids, mask, row = self._row(self.sample_offset)
                length, loss_mask = response(ids, mask)
                groups.append(
                    [
                        Sample(
                            group_index=self.sample_group_index,
                            index=self.sample_index,
                            prompt=[dict(m) for m in PROMPT],
                            tokens=ids,
                            response_length=length,
                            loss_mask=loss_mask,
                            reward=0,
                            metadata={"row": row},
                        )
                    ]
                )
                self.sample_offset += 1
                self.sample_group_index += 1
                self.sample_index += 1
        return groups

    def _segment_groups(self, num_samples: int) -> list[list[Any]]:
        """``num_samples`` groups, each the samples of one row's segments that train
        (``segment_responses``), all with the row's ``group_index`` and ``rollout_id``; a row
        none of whose segments trains is passed over."""
        groups: list[list[Any]] = []
        passed = 0
        with self._lock:
            while len(groups) < num_samples:
                if self.sample_offset == self.rows:
                    self.epoch_id, self.sample_offset = self.epoch_id + 1, 0
                ids, mask, row, lengths = self._row_and_segments(self.sample_offset)
                self.sample_offset += 1
                spans = segment_responses(mask, lengths)
                if not spans:
                    passed += 1
                    if passed > self.rows:
                        raise ValueError(f"{self.path}: no row has a segment that trains")
                    continue
                group = []
                for k, start, end, length, loss_mask in spans:
                    group.append(
                        Sample(
                            group_index=self.sample_group_index,
                            index=self.sample_index,
                            rollout_id=self.sample_group_index,
                            prompt=[dict(m) for m in PROMPT],
                            tokens=ids[start:end],
                            response_length=length,
                            loss_mask=loss_mask,
                            reward=0,
                            metadata={"row": row, "segment": k, "start": start},
                        )
                    )
                    self.sample_index += 1
                self.sample_group_index += 1
                groups.append(group)
        return groups

    def add_samples(self, samples: list[list[Any]]) -> None:
        if samples:
            raise RuntimeError("ParquetRowSource is read-only: it takes no samples back")

    def _state_path(self, folder: str, rollout_id: int | None) -> str:
        return os.path.join(folder, f"rollout/fixed_sft_row_source_{rollout_id}.json")

    def _identity(self) -> dict:
        """What a saved position belongs to: the file (its rows and bytes), the order, and the mode."""
        return {
            "rows": self.rows,
            "bytes": self.path.stat().st_size,
            "shuffle": self.shuffle,
            "seed": self.seed if self.shuffle else None,
            "per_segment": self.per_segment,
        }

    def save(self, rollout_id: int) -> None:
        if self.args.save is None:
            return
        path = self._state_path(self.args.save, rollout_id)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with self._lock:
            state = {
                "epoch_id": self.epoch_id,
                "sample_offset": self.sample_offset,
                "sample_group_index": self.sample_group_index,
                "sample_index": self.sample_index,
                **self._identity(),
            }
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(state, f)
        os.replace(path + ".tmp", path)

    def load(self, rollout_id: int | None = None) -> None:
        if self.args.load is None:
            return
        path = self._state_path(self.args.load, rollout_id)
        if not os.path.exists(path):
            logger.info("%s does not exist: starting at the first sample", path)
            return
        try:
            with open(path, encoding="utf-8") as f:
                state = json.load(f)
        except ValueError as error:
            raise ValueError(f"{path} is not a saved position (not JSON: {error})") from None
        if not isinstance(state, dict):
            raise ValueError(f"{path} is not a saved position (a JSON {type(state).__name__}, not an object)")
        identity = self._identity()
        saved = {key: state.get(key, False if key == "per_segment" else None) for key in identity}  # (states
        if saved != identity:  # saved before segment mode lack ``per_segment``: they were saved by rows)
            raise ValueError(f"{path} was saved for {saved}, but this run has {identity}")
        counts: dict[str, int] = {}
        for key in ("epoch_id", "sample_offset", "sample_group_index", "sample_index"):
            value = state.get(key)
            if type(value) is not int or value < 0 or (key == "sample_offset" and value > self.rows):
                bound = f"0 .. {self.rows}" if key == "sample_offset" else "a count"
                raise ValueError(f"{path}: {key} is {value!r}, not {bound}")
            counts[key] = value
        self.epoch_id, self.sample_offset = counts["epoch_id"], counts["sample_offset"]
        self.sample_group_index, self.sample_index = counts["sample_group_index"], counts["sample_index"]

    def get_buffer_length(self) -> int | None:
        return None


def check_rows_file(path: Path, file: Any, rows: int, per_segment: bool) -> int:
    """The row length of a file of fixed-sft rows (``pq.ParquetFile``), read from its
    schema and the ``manifest.json`` beside it; ``ValueError`` naming the file where its
    columns are not a build's (``metadata.input_ids`` list<int32>, ``metadata.loss_mask``
    list<uint8>, and in segment mode ``metadata.segments``), or its manifest names another
    format, row count or file. Each row group is checked as it is read (``check_group``)."""
    import pyarrow as pa

    schema = file.schema_arrow
    metadata = schema.field("metadata").type if "metadata" in schema.names else None
    fields = (
        {metadata.field(k).name: metadata.field(k).type for k in range(metadata.num_fields)}
        if (metadata is not None and pa.types.is_struct(metadata))
        else {}
    )
    wanted = {"input_ids": pa.int32(), "loss_mask": pa.uint8()}  # (lists of them, their items nullable or not)
    for name, item in wanted.items():
        kind = pa.list_(item)
        if name not in fields or not (pa.types.is_list(fields[name]) and fields[name].value_type == item):
            raise ValueError(
                f"{path} is not fixed-sft rows: metadata.{name} is {fields.get(name, 'missing')}, not {kind} "
                "(train on a build's train.parquet, format fixed-sft/2 or fixed-sft/3)"
            )
    if per_segment and "segments" not in fields:
        raise ValueError(f"{path} is not fixed-sft rows: segment mode needs metadata.segments")
    manifest_path = path.parent / "manifest.json"
    if manifest_path.is_file():
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
            recorded = (manifest["format"], manifest["stats"]["rows"], manifest["params"]["row_tokens"])
            parquet = manifest["parquet"]["bytes"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{manifest_path} is not a fixed-sft manifest ({type(error).__name__}: {error})") from None
        if recorded[0] not in ("fixed-sft/2", "fixed-sft/3") or recorded[1] != rows or parquet != path.stat().st_size:
            raise ValueError(
                f"{path} is not the file {manifest_path} records (format {recorded[0]}, {recorded[1]} rows, "
                f"{parquet} bytes; the file has {rows} rows, {path.stat().st_size} bytes): run verify on the folder"
            )
        row_tokens = recorded[2]
        if type(row_tokens) is not int or row_tokens < 2:
            raise ValueError(f"{manifest_path}: params.row_tokens is {row_tokens!r}")
    else:  # (no manifest: the first row's length)
        first = next(g for g in range(file.metadata.num_row_groups) if file.metadata.row_group(g).num_rows)
        row = file.read_row_group(first, columns=["metadata"]).column("metadata")[0].as_py()
        if not isinstance(row, dict) or not isinstance(row.get("input_ids"), list) or len(row["input_ids"]) < 2:
            raise ValueError(f"{path}: its first row holds no ids of a fixed-sft row")
        row_tokens = len(row["input_ids"])
    largest = max(file.metadata.row_group(g).num_rows for g in range(file.metadata.num_row_groups))
    if largest > GROUP_ROWS:
        logger.warning(
            "%s holds row groups of up to %d rows, all held at once (a build writes %d)", path, largest, GROUP_ROWS
        )
    return row_tokens


def check_group(path: Path, first: int, rows: Any, row_tokens: int, per_segment: bool) -> None:
    """``ValueError`` naming the file and row where a row group's rows (the ``metadata``
    struct array; its first row is file row ``first``) are not fixed-sft rows: each row's
    ids and mask ``row_tokens`` long, mask values 0 and 1 only, and in segment mode
    segments that cover the row."""
    ids, mask = rows.field("input_ids"), rows.field("loss_mask")
    nulls = [array for array in (rows, ids, mask) if array.null_count]
    if nulls:
        k = int(np.flatnonzero(nulls[0].is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(f"{path}: row {first + k} is null where its ids and mask should be")
    lengths = np.diff(ids.offsets.to_numpy())
    bad = np.flatnonzero((lengths != row_tokens) | (np.diff(mask.offsets.to_numpy()) != lengths))
    if len(bad):
        k = int(bad[0])
        raise ValueError(
            f"{path}: row {first + k} has {lengths[k]} ids and {len(mask[k].values)} mask values, "
            f"not {row_tokens} of each"
        )
    values = mask.values.to_numpy()
    if len(values) and values.max() > 1:
        k = int(np.searchsorted(mask.offsets.to_numpy(), int(np.argmax(values > 1)), side="right")) - 1
        raise ValueError(f"{path}: row {first + k} has a mask value other than 0 and 1")
    if per_segment:
        segments = rows.field("segments")
        counts = np.diff(segments.offsets.to_numpy())
        spans = segments.flatten()
        lengths = spans.field("end").to_numpy() - spans.field("start").to_numpy()
        covered = np.bincount(np.repeat(np.arange(len(rows)), counts), weights=lengths, minlength=len(rows))
        uncovered = np.flatnonzero(covered != row_tokens)
        if len(uncovered):
            k = int(uncovered[0])
            raise ValueError(f"{path}: row {first + k}'s segments cover {int(covered[k])} tokens, not its {row_tokens}")


def check_segment_backend(args: Any) -> None:
    """Segment mode needs a trainer that counts a step in rollouts and packs micro-batches by
    tokens: miles' Megatron backend (its schedule is made on the rollout side, by
    ``rollout_id``) with ``--use-dynamic-batch-size``. The FSDP backend and ``--indep-dp``
    count a step's batch in samples, and a fixed ``--micro-batch-size`` splits by sample count.
    ``--use-dynamic-global-batch-size`` fails an assertion in miles on samples that carry a
    ``rollout_id``. ``--delay-split-train-data-by-dp`` and ``--multi-lora`` turn the
    rollout-side schedule off (miles ``78527b91``: ``put_train_data`` in
    ``miles/ray/rollout/rollout_manager.py``, ``can_schedule_on_rollout_side`` in
    ``miles/ray/rollout/train_data_conversion.py``): the training side then splits by sample."""
    if getattr(args, "train_backend", "megatron") != "megatron" or getattr(args, "indep_dp", False):
        raise ValueError(
            "ParquetSegmentSource needs the Megatron backend without --indep-dp: others count a step's "
            "batch in samples, not rows; use ParquetRowSource"
        )
    for flag in ("delay_split_train_data_by_dp", "multi_lora"):
        if getattr(args, flag, False):
            raise ValueError(
                f"ParquetSegmentSource cannot take --{flag.replace('_', '-')}: miles then splits a step's "
                "batch by sample count on the training side, not by row; use ParquetRowSource"
            )
    if not getattr(args, "use_dynamic_batch_size", False):
        raise ValueError(
            "ParquetSegmentSource needs --use-dynamic-batch-size: a fixed --micro-batch-size splits "
            "micro-batches by sample count, and a row gives a varying number of samples"
        )
    if getattr(args, "use_dynamic_global_batch_size", False):  # (miles asserts in train_data_conversion.py)
        raise ValueError(
            "ParquetSegmentSource cannot take --use-dynamic-global-batch-size: miles sets it only for "
            "samples without a rollout_id, and a row's segments share one"
        )


class ParquetSegmentSource(ParquetRowSource):
    """``ParquetRowSource`` in segment mode (``--data-source-path
    pretokenized_sft_rollout.ParquetSegmentSource``): each group is one row, as the samples
    of its conversation segments that train (``segment_responses``), sharing the row's
    ``rollout_id``; the order, memory and resumption are the row source's. A state saved by
    one mode is refused by the other."""

    per_segment = True

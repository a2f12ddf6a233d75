"""What miles does with a row from reading it to training on it, for tests without miles.

Each piece follows radixark/miles at commit 78527b9102b3a5f15891128cbec3ac6c2dc4089e
(2026-08-18, the recipe's: the tip of release/v0.1.0); the pieces named are the same at
31f1ca961 (main's HEAD when read):
- ``miles/utils/types.py``: ``Sample``, a dataclass (only the fields used here);
- ``miles/rollout/data_source.py``: ``DataSource``, an ABC with abstract ``get_samples``,
  ``add_samples``, ``save`` and ``load``; ``RolloutDataSource.get_samples``: each prompt
  sample deep-copied ``n_samples_per_prompt`` times into a group, with running
  ``group_index`` and ``index``, wrapping to the next epoch (reshuffled) at the end;
- ``miles/utils/data.py``: ``read_file`` (``pq.ParquetFile(p).iter_batches()`` then
  ``batch.to_pylist()``); ``Dataset.__init__``: ``prompt = data.get(prompt_key)`` as it is
  (no chat template, no multimodal keys), ``metadata = data.get(metadata_key) or {}``, and
  with a processor ``assert isinstance(prompt, list)`` then ``process_vision_info``;
  ``Dataset.shuffle``: ``random.seed(seed + epoch)`` then ``random.shuffle`` of the indices;
- ``miles/utils/processing_utils.py``: ``process_vision_info`` calls
  ``processor.extract_media(prompt)`` when the processor has it (Inkling's, in
  ``miles_plugins/models/inkling/mm_processor.py``), else reads
  ``processor.image_processor`` for a patch size and calls
  ``qwen_vl_utils.process_vision_info(prompt, image_patch_size=...)``, whose
  ``extract_vision_info`` (qwen-vl-utils 0.0.14) takes ``conversations[0]`` and reads
  ``message["content"]`` of every message, looking into it when it is a list (Kimi's
  processor, remote code with no ``extract_media``, takes this path);
- ``miles/ray/rollout/rollout_manager.py``: ``get_num_rollout_per_epoch`` is
  ``len(data_source.dataset) // rollout_batch_size`` (asked when ``--num-rollout`` is unset);
- ``miles/ray/rollout/train_data_conversion.py``: ``convert_samples_to_train_data``
  asserts ``len(loss_mask) == response_length`` for every sample, and sets ``rollout_ids``
  (``rollout_id``, else ``index``) and ``rollout_mask_sums`` (``_compute_rollout_mask_sums``:
  each sample carries the loss-mask total of all samples of its rollout);
- ``miles/ray/rollout/rollout_data_conversion.py``: ``postprocess_rollout_data`` runs
  ``validate_compact_rollout_ids`` (a list of samples at depth 2 or more, of more than one,
  must share one non-None ``rollout_id``), then flattens the groups;
- ``miles/utils/dp_schedule.py``: ``build_dp_schedule`` (the Megatron backend's schedule,
  made on the rollout side) groups samples by rollout id in order of first appearance and
  gives each step ``global_batch_size`` rollouts with all their samples;
- ``miles/backends/training_utils/data.py``: ``get_batch`` in the ``thd`` layout without
  context parallelism: the micro-batch's samples concatenated, ``cu_seqlens`` 0 then each
  sample's end (and, after padding the stream to a multiple of ``tp_size * 128``, its end),
  ``position_ids`` ``arange`` of each sample's length, and each loss mask padded by
  ``(prompt_length - 1, 1)`` so that it sits on the logit that predicts its token;
- ``miles/backends/training_utils/loss.py``: ``loss_function``'s per-token normalizer, the sum
  over samples of ``max(loss_mask.sum(), 1)``.
"""

from __future__ import annotations

import abc
import copy
import random
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow.parquet as pq


@dataclass
class Sample:
    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: Any = ""
    tokens: list = field(default_factory=list)
    multimodal_inputs: Any = None
    response: str = ""
    response_length: int = 0
    label: Any = None
    reward: Any = None
    loss_mask: list | None = None
    metadata: dict = field(default_factory=dict)


class DataSource(abc.ABC):
    @abc.abstractmethod
    def get_samples(self, num_samples): ...

    @abc.abstractmethod
    def add_samples(self, samples): ...

    @abc.abstractmethod
    def save(self, rollout_id): ...

    @abc.abstractmethod
    def load(self, rollout_id=None): ...

    def get_buffer_length(self):
        return None


def install(monkeypatch) -> types.ModuleType:
    """Put ``miles.rollout.data_source`` and ``miles.utils.types`` in ``sys.modules`` and
    import ``pretokenized_sft_rollout`` afresh against them."""
    modules = {
        name: types.ModuleType(name)
        for name in ("miles", "miles.rollout", "miles.rollout.data_source", "miles.utils", "miles.utils.types")
    }
    modules["miles.rollout.data_source"].DataSource = DataSource
    modules["miles.utils.types"].Sample = Sample
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delitem(sys.modules, "pretokenized_sft_rollout", raising=False)
    import pretokenized_sft_rollout

    return pretokenized_sft_rollout


def extract_vision_info(conversations: list) -> list:
    """qwen-vl-utils' reading of a prompt's messages."""
    infos = []
    if isinstance(conversations[0], dict):
        conversations = [conversations]
    for conversation in conversations:
        for message in conversation:
            if isinstance(message["content"], list):
                for part in message["content"]:
                    if (
                        "image" in part
                        or "image_url" in part
                        or "video" in part
                        or part.get("type", "text") in ("image", "image_url", "video")
                    ):
                        infos.append(part)
    return infos


class QwenStyleProcessor:
    """A processor without ``extract_media`` (as Kimi's): miles hands the prompt to qwen-vl-utils."""

    image_processor = types.SimpleNamespace(patch_size=14)


class ExtractMediaProcessor:
    """A processor with ``extract_media`` (as Inkling's), reading every message's content."""

    def extract_media(self, prompt: list) -> dict:
        for message in prompt:
            if not isinstance(message["content"], (str, list)):
                raise TypeError(f"content is a {type(message['content']).__name__}")
        return {"images": extract_vision_info(prompt) or None}


def process_vision_info(prompt: list, processor: Any) -> dict:
    if hasattr(processor, "extract_media"):
        return processor.extract_media(prompt)
    getattr(processor.image_processor, "patch_size", 14)
    infos = extract_vision_info(prompt)
    return {"images": [i for i in infos if "video" not in i] or None, "videos": None}


def dataset(path, processor: Any = None, prompt_key: str = "messages", metadata_key: str = "metadata") -> list:
    """``Dataset(path, ...).origin_samples`` for the recipe's flags."""
    samples = []
    for batch in pq.ParquetFile(path).iter_batches():
        for data in batch.to_pylist():
            prompt = data.get(prompt_key)
            metadata = data.get(metadata_key) or {}
            multimodal_inputs = None
            if processor:
                assert isinstance(prompt, list), f"prompt must be a list when processor is not None, got {type(prompt)}"
                multimodal_inputs = process_vision_info(prompt, processor)
            samples.append(Sample(prompt=prompt, metadata=metadata, multimodal_inputs=multimodal_inputs))
    return samples


class RolloutDataSource:
    """miles' default data source over ``dataset`` samples (global dataset on)."""

    def __init__(self, samples: list, n_samples_per_prompt: int = 1, shuffle: bool = False, seed: int = 42):
        self.origin, self.samples = samples, samples
        self.n, self.shuffle, self.seed = n_samples_per_prompt, shuffle, seed
        self.epoch_id = self.sample_offset = self.sample_group_index = self.sample_index = 0
        if shuffle:
            self._shuffle()

    def _shuffle(self) -> None:
        random.seed(self.seed + self.epoch_id)
        permutation = list(range(len(self.origin)))
        random.shuffle(permutation)
        self.samples = [self.origin[i] for i in permutation]

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        if self.sample_offset + num_samples <= len(self.samples):
            prompts = self.samples[self.sample_offset : self.sample_offset + num_samples]
            self.sample_offset += num_samples
        else:
            prompts = self.samples[self.sample_offset :]
            num_samples -= len(prompts)
            self.epoch_id += 1
            if self.shuffle:
                self._shuffle()
            prompts += self.samples[:num_samples]
            self.sample_offset = num_samples
        groups = []
        for prompt in prompts:
            group = []
            for _ in range(self.n):
                sample = copy.deepcopy(prompt)
                sample.group_index, sample.index = self.sample_group_index, self.sample_index
                self.sample_index += 1
                group.append(sample)
            self.sample_group_index += 1
            groups.append(group)
        return groups


def num_rollout_per_epoch(data_source: Any, rollout_batch_size: int) -> int:
    return len(data_source.dataset) // rollout_batch_size


def validate_compact_rollout_ids(node, depth: int = 0) -> None:
    if isinstance(node, Sample):
        return
    assert isinstance(node, list), f"unexpected rollout output node type: {type(node).__name__}"
    if node and isinstance(node[0], Sample):
        if depth >= 2 and len(node) > 1:
            rollout_ids = [s.rollout_id for s in node]
            assert None not in rollout_ids, "compact rollout samples without rollout_id"
            assert len(set(rollout_ids)) == 1, f"sibling samples must share rollout_id; got {rollout_ids}"
        return
    for item in node:
        validate_compact_rollout_ids(item, depth + 1)


def flatten(groups: list) -> list[Sample]:
    """``postprocess_rollout_data``'s validation and flattening (trimming aside)."""
    validate_compact_rollout_ids(groups)
    data = groups
    while data and isinstance(data[0], list):
        data = [item for group in data for item in group]
    return data


def train_data(groups: list[list[Sample]]) -> dict:
    """The part of ``convert_samples_to_train_data`` that reads what the rollout set."""
    samples = flatten(groups)
    for sample in samples:
        assert len(sample.loss_mask) == sample.response_length, "loss mask length != response length"
    rollout_ids = [s.rollout_id if s.rollout_id is not None else s.index for s in samples]
    totals: dict = {}
    for rollout_id, sample in zip(rollout_ids, samples):
        totals[rollout_id] = totals.get(rollout_id, 0) + sum(sample.loss_mask)
    return {
        "tokens": [s.tokens for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "loss_masks": [s.loss_mask for s in samples],
        "rewards": [s.reward for s in samples],
        "rollout_ids": rollout_ids,
        "rollout_mask_sums": [totals[r] for r in rollout_ids],
    }


def steps(rollout_ids: list, global_batch_size: int) -> list[list[int]]:
    """``build_dp_schedule``'s samples of each full step: ``global_batch_size`` rollouts each."""
    by_rollout: dict = {}
    for position, rollout_id in enumerate(rollout_ids):
        by_rollout.setdefault(rollout_id, []).append(position)
    order = list(by_rollout)
    full = len(order) // global_batch_size
    assert full >= 1, f"total rollouts ({len(order)}) < global_batch_size ({global_batch_size})"
    return [
        [
            position
            for rollout_id in order[k * global_batch_size : (k + 1) * global_batch_size]
            for position in by_rollout[rollout_id]
        ]
        for k in range(full)
    ]


def get_batch(data: dict, indices: list[int], tp_size: int = 1, pad_multiplier: int = 128) -> dict:
    """``get_batch`` of the micro-batch of samples ``indices`` (``thd``, context parallel size 1)."""
    tokens = [np.asarray(data["tokens"][i]) for i in indices]
    cu_seqlens = [0]
    for t in tokens:
        cu_seqlens.append(cu_seqlens[-1] + len(t))
    stream = np.concatenate(tokens)
    pad_size = tp_size * pad_multiplier
    pad = (pad_size - len(stream) % pad_size) % pad_size
    if pad:
        cu_seqlens.append(cu_seqlens[-1] + pad)
    position_ids = np.concatenate([np.arange(len(t)) for t in tokens] + [np.zeros(pad, np.int64)])
    masks = []
    for i, t in zip(indices, tokens):
        prompt_length = len(t) - data["response_lengths"][i]
        masks.append(np.pad(np.asarray(data["loss_masks"][i], np.int64), (prompt_length - 1, 1)))
    full_loss_masks = np.pad(np.concatenate(masks), (0, pad))
    return {
        "tokens": np.pad(stream, (0, pad)),
        "cu_seqlens": np.array(cu_seqlens),
        "position_ids": position_ids,
        "full_loss_masks": full_loss_masks,
    }


def per_token_normalizer(loss_masks: list[list[int]]) -> int:
    return sum(max(sum(mask), 1) for mask in loss_masks)

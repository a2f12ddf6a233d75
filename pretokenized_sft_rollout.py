"""miles rollout function for rows built by fixed-sft.

Train with ``--input-key messages --metadata-key metadata --rollout-function-path
pretokenized_sft_rollout.generate_rollout`` (this file importable on PYTHONPATH).
Each row's ``messages`` column holds ``{"input_ids": [...], "loss_mask": [...]}``, so
``sample.prompt`` arrives as that dict. The sample gets the row's ids as ``tokens``;
the response runs from the first supervised token to the end of the row, but starts at
position 1 at the earliest: miles predicts a response token from the token before it,
so at least one token must come first (a row's token 0 has nothing to be predicted
from). ``loss_mask`` is the row's mask over that response. Train with miles'
``--loss-type sft_loss`` and ``--n-samples-per-prompt 1``, without
``--rollout-max-prompt-len`` or ``--apply-chat-template`` (README: "Training with miles").
"""

from __future__ import annotations

from typing import Any


def apply_row(sample: Any) -> None:
    """Set ``tokens``, ``response_length``, ``loss_mask`` and ``reward`` from the row."""
    row = sample.prompt
    if not isinstance(row, dict) or "input_ids" not in row or "loss_mask" not in row:
        raise ValueError(f"sample.prompt is not a fixed-sft row (a {type(row).__name__}): train on fixed-sft Parquet "
                         "with --input-key messages and the rollout global dataset on")
    tokens = [int(t) for t in row["input_ids"]]
    mask = [int(m) for m in row["loss_mask"]]
    if len(tokens) != len(mask) or 1 not in mask:
        raise ValueError("fixed-sft row has mismatched ids/mask or no supervised token")
    first = max(mask.index(1), 1)
    sample.tokens = tokens
    sample.response_length = len(tokens) - first
    sample.loss_mask = mask[first:]
    sample.reward = 0


def generate_rollout(args: Any, rollout_id: int, data_buffer: Any, evaluation: bool = False) -> list[list[Any]]:
    """Take ``args.rollout_batch_size`` groups of samples and fill each from its row."""
    if evaluation:
        raise ValueError("pretokenized SFT rollout has no evaluation mode: give miles its own --eval-function-path")
    groups = data_buffer.get_samples(args.rollout_batch_size)
    for group in groups:
        for sample in group:
            apply_row(sample)
    return groups

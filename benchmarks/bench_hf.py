#!/usr/bin/env python3
"""Speed of the any-model encoder (``fixed_sft.hf_chat``) against a plain apply_chat_template loop.

Usage::

    python benchmarks/bench_hf.py [--conversations N] [--repeat K] [--tokenizer FOLDER] [--generation]

Three paths over the same ``tests/synthetic.py`` conversations (seed 0), in one process:

- **plain loop** (the baseline): per conversation ``apply_chat_template(tokenize=True)``
  for the ids, and for each assistant message ``k`` the prefix renders a mask needs,
  ``apply_chat_template(messages[:k], add_generation_prompt=True)`` and
  ``apply_chat_template(messages[:k + 1])``, their token counts bounding the message's
  tokens (the way a trainer without generation blocks masks). Its ids must equal the
  encoder's; its masks differ where BPE merges across a message boundary (counted).
- **lean loop** (information): the same loop with the prefixes rendered untokenized
  (``tokenize=False``) and mapped to tokens through the offsets, by the encoder's rule:
  ids and masks must equal the encoder's. It shows what is left once the prefixes are not
  tokenized: BPE itself, which both run once per conversation.
- **encoder**: ``HFChatEncoder.encode_batch`` over chunks of 128 conversations (as a
  build encodes): the template compiled once, rendered once per conversation plus the
  prefix renders (without ``apply_chat_template``'s per-call work), the texts tokenized
  in one batched call of the fast tokenizer.

With ``--generation`` (a template with generation blocks) both loops are one call of
``apply_chat_template(tokenize=True, return_assistant_tokens_mask=True)`` per conversation.

Each path runs ``--repeat`` times (3); a figure is the ratio of the medians, with the
range of the per-repeat ratios. The batched call runs on as many threads as the fast
tokenizer's pool has (``TOKENIZERS_PARALLELISM``); on a busy machine of 2 cores it gains
little over one at a time. The tokenizer is the shared DeepSeek-V4 fast tokenizer with
a ChatML template written here (``--tokenizer`` names another folder of tokenizer.json and
tokenizer_config.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}[[{{ message['content'] + '<|im_end|>\\n' }}]]"
    "{% else %}{{ message['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHUNK = 128


def _folder(source: Path, generation: bool, into: Path) -> Path:
    template = CHATML.replace("[[", "{% generation %}" if generation else "").replace(
        "]]", "{% endgeneration %}" if generation else ""
    )
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (into / name).symlink_to(source.resolve() / name)
    (into / "chat_template.jinja").write_text(template, encoding="utf-8")
    return into


def plain_loop(tokenizer, conversations: list[list[dict]], generation: bool) -> list[tuple[list[int], list[int]]]:
    """The plain loop (module docstring): ``apply_chat_template``'s ids, and a mask from its ids of
    the prefixes (the tokens past those of ``messages[:k]`` with the generation prompt, through
    those of ``messages[:k + 1]``)."""
    out = []
    for messages in conversations:
        if generation:
            encoded = tokenizer.apply_chat_template(messages, tokenize=True, return_assistant_tokens_mask=True)
            out.append((list(encoded["input_ids"]), list(encoded["assistant_masks"])))
            continue
        ids = list(tokenizer.apply_chat_template(messages, tokenize=True)["input_ids"])
        mask = [0] * len(ids)
        for k, message in enumerate(messages):
            if message["role"] == "assistant":
                before = tokenizer.apply_chat_template(messages[:k], add_generation_prompt=True)["input_ids"]
                through = tokenizer.apply_chat_template(messages[: k + 1])["input_ids"]
                mask[len(before) : len(through)] = [1] * (len(through) - len(before))
        out.append((ids, mask))
    return out


def lean_loop(tokenizer, conversations: list[list[dict]], generation: bool) -> list[tuple[list[int], list[int]]]:
    """The loop with untokenized prefix renders and offsets (module docstring)."""
    import numpy as np

    from fixed_sft.hf_chat import token_mask

    if generation:
        return plain_loop(tokenizer, conversations, generation)
    out = []
    for messages in conversations:
        encoded = tokenizer.apply_chat_template(
            messages, tokenize=True, tokenizer_kwargs={"return_offsets_mapping": True}
        )
        spans = []
        for k, message in enumerate(messages):
            if message["role"] == "assistant":
                before = tokenizer.apply_chat_template(messages[:k], add_generation_prompt=True, tokenize=False)
                through = tokenizer.apply_chat_template(messages[: k + 1], tokenize=False)
                spans.append((len(before), len(through)))
        offsets = np.array(encoded["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        out.append((list(encoded["input_ids"]), token_mask(offsets, spans).tolist()))
    return out


def fast(encoder, conversations: list[list[dict]]) -> list[tuple[list[int], list[int]]]:
    out = []
    for start in range(0, len(conversations), CHUNK):
        for result in encoder.encode_batch(conversations[start : start + CHUNK]):
            assert isinstance(result, tuple), result
            out.append((result[0].tolist(), result[1].tolist()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conversations", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tokenizer", type=Path, default=ROOT.parent / "shared" / "tokenizers" / "deepseek-v4")
    parser.add_argument("--generation", action="store_true", help="a template with generation blocks")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    import synthetic
    from transformers import AutoTokenizer

    from fixed_sft.hf_chat import HFChatEncoder, load_tokenizer

    conversations = [row["messages"] for row in synthetic.conversations(args.conversations, seed=0)]
    with tempfile.TemporaryDirectory() as scratch:
        folder = _folder(args.tokenizer, args.generation, Path(scratch))
        encoder = HFChatEncoder(load_tokenizer(folder))
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        paths = {
            "plain loop": lambda: plain_loop(tokenizer, conversations, args.generation),
            "lean loop": lambda: lean_loop(tokenizer, conversations, args.generation),
            "encoder": lambda: fast(encoder, conversations),
        }
        times: dict[str, list[float]] = {name: [] for name in paths}
        results = {}
        for _ in range(args.repeat):
            for name, run in paths.items():
                began = time.perf_counter()
                results[name] = run()
                times[name].append(time.perf_counter() - began)
    encoded = results["encoder"]
    assert [ids for ids, _ in encoded] == [ids for ids, _ in results["plain loop"]], "ids differ"
    assert encoded == results["lean loop"], "the encoder's ids or masks differ from the lean loop's"
    other_masks = sum(a != b for a, b in zip(encoded, results["plain loop"]))
    tokens = sum(len(ids) for ids, _ in encoded)
    figures: dict = {
        "conversations": len(conversations),
        "tokens": tokens,
        "template": "chatml with generation blocks" if args.generation else "chatml (prefix-render mask)",
        "seconds": times,
        "plain_loop_masks_that_differ": other_masks,
    }
    print(f"{len(conversations)} conversations, {tokens} tokens, {figures['template']}, median of {args.repeat}:")
    for name in ("plain loop", "lean loop"):
        ratios = [b / e for b, e in zip(times[name], times["encoder"])]
        median = statistics.median(times[name]) / statistics.median(times["encoder"])
        figures[f"speedup_vs_{name.replace(' ', '_')}"] = {"median": median, "range": [min(ratios), max(ratios)]}
        seconds = f"{statistics.median(times[name]):.2f} s / {statistics.median(times['encoder']):.2f} s"
        print(f"  encoder vs {name}: {seconds} = {median:.2f}x (range {min(ratios):.2f}x - {max(ratios):.2f}x)")
    print(f"  (the plain loop's token-count mask differs from the encoder's on {other_masks} conversations)")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

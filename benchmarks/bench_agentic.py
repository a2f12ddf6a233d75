#!/usr/bin/env python3
"""The Kimi path on agentic conversations (tools, tool calls, reasoning) against the model's own tokenizer.

Usage::

    python benchmarks/bench_agentic.py [--conversations N] [--repeat K] [--tokenizer DIR]

Conversations are made from the synthetic corpus's texts (``tests/synthetic.py``) with a
seeded generator: a system message and a tool list, then turns of a user message, an
assistant step with reasoning and one or two tool calls, their results, and a final
answer; the last turn's reasoning is the one the template renders. Timed, in this process:

* **fast**: ``ChatEncoder.encode_arrays(messages, tools)`` (ids and ``kimi_k25`` mask).
* **reference**: ``tests/reference_kimi.py``'s ``ReferenceKimi``: the model's
  ``apply_chat_template(tokenize=True)`` through transformers' own slow-tokenizer
  machinery for the ids, and its generation-block mask for the mask.

The figure is the reference's time over the fast path's, median (range) of ``--repeat``
(default 3); ids and masks must be identical, else the script exits 1. The target is 10x.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "default": 5}},
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run Python code.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
        },
    },
]


def agentic(texts: list[str], rng: random.Random) -> list[dict[str, Any]]:
    """One trajectory of texts drawn from ``texts``."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful agent."}]
    calls = 0
    for _ in range(rng.randint(1, 3)):
        messages.append({"role": "user", "content": rng.choice(texts)})
        tool_calls = []
        for _ in range(rng.randint(1, 2)):
            name = rng.choice(["search", "python"])
            arguments = {"query": rng.choice(texts)[:200]} if name == "search" else {"code": rng.choice(texts)[:400]}
            tool_calls.append(
                {
                    "id": f"functions.{name}:{calls}",
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            )
            calls += 1
        messages.append(
            {"role": "assistant", "content": "", "reasoning_content": rng.choice(texts)[:600], "tool_calls": tool_calls}
        )
        for call in tool_calls:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": rng.choice(texts)[:800]})
        messages.append(
            {"role": "assistant", "content": rng.choice(texts), "reasoning_content": rng.choice(texts)[:300]}
        )
    return messages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tokenizer", type=Path, default=ROOT.parent / "shared" / "tokenizers" / "kimi-k2.6")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    import synthetic
    from reference_kimi import ReferenceKimi

    from fixed_sft.chat import ChatEncoder
    from fixed_sft.conversation import conversation
    from fixed_sft.tokenizer import KimiTokenizer

    encoder = ChatEncoder(KimiTokenizer(args.tokenizer))
    reference = ReferenceKimi(args.tokenizer)
    rng = random.Random(7)
    texts = [m["content"] for c in synthetic.conversations(400, seed=3) for m in c["messages"] if m["content"]]
    rows = [{"messages": agentic(texts, rng), "tools": TOOLS} for _ in range(args.conversations)]
    parsed = [conversation(row, encoder.schema) for row in rows]

    fast_times, reference_times = [], []
    for _ in range(args.repeat):
        start = time.perf_counter()
        fast = [encoder.encode_arrays(c.messages, c.tools) for c in parsed]
        fast_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        slow = [
            (reference.chat_ids(row["messages"], tools=TOOLS), reference.generation_mask(row["messages"], tools=TOOLS))
            for row in rows
        ]
        reference_times.append(time.perf_counter() - start)
    same = sum(f[0].tolist() == s[0] and f[1].tolist() == s[1] for f, s in zip(fast, slow))
    tokens = sum(len(f[0]) for f in fast)
    ratios = [r / f for r, f in zip(reference_times, fast_times)]
    print(f"{len(rows)} agentic conversations, {tokens:,} tokens; identical ids and masks: {same}/{len(rows)}")
    print(
        f"fast path  {statistics.median(fast_times):.3f} s ({tokens / statistics.median(fast_times) / 1e6:.2f} M tok/s)"
    )
    print(f"reference  {statistics.median(reference_times):.3f} s")
    print(f"ratio      {statistics.median(ratios):.1f}x ({min(ratios):.1f}-{max(ratios):.1f}); target >= 10x")
    if args.json:
        args.json.write_text(json.dumps({"fast_s": fast_times, "reference_s": reference_times, "tokens": tokens}))
    return 0 if same == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())

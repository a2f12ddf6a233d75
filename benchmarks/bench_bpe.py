#!/usr/bin/env python3
"""Whole-build speed with each BPE, against raw tiktoken ``encode_ordinary`` on the same texts.

Usage::

    python benchmarks/bench_bpe.py [--conversations N] [--workers W] [--repeat K] [--json OUT]

Writes ``tests/synthetic.py`` conversations as Parquet in a temporary folder, then times
whole processes, each from its start to its exit (interpreter start-up, imports, loading
included), ``--repeat`` rounds of three, in turn:

- ``build --bpe gigatoken``: a default-style build of the whole source (``--rows all``:
  every conversation encoded; 8,192-token rows, seed 42, the template check on 1 in 64,
  ``--workers W``), each into an empty token store of its own (``--cache-dir``): a first
  build, which fills it (from the store's first commit to ``d2d7a0f`` the user's store
  served every build after the first);
- ``build --bpe tiktoken``: the same build with the reference BPE;
- raw tiktoken: a process that reads the same Parquet, loads the Kimi ranks and pattern
  into a ``tiktoken.Encoding``, and encodes every message content with
  ``encode_ordinary_batch`` on W threads (the baseline: BPE alone, no rules, template,
  mask, packing or output).

It prints the median and range of each, and the ratios of the raw baseline's time over
each build's (>= 1: the build is at least as fast as raw tiktoken). Both builds must give
the same ``rows_sha256``. The corpus is synthetic, drawn from small pools of words, so a
BPE that caches words gains more on it than on real text; on a shared machine the
figures move with the neighbours' load.

Current figures: benchmarks/README.md. The build's fixed costs (imports, the workers'
fork server, loading the tokenizer: about 1.8 s on 2 cores) weigh less on a larger
source: at ``d2d7a0f``, 6,000 conversations gave 0.93x, 24,000 gave 2.17x.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bytecode

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests")]

import synthetic  # noqa: E402

TOKENIZER = ROOT.parent / "shared" / "tokenizers" / "kimi-k2.6"
CORPUS_SEED = 2024

RAW = """
import sys
from concurrent.futures import ThreadPoolExecutor
import pyarrow.parquet as pq
import tiktoken
from tiktoken.load import load_tiktoken_bpe
from fixed_sft.tokenizer import PATTERN

source, model, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
with ThreadPoolExecutor(2) as pool:  # as a build reads its source while the tokenizer loads
    table = pool.submit(pq.read_table, source, columns=["messages"])
    ranks = pool.submit(load_tiktoken_bpe, model)
    encoding = tiktoken.Encoding(name="kimi", pat_str=PATTERN, mergeable_ranks=ranks.result(), special_tokens={})
    messages = table.result().column("messages").to_pylist()
contents = [m["content"] for conversation in messages for m in conversation]
print(sum(map(len, encoding.encode_ordinary_batch(contents, num_threads=threads))))
"""


def timed(command: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Wall time of a whole process and its standard output; a failure ends the script."""
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=ROOT)
    took = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"{' '.join(command[:4])} failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return took, done.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=6000, help="synthetic conversations (default 6000)")
    parser.add_argument("--workers", type=int, default=2, help="build workers and raw BPE threads (default 2)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--tokenizer", type=Path, default=TOKENIZER, help="the Kimi-K2.6 tokenizer folder")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the times to OUT")
    args = parser.parse_args(argv)
    bytecode.keep()  # (as installed: compiled once)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # (keeps the caller's)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}
    times: dict[str, list[float]] = {"build --bpe gigatoken": [], "build --bpe tiktoken": [], "raw tiktoken": []}
    with tempfile.TemporaryDirectory(prefix="bench-bpe-") as work:
        source = Path(work) / "corpus.parquet"
        rows = synthetic.conversations(args.conversations, seed=CORPUS_SEED)
        synthetic.write_parquet(rows, source)
        characters = sum(len(m["content"]) for row in rows for m in row["messages"])
        megabytes = source.stat().st_size / 1e6
        print(f"{args.conversations} conversations, {characters / 1e6:.1f}M content characters, {megabytes:.1f} MB")
        digests: dict[str, set[str]] = {"gigatoken": set(), "tiktoken": set()}
        for round in range(args.repeat):
            for bpe in ("gigatoken", "tiktoken"):
                out = Path(work) / f"out-{bpe}"
                store = Path(work) / f"store-{bpe}-{round}"  # (empty: a first build, which fills it)
                command = [sys.executable, "generate_fixed_sft.py", "--source", str(source), "--rows", "all"]
                command += ["--tokenizer", str(args.tokenizer), "--out", str(out), "--bpe", bpe]
                command += ["--workers", str(args.workers), "--quiet", "--cache-dir", str(store)]
                took, _ = timed(command, env)
                times[f"build --bpe {bpe}"].append(took)
                digests[bpe].add(json.loads((out / "manifest.json").read_text())["rows_sha256"])
            took, tokens = timed(
                [sys.executable, "-c", RAW, str(source), str(args.tokenizer / "tiktoken.model"), str(args.workers)], env
            )
            times["raw tiktoken"].append(took)
    if len(digests["gigatoken"] | digests["tiktoken"]) != 1:
        sys.exit(f"rows_sha256 differ between builds: {digests}")
    print(f"raw tiktoken: {int(tokens):,} content tokens; rows_sha256 the same for both BPEs")
    raw = statistics.median(times["raw tiktoken"])
    for name, values in times.items():
        ratio = f"   raw / this {raw / statistics.median(values):.2f}x" if name != "raw tiktoken" else ""
        print(
            f"{name:24} median {statistics.median(values):6.2f} s  range {min(values):.2f}-{max(values):.2f} s{ratio}"
        )
    giga, tik = (statistics.median(times[f"build --bpe {b}"]) for b in ("gigatoken", "tiktoken"))
    print(f"build tiktoken / build gigatoken: {tik / giga:.2f}x")
    if args.json:
        args.json.write_text(
            json.dumps({"workers": args.workers, "conversations": args.conversations, "times": times}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

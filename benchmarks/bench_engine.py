#!/usr/bin/env python3
"""Start-up of the 2-worker engine: does the fork server's preloaded encoder pay for its lines?

Usage::

    python benchmarks/bench_engine.py [--repeat K] [--workers N] [--tokenizer DIR] [--json OUT]

Each run is a fresh interpreter that times, from before the pool is made to the result of
the first chunk (a 64-conversation chunk of synthetic conversations) in every worker:

* ``preload`` (what builds do): workers fork from a fork server that imported the
  encoding modules and loaded the encoder once (``fixed_sft.encode.PRELOAD_VARIABLE``).
* ``forkserver``: the same fork server, modules imported, but each worker loads its own
  encoder in the pool's initializer.
* ``spawn``: the standard library's pool with an initializer alone: each worker is a
  fresh interpreter that imports the modules and loads the encoder.

The figures are each variant's median over ``preload``'s, with the range over repeats,
and the workers' summed PSS once their chunks are done (a page shared by n processes
counts 1/n: what the preloaded encoder's copy-on-write pages save);
variants run interleaved, ``--repeat`` times each (default 3). The first chunk's ids must
be the same in every variant; the script exits 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

VARIANTS = ("preload", "forkserver", "spawn")


def child(variant: str, workers: int, tokenizer: Path) -> dict:
    """One timed start-up, in this fresh process."""
    import hashlib
    from multiprocessing import get_context

    import pyarrow as pa
    import synthetic

    from fixed_sft import encode
    from fixed_sft.engine import ProcessPool, forkserver_context
    from fixed_sft.hashes import sha256_file
    from fixed_sft.tokenizer import FILES, TEMPLATE_KWARGS

    config = encode.EncoderConfig(
        tokenizer, {name: sha256_file(tokenizer / name) for name in FILES}, "kimi_k25", TEMPLATE_KWARGS
    )
    messages = [c["messages"] for c in synthetic.conversations(64, seed=1)]
    count = len(messages)
    chunk = pa.table(
        {"messages": messages, "index": range(count), "bytes": [0] * count, "dropped": [False] * count}
    )  # a chunk as fixed_sft.bands cuts them
    start = time.perf_counter()
    if variant == "preload":
        environment = {encode.PRELOAD_VARIABLE: config.to_json(), encode.BUILDER_VARIABLE: str(os.getpid())}
        context = forkserver_context(encode.WORKER_MODULES, environment)
    elif variant == "forkserver":
        context = forkserver_context(encode.WORKER_MODULES, {})
    else:
        context = get_context("spawn")
    engine = ProcessPool(workers, partial(encode._worker_setup, config), context)
    tasks = [(encode.Chunk(chunk, 0),)] * workers  # one chunk per worker: the start-up of all of them
    with engine:
        results = list(engine.map(encode._encode_in_worker, tasks))
        took = time.perf_counter() - start
        pss = sum(_pss(pid) for pid in engine._pool._processes)  # the workers' proportional share
    digest = hashlib.sha256(results[0].tokens.tobytes()).hexdigest()
    return {"variant": variant, "seconds": took, "workers_pss": pss, "ids_sha256": digest}


def _pss(pid: int) -> int:
    """``Pss`` of process ``pid`` in bytes: a page it shares with n processes counts 1/n."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) << 10
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tokenizer", type=Path, default=ROOT.parent / "shared" / "tokenizers" / "kimi-k2.6")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.workers, args.tokenizer.resolve())))
        return 0
    runs = []
    for k in range(args.repeat):
        for variant in VARIANTS:
            command = [sys.executable, __file__, "--child", variant, "--workers", str(args.workers)]
            out = subprocess.run([*command, "--tokenizer", str(args.tokenizer)], capture_output=True, text=True)
            if out.returncode != 0:
                sys.stderr.write(out.stderr[-3000:])
                return 1
            run = json.loads(out.stdout.splitlines()[-1])
            runs.append(run)
            print(f"  {variant} #{k + 1}: {run['seconds']:.2f} s", flush=True)
    if len({run["ids_sha256"] for run in runs}) != 1:
        print("the variants' ids differ", file=sys.stderr)
        return 1
    base = statistics.median(r["seconds"] for r in runs if r["variant"] == "preload")
    print(
        f"\nstart-up of {args.workers} workers to their first chunk; "
        f"median (range) of {args.repeat}; cores {os.cpu_count()}"
    )
    print(f"{'variant':<12} {'seconds':>20} {'x preload':>10} {'workers PSS MiB':>16}")
    for variant in VARIANTS:
        times = [r["seconds"] for r in runs if r["variant"] == variant]
        median = statistics.median(times)
        pss = statistics.median(r["workers_pss"] for r in runs if r["variant"] == variant) / (1 << 20)
        print(f"{variant:<12} {median:8.2f} ({min(times):.2f}-{max(times):.2f}) {median / base:10.2f} {pss:16.0f}")
    if args.json:
        args.json.write_text(json.dumps({"workers": args.workers, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Issue 24's speed targets 1-3 and 7, each as a ratio against its baseline, in one run.

Usage::

    python benchmarks/bench_targets.py [--workers W] [--quick] [--repeats K] [--linear-conversations N]
        [--tokenizer FOLDER] [--json OUT]

Runs the scripts that measure each target, each in a process of its own with ``--json``,
then prints one line per target: its figure, the target and whether it is met.

- 1, a later build from the store (``bench_store.py``): the first build's median time over
  each later build's (another seed; another row length), at least 4;
- 2, faster than tiktoken (``bench_bpe.py``): raw tiktoken's median time over a first
  build's (gigatoken), at least 1;
- 3, parallel to the end (``bench_linear.py``): the median time of 1 worker over ``W``
  workers, whole process, at least 8 at 16 workers on 16 cores;
- 7, linear cost (``bench_linear.py``): source rows decoded per source row, 1 at each
  size; 4N's time over N's (information);
- 7, memory (``bench_memory.py``): the peak tree PSS of a ``--rows all`` build of 80,000
  conversations, in one row group and in row groups of 2,000, under 1 GiB. PSS counts a
  page the processes share once (the workers' encoder, loaded once in their fork server);
  their summed RSS, which counts it in each, is information.

``--workers`` (default: the cores this process may use) is the builds' worker count in
targets 1, 2 and 7 and the ``W`` of target 3; target 3 counts only at 16 workers on 16
cores, elsewhere its figure is information. ``--quick`` runs smaller sizes and one repeat
(a few minutes on 2 cores; the figures are then noisier). A script that fails ends the run
with its exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import bytecode

HERE = Path(__file__).resolve().parent
GIB = 1 << 30


def run(script: str, arguments: list[str], out: Path, tokenizer: Path) -> dict:
    """``script``'s figures: run with ``arguments``, ``--tokenizer`` and ``--json out``, its output shown."""
    print(f"== {script} {' '.join(arguments)}", flush=True)
    command = [sys.executable, str(HERE / script), *arguments, "--tokenizer", str(tokenizer), "--json", str(out)]
    done = subprocess.run(command)
    if done.returncode:
        sys.exit(done.returncode)
    return json.loads(out.read_text())


def median(values: list[float]) -> float:
    return statistics.median(values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--quick", action="store_true", help="smaller sizes, one repeat")
    parser.add_argument("--repeats", type=int, help="repeats of each script's builds (default 3; 1 with --quick)")
    parser.add_argument(
        "--linear-conversations", type=int, metavar="N", help="bench_linear's N (default 16000; 2000 with --quick)"
    )
    parser.add_argument("--tokenizer", type=Path, default=HERE.parents[1] / "shared" / "tokenizers" / "kimi-k2.6")
    parser.add_argument("--json", type=Path, help="write every target's figure here")
    args = parser.parse_args()
    bytecode.keep()  # (as installed: compiled once)
    w, repeats = str(args.workers), str(args.repeats or (1 if args.quick else 3))
    linear_n = args.linear_conversations or (2000 if args.quick else 16000)
    lines: list[tuple[str, float, str, bool | None]] = []
    with tempfile.TemporaryDirectory(prefix="bench-targets-") as scratch:
        folder = Path(scratch)

        conversations = "6000" if args.quick else "40000"
        store = run(
            "bench_store.py",
            ["--conversations", conversations, "--workers", w, "--repeats", repeats],
            folder / "1.json",
            args.tokenizer,
        )
        first = median(store["times"]["first"])
        for later in ("other seed", "other row length"):
            ratio = first / median(store["times"][later])
            lines.append((f"1. store: first / {later}", ratio, ">= 4", ratio >= 4))

        conversations = "6000" if args.quick else "24000"
        bpe = run(
            "bench_bpe.py",
            ["--conversations", conversations, "--workers", w, "--repeat", repeats],
            folder / "2.json",
            args.tokenizer,
        )
        ratio = median(bpe["times"]["raw tiktoken"]) / median(bpe["times"]["build --bpe gigatoken"])
        lines.append(("2. raw tiktoken / first build", ratio, ">= 1", ratio >= 1))

        linear_args = ["--conversations", str(linear_n), "--sizes", "1,2,4"]
        linear_args += ["--workers", f"1,{w}" if args.workers > 1 else "1", "--modes", "store", "--repeats", repeats]
        linear = run("bench_linear.py", linear_args, folder / "3.json", args.tokenizer)
        runs = linear["runs"]
        sizes = sorted({r["size"] for r in runs})

        def whole(size: int, workers: int) -> float:
            return median([r["whole_seconds"] for r in runs if r["size"] == size and r["workers"] == workers])

        if args.workers > 1:
            ratio = whole(sizes[-1], 1) / whole(sizes[-1], args.workers)
            counts = args.workers >= 16 and len(os.sched_getaffinity(0)) >= 16
            lines.append(
                (
                    f"3. 1 worker / {w} workers, {sizes[-1]:,} conv.",
                    ratio,
                    ">= 8 (16 cores)",
                    ratio >= 8 if counts else None,
                )
            )
        decoded = max(r["decoded"] / r["size"] for r in runs)
        lines.append(("7. source rows decoded per row", decoded, "1", decoded == 1))
        ratio = whole(sizes[-1], 1) / whole(sizes[0], 1)
        lines.append(
            (f"7. time of {sizes[-1] // sizes[0]}N / N (1 worker)", ratio, f"about {sizes[-1] // sizes[0]}", None)
        )

        cases = "small" if args.quick else "normal-all,normal-all-groups"
        memory_args = ["--cases", cases, "--repeat", "1", "--workers", w]
        memory = run("bench_memory.py", memory_args, folder / "7.json", args.tokenizer)
        for case in sorted({r["case"] for r in memory["runs"]}):
            shared = max(r["tree_pss"] for r in memory["runs"] if r["case"] == case)
            lines.append((f"7. peak tree PSS, GiB, {w} workers, {case}", shared / GIB, "< 1", shared < GIB))
        peak = max(r["tree_rss"] for r in memory["runs"])  # (the encoder's pages counted once per process)
        lines.append((f"7. peak tree RSS, GiB, {w} workers", peak / GIB, "(information)", None))

    print()
    for name, figure, target, met in lines:
        verdict = "info" if met is None else ("met" if met else "NOT met")
        print(f"{name:56} {figure:8.2f}   target {target:16} {verdict}")
    if args.json:
        figures = [dict(target=name, figure=figure, wanted=target, met=met) for name, figure, target, met in lines]
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE)
        plan = {"workers": args.workers, "quick": args.quick, "commit": commit.stdout.strip() or None}
        args.json.write_text(json.dumps({**plan, "figures": figures}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The token store: a later build of the same source beside the first, whole process, median of 3.

Writes a synthetic Tulu-like Parquet source (``tests/synthetic.py``). Each repeat starts from
an empty store (``--cache-dir``) and times, each in a fresh process (the CLI, as a user runs
it): the first build (``--rows all``: it encodes the whole source and fills the store), a
second with another seed, and a third with another row length at the first one's seed.
The template check samples by source row, so both find their checks stored and encode
nothing (before ``22cb3e4`` another seed checked other conversations). Prints the median
and range of each, and the first build's median over each later one's. A later build's
rows must be those of the same build without the store (``--no-cache``), else the script
exits 1. ``--invalid SHARE`` makes that share of the source's rows invalid (no messages;
every ``1 / SHARE``-th row, from the middle of the first file) and has every build skip and
record them (``--skip-invalid``).

    python benchmarks/bench_store.py [--conversations 6000] [--repeats 3] [--workers 1] [--no-card]
        [--invalid 0.01] [--json OUT]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=6000)
    parser.add_argument("--row-tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--no-card", action="store_true", help="builds write no dataset card (its plots cost ~0.6 s)")
    parser.add_argument("--invalid", type=float, default=0.0, help="the share of source rows made invalid, skipped")
    parser.add_argument("--tokenizer", type=Path, default=ROOT.parent / "shared" / "tokenizers" / "kimi-k2.6")
    parser.add_argument("--json", type=Path, help="write the plan and every time here")
    args = parser.parse_args()
    bytecode.keep()  # (as installed: compiled once)

    import synthetic

    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        source = folder / "source"
        rows = synthetic.conversations(args.conversations, seed=3)
        if args.invalid:
            for row in rows[1000 :: round(1 / args.invalid)]:
                row["messages"] = []
        synthetic.write_parquet(rows, source, rows_per_file=2000)
        common = ["--source", str(source), "--tokenizer", str(args.tokenizer), "--rows", "all"]
        common += ["--workers", str(args.workers), "--quiet", *(["--no-card"] if args.no_card else [])]
        common += ["--skip-invalid"] if args.invalid else []
        builds = {
            "first": ["--seed", "1", "--row-tokens", str(args.row_tokens)],
            "other seed": ["--seed", "2", "--row-tokens", str(args.row_tokens)],
            "other row length": ["--seed", "1", "--row-tokens", str(args.row_tokens // 2)],
        }

        def run(name: str, extra: list[str], out: Path) -> tuple[float, str]:
            command = [sys.executable, str(ROOT / "generate_fixed_sft.py"), "build", *common, *builds[name]]
            start = time.perf_counter()
            subprocess.run([*command, *extra, "--out", str(out)], check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
            seconds = time.perf_counter() - start
            return seconds, json.loads((out / "manifest.json").read_text())["rows_sha256"]

        times: dict[str, list[float]] = {name: [] for name in builds}
        hashes: dict[str, set[str]] = {name: set() for name in builds}
        for repeat in range(args.repeats):
            store = folder / f"store-{repeat}"
            for name in builds:
                seconds, digest = run(name, ["--cache-dir", str(store)], folder / f"{name}-{repeat}".replace(" ", "-"))
                times[name].append(seconds)
                hashes[name].add(digest)
        plain = {name: run(name, ["--no-cache"], folder / f"plain-{name}".replace(" ", "-"))[1] for name in builds}

    same = all(hashes[name] == {plain[name]} for name in builds)
    first = statistics.median(times["first"])
    card = (", no card" if args.no_card else "") + (f", {args.invalid:.1%} of rows invalid" if args.invalid else "")
    print(f"{args.conversations:,} conversations, rows of {args.row_tokens:,} tokens, {args.workers} worker(s){card}")
    for name, values in times.items():
        median = statistics.median(values)
        ratio = "" if name == "first" else f"  first / this: {first / median:.2f}x"
        print(f"{name:>17}: median {median:.2f} s ({min(values):.2f} to {max(values):.2f}){ratio}")
    print("rows the same as without the store: " + ("yes" if same else "NO"))
    if args.json:
        plan = {k: v for k, v in vars(args).items() if k != "json"}
        machine = {"cores": os.cpu_count(), "python": sys.version.split()[0]}
        document = {"plan": {**plan, "tokenizer": str(args.tokenizer)}, "machine": machine, "times": times}
        args.json.write_text(json.dumps({**document, "same_rows": same}, indent=1) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

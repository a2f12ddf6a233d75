#!/usr/bin/env python3
"""Where a build's peak memory is: each process's own memory by mapping, and the tree's PSS.

Usage::

    python benchmarks/smaps_peak.py [--workers W ...] [--conversations N] [--tokenizer FOLDER]

Builds ``--rows all`` of N synthetic conversations in one Parquet file (target 7's source
in ``bench_memory.py``) into a fresh store, once per worker count, reading
``/proc/PID/smaps`` of every process of the build every 0.2 s. Prints the tree's peak PSS
with each process's share then, and for each kind of process (the build, the fork server,
a worker, the drawing process) its own memory (private pages) at its peak, by mapping:
``[heap]`` (glibc's main heap), ``[anon]`` (other mappings: Python's arenas, large blocks,
threads' heaps), and files.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import synthetic  # noqa: E402
from bench_memory import _children  # noqa: E402  (each live process's children)


def descendants(root: int) -> list[tuple[int, int]]:
    """``root`` and every process below it, each with its depth."""
    tree, found = _children(), [(root, 0)]
    for pid, depth in found:
        found += [(child, depth + 1) for child in tree.get(pid, [])]
    return found


def by_mapping(pid: int) -> collections.Counter:
    """KiB of private pages by mapping, and ``PSS``."""
    kib: collections.Counter = collections.Counter()
    name = "[anon]"
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if not fields[0].endswith(":"):
                name = fields[5] if len(fields) > 5 else "[anon]"
                name = os.path.basename(name) if name.startswith("/") else name
            elif fields[0] in ("Private_Dirty:", "Private_Clean:"):
                kib[name] += int(fields[1])
            elif fields[0] == "Pss:":
                kib["PSS"] += int(fields[1])
    return kib


def role(pid: int, depth: int) -> str:
    command = Path(f"/proc/{pid}/cmdline").read_text()
    if depth == 0:
        return "build"
    if "forkserver" in command:
        return "fork server" if depth == 1 else "worker"
    return "drawing" if "plots" in command else f"other (depth {depth})"


def measure(source: Path, workers: int, tokenizer: Path, work: Path) -> None:
    out, cache = Path(tempfile.mkdtemp(dir=work)) / "out", Path(tempfile.mkdtemp(dir=work))  # (a fresh store)
    command = [sys.executable, str(HERE.parent / "generate_fixed_sft.py"), "build", "--source", str(source)]
    command += ["--tokenizer", str(tokenizer), "--rows", "all", "--row-tokens", "4096", "--workers", str(workers)]
    command += ["--cache-dir", str(cache), "--out", str(out), "--quiet"]
    start = time.perf_counter()
    build = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    own: dict[str, tuple[int, collections.Counter, float]] = {}
    peak: tuple[int, list[tuple[str, int]], float] = (0, [], 0.0)
    while build.poll() is None:
        time.sleep(0.2)
        total, shares = 0, []
        for pid, depth in descendants(build.pid):
            try:
                kind, kib = role(pid, depth), by_mapping(pid)
            except OSError:
                continue
            total += kib["PSS"]
            shares.append((kind, kib["PSS"] >> 10))
            private = sum(v for k, v in kib.items() if k != "PSS")
            if private > own.get(kind, (0,))[0]:
                own[kind] = (private, kib, time.perf_counter() - start)
        if total > peak[0]:
            peak = (total, sorted(shares), time.perf_counter() - start)
    print(
        f"{workers} workers: {time.perf_counter() - start:.1f} s, peak tree PSS {peak[0] >> 10} MiB at {peak[2]:.1f} s"
    )
    for kind in sorted({k for k, _ in peak[1]}):
        print(f"  PSS then, {kind}: {[mib for k, mib in peak[1] if k == kind]} MiB")
    for kind, (private, kib, at) in sorted(own.items()):
        top = ", ".join(f"{k} {v >> 10}" for k, v in kib.most_common(6) if k != "PSS" and v >= 1024)
        print(f"  own, {kind}: {private >> 10} MiB at {at:.1f} s ({top})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--conversations", type=int, default=80_000)
    parser.add_argument("--tokenizer", type=Path, default=HERE.parent.parent / "shared/tokenizers/kimi-k2.6")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        synthetic.write_parquet(
            synthetic.conversations(args.conversations, seed=6), work / "source", rows_per_file=args.conversations
        )
        for workers in args.workers:
            measure(work / "source", workers, args.tokenizer, work)


if __name__ == "__main__":
    main()

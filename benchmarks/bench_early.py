"""A first build's workers, their fork server started before the build's imports against after them, whole process.

Writes a synthetic source (``tests/synthetic.py``; ``--corpus short``: short dialogs, as
``bench_linear.py``; row groups of 1,000 and 4,000 rows, a fill task each) and times pairs
of first builds (``--rows all``, each from an empty store but for the template probes, each
in a fresh process as the CLI runs it), the two ways alternating: the fork server started
as the command line is read (``fixed_sft.early``; ``cli.EARLY_WORKERS`` at its value) and
started once the build knows its encoder (``EARLY_WORKERS`` past any worker count). Both
ways must give the same rows, else the script exits 1; it exits 2 where the workers or
cores are fewer than ``EARLY_WORKERS``. Prints the median and range of each and the ratio
of the medians.

    python benchmarks/bench_early.py [--conversations 64000] [--corpus tulu|short] [--workers 16] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

ROW_GROUPS = {"tulu": 1000, "short": 4000}  # rows per row group, as the 16-core rows of bench_linear.py
WAYS = {"early": "cli.EARLY_WORKERS", "after the imports": "1 << 62"}  # EARLY_WORKERS in the build's process


def _build(args: list[str], way: str) -> None:
    """The CLI's build of ``args`` in a fresh process, ``EARLY_WORKERS`` set for ``way``."""
    code = f"import sys; from fixed_sft import cli; cli.EARLY_WORKERS = {WAYS[way]}; "
    code += "sys.exit(cli.main(sys.argv[1:], early=True))"
    subprocess.run([sys.executable, "-c", code, "build", *args], check=True, stdout=subprocess.DEVNULL, cwd=ROOT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=64000)
    parser.add_argument("--corpus", choices=("tulu", "short"), default="tulu")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--row-group-rows", type=int, help="Parquet row group size (default: 1,000; short: 4,000)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tokenizer", type=Path, default=ROOT.parent / "shared" / "tokenizers" / "kimi-k2.6")
    parser.add_argument("--json", type=Path, help="write the plan and every time here")
    args = parser.parse_args()

    import pyarrow.parquet as pq
    import synthetic
    from bench_linear import _short

    from fixed_sft.cli import EARLY_WORKERS
    from fixed_sft.engine import usable_cores

    if min(args.workers, usable_cores()) < EARLY_WORKERS:
        print(f"error: the early start needs {EARLY_WORKERS} workers and cores", file=sys.stderr)
        return 2
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    same = True
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        rows = synthetic.conversations(args.conversations, seed=3)
        if args.corpus == "short":
            rows = [_short(row, k) for k, row in enumerate(rows)]
        synthetic.write_parquet(rows, folder / "source", rows_per_file=max(1, args.conversations // 4))
        for path in sorted((folder / "source").glob("*.parquet")):  # (a fill task per row group, as bench_linear)
            pq.write_table(pq.read_table(path), path, row_group_size=args.row_group_rows or ROW_GROUPS[args.corpus])
        common = ["--source", str(folder / "source"), "--tokenizer", str(args.tokenizer), "--rows", "all"]
        common += ["--row-tokens", "4096", "--seed", "1", "--workers", str(args.workers), "--no-card", "--quiet"]
        _build([*common, "--rows", "1", "--cache-dir", str(folder / "probes"), "--out", str(folder / "warm")], "early")
        hashes = set()
        for repeat in range(args.repeats):
            for way in WAYS if repeat % 2 == 0 else reversed(WAYS):
                name = f"{way}-{repeat}".replace(" ", "-")
                store = folder / f"store-{name}"
                shutil.copytree(folder / "probes" / "probes", store / "probes")  # (the template probes kept)
                start = time.perf_counter()
                _build([*common, "--cache-dir", str(store), "--out", str(folder / name)], way)
                times[way].append(time.perf_counter() - start)
                hashes.add(json.loads((folder / name / "manifest.json").read_text())["rows_sha256"])
        same = len(hashes) == 1

    print(f"{args.conversations:,} {args.corpus} conversations, a first build at {args.workers} workers")
    for way, values in times.items():
        print(f"  {way:18s} {statistics.median(values):6.2f} s ({min(values):.2f}-{max(values):.2f})")
    ratio = statistics.median(times["after the imports"]) / statistics.median(times["early"])
    print(f"  after / early: {ratio:.2f}x; same rows: {same}")
    if args.json:
        plan = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
        args.json.write_text(json.dumps({"plan": plan, "times": times, "ratio": ratio, "same_rows": same}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

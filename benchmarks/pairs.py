"""Two ways of one build, timed in alternating pairs, each build in a fresh process as the program runs it.

The helpers of ``bench_early.py``, ``bench_stored_packing.py`` and ``bench_parts.py``: a
way is a Python statement run in the build's process before the CLI (a module constant
set), and the two ways of a pair must give the same rows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

ROW_GROUPS = {"tulu": 1000, "short": 4000}  # rows per row group: a fill task each, as the 16-core rows of bench_linear


def arguments(description: str, conversations: int) -> argparse.ArgumentParser:
    """The flags both scripts take."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--conversations", type=int, default=conversations)
    parser.add_argument("--corpus", choices=("tulu", "short"), default="tulu")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tokenizer", type=Path, default=ROOT.parent / "shared" / "tokenizers" / "kimi-k2.6")
    parser.add_argument("--json", type=Path, help="write the plan and every time here")
    return parser


def enough(workers: int, needed: int, what: str) -> bool:
    """Whether ``workers`` (at most one a core here) reach ``needed``; else the error, said."""
    from fixed_sft.engine import usable_cores

    if min(workers, usable_cores()) >= needed:
        return True
    print(f"error: {what} needs {needed} workers and cores", file=sys.stderr)
    return False


def write_source(folder: Path, conversations: int, corpus: str) -> Path:
    """A synthetic source of ``conversations`` (``short``: short dialogs, as ``bench_linear.py``)
    in 4 Parquet files of ``ROW_GROUPS`` rows per row group."""
    import pyarrow.parquet as pq
    import synthetic
    from bench_linear import _short

    rows = synthetic.conversations(conversations, seed=3)
    if corpus == "short":
        rows = [_short(row, k) for k, row in enumerate(rows)]
    synthetic.write_parquet(rows, folder / "source", rows_per_file=max(1, conversations // 4))
    for path in sorted((folder / "source").glob("*.parquet")):
        pq.write_table(pq.read_table(path), path, row_group_size=ROW_GROUPS[corpus])
    return folder / "source"


def build(args: list[str], way: str) -> str:
    """The CLI's build of ``args`` (with ``--out``) in a fresh process, after the statement
    ``way``; its rows_sha256."""
    code = f"import sys; {way}; from fixed_sft.cli import main; sys.exit(main(sys.argv[1:], early=True))"
    subprocess.run([sys.executable, "-c", code, "build", *args], check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    return json.loads((Path(args[args.index("--out") + 1]) / "manifest.json").read_text())["rows_sha256"]


def alternate(ways: dict[str, str], repeats: int, run: Callable[[str, str, int], str]) -> tuple[dict, bool]:
    """Each way's times over ``repeats`` pairs, the order alternating (``run(way's name,
    way, repeat)`` builds and gives the rows' sha256), and whether each pair's rows are the same."""
    times: dict[str, list[float]] = {name: [] for name in ways}
    same = True
    for repeat in range(repeats):
        hashes = set()
        for name in list(ways) if repeat % 2 == 0 else reversed(list(ways)):
            start = time.perf_counter()
            hashes.add(run(name, ways[name], repeat))
            times[name].append(time.perf_counter() - start)
        same &= len(hashes) == 1
    return times, same


def later_builds(
    args: argparse.Namespace, ways: dict[str, str], fill: str, row_tokens: int = 4096
) -> tuple[dict, bool]:
    """Fill a store from a synthetic source (``write_source``) with a first build at
    ``args.workers`` after the statement ``fill``, then time later builds at other seeds
    (``alternate``)."""
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        source = write_source(folder, args.conversations, args.corpus)
        common = ["--source", str(source), "--tokenizer", str(args.tokenizer), "--rows", "all"]
        common += ["--row-tokens", str(row_tokens), "--workers", str(args.workers), "--no-card", "--quiet"]
        common += ["--cache-dir", str(folder / "store")]
        build([*common, "--seed", "1", "--out", str(folder / "first")], fill)

        def run(name: str, way: str, repeat: int) -> str:
            out = folder / f"{name}-{repeat}".replace(" ", "-")
            return build([*common, "--seed", str(10 + repeat), "--out", str(out)], way)

        return alternate(ways, args.repeats, run)


def report(title: str, times: dict[str, list[float]], same: bool, args: argparse.Namespace) -> int:
    """Print each way's median and range and the ratio of the medians (the second way's over
    the first's); write them with the plan to ``--json``; the exit code (1: rows differ)."""
    first, second = times
    ratio = statistics.median(times[second]) / statistics.median(times[first])
    print(title)
    for name, values in times.items():
        print(f"  {name:18s} {statistics.median(values):6.2f} s ({min(values):.2f}-{max(values):.2f})")
    print(f"  {second} / {first}: {ratio:.2f}x; same rows: {same}")
    if args.json:
        plan = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
        args.json.write_text(json.dumps({"plan": plan, "times": times, "ratio": ratio, "same_rows": same}, indent=1))
    return 0 if same else 1

"""A build that encodes nothing: packed in its workers against one conversation at a time, whole process.

Writes a synthetic source (``tests/synthetic.py``; ``--corpus short``: short dialogs, as
``bench_linear.py``), fills the token store with a first build (``--rows all``), then times
pairs of later builds at other seeds, each in a fresh process as the CLI runs it, the two
ways alternating: in the workers (``build.STORED_PACKING_TOKENS`` set to 0) and one
conversation at a time (set past any source). Both ways must give the same rows, else the
script exits 1; it exits 2 with fewer workers or cores than packing in the workers needs.
Prints the median and range of each and the ratio of the medians: the figure
``STORED_PACKING_TOKENS`` rests on.

    python benchmarks/bench_stored_packing.py [--conversations 40000] [--corpus tulu|short]
        [--workers 16] [--repeats 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

WAYS = {"workers": "0", "one at a time": "1 << 62"}  # STORED_PACKING_TOKENS in the build's process


def _build(args: list[str], way: str) -> None:
    """The CLI's build of ``args`` in a fresh process, ``STORED_PACKING_TOKENS`` set for ``way``."""
    code = (
        "import sys, fixed_sft.build as build; "
        f"build.STORED_PACKING_TOKENS = {WAYS[way]}; "
        "from fixed_sft.cli import main; sys.exit(main(sys.argv[1:], early=True))"
    )
    subprocess.run([sys.executable, "-c", code, "build", *args], check=True, stdout=subprocess.DEVNULL, cwd=ROOT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=40000)
    parser.add_argument("--corpus", choices=("tulu", "short"), default="tulu")
    parser.add_argument("--row-tokens", type=int, default=4096)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tokenizer", type=Path, default=ROOT.parent / "shared" / "tokenizers" / "kimi-k2.6")
    parser.add_argument("--json", type=Path, help="write the plan and every time here")
    args = parser.parse_args()

    import synthetic
    from bench_linear import _short

    from fixed_sft.build import PARALLEL_PACKING_WORKERS
    from fixed_sft.engine import usable_cores

    if min(args.workers, usable_cores()) < PARALLEL_PACKING_WORKERS:
        print(f"error: packing in the workers needs {PARALLEL_PACKING_WORKERS} workers and cores", file=sys.stderr)
        return 2

    times: dict[str, list[float]] = {way: [] for way in WAYS}
    same = True
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        rows = synthetic.conversations(args.conversations, seed=3)
        if args.corpus == "short":
            rows = [_short(row, k) for k, row in enumerate(rows)]
        synthetic.write_parquet(rows, folder / "source", rows_per_file=max(1, args.conversations // 4))
        common = ["--source", str(folder / "source"), "--tokenizer", str(args.tokenizer), "--rows", "all"]
        common += ["--row-tokens", str(args.row_tokens), "--workers", str(args.workers), "--no-card", "--quiet"]
        common += ["--cache-dir", str(folder / "store")]
        _build([*common, "--seed", "1", "--out", str(folder / "first")], "one at a time")  # (fills the store)
        for repeat in range(args.repeats):
            hashes = set()
            for way in WAYS if repeat % 2 == 0 else reversed(WAYS):
                out = folder / f"{way}-{repeat}".replace(" ", "-")
                start = time.perf_counter()
                _build([*common, "--seed", str(10 + repeat), "--out", str(out)], way)
                times[way].append(time.perf_counter() - start)
                hashes.add(json.loads((out / "manifest.json").read_text())["rows_sha256"])
            same &= len(hashes) == 1

    print(f"{args.conversations:,} {args.corpus} conversations, a later build at {args.workers} workers")
    for way, values in times.items():
        print(f"  {way:15s} {statistics.median(values):6.2f} s ({min(values):.2f}-{max(values):.2f})")
    ratio = statistics.median(times["one at a time"]) / statistics.median(times["workers"])
    print(f"  one at a time / workers: {ratio:.2f}x; same rows: {same}")
    if args.json:
        plan = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
        args.json.write_text(json.dumps({"plan": plan, "times": times, "ratio": ratio, "same_rows": same}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

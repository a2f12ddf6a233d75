"""A spot check of a few rows (``verify --rebuild --rows sample:N``) beside the full rebuild.

Writes a synthetic Tulu-like JSONL source (``tests/synthetic.py``), builds every row of it
(``--rows all``) with one worker, then times, in this process, ``rebuild.rebuild`` (one
worker: the spot check encodes in one process too) and ``spot.spot_check`` of
``sample:N`` rows and of row 0 alone (its fixed cost: the tokenizer loaded, the source
hashed, the order computed), each ``--repeats`` times after one warm-up run of each.
Prints the median and range of each, and the ratio of the full rebuild's median to the
spot check's. Each must find the rows the same, else the script exits 1.

    python benchmarks/bench_spot.py [--conversations 1500] [--row-tokens 1024] [--sample 10] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=1500)
    parser.add_argument("--row-tokens", type=int, default=1024)
    parser.add_argument("--sample", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokenizer", type=Path, default=ROOT.parent / "shared" / "tokenizers" / "kimi-k2.6")
    args = parser.parse_args()

    import synthetic

    from fixed_sft.build import BuildConfig, build
    from fixed_sft.rebuild import rebuild, report
    from fixed_sft.spot import parse_rows, spot_check

    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        source = synthetic.write_jsonl(synthetic.conversations(args.conversations, seed=3), folder / "rows.jsonl")
        config = BuildConfig(
            name="bench",
            source=str(source),
            tokenizer=str(args.tokenizer),
            rows=None,
            row_tokens=args.row_tokens,
            seed=42,
            workers=1,
            cache_dir=folder / "store",  # (not the user's)
        )
        manifest = build(config, folder / "out")

        def full() -> bool:
            return report(rebuild(folder / "out", str(source), str(args.tokenizer), workers=1))[0]

        def spot(rows: str) -> Callable[[], bool]:
            return lambda: spot_check(folder / "out", parse_rows(rows), str(source), str(args.tokenizer)).same

        runs = {
            "full rebuild": full,
            f"spot check of {args.sample} rows": spot(f"sample:{args.sample}"),
            "spot check of row 0": spot("0"),
        }
        times: dict[str, list[float]] = {name: [] for name in runs}
        for name, run in runs.items():
            for repeat in range(args.repeats + 1):  # (the first: a warm-up, not timed)
                start = time.perf_counter()
                if not run():
                    print(f"{name}: the rows differ", file=sys.stderr)
                    return 1
                if repeat:
                    times[name].append(time.perf_counter() - start)

    stats = manifest["stats"]
    print(
        f"{args.conversations} conversations, {stats['rows']} rows of {args.row_tokens} tokens "
        f"({stats['conversations']} conversations in them); median of {args.repeats}, seconds"
    )
    medians = {}
    for name, values in times.items():
        medians[name] = statistics.median(values)
        print(f"  {name}: {medians[name]:.3f} ({min(values):.3f} to {max(values):.3f})")
    full_time, spot_time, _ = medians.values()
    print(f"  ratio (full rebuild / spot check of {args.sample} rows): {full_time / spot_time:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

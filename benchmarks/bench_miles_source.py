"""Peak memory of the miles data source on a file and on one 10x larger.

Writes two fixed-sft/2 Parquet files of random rows (``--rows`` and 10x as many, 8,192
tokens each), then, each in a fresh process, reads every row once:
- ``ParquetRowSource`` (``get_samples`` in batches of 64, shuffled), and
- miles' own ``Dataset`` as ``tests/miles_emulation.py`` emulates it (every row as Python
  lists), on the smaller file only, for contrast.
A process that only imports and opens the file is the baseline. Prints peak RSS (MiB)
and the ratio of the larger file's to the smaller's, median and range over repeats.

    python benchmarks/bench_miles_source.py [--rows 320] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from fixed_sft.output import RowWriter  # noqa: E402
from fixed_sft.pack import Row, Segment  # noqa: E402

ROW_TOKENS = 8192

READ = r"""
import json, resource, sys
from types import SimpleNamespace
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests"]
import pytest, miles_emulation
mode, path = sys.argv[2], sys.argv[3]
patch = pytest.MonkeyPatch()
rollout = miles_emulation.install(patch)
args = SimpleNamespace(prompt_data=path, rollout_shuffle=True, rollout_seed=1, n_samples_per_prompt=1, save=None,
                       load=None, rollout_batch_size=64)
tokens = 0
if mode == "source":
    source = rollout.ParquetRowSource(args)
    for _ in range(-(-source.rows // 64)):
        tokens += sum(len(s.tokens) for (s,) in rollout.generate_rollout(args, 0, source))
elif mode == "dataset":
    source = miles_emulation.RolloutDataSource(miles_emulation.dataset(path), shuffle=True, seed=1)
    for _ in range(-(-len(source.samples) // 64)):
        tokens += sum(len(s.tokens) for (s,) in rollout.generate_rollout(args, 0, source))
else:
    rollout.ParquetRowSource(args)
print(json.dumps({"peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "tokens": tokens}))
"""


def write(path: Path, rows: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    writer = RowWriter(path)
    for n in range(rows):
        ids = rng.integers(0, 163_840, ROW_TOKENS, dtype=np.int32)
        mask = (rng.random(ROW_TOKENS) < 0.6).astype(np.uint8)
        writer.write(Row(ids, mask, (Segment(n, f"c{n}", 0, ROW_TOKENS),)))
    writer.close()


def peak(mode: str, path: Path) -> float:
    run = subprocess.run(
        [sys.executable, "-c", READ, str(ROOT), mode, str(path)], capture_output=True, text=True, check=True
    )
    return float(json.loads(run.stdout.splitlines()[-1])["peak_mib"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=320)
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        small, large = Path(tmp) / "small.parquet", Path(tmp) / "large.parquet"
        write(small, options.rows, 1)
        write(large, 10 * options.rows, 2)
        results: dict[str, list[float]] = {}
        for _ in range(options.repeats):
            for name, mode, path in [
                ("baseline (open only)", "open", large),
                ("source, 1x file", "source", small),
                ("source, 10x file", "source", large),
                ("miles Dataset, 1x file", "dataset", small),
            ]:
                results.setdefault(name, []).append(peak(mode, path))
    print(
        f"rows of {ROW_TOKENS:,} tokens: {options.rows:,} (1x) and {10 * options.rows:,} (10x); "
        f"{options.repeats} repeats"
    )
    print(f"{'case':<26}{'peak RSS MiB, median':>22}{'range':>20}")
    for name, values in results.items():
        print(f"{name:<26}{statistics.median(values):>22.0f}{f'{min(values):.0f}-{max(values):.0f}':>20}")
    ratios = [b / a for a, b in zip(results["source, 1x file"], results["source, 10x file"])]
    print(
        f"source peak, 10x file / 1x file: median {statistics.median(ratios):.2f} "
        f"(range {min(ratios):.2f}-{max(ratios):.2f})"
    )


if __name__ == "__main__":
    main()

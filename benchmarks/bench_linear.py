"""Cost of a ``--rows all`` build against the source's size: the store's one pass beside bands.

Writes synthetic Tulu-like Parquet sources (``tests/synthetic.py``) of N, 2N and 4N
conversations and builds each whole (``rows`` all), each build in a fresh process, with
bands of ``--band-mib`` (``fixed_sft.build.BAND_BYTES``, lowered so that a small source
is several bands; a real source is several bands of 384 MiB):

* ``store``: with an empty token store, which the build fills in one pass over the source;
* ``bands``: ``--no-cache``, which reads the source once per band.

For each, the seconds and the source rows decoded (Parquet batches counted in the build's
process), median and range of ``--repeats``; then each size's time over N's. Linear cost:
4N takes about 4x N's time, and decodes 4N rows. Both must give the same rows, else the
script exits 1.

    python benchmarks/bench_linear.py [--conversations 4000] [--band-mib 4] [--repeats 3] [--json OUT]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

# the build of one case, in a fresh interpreter: argv = config JSON, out, band bytes
CHILD = """
import json, sys, time
from pathlib import Path
import pyarrow.parquet as pq
import fixed_sft.build as build_module

decoded = []
iter_batches = pq.ParquetFile.iter_batches

def counting(self, *args, **kwargs):
    for batch in iter_batches(self, *args, **kwargs):
        decoded.append(batch.num_rows)
        yield batch

pq.ParquetFile.iter_batches = counting
build_module.BAND_BYTES = float(sys.argv[3])
start = time.perf_counter()
manifest = build_module.build(build_module.BuildConfig(**json.loads(sys.argv[1])), Path(sys.argv[2]))
print(json.dumps({"seconds": time.perf_counter() - start, "decoded": sum(decoded), "sha": manifest["rows_sha256"]}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=4000, metavar="N")
    parser.add_argument("--band-mib", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokenizer", type=Path, default=ROOT.parent / "shared" / "tokenizers" / "kimi-k2.6")
    parser.add_argument("--json", type=Path, help="write the plan and every build's figures here")
    args = parser.parse_args()

    import synthetic

    sizes = [args.conversations, 2 * args.conversations, 4 * args.conversations]
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        rows = synthetic.conversations(sizes[-1], seed=3)
        for size in sizes:
            synthetic.write_parquet(rows[:size], folder / f"source-{size}", rows_per_file=size // 4)
        for repeat in range(args.repeats):
            for size in sizes:
                for mode in ("store", "bands"):
                    name = f"{mode}-{size}-{repeat}"
                    config = dict(
                        name="linear",
                        source=str(folder / f"source-{size}"),
                        tokenizer=str(args.tokenizer),
                        rows=None,
                        row_tokens=4096,
                        seed=1,
                        workers=1,
                        no_card=True,
                        no_cache=mode == "bands",
                        cache_dir=str(folder / f"store-{name}"),
                    )
                    command = [sys.executable, "-c", CHILD, json.dumps(config), str(folder / name)]
                    done = subprocess.run(
                        [*command, str(args.band_mib * (1 << 20))], check=True, capture_output=True, text=True, cwd=ROOT
                    )
                    runs.append({"mode": mode, "size": size, **json.loads(done.stdout.splitlines()[-1])})
                    print(f"  {name}: {runs[-1]['seconds']:.2f} s, {runs[-1]['decoded']:,} rows decoded", flush=True)

    def of(mode: str, size: int, key: str) -> list[float]:
        return [r[key] for r in runs if r["mode"] == mode and r["size"] == size]

    print(f"--rows all builds, bands of {args.band_mib} MiB, 1 worker, median (range) of {args.repeats}")
    for mode in ("store", "bands"):
        base = statistics.median(of(mode, sizes[0], "seconds"))
        for size in sizes:
            seconds = of(mode, size, "seconds")
            median = statistics.median(seconds)
            print(
                f"{mode:>6} {size:>7,} conversations: {median:6.2f} s ({min(seconds):.2f}-{max(seconds):.2f}), "
                f"{median / base:.2f}x N's time; decoded {statistics.median(of(mode, size, 'decoded')):,.0f} rows"
            )
    same = all(len({r["sha"] for r in runs if r["size"] == size}) == 1 for size in sizes)
    print("rows the same with the store and with bands: " + ("yes" if same else "NO"))
    if args.json:
        plan = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "json"}
        machine = {"cores": os.cpu_count(), "python": sys.version.split()[0]}
        args.json.write_text(json.dumps({"plan": plan, "machine": machine, "runs": runs, "same_rows": same}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

"""Cost of a ``--rows all`` build against the source's size: the store's one pass beside bands.

Writes synthetic Tulu-like Parquet sources (``tests/synthetic.py``) of N, 2N and 4N
conversations and builds each whole (``rows`` all), each build in a fresh process run as
the CLI runs it (``fixed_sft.cli.main``), with bands of ``--band-mib``
(``fixed_sft.build.BAND_BYTES``, lowered so that a small source is several bands; a real
source is several bands of 384 MiB):

* ``store``: with an empty token store, which the build fills in one pass over the source;
* ``bands``: ``--no-cache``, which reads the source once per band.

For each, the seconds of ``main`` once the build's modules are imported (and where they
went: filling the store, packing one conversation at a time, the parallel packing's index
and write passes, the rest), the seconds of the whole process (the interpreter's start,
the imports and the exit too, as a user waits for them), the CPU seconds the
machine was busy meanwhile (all the build's processes, and anything else running) and the
source rows decoded (Parquet batches counted in the build's process), median and range of
``--repeats``; then each size's time over N's. Linear cost: 4N takes about 4x N's time,
and decodes 4N rows. Both must give the same rows, else the
script exits 1.

    python benchmarks/bench_linear.py [--conversations 4000] [--band-mib 4] [--repeats 3] [--json OUT]
        [--sizes 1,2,4] [--workers 1] [--modes store,bands] [--corpus tulu|short] [--row-group-rows R]
        [--cold-probes]

``--workers 1,16`` builds each case at each worker count (the fill pass runs a task per
Parquet row group, so a source needs many row groups to keep many workers busy:
``--row-group-rows``); ``--corpus short`` makes short dialogs (2 to 4 turns of up to 300
characters) instead of Tulu-like conversations. Each build finds the template's probes kept
in its store's folder, as after any earlier build with the tokenizer (a build of one row
keeps them first); ``--cold-probes`` times builds that find none.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bytecode
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

# the build of one case, in a fresh interpreter, as the command line runs it: argv = the CLI's
# arguments as JSON, band bytes
CHILD = """
import json, os, sys, time
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # (as fixed_sft.cli.main does: numpy is imported here first)
from pathlib import Path
import pyarrow.parquet as pq
import fixed_sft.build as build_module
from fixed_sft import cli

decoded = []
iter_batches = pq.ParquetFile.iter_batches

def counting(self, *args, **kwargs):
    for batch in iter_batches(self, *args, **kwargs):
        decoded.append(batch.num_rows)
        yield batch

pq.ParquetFile.iter_batches = counting
build_module.BAND_BYTES = float(sys.argv[2])
phases = {}

def timed(module, name):
    real = getattr(module, name)

    def wrapper(*args, **kwargs):
        begin = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            phases[name] = phases.get(name, 0.0) + time.perf_counter() - begin

    setattr(module, name, wrapper)

import fixed_sft.parallel as parallel_module
for module, name in (
    (build_module, "_fill"),
    (parallel_module, "_index"),
    (parallel_module, "_write"),
    (build_module, "_pack"),
):
    timed(module, name)
argv = json.loads(sys.argv[1])
start = time.perf_counter()
code = cli.main(argv, early=True)
seconds = time.perf_counter() - start
assert code == 0, code
phases["other"] = seconds - sum(phases.values())
manifest = json.loads((Path(argv[argv.index("--out") + 1]) / "manifest.json").read_text())
print(json.dumps({"seconds": seconds, "decoded": sum(decoded), "sha": manifest["rows_sha256"], "phases": phases}))
"""


def _arguments(config: dict) -> list[str]:
    """The CLI's ``build`` arguments for ``config`` (flag name -> value; ``True``: a bare flag)."""
    argv = ["build"]
    for key, value in config.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not False and value is not None:
            argv += [flag, str(value)]
    return argv


def _busy_seconds() -> float:
    """CPU seconds the machine has been busy (``/proc/stat``: all but idle and I/O wait), so
    far: over a build, its processes' (the fork server's workers are no child this process
    waits for) and whatever else runs; 0 where there is no ``/proc/stat``."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return 0.0
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _short(row: dict, k: int) -> dict:
    """A short dialog from a synthetic row: 2 to 4 of its first messages, each cut to 300 characters."""
    turns = 2 + k % 3
    messages = [{**m, "content": m["content"][:300]} for m in row["messages"][:turns]]
    if messages[-1]["role"] != "assistant" and len(messages) > 1:
        messages = messages[:-1]
    return {**row, "messages": messages}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=4000, metavar="N")
    parser.add_argument("--band-mib", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", type=int, help="rows of 4,096 tokens to build (default: all)")
    parser.add_argument("--sizes", default="1,2,4", help="multiples of N to build (default 1,2,4)")
    parser.add_argument("--workers", default="1", help="comma-separated worker counts (default 1)")
    parser.add_argument("--modes", default="store,bands", help="store, bands or both (default both)")
    parser.add_argument("--corpus", choices=("tulu", "short"), default="tulu")
    parser.add_argument("--row-group-rows", type=int, default=1000, metavar="R", help="Parquet row group size")
    parser.add_argument("--tokenizer", type=Path, default=ROOT.parent / "shared" / "tokenizers" / "kimi-k2.6")
    parser.add_argument(
        "--cold-probes", action="store_true", help="builds find no template probes kept (as a first build ever)"
    )
    parser.add_argument("--json", type=Path, help="write the plan and every build's figures here")
    args = parser.parse_args()
    bytecode.keep()  # (as installed: compiled once)

    import synthetic

    sizes = [int(k) * args.conversations for k in args.sizes.split(",")]
    worker_counts = [int(w) for w in args.workers.split(",")]
    modes = args.modes.split(",")
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        rows = synthetic.conversations(sizes[-1], seed=3)
        if args.corpus == "short":
            rows = [_short(row, k) for k, row in enumerate(rows)]
        for size in sizes:
            synthetic.write_parquet(rows[:size], folder / f"source-{size}", rows_per_file=max(1, size // 4))
            for path in sorted((folder / f"source-{size}").glob("*.parquet")):
                pq.write_table(pq.read_table(path), path, row_group_size=args.row_group_rows)
        probes = folder / "probes-root"
        if not args.cold_probes:  # (a build of a few rows keeps them: fixed_sft.chat.read_probes)
            warm = dict(source=folder / f"source-{sizes[0]}", tokenizer=args.tokenizer, rows=1, row_tokens=64)
            warm |= dict(seed=1, workers=1, no_card=True, cache_dir=probes, out=folder / "warm")
            command = [sys.executable, "-c", CHILD, json.dumps(_arguments(warm)), str(1 << 30)]
            subprocess.run(command, check=True, capture_output=True, cwd=ROOT)
        for repeat in range(args.repeats):
            for size in sizes:
                for workers in worker_counts:
                    for mode in modes:
                        name = f"{mode}-{size}-w{workers}-{repeat}"
                        config = dict(
                            source=folder / f"source-{size}",
                            tokenizer=args.tokenizer,
                            rows=args.rows or "all",
                            row_tokens=4096,
                            seed=1,
                            workers=workers,
                            no_card=True,
                            no_cache=mode == "bands",
                            cache_dir=folder / f"store-{name}",
                            quiet=True,
                            out=folder / name,
                        )
                        if (probes / "probes").is_dir():
                            shutil.copytree(probes / "probes", folder / f"store-{name}" / "probes")
                        command = [sys.executable, "-c", CHILD, json.dumps(_arguments(config))]
                        before, begin = _busy_seconds(), time.perf_counter()
                        done = subprocess.run(
                            [*command, str(args.band_mib * (1 << 20))],
                            check=True,
                            capture_output=True,
                            text=True,
                            cwd=ROOT,
                        )
                        whole = time.perf_counter() - begin
                        result = json.loads(done.stdout.splitlines()[-1])
                        result["whole_seconds"] = whole
                        result["busy_cpu_seconds"] = _busy_seconds() - before
                        runs.append({"mode": mode, "size": size, "workers": workers, **result})
                        phases = ", ".join(f"{k.strip('_')} {v:.2f}" for k, v in result["phases"].items())
                        busy = result["busy_cpu_seconds"]
                        print(
                            f"  {name}: {result['seconds']:.2f} s ({phases}), whole process {whole:.2f} s, "
                            f"machine busy {busy:.1f} CPU-s, "
                            f"{result['decoded']:,} rows decoded",
                            flush=True,
                        )
                        shutil.rmtree(folder / name, ignore_errors=True)
                        shutil.rmtree(folder / f"store-{name}", ignore_errors=True)

    def of(mode: str, size: int, workers: int, key: str) -> list[float]:
        return [r[key] for r in runs if (r["mode"], r["size"], r["workers"]) == (mode, size, workers)]

    rows = args.rows or "all"
    print(f"--rows {rows} builds, bands of {args.band_mib} MiB, {args.corpus} corpus, median (range) of {args.repeats}")
    for mode in modes:
        for workers in worker_counts:
            base = statistics.median(of(mode, sizes[0], workers, "seconds"))
            for size in sizes:
                seconds = of(mode, size, workers, "seconds")
                median = statistics.median(seconds)
                scaling = statistics.median(of(mode, size, worker_counts[0], "seconds")) / median
                whole = statistics.median(of(mode, size, workers, "whole_seconds"))
                whole_scaling = statistics.median(of(mode, size, worker_counts[0], "whole_seconds")) / whole
                print(
                    f"{mode:>6} {size:>7,} conversations, {workers:>2} workers: {median:6.2f} s "
                    f"({min(seconds):.2f}-{max(seconds):.2f}), {median / base:.2f}x N's time, "
                    f"{scaling:.2f}x {worker_counts[0]} worker(s); decoded in the build's process "
                    f"{statistics.median(of(mode, size, workers, 'decoded')):,.0f} rows; whole process "
                    f"{whole:.2f} s, {whole_scaling:.2f}x {worker_counts[0]} worker(s)"
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

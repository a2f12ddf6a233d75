#!/usr/bin/env python3
"""Speed and memory benchmark of the fixed-sft build, each figure next to its baseline.

Usage::

    python benchmarks/bench_build.py [--quick] [--workers-max N] [--repeat K] [--json OUT]

The script writes a Tulu-like chat corpus with ``tests/synthetic.py`` (prose, code,
math, multi-turn, a dozen languages and scripts, short and 20k-60k character
conversations) as sharded Parquet in a temporary folder, runs real builds, and prints
one table. Every build is a fresh child process timing one whole
``fixed_sft.build.build(...)`` call: tokenizer loading, source reading, the template
check (1 in 64 conversations), encoding, packing, Parquet writing and hashing are all
inside the figure; interpreter start-up and imports are not.

Figures (targets from the project issue "Speed and memory"):

1. **Pipeline tokens/s, 1 worker**: output tokens (rows x 8,192) / wall time of the
   whole build. Baseline: raw tiktoken ``encode_ordinary`` (the Kimi BPE, one thread)
   over the message contents of exactly the conversations that build used (read from
   the output's ``metadata.segments.source_index``), in content tokens per second.
   Target: ratio >= 0.5. An info row gives ``ChatEncoder.encode_arrays`` over the same
   conversations, which splits the gap between encoding and the rest of the build.
2. **Fast path vs reference**: ``ChatEncoder.encode_arrays`` (ids and mask) against
   ``tests/reference_kimi.py``'s ``ReferenceKimi`` on a seeded sample of the used
   conversations, in tokens/s. The reference is the render-then-tokenize path that
   equals the model's own tokenizer: ``chat_ids`` is transformers'
   ``apply_chat_template`` through a slow tokenizer, and ``chat_mask`` finds each
   assistant body the way a trainer without generation tags in the template must, by
   rendering and tokenizing prefixes: the whole conversation, then for each assistant
   turn the conversation up to it, the conversation before it (only to check that
   prefixes are stable) and its generation prompt. Each path is timed as the best of 3
   passes. Target: >= 10x, ids and masks identical on the whole sample. An info row
   times ``chat_ids`` alone. The fast path runs at about the speed of raw BPE (figure
   1's info row), so that ratio is about the reference's time over raw BPE time on the
   same text: no faster encoder that still runs BPE on every message can go above it.
3. **Workers**: whole-build wall time with ``--workers 2`` against ``--workers 1``
   (same parameters, fresh builds). Target: speedup >= 1.8x. ``--workers-max N`` adds
   4, 8, ... and N workers (info rows). ``rows_sha256`` must be identical for every
   worker count and every repeat. An info row gives the speedup of each repeat's
   N-worker build over the 1-worker build run just before it (median and range: on a
   machine whose speed drifts, adjacent builds are the fairest pairs, while the
   fastest of each count may come from different moments). Info rows give the CPU
   time of each count's kept (fastest) build, all its processes together (the build process, the workers' fork
   server and the workers, read from /proc: left out where there is none), against the
   1-worker build's, and how it splits between the build process, the fork server
   (with multiprocessing's resource tracker) and the workers; the cores the 1-worker
   build keeps busy (its CPU time over its wall time: the Parquet writer, source
   hashing and reading run in threads beside the encoder); and, on a 2-core machine,
   the most two workers can gain there for the CPU they used: 2 x (1-worker wall time)
   / (2-worker CPU time), the speedup if both cores were busy from start to end. Under
   each worker count, an info row gives the machine's own ceiling in the same run: N forked
   processes each running raw ``encode_ordinary`` over every 4th used conversation's
   contents, released together, against 1 process (perfectly parallel work, no
   transfers), fastest of 3 passes over all counts; on a shared VM it moves from run to
   run with the neighbours' load.
4. **Default build projection**: 6,400 x 8,192 = 52,428,800 tokens divided by the best
   whole-build throughput measured at a worker count <= the cores here. It is a
   projection from the synthetic corpus, not a measurement of the real one. The real
   Tulu 3 source is ~1.4 GB of Parquet, which the build reads once per band and
   hashes once; proxies for both are measured and scaled linearly to 1.4 GB: one
   ``fixed_sft.bands.read_band`` pass over the synthetic source keeping 6% of its
   rows (the default build keeps ~50k of Tulu's 939k rows), and ``sha256_file`` over
   its files, each the fastest of 3 passes from a warm page cache (a cold disk read
   can only add to them). The total
   row adds both to the projection (counting the synthetic source's own read and hash
   twice, so it errs high) and is compared with the target: <= 30 s. The full run
   also builds 6,400 x 8,192 rows of the synthetic corpus for real and shows that
   time next to the projection.
5. **Peak RSS** of a 1-worker build of the same rows from a small source and from a
   4x larger one, both in the same number of files (so read by as many threads):
   ``VmHWM`` of the build process, which it reads from
   ``/proc/self/status`` when the build returns. (``ru_maxrss`` from ``wait4`` or
   ``RUSAGE_CHILDREN`` is not used: Linux carries the RSS of the process that forked
   the child, i.e. this script holding the corpus, into the child's ``ru_maxrss``.)
   Target: <= 1 GiB, and the 4x source may add at most 25% (this script's tolerance
   for "does not grow with the source"). Baseline: a child that only loads the
   tokenizer. For the 6,400-row build of figure 6 the table also gives the summed RSS
   of the build's whole process tree (workers included), sampled every 0.1 s.
6. **verify** wall time on a 6,400-row output. ``--quick`` builds 6,400 rows of 1,024
   tokens and also reports the time projected to 8,192 tokens (verify reads, hashes
   and checks every byte, so it is linear in the token count); the full run builds
   6,400 x 8,192 rows. Target: <= 5 s at 8,192 tokens.

PASS/FAIL only compares a figure with its target; speed never changes the exit code
(no timed assertions). Correctness checks (identical ids, identical ``rows_sha256``,
``verify`` finding no problem) make the script exit 1 when they fail. The machine
(CPU, cores, versions, load average) is printed with the table, because other
processes on the machine distort every figure. ``--json OUT`` writes the machine,
the plan, every build and every figure. ``--quick`` takes under a minute on 2
cores, the full run 2-4 minutes.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the package, and the corpus generator the tests use

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import synthetic  # noqa: E402

from fixed_sft.engine import usable_cores  # noqa: E402

DEFAULT_TOKENIZER = ROOT.parent / "shared" / "tokenizers" / "kimi-k2.6"
DEFAULT_ROWS = 6_400
DEFAULT_ROW_TOKENS = 8_192
TULU_PARQUET_BYTES = 1.4e9  # allenai/tulu-3-sft-mixture, all Parquet shards
KEEP_FRACTION = 0.06  # ~50k of Tulu's 939,343 rows fill the default 6,400 x 8,192 build
ROW_GROUP_ROWS = 1_000  # rows per Parquet row group in the synthetic shards
ORDER_SEED = 42
CORPUS_SEED = 2024
SAMPLE_SEED = 0
PROXY_PASSES = 3
PARALLEL_SHARE = 4  # the machine-ceiling rows encode 1/4 of the used contents in each process
PARALLEL_PASSES = 3  # ... in passes over all the worker counts, the fastest pass of each count kept
SAMPLE_INTERVAL_S = 0.1
GIB = 1 << 30
MIB = 1 << 20

TARGET_PIPELINE_RATIO = 0.5
TARGET_FAST_PATH_RATIO = 10.0
TARGET_TWO_WORKER_SPEEDUP = 1.8
TARGET_RSS_BYTES = GIB
TOLERANCE_RSS_GROWTH = 1.25
TARGET_VERIFY_SECONDS = 5.0
TARGET_DEFAULT_BUILD_SECONDS = 30.0


# ---------------------------------------------------------------------------
# Plan and results
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Sizes of one run. ``corpus`` conversations make the large source, its first
    quarter the small one. The large one is sharded ``rows_per_file`` rows a file and
    the small one into as many files, so both are read by as many threads."""

    mode: str
    corpus: int
    rows_per_file: int
    speed_rows: int  # rows of 8,192 tokens for figures 1, 3 and 4
    rss_rows: int  # rows of 8,192 tokens for figure 5
    verify_row_tokens: int  # row length of the 6,400-row build of figure 6
    repeat: int  # fresh builds per worker count (the fastest counts) and baseline passes
    sample: int = 300  # conversations for figure 2
    workers: tuple[int, ...] = (1, 2)

    @property
    def small(self) -> int:
        return self.corpus // 4


QUICK = Plan(
    "quick", corpus=16_000, rows_per_file=2_000, speed_rows=768, rss_rows=256, verify_row_tokens=1_024, repeat=1
)
FULL = Plan(
    "full", corpus=72_000, rows_per_file=9_000, speed_rows=1_536, rss_rows=1_024, verify_row_tokens=8_192, repeat=2
)


@dataclass
class BuildRun:
    """One child-process build. ``wall_s``: the ``build()`` call alone; ``cpu_s``: CPU
    time of the build process in it, all its threads (worker processes not included);
    ``tree_cpu_s``: the same plus the CPU time of every process the build started (the
    workers' fork server, the workers it forked, multiprocessing's resource tracker),
    read from /proc once the build has returned (None where there is no /proc);
    ``worker_cpu_s``: the part of it spent in processes that those reaped (the workers,
    which the fork server reaps); ``read_s`` and
    ``read_passes``: time in, and calls of, ``read_band`` inside it; ``peak_rss``:
    the build process' ``VmHWM`` (bytes); ``tree_rss``: the sampled peak of the
    summed RSS of the build's process tree (0 when not sampled)."""

    label: str
    source: str
    rows: int
    row_tokens: int
    workers: int
    wall_s: float
    cpu_s: float
    tree_cpu_s: float | None
    worker_cpu_s: float | None
    read_s: float
    read_passes: int
    peak_rss: int
    tree_rss: int
    rows_sha256: str
    conversations: int
    out: str

    @property
    def tokens(self) -> int:
        return self.rows * self.row_tokens

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


@dataclass
class Figure:
    """One table line. ``ok`` is None for information rows (no target)."""

    metric: str
    value: str
    baseline: str = ""
    ratio: str = ""
    target: str = "info"
    ok: bool | None = None
    correctness: bool = False  # a failure makes the script exit 1
    numbers: dict[str, Any] = field(default_factory=dict)

    @property
    def result(self) -> str:
        return "" if self.ok is None else ("PASS" if self.ok else "FAIL")


# ---------------------------------------------------------------------------
# Machine
# ---------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """CPU model, usable cores, library versions and the load average now."""
    import tiktoken
    import transformers

    import fixed_sft

    model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from fixed_sft.build import code_version

    return {
        "cpu": model,
        "cores": usable_cores(),
        "python": platform.python_version(),
        "tiktoken": tiktoken.__version__,
        "pyarrow": pa.__version__,
        "numpy": np.__version__,
        "transformers": transformers.__version__,
        "fixed_sft": fixed_sft.__version__,
        "code": code_version(),
        "loadavg_start": os.getloadavg(),
    }


# ---------------------------------------------------------------------------
# Corpus
# ---------------------------------------------------------------------------


@dataclass
class Corpus:
    """The generated conversations and the two Parquet sources made from them."""

    rows: list[dict[str, Any]]
    large: Path
    small: Path
    large_bytes: int
    small_bytes: int
    info: dict[str, Any]


def write_source(rows: Sequence[dict[str, Any]], folder: Path, rows_per_file: int) -> int:
    """Write ``rows`` as Tulu-schema Parquet shards (``train-KKKKK-of-NNNNN.parquet``,
    row groups of ``ROW_GROUP_ROWS`` rows, Snappy as in the Hub's files); return the bytes."""
    folder.mkdir(parents=True)
    count = max(1, -(-len(rows) // rows_per_file))
    total = 0
    for k in range(count):
        part = rows[k * rows_per_file : (k + 1) * rows_per_file]
        table = pa.Table.from_pylist(
            [{"id": r["id"], "messages": r["messages"], "source": r["source"]} for r in part],
            schema=synthetic.TULU_SCHEMA,
        )
        path = folder / f"train-{k:05d}-of-{count:05d}.parquet"
        pq.write_table(table, path, row_group_size=ROW_GROUP_ROWS)
        total += path.stat().st_size
    return total


def make_corpus(plan: Plan, work: Path) -> Corpus:
    """``plan.corpus`` synthetic conversations as the large source, the first quarter as
    the small one, in the same number of files."""
    start = time.perf_counter()
    rows = synthetic.conversations(plan.corpus, seed=CORPUS_SEED)
    large, small = work / "source-large", work / "source-small"
    large_bytes = write_source(rows, large, plan.rows_per_file)
    files = -(-plan.corpus // plan.rows_per_file)
    small_bytes = write_source(rows[: plan.small], small, -(-plan.small // files))
    kinds: dict[str, int] = {}
    for r in rows:
        kinds[r["source"]] = kinds.get(r["source"], 0) + 1
    info: dict[str, Any] = {
        "conversations": plan.corpus,
        "small_conversations": plan.small,
        "content_bytes": sum(len(m["content"].encode()) for r in rows for m in r["messages"]),
        "messages": sum(len(r["messages"]) for r in rows),
        "parquet_bytes_large": large_bytes,
        "parquet_bytes_small": small_bytes,
        "rows_per_file": plan.rows_per_file,
        "row_group_rows": ROW_GROUP_ROWS,
        "kinds": dict(sorted(kinds.items())),
        "seconds": time.perf_counter() - start,
    }
    print(
        f"corpus: {plan.corpus:,} conversations, {info['messages']:,} messages, "
        f"{info['content_bytes'] / MIB:.0f} MiB of content, {large_bytes / MIB:.0f} MiB Parquet; small source "
        f"{plan.small:,} conversations ({small_bytes / MIB:.0f} MiB); made in {info['seconds']:.1f} s",
        flush=True,
    )
    return Corpus(rows, large, small, large_bytes, small_bytes, info)


# ---------------------------------------------------------------------------
# Child-process builds
# ---------------------------------------------------------------------------


def own_peak_rss() -> int:
    """This process' peak RSS in bytes: ``VmHWM`` (not carried over from the parent)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)


def child_main(spec_path: Path) -> None:
    """Child side: load the tokenizer only (``idle``) or run one build; write the result JSON."""
    spec = json.loads(spec_path.read_text())
    result: dict[str, Any] = {}
    if spec.get("idle"):
        from fixed_sft.chat import ChatEncoder
        from fixed_sft.tokenizer import KimiTokenizer

        ChatEncoder(KimiTokenizer(spec["tokenizer"]))
    else:
        from fixed_sft import build as build_module

        reads = {"calls": 0, "seconds": 0.0}
        read_band = build_module.read_band

        def timed_read_band(*args: Any, **kwargs: Any) -> pa.Table:
            start = time.perf_counter()
            try:
                return read_band(*args, **kwargs)
            finally:
                reads["calls"] += 1
                reads["seconds"] += time.perf_counter() - start

        build_module.read_band = timed_read_band  # instrumentation only; the build is unchanged
        config = build_module.BuildConfig(**spec["config"])
        start, cpu_start = time.perf_counter(), time.process_time()
        manifest = build_module.build(config, Path(spec["out"]))
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        children = children_cpu()  # no child runs before the build
        result = {
            "wall_s": wall,
            "cpu_s": cpu,
            "tree_cpu_s": None if children is None else cpu + sum(children),
            "worker_cpu_s": None if children is None else children[1],
            "read_s": reads["seconds"],
            "read_passes": reads["calls"],
            "rows_sha256": manifest["rows_sha256"],
            "rows": manifest["stats"]["rows"],
            "conversations": manifest["stats"]["conversations"],
        }
    result["peak_rss"] = own_peak_rss()
    Path(spec["result"]).write_text(json.dumps(result))


def proc_stats() -> dict[int, list[str]] | None:
    """Each process' ``/proc/PID/stat`` fields after the command name (``[0]`` is field 3,
    the state; ``[1]`` the parent's pid); None where there is no /proc."""
    try:
        entries = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return None
    stats = {}
    for name in entries:
        try:
            stats[int(name)] = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
    return stats


def children_cpu() -> tuple[float, float] | None:
    """CPU time (s) of this process' live children themselves (``utime + stime``, fields
    14-15) and of the descendants they have reaped (``cutime + cstime``, fields 16-17);
    None where there is no /proc. The workers' fork server reaps each worker, so the
    second holds the workers' CPU once the pool has shut down."""
    stats = proc_stats()
    if stats is None:
        return None
    children = [list(map(int, fields[11:15])) for fields in stats.values() if int(fields[1]) == os.getpid()]
    tick = os.sysconf("SC_CLK_TCK")
    return sum(c[0] + c[1] for c in children) / tick, sum(c[2] + c[3] for c in children) / tick


def tree_rss(root: int) -> int:
    """Summed RSS (bytes) of ``root`` and all its descendants, from /proc (0 elsewhere)."""
    children: dict[int, list[int]] = {}
    for pid, fields in (proc_stats() or {}).items():
        children.setdefault(int(fields[1]), []).append(pid)
    page = os.sysconf("SC_PAGE_SIZE")
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        except OSError:
            pass
        todo += children.get(pid, [])
    return total


class TreeSampler(threading.Thread):
    """Samples ``tree_rss(pid)`` every ``SAMPLE_INTERVAL_S`` until stopped; keeps the peak."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.peak = max(self.peak, tree_rss(self.pid))
            self.done.wait(SAMPLE_INTERVAL_S)


def run_child(spec: dict[str, Any], work: Path, sample_tree: bool = False) -> tuple[dict[str, Any], int]:
    """Run ``child_main`` in a fresh interpreter; return its result and the sampled
    peak RSS of its process tree (0 unless ``sample_tree``)."""
    name = f"child-{time.monotonic_ns()}"
    spec = {**spec, "result": str(work / f"{name}.result.json")}
    spec_path = work / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    log = work / f"{name}.log"
    with log.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child", str(spec_path)],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=env,
            cwd=str(ROOT),
        )
        sampler = TreeSampler(proc.pid) if sample_tree else None
        if sampler:
            sampler.start()
        try:
            code = proc.wait()
        except BaseException:  # e.g. Ctrl-C: do not leave the build running
            proc.kill()
            proc.wait()
            raise
        finally:
            if sampler:
                sampler.done.set()
                sampler.join()
    if code != 0:
        sys.stderr.write(log.read_text(errors="replace")[-4000:])
        raise RuntimeError(f"child failed (exit {code}); spec {spec_path}")
    return json.loads(Path(spec["result"]).read_text()), sampler.peak if sampler else 0


def child_build(
    label: str,
    source: Path,
    out: Path,
    rows: int,
    row_tokens: int,
    workers: int,
    tokenizer: Path,
    work: Path,
    sample_tree: bool = False,
) -> BuildRun:
    """A fresh build of ``rows`` x ``row_tokens`` from ``source`` in a child process: a
    first build, into an empty token store of its own."""
    config = dict(
        name=label,
        source=str(source),
        tokenizer=str(tokenizer),
        rows=rows,
        row_tokens=row_tokens,
        seed=ORDER_SEED,
        workers=workers,
        cache_dir=str(work / "store" / f"{label}-{time.monotonic_ns()}"),
    )
    result, tree = run_child({"config": config, "out": str(out)}, work, sample_tree)
    run = BuildRun(
        label=label,
        source=source.name,
        rows=result["rows"],
        row_tokens=row_tokens,
        workers=workers,
        wall_s=result["wall_s"],
        cpu_s=result["cpu_s"],
        tree_cpu_s=result["tree_cpu_s"],
        worker_cpu_s=result["worker_cpu_s"],
        read_s=result["read_s"],
        read_passes=result["read_passes"],
        peak_rss=result["peak_rss"],
        tree_rss=tree,
        rows_sha256=result["rows_sha256"],
        conversations=result["conversations"],
        out=str(out),
    )
    print(
        f"  {label}: {run.rows} x {row_tokens} tokens, {workers} worker(s): {run.wall_s:.2f} s "
        f"({run.tokens_per_s / 1e6:.2f} M tok/s; source read {run.read_s:.2f} s in {run.read_passes} pass(es)); "
        f"peak RSS {run.peak_rss / MIB:.0f} MiB" + (f", process tree {tree / MIB:.0f} MiB" if tree else ""),
        flush=True,
    )
    return run


# ---------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------


def best_time(fn: Callable[[], int], repeat: int = 1) -> tuple[float, int]:
    """Best wall time of ``repeat`` calls of ``fn``, and what ``fn`` returned (a token count)."""
    best, count = float("inf"), 0
    for _ in range(repeat):
        start = time.perf_counter()
        count = fn()
        best = min(best, time.perf_counter() - start)
    return best, count


def _bpe_process(contents: list[str], barrier: Any, done: Any, encoding: Any) -> None:
    contents = [c.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass") for c in contents]  # own copies
    barrier.wait()
    tokens = sum(len(encoding.encode_ordinary(c)) for c in contents)
    done.put((tokens, time.perf_counter()))


def parallel_bpe(encoding: Any, contents: list[str], processes: int) -> tuple[float, int]:
    """``(seconds, tokens)`` for ``processes`` forked processes that each run raw
    ``encode_ordinary`` over ``contents``, released together by a barrier: the time
    until the last one ends. Perfectly parallel work, no transfers: the speedup this
    machine gives N workers at best."""
    context = multiprocessing.get_context("fork")
    barrier, done = context.Barrier(processes + 1), context.Queue()
    children = [
        context.Process(target=_bpe_process, args=(contents, barrier, done, encoding)) for _ in range(processes)
    ]
    for child in children:
        child.start()
    barrier.wait()
    start = time.perf_counter()
    results = [done.get() for _ in children]
    for child in children:
        child.join()
    return max(end for _, end in results) - start, sum(tokens for tokens, _ in results)


def used_conversations(out: Path) -> list[int]:
    """Source row indices of the conversations a build put in its rows."""
    metadata = pq.read_table(out / "train.parquet", columns=["metadata"]).column("metadata").combine_chunks()
    return np.unique(metadata.field("segments").flatten().field("source_index").to_numpy()).tolist()


def read_proxy(source_dir: Path) -> dict[str, Any]:
    """The fastest of ``PROXY_PASSES`` ``read_band`` passes over ``source_dir`` keeping
    ``KEEP_FRACTION`` of its rows (warm page cache), scaled linearly to ``TULU_PARQUET_BYTES``."""
    from fixed_sft.bands import read_band
    from fixed_sft.order import permutation, positions
    from fixed_sft.source import open_source

    source = open_source(str(source_dir))
    rank = positions(permutation(ORDER_SEED, source.num_rows))
    keep = max(1, round(source.num_rows * KEEP_FRACTION))
    source_bytes = sum(path.stat().st_size for path in source.files)
    seconds = float("inf")
    for _ in range(PROXY_PASSES):
        start = time.perf_counter()
        band = read_band(source, rank, 0, keep)
        seconds = min(seconds, time.perf_counter() - start)
        if band.num_rows != keep:
            raise RuntimeError(f"read_band kept {band.num_rows} rows, expected {keep}")
    return {
        "seconds": seconds,
        "bytes": source_bytes,
        "kept_rows": keep,
        "rows": source.num_rows,
        "projected_s": seconds * TULU_PARQUET_BYTES / source_bytes,
    }


def hash_proxy(source_dir: Path) -> dict[str, Any]:
    """The build's sha256 of every source file over ``source_dir`` (fastest of
    ``PROXY_PASSES``), scaled linearly to ``TULU_PARQUET_BYTES``."""
    from fixed_sft.hashes import sha256_file

    files = sorted(source_dir.glob("*.parquet"))
    source_bytes = sum(path.stat().st_size for path in files)
    seconds = float("inf")
    for _ in range(PROXY_PASSES):
        start = time.perf_counter()
        for path in files:
            sha256_file(path)
        seconds = min(seconds, time.perf_counter() - start)
    return {"seconds": seconds, "bytes": source_bytes, "projected_s": seconds * TULU_PARQUET_BYTES / source_bytes}


def worker_counts(workers_max: int) -> list[int]:
    """1, 2, 4, ... below ``workers_max``, then ``workers_max``."""
    counts, w = [], 1
    while w < workers_max:
        counts.append(w)
        w *= 2
    return counts + [workers_max]


def fmt_s(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds < 120 else f"{seconds:.0f} s ({seconds / 60:.1f} min)"


def fmt_rate(tokens_per_s: float) -> str:
    return f"{tokens_per_s / 1e6:.2f} M tok/s"


def fmt_mib(size: int) -> str:
    return f"{size / MIB:.0f} MiB"


class Benchmark:
    """Runs the figures in order; ``figures`` is the table, ``details`` the rest of ``--json``."""

    def __init__(self, plan: Plan, tokenizer_dir: Path, work: Path):
        from fixed_sft.chat import ChatEncoder
        from fixed_sft.tokenizer import KimiTokenizer

        self.plan = plan
        self.tokenizer_dir = tokenizer_dir
        self.work = work
        self.cores = usable_cores()
        self.tokenizer = KimiTokenizer(tokenizer_dir)
        self.encoder = ChatEncoder(self.tokenizer)
        self.figures: list[Figure] = []
        self.details: dict[str, Any] = {"plan": asdict(plan), "builds": []}
        self.corpus: Corpus  # made by run()
        self.runs: dict[int, list[BuildRun]] = {}  # every build of figures 1 and 3, by worker count

    def build(
        self, label: str, source: Path, rows: int, row_tokens: int, workers: int, sample_tree: bool = False
    ) -> BuildRun:
        run = child_build(
            label, source, self.work / label, rows, row_tokens, workers, self.tokenizer_dir, self.work, sample_tree
        )
        self.details["builds"].append({**asdict(run), "tokens": run.tokens, "tokens_per_s": run.tokens_per_s})
        return run

    def add(self, figure: Figure) -> None:
        self.figures.append(figure)

    def run(self) -> None:
        self.corpus = make_corpus(self.plan, self.work)
        self.details["corpus"] = self.corpus.info
        curve = self.worker_builds()
        used = [self.corpus.rows[i]["messages"] for i in used_conversations(Path(curve[1].out))]
        self.pipeline(curve[1], used)
        self.fast_path(used)
        self.workers(curve, used)
        projected = self.projection(curve)
        self.memory()
        self.verify(max((run for w, run in curve.items() if w <= self.cores), key=lambda r: r.tokens_per_s), projected)

    def worker_builds(self) -> dict[int, BuildRun]:
        """Figures 1 and 3: ``plan.repeat`` fresh builds per worker count, interleaved;
        the fastest of each count is kept. All must have the same ``rows_sha256``."""
        plan = self.plan
        print(
            f"builds of {plan.speed_rows} x {DEFAULT_ROW_TOKENS} tokens from the large source (best of {plan.repeat}):",
            flush=True,
        )
        runs: dict[int, list[BuildRun]] = {w: [] for w in plan.workers}
        for k in range(plan.repeat):
            for w in plan.workers:
                runs[w].append(self.build(f"speed-w{w}-{k}", self.corpus.large, plan.speed_rows, DEFAULT_ROW_TOKENS, w))
        self.runs = runs
        return {w: min(batch, key=lambda r: r.wall_s) for w, batch in runs.items()}

    def pipeline(self, one: BuildRun, used: list[list[dict]]) -> None:
        """Figure 1: whole build at 1 worker against raw ``encode_ordinary`` of the same contents."""
        contents = [m["content"] for messages in used for m in messages]
        encoding = self.tokenizer.encoding
        raw_s, raw_tokens = best_time(lambda: sum(len(encoding.encode_ordinary(c)) for c in contents), self.plan.repeat)
        fast_s, fast_tokens = best_time(
            lambda: sum(len(self.encoder.encode_arrays(m)[0]) for m in used), self.plan.repeat
        )
        raw_rate, fast_rate = raw_tokens / raw_s, fast_tokens / fast_s
        self.details["baseline"] = {
            "conversations": len(used),
            "contents": len(contents),
            "raw_tokens": raw_tokens,
            "raw_s": raw_s,
            "fast_tokens": fast_tokens,
            "fast_s": fast_s,
        }
        ratio = one.tokens_per_s / raw_rate
        self.add(
            Figure(
                f"1. pipeline, 1 worker ({one.tokens / 1e6:.1f}M tok)",
                fmt_rate(one.tokens_per_s),
                f"raw tiktoken {fmt_rate(raw_rate)}",
                f"{ratio:.2f}",
                f">= {TARGET_PIPELINE_RATIO}",
                ratio >= TARGET_PIPELINE_RATIO,
                numbers={
                    "tokens_per_s": one.tokens_per_s,
                    "wall_s": one.wall_s,
                    "raw_tokens_per_s": raw_rate,
                    "ratio": ratio,
                },
            )
        )
        self.add(
            Figure(
                f"   encode_arrays alone ({len(used):,} convs)",
                fmt_rate(fast_rate),
                f"raw tiktoken {fmt_rate(raw_rate)}",
                f"{fast_rate / raw_rate:.2f}",
                numbers={"tokens_per_s": fast_rate},
            )
        )

    def fast_path(self, used: list[list[dict]]) -> None:
        """Figure 2: ``encode_arrays`` against ``ReferenceKimi`` on a sample: ids and masks
        (the target), and ids alone; both must be identical."""
        sys.path.insert(0, str(ROOT / "tests"))
        from reference_kimi import ReferenceKimi

        reference = ReferenceKimi(self.tokenizer_dir)
        picks = random.Random(SAMPLE_SEED).sample(range(len(used)), min(self.plan.sample, len(used)))
        sample = [used[k] for k in picks]
        fast_s, tokens = best_time(lambda: sum(len(self.encoder.encode_arrays(m)[0]) for m in sample), 3)
        ids: list[list[int]] = []
        masks: list[list[int]] = []

        def ids_pass() -> int:
            ids[:] = [reference.chat_ids(m) for m in sample]
            return sum(map(len, ids))

        def masks_pass() -> int:
            masks[:] = [reference.chat_mask(m) for m in sample]
            return sum(map(len, masks))

        ids_s, _ = best_time(ids_pass, 3)
        reference_s, _ = best_time(masks_pass, 3)  # chat_mask encodes the whole conversation too
        fast = [self.encoder.encode_arrays(m) for m in sample]
        same = sum(f[0].tolist() == i and f[1].tolist() == k for f, i, k in zip(fast, ids, masks))
        speedup = reference_s / fast_s
        self.add(
            Figure(
                f"2. fast path vs reference, ids + masks ({len(sample)} convs)",
                fmt_rate(tokens / fast_s),
                f"reference {fmt_rate(tokens / reference_s)}",
                f"{speedup:.1f}x",
                f">= {TARGET_FAST_PATH_RATIO:.0f}x",
                speedup >= TARGET_FAST_PATH_RATIO,
                numbers={
                    "fast_s": fast_s,
                    "reference_ids_s": ids_s,
                    "reference_s": reference_s,
                    "tokens": tokens,
                    "ratio": speedup,
                },
            )
        )
        self.add(
            Figure(
                "   fast-path ids and masks == reference",
                f"{same}/{len(sample)}",
                target="all identical",
                ok=same == len(sample),
                correctness=True,
                numbers={"identical": same, "sample": len(sample)},
            )
        )
        self.add(
            Figure(
                "   fast path vs reference, ids only",
                fmt_rate(tokens / fast_s),
                f"reference {fmt_rate(tokens / ids_s)}",
                f"{ids_s / fast_s:.1f}x",
                numbers={"ratio": ids_s / fast_s},
            )
        )

    def workers(self, curve: dict[int, BuildRun], used: list[list[dict]]) -> None:
        """Figure 3: speedup of 2 (and more) workers over 1; identical rows at every count.
        Under each count, the CPU its build used in all processes against 1 worker's, and
        the speedup the machine gives perfectly parallel work there (``parallel_bpe``,
        fastest of ``PARALLEL_PASSES`` interleaved passes)."""
        one = curve[1]
        contents = [m["content"] for messages in used[::PARALLEL_SHARE] for m in messages]
        rates: dict[int, float] = {}
        for _ in range(PARALLEL_PASSES):  # interleaved, like the builds, so drift hits every count alike
            for w in curve:
                seconds, tokens = parallel_bpe(self.tokenizer.encoding, contents, w)
                rates[w] = max(rates.get(w, 0.0), tokens / seconds)
        self.details["parallel_bpe"] = {"contents": len(contents), "tokens_per_s": rates}
        for w, run in curve.items():
            if w == 1:
                continue
            speedup = one.wall_s / run.wall_s
            main = w == 2
            self.add(
                Figure(
                    f"{'3.' if main else '  '} build wall, {w} workers",
                    fmt_s(run.wall_s),
                    f"1 worker {fmt_s(one.wall_s)}",
                    f"{speedup:.2f}x",
                    f">= {TARGET_TWO_WORKER_SPEEDUP}x" if main else "info",
                    (speedup >= TARGET_TWO_WORKER_SPEEDUP) if main else None,
                    numbers={"workers": w, "wall_s": run.wall_s, "speedup": speedup},
                )
            )
            pairs = [first.wall_s / other.wall_s for first, other in zip(self.runs[1], self.runs[w])]
            self.add(
                Figure(
                    f"   adjacent pairs, {w} workers vs 1",
                    f"median {statistics.median(pairs):.2f}x",
                    f"{len(pairs)} pairs",
                    f"{min(pairs):.2f}-{max(pairs):.2f}x",
                    numbers={"workers": w, "speedups": pairs, "median": statistics.median(pairs)},
                )
            )
            if run.tree_cpu_s is not None and one.tree_cpu_s is not None:
                cpu = run.tree_cpu_s / one.tree_cpu_s
                self.add(
                    Figure(
                        "   CPU of all its processes",
                        fmt_s(run.tree_cpu_s),
                        f"1 worker {fmt_s(one.tree_cpu_s)}",
                        f"{cpu:.2f}x",
                        numbers={"workers": w, "tree_cpu_s": run.tree_cpu_s, "ratio": cpu},
                    )
                )
                helpers = run.tree_cpu_s - run.cpu_s - run.worker_cpu_s
                self.add(
                    Figure(
                        "   ... build process / fork server / workers",
                        f"{run.cpu_s:.1f} / {helpers:.1f} / {run.worker_cpu_s:.1f} s",
                        numbers={"build_process_s": run.cpu_s, "fork_server_s": helpers, "workers_s": run.worker_cpu_s},
                    )
                )
            ceiling = rates[w] / rates[1]
            self.add(
                Figure(
                    f"   raw BPE in {w} processes (machine ceiling)",
                    fmt_rate(rates[w]),
                    f"1 process {fmt_rate(rates[1])}",
                    f"{ceiling:.2f}x",
                    numbers={"processes": w, "tokens_per_s": rates[w], "speedup": ceiling},
                )
            )
        if len(curve) == 1:
            self.add(Figure("3. build wall, 2 workers", "not run", target="--workers-max >= 2"))
        busy = one.cpu_s / one.wall_s  # one worker encodes in the build process
        self.add(
            Figure(
                "   cores busy in the 1-worker build",
                f"{busy:.2f}",
                f"CPU {fmt_s(one.cpu_s)} / wall {fmt_s(one.wall_s)}",
                numbers={"cpu_s": one.cpu_s, "busy_cores": busy},
            )
        )
        two = curve.get(2)
        if two is not None and two.tree_cpu_s is not None and self.cores == 2:
            allowed = 2 * one.wall_s / two.tree_cpu_s
            self.add(
                Figure(
                    "   2 workers with both cores busy throughout",
                    f"{allowed:.2f}x",
                    f"2 x {fmt_s(one.wall_s)} / {fmt_s(two.tree_cpu_s)} of CPU",
                    numbers={"speedup": allowed},
                )
            )
        builds = len(curve) * self.plan.repeat
        digests = {run.rows_sha256 for batch in self.runs.values() for run in batch}
        self.add(
            Figure(
                f"   rows_sha256, {builds} build(s) at {','.join(map(str, curve))} workers",
                "identical" if len(digests) == 1 else f"{len(digests)} different",
                one.rows_sha256[:16] + "...",
                target="identical",
                ok=len(digests) == 1,
                correctness=True,
                numbers={"rows_sha256": sorted(digests)},
            )
        )

    def projection(self, curve: dict[int, BuildRun]) -> float:
        """Figure 4: default build time projected from the best throughput (<= cores), and
        the proxy for one read pass over the real 1.4 GB source."""
        best = max((run for w, run in curve.items() if w <= self.cores), key=lambda r: r.tokens_per_s)
        projected = DEFAULT_ROWS * DEFAULT_ROW_TOKENS / best.tokens_per_s
        self.add(
            Figure(
                "4. PROJECTED default build 6400x8192 (synthetic)",
                fmt_s(projected),
                f"{fmt_rate(best.tokens_per_s)} @ {best.workers}w",
                target="projection",
                numbers={"projected_s": projected, "workers": best.workers, "tokens_per_s": best.tokens_per_s},
            )
        )
        proxy = read_proxy(self.corpus.large)
        self.details["read_proxy"] = proxy
        self.add(
            Figure(
                "   + read of real 1.4 GB source, per band (proxy)",
                fmt_s(proxy["projected_s"]),
                f"{fmt_s(proxy['seconds'])} / {proxy['bytes'] / MIB:.0f} MiB",
                numbers=proxy,
            )
        )
        hashing = hash_proxy(self.corpus.large)
        self.details["hash_proxy"] = hashing
        self.add(
            Figure(
                "   + sha256 of real 1.4 GB source (proxy)",
                fmt_s(hashing["projected_s"]),
                f"{fmt_s(hashing['seconds'])} / {hashing['bytes'] / MIB:.0f} MiB",
                numbers=hashing,
            )
        )
        total = projected + proxy["projected_s"] + hashing["projected_s"]
        self.add(
            Figure(
                "   PROJECTED default build, total",
                fmt_s(total),
                "build + both proxies",
                target="<= 30 s",
                ok=total <= TARGET_DEFAULT_BUILD_SECONDS,
                numbers={"projected_total_s": total},
            )
        )
        return projected

    def memory(self) -> None:
        """Figure 5: peak RSS of the same 1-worker build from a small and a 4x source."""
        rows = self.plan.rss_rows
        print(f"builds of {rows} x {DEFAULT_ROW_TOKENS} tokens for peak RSS (1 worker):", flush=True)
        idle, _ = run_child({"idle": True, "tokenizer": str(self.tokenizer_dir)}, self.work)
        small = self.build("rss-small", self.corpus.small, rows, DEFAULT_ROW_TOKENS, 1, sample_tree=True)
        large = self.build("rss-4x", self.corpus.large, rows, DEFAULT_ROW_TOKENS, 1, sample_tree=True)
        growth = large.peak_rss / small.peak_rss
        self.add(
            Figure(
                f"5. peak RSS, {rows} rows, small source",
                fmt_mib(small.peak_rss),
                f"tokenizer only {fmt_mib(idle['peak_rss'])}",
                f"{small.peak_rss / idle['peak_rss']:.2f}x",
                "<= 1 GiB",
                small.peak_rss <= TARGET_RSS_BYTES,
                numbers={
                    "peak_rss": small.peak_rss,
                    "idle_rss": idle["peak_rss"],
                    "source_bytes": self.corpus.small_bytes,
                },
            )
        )
        self.add(
            Figure(
                f"   peak RSS, {rows} rows, 4x source",
                fmt_mib(large.peak_rss),
                f"small source {fmt_mib(small.peak_rss)}",
                f"{growth:.2f}x",
                f"<= 1 GiB, <= {TOLERANCE_RSS_GROWTH}x",
                large.peak_rss <= TARGET_RSS_BYTES and growth <= TOLERANCE_RSS_GROWTH,
                numbers={"peak_rss": large.peak_rss, "growth": growth, "source_bytes": self.corpus.large_bytes},
            )
        )

    def verify(self, best: BuildRun, projected: float) -> None:
        """Figure 6: ``verify`` on a 6,400-row build (at the best worker count); its peak
        RSS; in the full run, the measured default-size build next to its projection."""
        from fixed_sft.verify import verify

        row_tokens = self.plan.verify_row_tokens
        print(f"build of {DEFAULT_ROWS} x {row_tokens} tokens for verify ({best.workers} workers):", flush=True)
        run = self.build(
            f"verify-{row_tokens}", self.corpus.large, DEFAULT_ROWS, row_tokens, best.workers, sample_tree=True
        )
        start = time.perf_counter()
        problems = verify(Path(run.out))  # the output was just written: warm page cache
        verify_s = time.perf_counter() - start
        at_default = row_tokens == DEFAULT_ROW_TOKENS
        if at_default:
            self.insert_after(
                "   PROJECTED default build, total",
                Figure(
                    "   MEASURED default build 6400x8192 (synthetic)",
                    fmt_s(run.wall_s),
                    f"projection {fmt_s(projected)}",
                    f"{run.wall_s / projected:.2f}",
                    numbers={"wall_s": run.wall_s, "workers": run.workers},
                ),
            )
        self.add(
            Figure(
                f"   peak RSS, {DEFAULT_ROWS}x{row_tokens} build, {run.workers}w: main",
                fmt_mib(run.peak_rss),
                target="<= 1 GiB",
                ok=run.peak_rss <= TARGET_RSS_BYTES,
                numbers={"peak_rss": run.peak_rss},
            )
        )
        self.add(
            Figure(
                "   ... all processes (sum of RSS, sampled)", fmt_mib(run.tree_rss), numbers={"tree_rss": run.tree_rss}
            )
        )
        parquet_bytes = (Path(run.out) / "train.parquet").stat().st_size
        self.add(
            Figure(
                f"6. verify {DEFAULT_ROWS}x{row_tokens}" + ("" if at_default else " (measured)"),
                fmt_s(verify_s),
                f"{parquet_bytes / MIB:.0f} MiB Parquet",
                target="<= 5 s" if at_default else "info",
                ok=verify_s <= TARGET_VERIFY_SECONDS if at_default else None,
                numbers={"verify_s": verify_s, "row_tokens": row_tokens, "parquet_bytes": parquet_bytes},
            )
        )
        if not at_default:
            scaled = verify_s * DEFAULT_ROW_TOKENS / row_tokens
            self.add(
                Figure(
                    f"   verify {DEFAULT_ROWS}x{DEFAULT_ROW_TOKENS} (PROJECTED, linear)",
                    fmt_s(scaled),
                    f"{DEFAULT_ROW_TOKENS // row_tokens}x the measured",
                    target="<= 5 s",
                    ok=scaled <= TARGET_VERIFY_SECONDS,
                    numbers={"projected_verify_s": scaled},
                )
            )
        self.add(
            Figure(
                "   verify result",
                "ok" if not problems else f"{len(problems)} problem(s)",
                target="ok",
                ok=not problems,
                correctness=True,
                numbers={"problems": problems},
            )
        )

    def insert_after(self, prefix: str, figure: Figure) -> None:
        at = next(k for k, f in enumerate(self.figures) if f.metric.startswith(prefix))
        self.figures.insert(at + 1, figure)


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------


def print_table(figures: Sequence[Figure]) -> None:
    headers = ("metric", "value", "baseline", "ratio", "target", "result")
    rows = [(f.metric, f.value, f.baseline, f.ratio, f.target, f.result) for f in figures]
    widths = [max(len(h), *(len(r[k]) for r in rows)) for k, h in enumerate(headers)]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    print(line.format(*headers).rstrip())
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(line.format(*r).rstrip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller corpus and builds (under a minute on 2 cores)")
    parser.add_argument(
        "--workers-max",
        type=int,
        default=2,
        metavar="N",
        help="time whole builds at 1, 2, 4, ... and N workers (default 2)",
    )
    parser.add_argument(
        "--repeat", type=int, metavar="K", help="fresh builds per worker count, fastest kept (default: 1 quick, 2 full)"
    )
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the machine, plan, builds and figures to OUT")
    parser.add_argument(
        "--speed-rows",
        type=int,
        metavar="R",
        help="rows of 8,192 tokens for figures 1, 3 and 4 (default: 768 quick, 1,536 full)",
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=DEFAULT_TOKENIZER,
        help=f"Kimi-K2.6 tokenizer folder (default {DEFAULT_TOKENIZER})",
    )
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child_main(args.child)
        return 0
    if args.workers_max < 1:
        parser.error("--workers-max must be at least 1")
    if args.repeat is not None and args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if not (args.tokenizer / "tiktoken.model").is_file():
        parser.error(f"no tokenizer files in {args.tokenizer}")

    base = QUICK if args.quick else FULL
    plan = Plan(
        **{
            **asdict(base),
            "workers": tuple(worker_counts(args.workers_max)),
            "repeat": args.repeat or base.repeat,
            "speed_rows": args.speed_rows or base.speed_rows,
        }
    )
    info = machine()
    print(
        f"machine: {info['cpu']}, {info['cores']} cores; python {info['python']}, tiktoken {info['tiktoken']}, "
        f"pyarrow {info['pyarrow']}, numpy {info['numpy']}, transformers {info['transformers']}; "
        f"fixed_sft {info['fixed_sft']} (code_sha256 {info['code']['code_sha256'][:12]}, "
        f"git {info['code'].get('git_commit', 'none')[:12]}{' + changes' if info['code'].get('git_dirty') else ''})"
    )
    print(
        f"mode: {plan.mode}; workers {', '.join(map(str, plan.workers))}; repeat {plan.repeat}; "
        f"load average {info['loadavg_start'][0]:.2f}",
        flush=True,
    )
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_build-") as tmp:
        bench = Benchmark(plan, args.tokenizer, Path(tmp))
        bench.run()
    total = time.perf_counter() - start
    info["loadavg_end"] = os.getloadavg()
    print()
    print(
        f"fixed-sft build benchmark ({plan.mode}, synthetic Tulu-like corpus): {info['cpu']}, {info['cores']} cores, "
        f"python {info['python']}, tiktoken {info['tiktoken']}, pyarrow {info['pyarrow']}; {total:.0f} s; "
        f"load average {info['loadavg_start'][0]:.2f} at start"
    )
    print_table(bench.figures)
    print("PROJECTED rows are estimates from the synthetic corpus, not measurements of the real Tulu 3 build.")
    if info["loadavg_start"][0] > 0.5:
        print(
            f"note: the machine was busy at start (load average {info['loadavg_start'][0]:.2f}); "
            "timings are distorted by other processes."
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": info,
                    "mode": plan.mode,
                    "seconds": total,
                    **bench.details,
                    "figures": [{**asdict(f), "result": f.result} for f in bench.figures],
                },
                indent=1,
            )
            + "\n"
        )
        print(f"wrote {args.json}")
    return 0 if all(f.ok for f in bench.figures if f.correctness) else 1


if __name__ == "__main__":
    sys.exit(main())

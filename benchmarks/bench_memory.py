#!/usr/bin/env python3
"""Peak memory of builds of huge conversations, next to normal builds of the same rows.

Usage::

    python benchmarks/bench_memory.py [--repeat K] [--cases NAME,...] [--workers 1,2] [--json OUT]
        [--cgroup [--limit MIB]]

The script writes its sources in a temporary folder (``--keep DIR`` keeps them), runs
each build in a fresh interpreter (``fixed_sft.build.build(...)``, as the command line
runs it) and samples the memory of that interpreter's whole process tree (the build
process and, with 2 workers, the workers' fork server, the workers it forks and
multiprocessing's resource tracker) from /proc every ``SAMPLE_INTERVAL_S``:

* **tree RSS**: the peak of the summed ``VmRSS`` of the tree. Pages the workers share
  with the fork server they forked from (the loaded encoder: about 120 MB) count once
  per process, so this is what a tool summing RSS shows, and errs high. The target,
  1 GiB, is read on it.
* **tree PSS**: the peak of the summed ``Pss`` (``/proc/PID/smaps_rollup``), where a
  shared page counts as its share in each process: the memory the tree takes.
* **sum of peaks**: the sum of each process's own ``VmHWM`` (its peak RSS, which the
  kernel keeps, so no sampling misses it): at least the tree RSS, whenever the
  processes peaked.

* **cgroup** (``--cgroup``, where the cgroup v1 memory hierarchy at
  ``/sys/fs/cgroup/memory`` is writable, as root): each build runs in a memory cgroup of
  its own, where the kernel counts every page once. ``cgroup anon`` is the peak of its
  sampled anonymous memory (``total_rss`` of ``memory.stat``); ``cgroup peak`` the
  kernel's own peak of its usage (``memory.max_usage_in_bytes``), which counts the page
  cache of the files the build reads and writes too. With ``--limit MIB``, memory and
  memory+swap are limited to MIB: a build that needs more is killed, and its case fails.

(``getrusage(RUSAGE_CHILDREN)`` is not used: it gives the largest child's peak, not a
sum, and Linux counts the RSS of the forking process, this script holding the sources,
into a child's ``ru_maxrss``.)

Cases (``--cases`` picks some; each runs ``--repeat`` times, default 3, at each worker
count; the table gives the median and range of the repeats, and the ratio of the median
to its baseline's at the same worker count). Huge conversations are a short user
message and an assistant reply of synthetic text (``tests/synthetic.py``); Parquet is
written by ``pyarrow.parquet.write_table``.

* ``small`` (baseline): a normal build, 64 rows of 8,192 tokens from 4,000 synthetic
  conversations in 2 Parquet files.
* ``4mb``: 150 conversations of 4 MiB in Parquet row groups of 8; 1 row of 8,192
  tokens, which one conversation fills (the issue's case).
* ``4mb-one-group``: the same written in one row group: pyarrow puts all 150 replies
  in one 600 MB page, which the build refuses when it opens the source.
* ``max`` and ``max-parquet``: one conversation at the bound (its JSONL line is
  ``MAX_CONVERSATION_BYTES``) packed first among 300 synthetic ones; 4 rows. Its reply
  is ASCII after one emoji, so that Python holds it 4 bytes a character: the most a
  text takes per UTF-8 byte.
* ``normal-2000`` (baseline): a normal build of 2,000 rows of 8,192 tokens from 16,000
  synthetic conversations in 4 Parquet files.
* ``many-max``: 48 such conversations at the bound, JSONL; 2,000 rows, which take about
  ten of them.
* ``normal-all`` (only when named): 80,000 synthetic conversations in one Parquet file
  (more than one band of rows), built whole: the build fills the token store in one pass
  over the source (with ``--no-cache``: a band at a time, with its sorting copies).
* ``normal-all-groups`` (only when named): the same 80,000 conversations in one file of
  row groups of 2,000 rows, as a dataset's shards are cut: the fill's tasks read a row
  group each, in the workers.
* ``4mb-all`` (only when named): the ``4mb`` source built whole (``rows`` all): the pass
  that fills the store holds its conversations in flight, 19 row groups of 8 (rows of
  over 64 KiB: read by the build's process, the bytes in flight bounded).
* ``100mb`` and ``100mb-parquet``: one 100 MiB conversation packed first among 300
  synthetic ones, JSONL and Parquet, with ``skip_invalid``; 4 rows. In JSONL the row is
  refused (over the bound) and recorded, and the build goes on; in Parquet its page is
  over ``MAX_PAGE_BYTES`` and the build stops when it opens the source.

Builds of one case must give the same ``rows_sha256`` at every worker count and repeat,
and the refused cases must stop with their error; the script exits 1 otherwise. No
figure changes the exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the package, and the corpus generator the tests use

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import synthetic  # noqa: E402

DEFAULT_TOKENIZER = ROOT.parent / "shared" / "tokenizers" / "kimi-k2.6"
SAMPLE_INTERVAL_S = 0.01
SEED = 42
MIB = 1 << 20
GIB = 1 << 30
TARGET_BYTES = GIB
OUTCOME_CHARS = 60
CASES = ("small", "4mb", "4mb-one-group", "max", "max-parquet", "normal-2000", "many-max", "100mb", "100mb-parquet")
EXTRA_CASES = ("4mb-all", "normal-all", "normal-all-groups")  # run only when --cases names them


@dataclass(frozen=True)
class Case:
    """One source and the build made from it."""

    name: str
    title: str
    source: Path
    rows: int | None  # None: the whole source
    row_tokens: int = 8192
    skip_invalid: bool = False
    refused: str | None = None  # the error the build must stop with (a text it holds), if any
    baseline: str = "small"  # the case whose memory this one is compared with


# ---------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------


def text_pool() -> bytes:
    """About 10 MB of synthetic chat content (prose, code, math, a dozen scripts), as UTF-8."""
    rows = synthetic.conversations(3000, seed=2024)
    return "\n\n".join(m["content"] for r in rows for m in r["messages"]).encode()


def big_text(pool: bytes, size: int, k: int) -> str:
    """About ``size`` bytes of UTF-8 text: the pool repeated from an offset that ``k``
    sets (so that conversations differ), cut at character boundaries."""
    start = (k * 7_919_113) % len(pool)
    repeats = -(-(start + size) // len(pool))
    return (pool * repeats)[start : start + size].decode("utf-8", "ignore")


def huge_conversation(pool: bytes, size: int, k: int, line_bytes: int | None = None) -> dict[str, Any]:
    """A short user message and an assistant reply of about ``size`` bytes; with
    ``line_bytes``, the reply shortened until the row's JSONL line has at most that many."""
    row = {
        "id": f"huge_{k}",
        "source": "bench/huge",
        "messages": [
            {"role": "user", "content": f"Summarize document {k}."},
            {"role": "assistant", "content": big_text(pool, size, k)},
        ],
    }
    while line_bytes is not None and (over := len(json.dumps(row, ensure_ascii=False).encode()) - line_bytes) > 0:
        reply = row["messages"][1]["content"]
        row["messages"][1]["content"] = reply[: len(reply) - over - 64]
    return row


def widest(pool: bytes) -> bytes:
    """The pool's ASCII characters after one emoji: Python then holds the text 4 bytes a
    character, the most memory a str takes per UTF-8 byte (the synthetic mixture: 2.9)."""
    return "\N{GRINNING FACE} ".encode() + pool.decode().encode("ascii", "ignore")


def with_huge_first(huge: dict[str, Any], others: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``others`` with ``huge`` inserted where the build's order packs it first."""
    from fixed_sft.order import permutation

    first = int(permutation(SEED, len(others) + 1)[0])
    return [*others[:first], huge, *others[first:]]


def write_parquet(rows: list[dict[str, Any]], path: Path, **options: Any) -> Path:
    """Tulu-schema Parquet, as ``pyarrow.parquet.write_table`` writes it with ``options``."""
    pq.write_table(synthetic._to_table(rows), path, **options)
    return path


def make_sources(work: Path, names: set[str]) -> dict[str, Case]:
    from fixed_sft.bands import MAX_CONVERSATION_BYTES

    cases = {}
    if "small" in names:
        synthetic.write_parquet(synthetic.conversations(4000, seed=5), work / "small", rows_per_file=2000)
        cases["small"] = Case("small", "normal, 4,000 conv., 64 x 8192", work / "small", rows=64)
    if "normal-2000" in names:
        synthetic.write_parquet(synthetic.conversations(16000, seed=5), work / "normal-2000", rows_per_file=4000)
        cases["normal-2000"] = Case(
            "normal-2000", "normal, 16,000 conv., 2000 x 8192", work / "normal-2000", rows=2000, baseline="normal-2000"
        )
    if "normal-all" in names:
        synthetic.write_parquet(synthetic.conversations(80000, seed=6), work / "normal-all", rows_per_file=80000)
        cases["normal-all"] = Case(
            "normal-all", "normal, 80,000 conv. in 1 file, all rows", work / "normal-all", rows=None, baseline="small"
        )
    if "normal-all-groups" in names:
        rows = synthetic.conversations(80000, seed=6)
        cases["normal-all-groups"] = Case(
            "normal-all-groups",
            "normal, 80,000 conv. in 1 file, groups of 2,000, all rows",
            write_parquet(rows, work / "normal-all-groups.parquet", row_group_size=2000),
            rows=None,
            baseline="small",
        )
        del rows
    pool = text_pool() if names - {"small", "normal-all", "normal-all-groups"} else b""
    if names & {"4mb", "4mb-one-group", "4mb-all"}:
        rows = [huge_conversation(pool, 4 * MIB, k) for k in range(150)]
        if "4mb" in names:
            cases["4mb"] = Case(
                "4mb",
                "150 of 4 MiB, Parquet, groups of 8, 1 x 8192",
                write_parquet(rows, work / "4mb.parquet", row_group_size=8),
                rows=1,
            )
        if "4mb-all" in names:
            cases["4mb-all"] = Case(
                "4mb-all",
                "150 of 4 MiB, Parquet, groups of 8, all rows",
                write_parquet(rows, work / "4mb-all.parquet", row_group_size=8),
                rows=None,
            )
        if "4mb-one-group" in names:
            cases["4mb-one-group"] = Case(
                "4mb-one-group",
                "150 of 4 MiB, Parquet, one row group, 1 x 8192",
                write_parquet(rows, work / "4mb-one-group.parquet"),
                rows=1,
                refused="MAX_PAGE_BYTES",
            )
        del rows
    others = synthetic.conversations(300, seed=7)
    if names & {"max", "max-parquet"}:
        huge = huge_conversation(widest(pool), MAX_CONVERSATION_BYTES, 0, MAX_CONVERSATION_BYTES)
        rows = with_huge_first(huge, others)
        if "max" in names:
            cases["max"] = Case(
                "max",
                f"one of {MAX_CONVERSATION_BYTES / MIB:.0f} MiB (bound), JSONL, 4 x 8192",
                synthetic.write_jsonl(rows, work / "max.jsonl"),
                rows=4,
            )
        if "max-parquet" in names:
            cases["max-parquet"] = Case(
                "max-parquet",
                f"one of {MAX_CONVERSATION_BYTES / MIB:.0f} MiB (bound), Parquet, 4 x 8192",
                write_parquet(rows, work / "max.parquet"),
                rows=4,
            )
    if "many-max" in names:
        wide = widest(pool)
        rows = [huge_conversation(wide, MAX_CONVERSATION_BYTES, k, MAX_CONVERSATION_BYTES) for k in range(48)]
        cases["many-max"] = Case(
            "many-max",
            f"48 of {MAX_CONVERSATION_BYTES / MIB:.0f} MiB, JSONL, 2000 x 8192",
            synthetic.write_jsonl(rows, work / "many-max.jsonl"),
            rows=2000,
            baseline="normal-2000",
        )
        del rows
    if names & {"100mb", "100mb-parquet"}:
        rows = with_huge_first(huge_conversation(pool, 100 * MIB, 0), others)
        if "100mb" in names:
            cases["100mb"] = Case(
                "100mb",
                "one of 100 MiB, JSONL, skip_invalid, 4 x 8192",
                synthetic.write_jsonl(rows, work / "100mb.jsonl"),
                rows=4,
                skip_invalid=True,
            )
        if "100mb-parquet" in names:
            cases["100mb-parquet"] = Case(
                "100mb-parquet",
                "one of 100 MiB, Parquet, skip_invalid, 4 x 8192",
                write_parquet(rows, work / "100mb.parquet"),
                rows=4,
                skip_invalid=True,
                refused="MAX_PAGE_BYTES",
            )
    return cases


# ---------------------------------------------------------------------------
# Child build and process-tree sampling
# ---------------------------------------------------------------------------


def child_main(spec_path: Path) -> None:
    """Child side: one build; write what it gave as JSON."""
    spec = json.loads(spec_path.read_text())
    from fixed_sft.build import BuildConfig, build

    start = time.perf_counter()
    try:
        manifest = build(BuildConfig(**spec["config"]), Path(spec["out"]))
        result = {
            "rows_sha256": manifest["rows_sha256"],
            "stats": manifest["stats"],
            "skipped": [s["reason"] for s in manifest["skipped_invalid"]],
        }
    except Exception as error:  # reported, and the script exits 1
        result = {"error": f"{type(error).__name__}: {error}"}
    result["wall_s"] = time.perf_counter() - start
    Path(spec["result"]).write_text(json.dumps(result))


def _children() -> dict[int, list[int]]:
    """Each live process's children, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                parent = int(Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    return children


def _status(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of ``pid`` in bytes (empty once it has ended)."""
    values = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                values[line[:5]] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return values


def _pss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _role(pid: int) -> str:
    """What process ``pid`` runs, from its command line (a worker's is its fork server's)."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(w.decode(errors="replace") for w in words)
    if "forkserver" in text:  # the fork server, or a worker it forked (which has its command line)
        parent = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1]
        return "worker" if "forkserver" in _role(int(parent)) else "fork server"
    if "resource_tracker" in text:
        return "resource tracker"
    return "build" if "--child" in text or "child" in text else text[:40]


CGROUP_ROOT = Path("/sys/fs/cgroup/memory")


class MemoryCgroup:
    """A cgroup v1 memory group of its own for one build (``limit``: bytes of memory, and of
    memory+swap, it may use; ``None``: no limit)."""

    def __init__(self, name: str, limit: int | None):
        self.path = CGROUP_ROOT / name
        self.path.mkdir()
        if limit is not None:
            (self.path / "memory.limit_in_bytes").write_text(str(limit))
            swap = self.path / "memory.memsw.limit_in_bytes"
            if swap.exists():
                swap.write_text(str(limit))

    def add(self, pid: int) -> None:
        """Move ``pid`` in (the processes it starts from then on are in it too)."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def _count(self, name: str, key: str) -> int:
        """The value of ``key`` in the cgroup's file ``name`` (``KEY VALUE`` lines), or 0."""
        for line in (self.path / name).read_text().splitlines():
            if line.startswith(f"{key} "):
                return int(line.split()[1])
        return 0

    def anon(self) -> int:
        return self._count("memory.stat", "total_rss")

    def peak(self) -> int:
        return int((self.path / "memory.max_usage_in_bytes").read_text())

    def oom_kills(self) -> int:
        return self._count("memory.oom_control", "oom_kill")

    def remove(self) -> None:
        for _ in range(100):  # (until the kernel has let go of its last process)
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.05)


class TreeSampler(threading.Thread):
    """Samples the process tree of ``pid`` until stopped: peaks of its summed RSS and
    PSS, each process's last seen ``VmHWM``, and the most processes seen at once."""

    def __init__(self, pid: int, cgroup: MemoryCgroup | None = None):
        super().__init__(daemon=True)
        self.pid, self.cgroup = pid, cgroup
        self.rss = self.pss = self.processes = self.anon = 0
        self.hwm: dict[int, int] = {}
        self.names: dict[int, str] = {}  # pid -> "pid: what it runs"
        self.pss_at_peak: dict[str, list[int]] = {}  # what each kind of process held at the tree's peak PSS
        self.began = time.perf_counter()
        self.peak_at = 0.0  # seconds from the start to the tree's peak PSS
        self.done = threading.Event()

    def tree(self) -> list[int]:
        children, found, todo = _children(), [], [self.pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo += children.get(pid, [])
        return found

    def run(self) -> None:
        while not self.done.is_set():
            pids = self.tree()
            rss = 0
            for pid in pids:
                status = _status(pid)
                rss += status.get("VmRSS", 0)
                if pid not in self.names:
                    self.names[pid] = f"{pid}: {_role(pid)}"
                if "VmHWM" in status:
                    self.hwm[pid] = max(self.hwm.get(pid, 0), status["VmHWM"])
            self.rss = max(self.rss, rss)
            shares = {pid: _pss(pid) for pid in pids}
            if (total := sum(shares.values())) > self.pss:
                self.pss, self.peak_at = total, time.perf_counter() - self.began
                self.pss_at_peak = {}
                for pid, share in shares.items():
                    self.pss_at_peak.setdefault(self.names[pid].split(": ", 1)[1], []).append(share)
            self.processes = max(self.processes, len(pids))
            if self.cgroup is not None:
                self.anon = max(self.anon, self.cgroup.anon())
            self.done.wait(SAMPLE_INTERVAL_S)


def run_build(
    case: Case, workers: int, tokenizer: Path, work: Path, cgroup: bool = False, limit: int | None = None
) -> dict[str, Any]:
    """One build of ``case`` in a fresh interpreter, its process tree sampled (with
    ``cgroup``: in a memory cgroup of its own, limited to ``limit`` bytes)."""
    name = f"{case.name}-w{workers}-{time.monotonic_ns()}"
    config = dict(
        name=case.name,
        source=str(case.source),
        tokenizer=str(tokenizer),
        rows=case.rows,
        row_tokens=case.row_tokens,
        seed=SEED,
        workers=workers,
        skip_invalid=case.skip_invalid,
    )
    spec = {"config": config, "out": str(work / "out" / name), "result": str(work / f"{name}.json")}
    spec_path = work / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env["FIXED_SFT_CACHE"] = str(work / "store" / name)  # a first build: an empty token store of its own
    log = work / f"{name}.log"
    with log.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child", str(spec_path)],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=env,
            cwd=str(ROOT),
        )
        group = MemoryCgroup(f"fixed-sft-bench-{os.getpid()}-{proc.pid}", limit) if cgroup else None
        if group is not None:
            group.add(proc.pid)  # (before the interpreter has started any process of its own)
        sampler = TreeSampler(proc.pid, group)
        sampler.start()
        try:
            code = proc.wait()
        except BaseException:  # e.g. Ctrl-C: do not leave the build running
            proc.kill()
            proc.wait()
            raise
        finally:
            sampler.done.set()
            sampler.join()
            shutil.rmtree(env["FIXED_SFT_CACHE"], ignore_errors=True)
    measured: dict[str, Any] = {}
    if group is not None:
        measured = {"cgroup_anon": sampler.anon, "cgroup_peak": group.peak(), "oom_kills": group.oom_kills()}
        group.remove()
    if code != 0 or not Path(spec["result"]).exists():
        sys.stderr.write(log.read_text(errors="replace")[-4000:])
        result = {"error": f"the build process exited {code}"}
    else:
        result = json.loads(Path(spec["result"]).read_text())
    return {
        **result,
        "case": case.name,
        "workers": workers,
        "tree_rss": sampler.rss,
        "tree_pss": sampler.pss,
        "tree_pss_at_s": sampler.peak_at,
        "pss_at_peak_by_role": sampler.pss_at_peak,
        "sum_hwm": sum(sampler.hwm.values()),
        "hwm_by_process": {sampler.names.get(pid, str(pid)): hwm for pid, hwm in sampler.hwm.items()},
        "processes": sampler.processes,
        **measured,
    }


# ---------------------------------------------------------------------------
# Table
# ---------------------------------------------------------------------------


def spread(values: list[float], unit: float, fmt: str = "{:.0f}") -> str:
    """``median (low-high)`` of ``values`` in ``unit``."""
    scaled = [v / unit for v in values]
    median = fmt.format(statistics.median(scaled))
    if len(scaled) == 1:
        return median
    return f"{median} ({fmt.format(min(scaled))}-{fmt.format(max(scaled))})"


def outcome(case: Case, runs: list[dict[str, Any]]) -> str:
    errors = [r["error"].replace(f"{case.source}: ", "") for r in runs if "error" in r]
    if errors:
        return f"stopped: {errors[0][:OUTCOME_CHARS]}"
    first = runs[0]
    text = f"{first['stats']['rows']} rows from {first['stats']['conversations']} conv."
    if first["skipped"]:
        text += f"; skipped: {first['skipped'][0][:OUTCOME_CHARS]}"
    return text


def as_expected(case: Case, runs: list[dict[str, Any]]) -> bool:
    """Every build of ``case`` stopped with the error it must, or built, all with the same rows."""
    if case.refused is not None:
        return all(case.refused in r.get("error", "") for r in runs)
    return all("error" not in r for r in runs) and len({r["rows_sha256"] for r in runs}) == 1


def cgroup_figure(runs: list[dict[str, Any]]) -> str:
    """``anon / peak`` of builds run in a cgroup (empty without ``--cgroup``)."""
    if not all("cgroup_anon" in r for r in runs):
        return ""
    return f"{spread([r['cgroup_anon'] for r in runs], MIB)} / {spread([r['cgroup_peak'] for r in runs], MIB)}"


def print_table(cases: dict[str, Case], runs: list[dict[str, Any]], workers: list[int]) -> None:
    headers = (
        "case",
        "workers",
        "tree RSS MiB",
        "x baseline",
        "tree PSS MiB",
        "sum of peaks MiB",
        "cgroup anon / peak MiB",
        "wall s",
        "RSS < 1 GiB",
        "outcome",
    )

    def median_rss(name: str, count: int) -> float | None:
        mine = [r["tree_rss"] for r in runs if r["case"] == name and r["workers"] == count]
        return statistics.median(mine) if mine else None

    table = []
    for name, case in cases.items():
        for count in workers:
            mine = [r for r in runs if r["case"] == name and r["workers"] == count]
            if not mine:
                continue
            rss = [r["tree_rss"] for r in mine]
            base = median_rss(case.baseline, count)
            ratio = "(baseline)" if case.baseline == name else f"{statistics.median(rss) / base:.2f}x" if base else ""
            table.append(
                (
                    case.title,
                    str(count),
                    spread(rss, MIB),
                    ratio,
                    spread([r["tree_pss"] for r in mine], MIB),
                    spread([r["sum_hwm"] for r in mine], MIB),
                    cgroup_figure(mine),
                    spread([r["wall_s"] for r in mine], 1, "{:.1f}"),
                    "yes" if max(rss) < TARGET_BYTES else "NO",
                    outcome(case, mine),
                )
            )
    widths = [max(len(h), *(len(row[k]) for row in table)) for k, h in enumerate(headers)]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    print(line.format(*headers).rstrip())
    print("  ".join("-" * w for w in widths))
    for row in table:
        print(line.format(*row).rstrip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, metavar="K", help="builds per case and worker count")
    parser.add_argument(
        "--cases",
        default=",".join(CASES),
        help=f"comma-separated, of {', '.join(CASES + EXTRA_CASES)} (default: all but {', '.join(EXTRA_CASES)})",
    )
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts (default 1,2)")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write every build's figures to OUT")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="write the sources and builds in DIR, and keep them")
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=DEFAULT_TOKENIZER,
        help=f"Kimi-K2.6 tokenizer folder (default {DEFAULT_TOKENIZER})",
    )
    parser.add_argument("--cgroup", action="store_true", help="run each build in a memory cgroup of its own (root)")
    parser.add_argument("--limit", type=int, metavar="MIB", help="with --cgroup: limit each build's memory to MIB")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child_main(args.child)
        return 0
    names = args.cases.split(",")
    if unknown := set(names) - set(CASES + EXTRA_CASES):
        parser.error(f"unknown case(s) {', '.join(sorted(unknown))}")
    workers = [int(w) for w in args.workers.split(",")]
    if args.limit is not None and not args.cgroup:
        parser.error("--limit needs --cgroup")
    if args.cgroup and not os.access(CGROUP_ROOT, os.W_OK):
        parser.error(f"--cgroup needs a writable cgroup v1 memory hierarchy at {CGROUP_ROOT}")
    limit = args.limit * MIB if args.limit is not None else None
    if args.repeat < 1 or min(workers) < 1:
        parser.error("--repeat and --workers must be at least 1")
    if not (args.tokenizer / "tiktoken.model").is_file():
        parser.error(f"no tokenizer files in {args.tokenizer}")
    import fixed_sft
    from fixed_sft.build import code_version

    code = code_version()
    print(
        f"python {platform.python_version()}, pyarrow {pa.__version__}, {os.cpu_count()} cores; fixed_sft "
        f"{fixed_sft.__version__} (code_sha256 {code['code_sha256'][:12]}, git {code.get('git_commit', 'none')[:12]}"
        f"{' + changes' if code.get('git_dirty') else ''}); load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench_memory-") as tmp:
        work = Path(tmp) if args.keep is None else args.keep
        work.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        cases = {name: case for name, case in make_sources(work, set(names)).items()}
        cases = {name: cases[name] for name in names}
        print(f"sources written in {time.perf_counter() - start:.0f} s", flush=True)
        for repeat in range(args.repeat):
            for case in cases.values():
                for count in workers:
                    run = run_build(case, count, args.tokenizer, work, args.cgroup, limit)
                    runs.append(run)
                    print(
                        f"  {case.name} w{count} #{repeat + 1}: tree RSS {run['tree_rss'] / MIB:.0f} MiB, "
                        f"PSS {run['tree_pss'] / MIB:.0f} MiB, sum of peaks {run['sum_hwm'] / MIB:.0f} MiB, "
                        f"{run['processes']} processes, {run.get('wall_s', 0):.1f} s"
                        + (f", cgroup anon {run['cgroup_anon'] / MIB:.0f} MiB" if "cgroup_anon" in run else "")
                        + (f"; {run['error']}" if "error" in run else ""),
                        flush=True,
                    )
    print()
    print(
        f"peak memory of builds, median (range) of {args.repeat} build(s) each; load average "
        f"{os.getloadavg()[0]:.2f} at end"
    )
    print_table(cases, runs, workers)
    if args.json:
        args.json.write_text(json.dumps({"code": code, "runs": runs}, indent=1) + "\n")
        print(f"wrote {args.json}")
    failed = [name for name, case in cases.items() if not as_expected(case, [r for r in runs if r["case"] == name])]
    if failed:
        print(f"FAIL: {', '.join(failed)}: a build did not end as it must, or builds gave different rows_sha256")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

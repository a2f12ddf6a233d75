"""kill -9 safety: a build killed at any point leaves its output folder absent or
complete (``verify`` finds nothing wrong), never partial; a rerun then completes with
the rows of an uninterrupted build; two builds into one folder never mix.

The builds are real ``generate_fixed_sft.py build`` subprocesses, killed with SIGKILL
at seeded random moments: one trial during start-up, the others at a random delay
after the build took its lock and made its temporary folder (the work proper),
some into a fresh folder and some over a previous, different build. The moments of
``_publish`` (moving the old build aside, moving the new one in, removing the old)
are too short to hit by timing, so a forked build kills itself at each of them too.
A 2-worker build killed so leaves multiprocessing's ``pymp-*`` folder in TMPDIR; the
next 2-worker build removes it.

Ctrl-C and SIGTERM, once or several times in a row, at moments spread over a build
(its encoder start-up too, one that never ends included, and after ``built`` is
printed) end it within seconds with 130 or 143 and one line, leaving no worker and no
temporary folder.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import synthetic

import fixed_sft.output
from fixed_sft.verify import verify

ROOT = Path(__file__).resolve().parent.parent
ROWS = 20
OLD_ROWS = 7
SEED = 20240611
TRIALS = 4


def command(source: Path, kimi_dir: Path, out: Path, rows: int = ROWS, card: bool = False) -> list[str]:
    """A build's command line; ``card``: with its dataset card (the kills at random moments
    and their reference build draw it, so that a kill may land in it)."""
    return [
        sys.executable,
        str(ROOT / "generate_fixed_sft.py"),
        "build",
        "--source",
        str(source),
        "--tokenizer",
        str(kimi_dir),
        "--rows",
        str(rows),
        "--row-tokens",
        "1024",
        "--out",
        str(out),
        "--workers",
        "1",
        "--quiet",
        *([] if card else ["--no-card"]),
    ]


def start(source: Path, kimi_dir: Path, out: Path, rows: int = ROWS, card: bool = False) -> subprocess.Popen:
    return subprocess.Popen(
        command(source, kimi_dir, out, rows, card), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def run_build(source: Path, kimi_dir: Path, out: Path, rows: int = ROWS) -> tuple[float, float]:
    """Build to completion; return the seconds until the temporary folder appeared
    (start-up) and from then until ``out`` appeared (the work proper)."""
    began = time.monotonic()
    process = start(source, kimi_dir, out, rows, card=True)
    appeared = published = None
    while process.poll() is None:
        now = time.monotonic() - began
        if appeared is None and any(out.parent.glob(f".{out.name}.tmp-*")):
            appeared = now
        if published is None and out.exists():
            published = now
        time.sleep(0.005)
    stdout, stderr = process.communicate()
    assert process.returncode == 0, stderr
    total = time.monotonic() - began
    appeared = appeared if appeared is not None else total
    return appeared, (published if published is not None else total) - appeared


def rows_sha256(out: Path) -> str:
    return json.loads((out / "manifest.json").read_text(encoding="utf-8"))["rows_sha256"]


def leftovers(out: Path, kind: str) -> list[str]:
    return sorted(p.name for p in out.parent.glob(f".{out.name}.{kind}-*"))


def assert_absent_or_complete(out: Path, allowed: set[str]) -> str:
    """``out`` is absent, or a complete build whose rows are one of ``allowed``."""
    if not out.exists():
        return "absent"
    assert out.is_dir()
    problems = verify(out)
    assert problems == [], f"partial output after kill -9: {problems}; files {sorted(os.listdir(out))}"
    assert rows_sha256(out) in allowed
    return "complete"


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("interrupt") / "source"
    synthetic.write_parquet(synthetic.conversations(300, seed=3), folder, rows_per_file=150)
    return folder


@pytest.fixture(scope="module")
def uninterrupted(source, kimi_dir, tmp_path_factory):
    """The reference build and a different (smaller) previous build to be replaced,
    built side by side; with the reference build's timings."""
    base = tmp_path_factory.mktemp("uninterrupted")
    with ThreadPoolExecutor(2) as pool:
        reference = pool.submit(run_build, source, kimi_dir, base / "reference")
        old = pool.submit(run_build, source, kimi_dir, base / "old", OLD_ROWS)
        startup_s, work_s = reference.result()
        old.result()
    assert verify(base / "reference") == [] and verify(base / "old") == []
    return {
        "sha": rows_sha256(base / "reference"),
        "old": base / "old",
        "old_sha": rows_sha256(base / "old"),
        "startup_s": startup_s,
        "work_s": work_s,
    }


def _trial(k: int, source: Path, kimi_dir: Path, base: Path, uninterrupted: dict) -> dict:
    rng = random.Random(f"{SEED}:{k}")
    out = base / f"trial{k}" / "out"
    out.parent.mkdir(parents=True)
    over_old = k % 2 == 1
    allowed = {uninterrupted["sha"]}
    if over_old:
        shutil.copytree(uninterrupted["old"], out)
        allowed.add(uninterrupted["old_sha"])
    during_startup = k == 0

    process = start(source, kimi_dir, out, card=True)
    began = time.monotonic()
    if during_startup:
        delay = rng.uniform(0.05, max(0.1, uninterrupted["startup_s"]))
        time.sleep(delay)
    else:
        while process.poll() is None and not any(out.parent.glob(f".{out.name}.tmp-*")):
            time.sleep(0.002)
        delay = rng.uniform(0.0, 1.05 * uninterrupted["work_s"])
        time.sleep(delay)
    process.send_signal(signal.SIGKILL)
    killed_at = time.monotonic() - began
    process.communicate()
    killed = process.returncode == -signal.SIGKILL
    state = assert_absent_or_complete(out, allowed)
    if over_old and state == "complete" and killed and rows_sha256(out) == uninterrupted["old_sha"]:
        state = "previous build kept"

    rerun = start(source, kimi_dir, out, card=True)
    _, stderr = rerun.communicate()
    assert rerun.returncode == 0, stderr
    assert verify(out) == []
    assert rows_sha256(out) == uninterrupted["sha"]
    assert leftovers(out, "tmp") == [], "the rerun leaves no temporary folder behind"
    return {
        "trial": k,
        "over_old": over_old,
        "during_startup": during_startup,
        "delay": round(delay, 3),
        "killed_at": round(killed_at, 3),
        "killed": killed,
        "state": state,
    }


def test_kill_9_at_random_moments(source, kimi_dir, uninterrupted, tmp_path):
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda k: _trial(k, source, kimi_dir, tmp_path, uninterrupted), range(TRIALS)))
    print("\n".join(map(str, results)))
    assert any(r["killed"] for r in results), results


def test_two_builds_into_one_folder_never_mix(source, kimi_dir, uninterrupted, tmp_path):
    out = tmp_path / "shared-out"
    first, second = start(source, kimi_dir, out), start(source, kimi_dir, out)
    outcomes = [(p.returncode, stderr) for p in (first, second) for _, stderr in [p.communicate()]]
    codes = sorted(code for code, _ in outcomes)
    print(f"two builds into one folder: exit codes {codes}")
    assert codes in ([0, 0], [0, 1]), outcomes
    for code, stderr in outcomes:
        if code:
            assert "another build" in stderr, stderr
    assert verify(out) == []
    assert rows_sha256(out) == uninterrupted["sha"]
    assert leftovers(out, "tmp") == []


# --- kills inside _publish, made deterministic: a forked build kills itself ---------------------------


def _build_then_die_at(step: str, source: Path, kimi_dir: Path, out: Path) -> None:
    """In a forked child: build ``out``, SIGKILLing this process at ``step`` of publishing."""
    from fixed_sft import build as build_module
    from fixed_sft import folder as folder_module

    real_rename, real_remove = Path.rename, folder_module.remove_build_folder

    def rename(self, target):
        if (
            step == "before-aside"
            and self == out
            or step == "before-move-in"
            and self.name.startswith(f".{out.name}.tmp-")
        ):
            os.kill(os.getpid(), signal.SIGKILL)
        return real_rename(self, target)

    def remove(folder):
        if step == "removing-old" and folder.name.startswith(f".{out.name}.old-"):
            entries = sorted(folder.iterdir())
            if entries:  # half-removed, then killed
                entries[0].unlink()
            os.kill(os.getpid(), signal.SIGKILL)
        return real_remove(folder)

    Path.rename = rename
    folder_module.remove_build_folder = remove
    config = build_module.BuildConfig(
        name="custom", source=str(source), tokenizer=str(kimi_dir), rows=ROWS, row_tokens=1024, workers=1
    )
    build_module.build(config, out)
    os._exit(0)  # not killed: the step was never reached


@pytest.mark.parametrize("step", ["before-aside", "before-move-in", "removing-old"])
def test_kill_9_inside_publish(step, source, kimi_dir, uninterrupted, tmp_path):
    from fixed_sft.build import BuildConfig, build

    out = tmp_path / "out"
    shutil.copytree(uninterrupted["old"], out)
    child = multiprocessing.get_context("fork").Process(target=_build_then_die_at, args=(step, source, kimi_dir, out))
    child.start()
    child.join(120)
    assert child.exitcode == -signal.SIGKILL, f"{step}: the build was not killed (exit {child.exitcode})"
    state = assert_absent_or_complete(out, {uninterrupted["sha"], uninterrupted["old_sha"]})
    expected = {"before-aside": "old", "before-move-in": "absent", "removing-old": "new"}[step]
    if expected == "absent":
        assert state == "absent"
    else:
        assert rows_sha256(out) == uninterrupted[{"old": "old_sha", "new": "sha"}[expected]]

    manifest = build(
        BuildConfig(name="custom", source=str(source), tokenizer=str(kimi_dir), rows=ROWS, row_tokens=1024, workers=1),
        out,
    )
    assert manifest["rows_sha256"] == uninterrupted["sha"]
    assert verify(out) == []
    assert leftovers(out, "tmp") == [] and leftovers(out, "old") == []


def test_recover_puts_back_a_previous_build_moved_aside(uninterrupted, tmp_path):
    """Killed between moving the old build aside and moving the new one in: the next
    build first puts the old one back, so a complete build is never lost."""
    from fixed_sft.folder import _recover

    out = tmp_path / "out"
    shutil.copytree(uninterrupted["old"], tmp_path / ".out.old-123")
    (tmp_path / ".out.tmp-123").mkdir()
    _recover(out)
    assert verify(out) == [] and rows_sha256(out) == uninterrupted["old_sha"]
    assert leftovers(out, "tmp") == [] and leftovers(out, "old") == []


def _fake_build(folder: Path, name: str) -> Path:
    """A folder that ``is_build`` accepts: a fixed-sft manifest and nothing else."""
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"format": "fixed-sft/2", "name": name}))
    return folder


def test_recover_keeps_a_published_build_and_deletes_the_old_one(tmp_path):
    """Killed after moving the new build in, before removing the old one: the new one stays."""
    from fixed_sft.folder import _recover

    out = _fake_build(tmp_path / "out", "new")
    _fake_build(tmp_path / ".out.old-123", "old")
    _recover(out)
    assert json.loads((out / "manifest.json").read_text())["name"] == "new"
    assert leftovers(out, "old") == []


def test_recover_puts_back_the_build_moved_aside_last(tmp_path):
    """A previous build whose removal failed (a read-only folder) stays moved aside; a later
    build killed between its two renames leaves its own previous build beside it. The one
    moved aside last is put back, whatever the names' order."""
    from fixed_sft.folder import _recover

    _fake_build(tmp_path / "stuck", "older")
    _fake_build(tmp_path / "out", "newer")
    (tmp_path / "stuck").rename(tmp_path / ".out.old-100")  # (first by name)
    time.sleep(0.01)
    (tmp_path / "out").rename(tmp_path / ".out.old-900")  # (moved aside after the stuck one)
    _recover(tmp_path / "out")
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["name"] == "newer"
    assert leftovers(tmp_path / "out", "old") == []


def test_recover_never_publishes_a_killed_builds_temporary_folder(tmp_path):
    """Only a previous build moved aside is put back; a complete temporary folder is deleted."""
    from fixed_sft.folder import _recover

    _fake_build(tmp_path / ".out.tmp-123", "unpublished")
    _recover(tmp_path / "out")
    assert not (tmp_path / "out").exists() and leftovers(tmp_path / "out", "tmp") == []


def test_recover_deletes_a_killed_builds_parquet_parts(tmp_path):
    """A build killed while its workers wrote the rows leaves their Parquet parts in its
    temporary folder: the next build deletes them with it; anything else there stops it."""
    from fixed_sft.errors import UsageError
    from fixed_sft.folder import _recover
    from fixed_sft.output import PARTS_NAME

    tmp = tmp_path / ".out.tmp-123"
    (tmp / PARTS_NAME).mkdir(parents=True)
    (tmp / "train.parquet").write_bytes(b"PAR1")
    (tmp / PARTS_NAME / "00000007.parquet").write_bytes(b"PAR1")
    _recover(tmp_path / "out")
    assert not tmp.exists()
    (tmp / PARTS_NAME).mkdir(parents=True)
    (tmp / PARTS_NAME / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match=f"its {PARTS_NAME} holds notes.txt"):
        _recover(tmp_path / "out")
    assert (tmp / PARTS_NAME / "notes.txt").exists()


def test_recover_does_not_put_back_a_half_removed_old_folder(tmp_path):
    from fixed_sft.folder import _recover

    (tmp_path / ".out.old-123").mkdir()
    (tmp_path / ".out.old-123" / "train.parquet").write_bytes(b"PAR1")  # its manifest already removed
    _recover(tmp_path / "out")
    assert not (tmp_path / "out").exists() and leftovers(tmp_path / "out", "old") == []


def test_cleanup_matches_the_output_name_literally(tmp_path):
    """A name with glob characters never touches another build's folders."""
    from fixed_sft.folder import _recover

    other = tmp_path / ".run1.tmp-424242"
    other.mkdir()
    (tmp_path / ".run[1].tmp-777").mkdir()
    _recover(tmp_path / "run[1]")
    assert other.exists()
    assert not (tmp_path / ".run[1].tmp-777").exists()


def test_cleanup_leaves_folders_of_targets_whose_names_extend_this_one(tmp_path):
    """``.run.old-v1.tmp-5`` is the temporary folder of a build into ``run.old-v1``."""
    from fixed_sft.folder import _recover

    others = [tmp_path / ".run.old-v1.tmp-5", tmp_path / ".run.tmp-x.old-6"]
    for folder in others:
        folder.mkdir()
    (tmp_path / ".run.tmp-7").mkdir()
    _recover(tmp_path / "run")
    assert all(folder.exists() for folder in others) and not (tmp_path / "run").exists()
    assert not (tmp_path / ".run.tmp-7").exists()


def _session_processes(session: int) -> set[int]:
    """Pids of the live (not zombie) processes of ``session``: a build started in a session
    of its own, its fork server and the workers that forks (others' builds on the machine
    are left out)."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit():
                state, _, _, sid = (entry / "stat").read_text().rpartition(")")[2].split()[:4]
                if int(sid) == session and state != "Z":
                    found.add(int(entry.name))
        except (OSError, ValueError):
            pass
    return found


def _wait_until_gone(session: int, within_s: float = 10) -> set[int]:
    """The processes of ``session`` still there after ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while (left := _session_processes(session)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _in_session(args: list[str], **environment: str) -> subprocess.Popen:
    """Start ``args`` in a session of its own (``_session_processes`` finds its workers), with
    ``environment`` added, every thread's stack printed should it crash."""
    return subprocess.Popen(
        args,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1", **environment},
    )


def _assert_stopped_by(sig: int, code: int, stderr: str) -> None:
    """Ctrl-C exits 130, SIGTERM 143, each with one line and no traceback."""
    expected = (130, "interrupted") if sig == signal.SIGINT else (143, "terminated")
    assert (code, stderr.strip().splitlines()[-1]) == expected, stderr
    assert "Traceback" not in stderr, stderr


@pytest.fixture(scope="module")
def long_source(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("long") / "long.jsonl"
    # (a 2-worker build of 10,000 took 2.7 s here, within the 3.3 s the repeated signals span)
    synthetic.write_jsonl(synthetic.conversations(30_000, seed=2), path)
    return path


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_a_signal_stops_workers_without_a_traceback(sig, long_source, kimi_dir, tmp_path):
    """Ctrl-C (sent to the whole process group, as a terminal does) and SIGTERM exit
    130 and 143 with one line; after SIGKILL of the build alone, its workers exit too.
    Signals land as the build starts (the fork server still importing) and during the
    work; the build has started once it holds its lock, after its handlers are set."""
    for delay in (0.3, 1.6):
        args = command(long_source, kimi_dir, tmp_path / f"out-{delay}")
        args[args.index("--rows") + 1], args[args.index("--workers") + 1] = "all", "2"
        process = _in_session(args)
        deadline = time.monotonic() + 60  # (a crash would show every thread's stack in the message below)
        while not (tmp_path / f".out-{delay}.lock").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(delay)
        if sig == signal.SIGINT:
            os.killpg(process.pid, sig)
        else:
            process.send_signal(sig)
        _, stderr = process.communicate(timeout=60)
        if sig == signal.SIGKILL:
            assert process.returncode == -signal.SIGKILL
        else:
            _assert_stopped_by(sig, process.returncode, stderr)
        assert not (tmp_path / f"out-{delay}").exists()
        assert not _wait_until_gone(process.pid), "worker processes outlived the build"


# --- Ctrl-C and SIGTERM, once or repeatedly, at moments spread over the build ------------------------

STOP_WITHIN_S = 15  # a signalled build exits within seconds; past this, it counts as hung
EXIT_CODES = {signal.SIGINT: (130, "interrupted"), signal.SIGTERM: (143, "terminated")}
# a template line that renders nothing, slowly: 10**10 loop turns, so start-up never ends
NEVER_ENDING = "{%- for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor -%}\n"


@pytest.fixture(scope="module")
def never_ending_tokenizer(kimi_dir, tmp_path_factory) -> Path:
    """The Kimi tokenizer with a chat template whose every rendering takes forever: the
    encoder's start-up (which renders probe conversations) never ends."""
    from fixed_sft.tokenizer import FILES

    folder = tmp_path_factory.mktemp("never-ending")
    for name in FILES:
        shutil.copy(kimi_dir / name, folder / name)
    template = folder / "chat_template.jinja"
    template.write_text(NEVER_ENDING + template.read_text(encoding="utf-8"), encoding="utf-8")
    return folder


def _signal_build(
    base: Path,
    source: Path,
    tokenizer: Path,
    workers: int,
    sig: int,
    times: int,
    delay: float,
    gap: float,
    rows: str = "all",
    extra: tuple[str, ...] = (),
) -> dict:
    """Start a build in a session of its own (its own TMPDIR under ``base``); ``delay``
    seconds after it takes its lock, send ``sig`` ``times`` times, ``gap`` seconds apart
    (Ctrl-C to the whole process group, as a terminal does; SIGTERM to the build alone).
    Return what happened; a build still running ``STOP_WITHIN_S`` seconds after the last
    signal is stopped (first with SIGABRT, which makes it print every thread's stack)."""
    out, tmpdir = base / "out", short_tmpdir()
    args = command(source, tokenizer, out) + ["--allow-unpinned-tokenizer", *extra]
    args[args.index("--rows") + 1], args[args.index("--workers") + 1] = rows, str(workers)
    process = _in_session(args, TMPDIR=str(tmpdir))
    deadline = time.monotonic() + 60
    while not (base / ".out.lock").exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(delay)
    for n in range(times):
        try:
            os.killpg(process.pid, sig) if sig == signal.SIGINT else process.send_signal(sig)
        except ProcessLookupError:  # (all gone already)
            pass
        if n + 1 < times:
            time.sleep(gap)
    sent = time.monotonic()
    try:
        _, stderr = process.communicate(timeout=STOP_WITHIN_S)
        hung = False
    except subprocess.TimeoutExpired:  # (the build, or a process of its session holding its stderr open)
        hung = True
        process.send_signal(signal.SIGABRT)
        time.sleep(2)
        os.killpg(process.pid, signal.SIGKILL)
        _, stderr = process.communicate()
    stopped_s = time.monotonic() - sent
    left = _wait_until_gone(process.pid)
    return {
        "signal": signal.Signals(sig).name,
        "times": times,
        "delay": round(delay, 2),
        "workers": workers,
        "hung": hung,
        "stopped_s": round(stopped_s, 2),
        "code": process.returncode,
        "stderr": stderr,
        "out": out,
        "processes_left": sorted(left),
        "tmp_left": leftovers(out, "tmp"),
        "tmpdir_left": _removed(tmpdir),
    }


def short_tmpdir() -> Path:
    """A TMPDIR for a build, directly in the system's temporary folder: the fork server's
    socket is made in it, and a socket's path must stay under 108 bytes."""
    import tempfile

    return Path(tempfile.mkdtemp(prefix="fsft-"))


def _removed(tmpdir: Path) -> list[str]:
    """The ``pymp-*`` folders left in ``tmpdir``, which is then removed."""
    left = sorted(p.name for p in tmpdir.glob("pymp-*"))
    shutil.rmtree(tmpdir, ignore_errors=True)
    return left


def _stop_problems(result: dict, allowed: set[str]) -> list[str]:
    """What is wrong with how a signalled build stopped: it must exit within seconds with
    130 or 143 and one line, without a traceback, leaving no worker, no temporary folder
    (its own, or multiprocessing's ``pymp-*`` in TMPDIR), and its output absent or complete."""
    code, line = EXIT_CODES[signal.Signals[result["signal"]]]
    lines = (result["stderr"] or "").strip().splitlines()
    problems = []
    if result["hung"]:
        problems.append(f"still running {STOP_WITHIN_S} s after the last signal")
    if (result["code"], lines) != (code, [line]):
        problems.append(f"exit {result['code']}, stderr {result['stderr']!r}")
    if result["processes_left"] or result["tmp_left"] or result["tmpdir_left"]:
        problems.append(
            f"left behind: processes {result['processes_left']}, {result['tmp_left']}, TMPDIR {result['tmpdir_left']}"
        )
    try:
        assert_absent_or_complete(result["out"], allowed)
    except AssertionError as error:
        problems.append(str(error))
    return problems


def _report(results: list[dict], allowed: set[str]) -> None:
    summary = [{k: v for k, v in r.items() if k not in ("stderr", "out")} for r in results]
    print("\n".join(map(str, summary)))
    problems = [(r["signal"], r["times"], r["delay"], p) for r in results for p in _stop_problems(r, allowed)]
    assert not problems, "\n".join(map(str, problems))


REPEATS = 6  # attempts per signal


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_repeated_signals_stop_a_two_worker_build_within_seconds(sig, long_source, kimi_dir, tmp_path):
    """Two or three Ctrl-C (or SIGTERM) in a row, at moments spread over the first 3 s of
    a 2-worker build (the fork server starting and importing, workers starting, the work),
    end it within seconds, as one does; they once could hang it for good (the builder in
    multiprocessing's join at exit, its pool's thread joining workers that waited for work)
    or end it with a traceback."""
    rng = random.Random(f"{SEED}:{sig}")
    moments = [(2 + k % 2, 3.0 * (k + rng.random()) / REPEATS, rng.uniform(0.0, 0.3)) for k in range(REPEATS)]
    with ThreadPoolExecutor(2) as pool:
        results = list(
            pool.map(
                lambda k: _signal_build(tmp_path / str(k), long_source, kimi_dir, 2, sig, *moments[k]), range(REPEATS)
            )
        )
    _report(results, set())  # (the whole source is far from built by then)


def _stop_once_parts_are_written(args: list[str], tmp_path: Path) -> None:
    """Run the build ``args`` (its ``--out`` replaced) twice, stopped by Ctrl-C to its process
    group, then by SIGTERM to it alone, once its workers write Parquet parts: each exits as
    any build does (no output, no temporary folder, no worker left), or is complete where
    the signal came too late, and a folder beside the output is untouched. At least one stops."""
    from fixed_sft.output import PARTS_NAME

    stopped = 0
    for sig in (signal.SIGINT, signal.SIGTERM):
        out, tmpdir = tmp_path / signal.Signals(sig).name / "out", short_tmpdir()
        out.parent.mkdir()
        (out.parent / "kept").mkdir()
        args[args.index("--out") + 1] = str(out)
        process = _in_session(args, TMPDIR=str(tmpdir))
        deadline = time.monotonic() + 60
        while not list(out.parent.glob(f".out.tmp-*/{PARTS_NAME}")) and process.poll() is None:
            assert time.monotonic() < deadline, "the workers never wrote a part"
            time.sleep(0.002)
        os.killpg(process.pid, sig) if sig == signal.SIGINT else process.send_signal(sig)
        _, stderr = process.communicate(timeout=STOP_WITHIN_S)
        assert not _wait_until_gone(process.pid) and not leftovers(out, "tmp") and not _removed(tmpdir)
        assert (out.parent / "kept").is_dir()
        if process.returncode == 0:  # (done as the signal came)
            assert assert_absent_or_complete(out, {rows_sha256(out)}) == "complete"
        else:
            _assert_stopped_by(sig, process.returncode, stderr)
            assert not out.exists()
            stopped += 1
    assert stopped


def test_a_signal_while_workers_pack_from_the_store_stops_the_build(source, kimi_dir, tmp_path, token_store):
    """A later build, whose 4 workers check its sample of conversations (stored unchecked)
    and then pack its rows from the store, stopped by Ctrl-C or SIGTERM once they write its
    Parquet parts, exits as any build does: no output, no temporary folder, no parts, no
    workers left. (One the signal came too late for is complete.)"""
    args = command(source, kimi_dir, tmp_path / "filled")
    args[args.index("--rows") + 1] = "all"
    subprocess.run([*args, "--check-every", "0"], check=True, cwd=ROOT, capture_output=True)  # (fills the store)
    args[args.index("--workers") + 1] = "4"
    args += ["--row-tokens", "256", "--seed", "9"]  # (its sample: checked, then packed from the store)
    _stop_once_parts_are_written(args, tmp_path)


# A later build that packs in workers forked from its process, with 4 workers on any machine
# (it takes 8 workers and cores, and 16M tokens: ``build._packs_stored_apart``)
FORKED_PACKERS = (
    "import sys; from fixed_sft import build, cli; build.STORED_PACKING_CORES = build.STORED_PACKING_TOKENS = 1; "
    "build.usable_cores = lambda: 4; sys.exit(cli.run())"
)


def test_a_signal_while_forked_workers_pack_stops_the_build(source, kimi_dir, tmp_path, token_store):
    """A later build that encodes nothing and packs its rows in 4 workers forked from its
    process (``build._Encoding.packers``), stopped by Ctrl-C (to its process group) or
    SIGTERM (to the build alone) once they write its Parquet parts, exits as any build
    does: no output, no temporary folder, no parts, no worker left. A folder beside the
    build is untouched (a forked worker removes none of its parent's folders)."""
    args = command(source, kimi_dir, tmp_path / "filled")
    args[args.index("--rows") + 1] = "all"
    subprocess.run(args, check=True, cwd=ROOT, capture_output=True)  # (fills the store, every sample checked)
    args = [sys.executable, "-c", FORKED_PACKERS, *args[2:]]
    args[args.index("--workers") + 1] = "4"
    args += ["--row-tokens", "256", "--seed", "9"]
    _stop_once_parts_are_written(args, tmp_path)


_blocked_when_forked: set[int] = set()  # (in a forked worker: the signals blocked as it began)


def _note_blocked() -> None:
    _blocked_when_forked.update(signal.pthread_sigmask(signal.SIG_BLOCK, []))


os.register_at_fork(after_in_child=_note_blocked)


def _worker_state(_: object) -> tuple[object, list[Path], set[int], set[int]]:
    from fixed_sft import exits

    blocked = set(signal.pthread_sigmask(signal.SIG_BLOCK, []))
    return signal.getsignal(signal.SIGTERM), list(exits._folders), set(_blocked_when_forked), blocked


def test_a_forked_worker_has_none_of_its_parents_signal_handlers_or_exit_folders(tmp_path):
    """A worker forked from the build's process (``engine.forked``) takes SIGTERM's default
    action and removes no folder on exit: it must not run the build's handler, whose
    second signal removes the build's temporary folders (``exits.exit_now``). It begins
    with Ctrl-C and SIGTERM blocked, so that neither reaches that handler before it has
    set its own, and then takes them."""
    from fixed_sft import engine, exits

    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with exits.removed_on_exit(tmp_path), engine.forked(1, lambda: None) as pool:
            ((handler, folders, at_fork, now),) = pool.map(_worker_state, [()])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert handler == signal.SIG_DFL and folders == []
    assert {signal.SIGINT, signal.SIGTERM} <= at_fork and not {signal.SIGINT, signal.SIGTERM} & now


def test_the_fork_server_ends_quietly_when_a_build_vanishes_mid_request() -> None:
    """A build stopped as one of its workers starts may close its fork server's connection
    before it sends the worker's files: the server ends (the build is going), with no
    traceback on the build's terminal. (Seen as an EOFError's traceback after "interrupted".)"""
    script = """
import os, socket, sys, time
from multiprocessing import forkserver
from fixed_sft.early import BUILDER_VARIABLE
from fixed_sft.engine import forkserver_context
forkserver_context(["fixed_sft.encode"], {BUILDER_VARIABLE: str(os.getpid())})
server = forkserver._forkserver
client = socket.socket(socket.AF_UNIX)
client.connect(server._forkserver_address)
client.close()  # (a request, ended before its files)
deadline = time.monotonic() + 30
while os.waitpid(server._forkserver_pid, os.WNOHANG) == (0, 0):
    assert time.monotonic() < deadline, "the fork server did not end"
    time.sleep(0.01)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize("workers", [1, 2])
def test_a_signal_during_a_start_up_that_never_ends_stops_the_build(
    workers, long_source, never_ending_tokenizer, tmp_path
):
    """With a chat template that renders forever, the encoder's start-up never ends (in
    the build's process for one worker; in the fork server, before any worker starts, for
    two): a signal at any moment of it still ends the build within seconds, and the fork
    server with it. It once waited for start-up to end, forever."""
    moments = [(signal.SIGINT, 1, 0.1, 0.0), (signal.SIGTERM, 1, 0.7, 0.0), (signal.SIGINT, 2, 1.4, 0.2)]
    with ThreadPoolExecutor(len(moments)) as pool:
        results = list(
            pool.map(
                lambda k: _signal_build(tmp_path / str(k), long_source, never_ending_tokenizer, workers, *moments[k]),
                range(len(moments)),
            )
        )
    _report(results, set())


# The program, with an exit function that waits a second once the command is over, so that a
# Ctrl-C surely lands in the interpreter's shutdown (as it may when threads are joined).
SLOW_SHUTDOWN = (
    "import atexit, sys, time; import fixed_sft.cli as cli; command = cli.main; "
    "cli.main = lambda argv=None, early=False: (command(argv, early), atexit.register(time.sleep, 1))[0]; cli.run()"
)


def _ctrl_c_after_built(
    source: Path, kimi_dir: Path, out: Path, workers: int, delay: float, slow_shutdown: bool = False
) -> tuple[int, str]:
    """Build; ``delay`` seconds after ``built`` is printed, press Ctrl-C; return the exit
    code and stderr."""
    args = command(source, kimi_dir, out)
    args[args.index("--workers") + 1] = str(workers)
    if slow_shutdown:
        args[1:2] = ["-c", SLOW_SHUTDOWN]
    process = _in_session(args, PYTHONUNBUFFERED="1")
    built = process.stdout.readline()
    time.sleep(delay)
    try:
        os.killpg(process.pid, signal.SIGINT)
    except ProcessLookupError:
        pass
    _, stderr = process.communicate(timeout=STOP_WITHIN_S)
    assert built.startswith("built "), (built, stderr)
    assert not _wait_until_gone(process.pid), "worker processes outlived the build"
    return process.returncode, stderr


def test_ctrl_c_after_built_is_printed_exits_130(source, kimi_dir, uninterrupted, tmp_path):
    """A Ctrl-C once the build has printed ``built`` (the interpreter shutting down:
    threads joined, multiprocessing's exit functions) exits 130 with one line; it once
    exited -2 (killed by SIGINT), or with a traceback. In the very last moments of the
    exit, when Python has put back the default handlers, it is ignored (exit 0). The
    output is complete either way."""
    attempts = [(1, 0.0, False), (2, 0.03, False), (2, 0.0, True)]  # (workers, delay, slow shutdown)
    with ThreadPoolExecutor(len(attempts)) as pool:
        results = list(
            pool.map(
                lambda k: _ctrl_c_after_built(source, kimi_dir, tmp_path / f"out{k}", *attempts[k]),
                range(len(attempts)),
            )
        )
    print(results)
    for k, (code, stderr) in enumerate(results):
        assert (code, stderr) == (130, "interrupted\n") or (code, stderr) == (0, ""), (code, stderr)
        assert verify(tmp_path / f"out{k}") == [] and rows_sha256(tmp_path / f"out{k}") == uninterrupted["sha"]
    assert results[-1] == (130, "interrupted\n")  # the Ctrl-C that surely landed in the shutdown


# --- kill -9 and multiprocessing's temporary folder ---------------------------------------------------


def test_a_build_removes_the_multiprocessing_folder_a_killed_build_left(source, long_source, kimi_dir, tmp_path):
    """A 2-worker build killed with SIGKILL cannot remove its ``pymp-*`` folder in TMPDIR
    (where its fork server's socket is); the next 2-worker build removes it, and only
    such folders: not another program's, nor a running build's."""
    tmpdir = short_tmpdir()
    (tmpdir / "pymp-another-program").mkdir()
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    args = command(long_source, kimi_dir, tmp_path / "killed")
    args[args.index("--rows") + 1], args[args.index("--workers") + 1] = "all", "2"
    running = []
    for name in ("killed", "running"):
        args[args.index("--out") + 1] = str(tmp_path / name)
        running.append(
            subprocess.Popen(
                args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, env=env
            )
        )
    killed, alive = running
    deadline = time.monotonic() + 60
    while len(list(tmpdir.glob("pymp-*/listener-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(alive.pid, signal.SIGSTOP)  # still running (holding its folder's lock) until killed below
    killed.kill()
    killed.communicate()
    assert not _wait_until_gone(killed.pid)
    assert len(list(tmpdir.glob("pymp-*"))) == 3  # the killed build's is left

    later = command(source, kimi_dir, tmp_path / "later")
    later[later.index("--workers") + 1] = "2"
    done = subprocess.run(later, cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert alive.poll() is None
    os.killpg(alive.pid, signal.SIGKILL)
    alive.communicate()
    left = _removed(tmpdir)
    assert len(left) == 2 and "pymp-another-program" in left, left  # and the running build's


@pytest.mark.parametrize("moment", ["interrupted", "unrecorded"])
def test_abort_closes_the_parquet_writer_only_once_its_write_has_ended(tmp_path, monkeypatch, moment):
    """Closing the Parquet writer while its thread writes a row group crashes the process:
    ``abort`` closes it in that thread, after the write, even when a signal's exception
    interrupts the wait (``interrupted``), or landed after the write was submitted but
    before it was recorded (``unrecorded``)."""
    import threading

    import numpy as np
    import pyarrow.parquet as pq

    from fixed_sft.output import ROWS_PER_GROUP, RowWriter
    from fixed_sft.pack import Row, Segment

    events, writing, release = [], threading.Event(), threading.Event()
    real_write, real_close = pq.ParquetWriter.write_table, pq.ParquetWriter.close

    def slow_write(self, table, *args, **kwargs):
        writing.set()
        release.wait(5)
        events.append("written")
        return real_write(self, table, *args, **kwargs)

    def close(self):
        events.append("closed")
        return real_close(self)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", slow_write)
    monkeypatch.setattr(pq.ParquetWriter, "close", close)
    writer = RowWriter(tmp_path / "train.parquet")
    for n in range(ROWS_PER_GROUP):
        writer.write(Row(np.zeros(4, np.int32), np.ones(4, np.uint8), (Segment(n, None, 0, 4),)))
    assert writing.wait(5)
    timer = threading.Timer(0.2, release.set)
    timer.start()
    if moment == "unrecorded":
        writer._writing = None
        writer.abort()
    else:
        waits = iter([KeyboardInterrupt()])  # the first wait is interrupted, as by a signal
        from concurrent.futures import wait as real_wait

        def interrupted_wait(*args, **kwargs):
            error = next(waits, None)
            if error is not None:
                raise error
            return real_wait(*args, **kwargs)

        def join_as_311_after_a_signal(self, *args, **kwargs):
            """Python 3.11's join interrupted by a signal: it raises, and takes the thread for
            ended from then on (the lock it waited on is released, the thread marked stopped)."""
            if self.name.startswith("parquet") and not getattr(self, "interrupted", False):
                self.interrupted = True
                raise KeyboardInterrupt

        monkeypatch.setattr(fixed_sft.output, "wait", interrupted_wait, raising=False)
        monkeypatch.setattr(threading.Thread, "join", join_as_311_after_a_signal)
        with pytest.raises(KeyboardInterrupt):
            writer.abort()
    timer.join()
    assert events == ["written", "closed"]


# Runs a build as the command line does, with bands of 1 MiB: a --rows all build of a source over
# that fills the token store first.
FILLING_BUILD = """
import sys
import fixed_sft.build as build_module
from fixed_sft.cli import run

build_module.BAND_BYTES = 1 << 20
sys.argv = ["generate_fixed_sft.py", *sys.argv[1:]]
run()
"""


@pytest.fixture(scope="module")
def row_group_source(tmp_path_factory) -> Path:
    """3,000 conversations in Parquet row groups of 100: many tasks for the pass that fills the store."""
    import pyarrow.parquet as pq

    folder = tmp_path_factory.mktemp("groups")
    (path,) = synthetic.write_parquet(synthetic.conversations(3000, seed=4), folder / "rows.parquet")
    pq.write_table(pq.read_table(path), path, row_group_size=100)
    return path


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_workers_fill_the_store_stops_the_build(sig, row_group_source, kimi_dir, tmp_path, token_store):
    """Ctrl-C or SIGTERM once the workers' tasks have written segments into the store: the
    build exits 130 or 143 with one line, its workers with it, and leaves no output."""
    args = command(row_group_source, kimi_dir, tmp_path / "out")
    args[args.index("--rows") + 1], args[args.index("--workers") + 1] = "all", "2"
    process = _in_session([sys.executable, "-c", FILLING_BUILD, *args[2:]])
    deadline = time.monotonic() + 60
    while not list(token_store.glob("tokens/*/*.seg")) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert process.poll() is None, process.communicate()[1]  # (still filling)
    os.killpg(process.pid, sig) if sig == signal.SIGINT else process.send_signal(sig)
    _, stderr = process.communicate(timeout=STOP_WITHIN_S)
    _assert_stopped_by(sig, process.returncode, stderr)
    assert not (tmp_path / "out").exists()
    assert not _wait_until_gone(process.pid), "worker processes outlived the build"

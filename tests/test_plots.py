"""Plots drawn in a process of their own are the plots drawn here; that process never outlives the build."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT

from fixed_sft.plots import PLOT_NAMES, Inputs, Plotter, draw, plot_names, same

INPUTS = Inputs(
    row_supervised=np.array([10, 900, 4000, 2500]),
    row_tokens=4096,
    ratio=0.45,
    conversation_tokens=np.array([3, 40, 500, 7000]),
    mix=[("tulu/$math$", 900), ("(none)", 12)],
)
# A process without matplotlib loaded: its Plotter starts the drawing process.
DRAW_IN_CHILD = """
import hashlib, sys
import numpy as np
from fixed_sft.plots import Inputs, Plotter
rows, conversations = np.array([10, 900, 4000, 2500]), np.array([3, 40, 500, 7000])
INPUTS = Inputs(rows, 4096, 0.45, conversations, [("tulu/$math$", 900), ("(none)", 12)])
with Plotter() as plotter:
    assert plotter._process is not None, "no drawing process"
    plots = plotter.draw(INPUTS)
assert "matplotlib" not in sys.modules, "drew here"
for name, data in sorted(plots.items()):
    print(name, hashlib.sha256(data).hexdigest())
"""


def _run(code: str, *args: str) -> subprocess.CompletedProcess:
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    environment = {**os.environ, "PYTHONPATH": path}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=environment)


@pytest.mark.parametrize("mix", [True, False])
def test_the_drawing_process_draws_these_plots(mix):
    """The drawing process draws each plot but the first in a child of its own: the same bytes."""
    inputs = INPUTS if mix else Inputs(INPUTS.row_supervised, 4096, 0.45, INPUTS.conversation_tokens, None)
    here = {name: hashlib.sha256(data).hexdigest() for name, data in draw(inputs).items()}
    assert list(here) == plot_names(inputs) == [n for n in PLOT_NAMES if mix or n != "source_mix.png"]
    code = DRAW_IN_CHILD if mix else DRAW_IN_CHILD.replace('[("tulu/$math$", 900), ("(none)", 12)]', "None")
    result = _run(code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert dict(line.split() for line in result.stdout.splitlines()) == here


def test_a_plot_whose_child_fails_is_drawn_by_its_parent():
    """A forked child's plot is taken only where it exited cleanly; else ``draw`` draws it
    itself (in a process of its own here: the test process runs threads)."""
    code = """
from fixed_sft import plots
assert plots._taken(*plots._forked(lambda: b"png")) == b"png"
assert plots._taken(*plots._forked(lambda: 1 / 0)) is None
assert plots._taken(*plots._forked(lambda: b"")) is None
forked = plots._forked
plots._forked = lambda drawer: forked(lambda: 1 / 0)
INPUTS = plots.Inputs([10, 900], 4096, 0.4, [3, 40], [("a", 9)])
assert plots.draw(INPUTS, apart=True) == plots.draw(INPUTS)
import os
def no_fork():
    raise BlockingIOError(11, "Resource temporarily unavailable")
plots._forked, os.fork = forked, no_fork  # (no process to spare: every plot drawn here, no pipe left open)
before = len(os.listdir("/proc/self/fd"))
assert plots.draw(INPUTS, apart=True) == plots.draw(INPUTS)
assert len(os.listdir("/proc/self/fd")) == before
print("ok")
"""
    result = _run(code)
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr[-2000:]


def test_a_users_matplotlibrc_does_not_change_the_plots(tmp_path):
    """The plots are drawn under matplotlib's defaults, whatever matplotlibrc the user has
    (``MPLCONFIGDIR``, ``~/.config/matplotlib``, the working folder): the same bytes."""
    (tmp_path / "matplotlibrc").write_text("axes.facecolor: yellow\nfont.size: 17\nlines.linewidth: 5\n")
    code = """
import hashlib
import matplotlib
from fixed_sft import plots
assert matplotlib.rcParams["axes.facecolor"] == "yellow"
INPUTS = plots.Inputs([10, 900, 3000], 4096, 0.4, [3, 40, 900], [("a", 9)])
print(sorted((name, hashlib.sha256(data).hexdigest()) for name, data in plots.draw(INPUTS).items()))
"""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    runs = [
        subprocess.run(
            [sys.executable, "-c", code.replace('assert matplotlib.rcParams["axes.facecolor"] == "yellow"', check)],
            capture_output=True,
            text=True,
            env={**environment, "MPLCONFIGDIR": str(folder)},
        )
        for folder, check in (
            (tmp_path, 'assert matplotlib.rcParams["axes.facecolor"] == "yellow"'),
            (tmp_path / "none", ""),
        )
    ]
    assert all(run.returncode == 0 for run in runs), runs[0].stderr[-2000:] + runs[1].stderr[-2000:]
    assert runs[0].stdout == runs[1].stdout


def test_plots_started_early_are_those_drawn_when_asked():
    """``start`` has the process draw at once; ``draw`` of the same inputs takes its plots, and
    of other inputs draws those (here), not the ones started."""
    early = DRAW_IN_CHILD.replace(
        "plots = plotter.draw(INPUTS)", "plotter.start(INPUTS)\n    plots = plotter.draw(INPUTS)"
    )
    result = _run(early)
    assert result.returncode == 0, result.stderr[-2000:]
    here = {name: hashlib.sha256(data).hexdigest() for name, data in draw(INPUTS).items()}
    assert dict(line.split() for line in result.stdout.splitlines()) == here
    other = Inputs(INPUTS.row_supervised, INPUTS.row_tokens, 0.5, INPUTS.conversation_tokens, INPUTS.mix)
    assert not same(INPUTS, other) and same(INPUTS, Inputs(*(getattr(INPUTS, f) for f in INPUTS.__dataclass_fields__)))
    changed = early.replace("plots = plotter.draw(INPUTS)", "plots = plotter.draw(OTHER)")
    changed = changed.replace(
        "with Plotter()", "OTHER = Inputs(rows, 4096, 0.5, conversations, INPUTS.mix)\nwith Plotter()"
    )
    changed = changed.replace('assert "matplotlib" not in sys.modules, "drew here"', "")
    result = _run(changed)
    assert result.returncode == 0, result.stderr[-2000:]
    there = {name: hashlib.sha256(data).hexdigest() for name, data in draw(other).items()}
    assert dict(line.split() for line in result.stdout.splitlines()) == there != here


LAZY = """
import hashlib, sys, time
import numpy as np
from fixed_sft.plots import Inputs, Plotter
rows, conversations = np.array([10, 900, 4000, 2500]), np.array([3, 40, 500, 7000])
INPUTS = Inputs(rows, 4096, 0.45, conversations, [("tulu/$math$", 900), ("(none)", 12)])

def loaded(pid):  # (matplotlib's font library mapped in the process)
    with open(f"/proc/{pid}/maps") as maps:
        return "ft2font" in maps.read()

with Plotter(many=True) as plotter:
    first = plotter._process
    plotter.encodes()  # (a build of many workers that encodes)
    assert first.returncode is not None and plotter._process.lazy, "not replaced"
    pid = plotter._process.pid
    time.sleep(1)
    print("before", loaded(pid))
    if sys.argv[1] == "load":
        plotter.load()
        while not loaded(pid):
            time.sleep(0.05)
        print("loaded", True)
    plots = plotter.draw(INPUTS)
assert "matplotlib" not in sys.modules, "drew here"
for name, data in sorted(plots.items()):
    print(name, hashlib.sha256(data).hexdigest())
"""


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="no /proc")
@pytest.mark.parametrize("load", [True, False])
def test_a_build_of_many_workers_that_encodes_draws_in_a_lazy_process(load):
    """With many workers, a build that encodes replaces the drawing process with one that has
    not imported matplotlib until it is asked (``load``) or sent what to draw; it draws these
    plots either way."""
    result = _run(LAZY, "load" if load else "draw")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = dict(line.split() for line in result.stdout.splitlines())
    assert lines.pop("before") == "False" and lines.pop("loaded", "True") == "True"
    assert lines == {name: hashlib.sha256(data).hexdigest() for name, data in draw(INPUTS).items()}


@pytest.mark.parametrize("many, lazy", [(False, False), (False, True), (True, True)])
def test_a_drawing_process_is_kept_where_it_holds_no_matplotlib_beside_many_workers(many, lazy):
    """A build that encodes keeps its drawing process with few workers, or where it is lazy."""
    code = "from fixed_sft import plots\n"
    code += f"plots.start_early({lazy})\nearly = plots._early\n"
    code += f"with plots.Plotter(many={many}) as plotter:\n    plotter.encodes()\n"
    code += f'    assert plotter._process is early and early.lazy is {lazy} and early.poll() is None, "replaced"\n'
    result = _run(code)
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_plotter_takes_the_process_started_early():
    """``start_early`` starts the drawing process without importing numpy or matplotlib; the
    next Plotter entered takes it and draws these plots with it; the one after starts its own."""
    code = "import sys\nfrom fixed_sft import plots\nplots.start_early()\nearly = plots._early\n"
    code += 'assert early is not None and "numpy" not in sys.modules, "not started early"\n'
    code += DRAW_IN_CHILD.replace(
        'assert plotter._process is not None, "no drawing process"',
        'assert plotter._process is early and plots._early is None, "not taken"',
    )
    code += "with Plotter() as other:\n    assert other._process not in (None, early), 'taken twice'\n"
    result = _run(code)
    assert result.returncode == 0, result.stderr[-2000:]
    here = {name: hashlib.sha256(data).hexdigest() for name, data in draw(INPUTS).items()}
    assert dict(line.split() for line in result.stdout.splitlines()) == here


def test_a_drawing_process_that_is_gone_leaves_the_drawing_here():
    with Plotter() as plotter:
        assert plotter._process is None  # (matplotlib is loaded in the test processes)
        gone = [sys.executable, "-c", "pass"]
        plotter._process = subprocess.Popen(gone, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        plotter._process.wait()
        assert plotter.draw(INPUTS) == draw(INPUTS)


def test_a_drawing_that_never_started_still_ends_its_process():
    """A ``start`` stopped before its thread ran (Ctrl-C) leaves ``_stop`` to end the process."""
    import threading

    plotter = Plotter()
    plotter._process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdin=subprocess.PIPE)
    plotter._drawing = (INPUTS, threading.Thread(target=lambda: None))
    process = plotter._process
    plotter._stop()
    assert process.returncode is not None and plotter._process is None


def test_the_drawing_process_ends_with_the_build():
    """A build killed with SIGKILL closes the drawing process's stdin: it ends."""
    code = "import os, sys, time\nfrom fixed_sft.plots import Plotter\nplotter = Plotter().__enter__()\n"
    code += "print(plotter._process.pid, flush=True)\ntime.sleep(60)\n"
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    build = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": path}
    )
    assert build.stdout is not None
    child = int(build.stdout.readline())
    build.send_signal(signal.SIGKILL)
    build.wait()
    deadline = time.monotonic() + 30
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (and is not a zombie: an orphan is reaped by init)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_stopping_the_drawing_process_stops_the_children_it_forked(tmp_path):
    """A drawing process whose child hangs (a plot that takes for ever) is stopped with its
    children, at once: none outlives the build."""
    started = tmp_path / "started"
    code = (
        "import pathlib, time\nfrom fixed_sft import plots\n"
        "def hang(*args):\n"
        f"    pathlib.Path({str(started)!r}).touch()\n"
        "    time.sleep(600)\n"
        "plots._lengths = hang\nplots._serve()\n"
    )
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    with Plotter() as plotter:
        plotter._process = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": path},
            process_group=0,
        )
        group = plotter._process.pid
        plotter.start(INPUTS)
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), "the child never drew"
        begun = time.monotonic()
        plotter._stop()
        assert time.monotonic() - begun < 10
    deadline = time.monotonic() + 30
    while _group_alive(group) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _group_alive(group)


def _group_alive(group: int) -> bool:
    """Whether a process of group ``group`` runs (a zombie does not count)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = (Path("/proc") / entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == group and fields[0] != "Z":
                return True
    return False


HELD = """
import hashlib, os, sys
import numpy as np
from fixed_sft.plots import Inputs, Plotter
rows, conversations = np.array([10, 900, 4000, 2500]), np.array([3, 40, 500, 7000])
INPUTS = Inputs(rows, 4096, 0.45, conversations, [("tulu/$math$", 900), ("(none)", 12)])
with Plotter() as plotter:
    assert plotter._process is not None, "no drawing process"
    held = os.dup(plotter._process.stdin.fileno())  # (as a forked worker holds it)
    plotter.start(INPUTS)
    plotter._drawing[1].join(60)
    assert not plotter._drawing[1].is_alive(), "the drawing waited for its stdin's end"
    assert plotter._drawn is not None, "not drawn by the drawing process"
    for name, data in sorted(plotter._drawn.items()):
        print(name, hashlib.sha256(data).hexdigest())
    os.close(held)
"""


def test_the_drawing_process_draws_while_a_worker_holds_its_stdin():
    """Workers forked from the build (``engine.forked``) hold copies of the drawing
    process's stdin, so its end never comes while they run: the process reads no further
    than the inputs, and draws while they write the rows."""
    result = _run(HELD)
    assert result.returncode == 0, result.stderr[-2000:]
    here = {name: hashlib.sha256(data).hexdigest() for name, data in draw(INPUTS).items()}
    assert dict(line.split() for line in result.stdout.splitlines()) == here

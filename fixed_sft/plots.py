"""The dataset card's plots: PNG bytes from a build's figures, drawn by matplotlib's Agg backend.

The plots carry no metadata that varies (no ``Software`` stamp), so the same figures give
the same bytes in any process. Importing matplotlib takes about 0.3 s, a fifth of a later
build from the token store, so a build draws in a process of its own (``Plotter``). The
program starts it before its own imports (``start_early``, which imports no numpy), and it
imports matplotlib at once: on 2 cores the two import side by side, before the build's
writer thread needs the second core. With many workers a build that encodes replaces it
with a ``lazy`` one (``Plotter.encodes``), which imports once the build sends what to draw:
its 45-50 MiB are not held beside the workers' while they encode, and there are cores to
spare for the import. There each plot but the first is drawn in a child forked for it, all
at once. A process that has matplotlib loaded already draws itself.
"""

from __future__ import annotations

import gc
import io
import os
import pickle
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

PLOT_NAMES = ("supervised_ratio.png", "conversation_tokens.png", "source_mix.png")
SUPERVISED_PLOT, LENGTHS_PLOT, MIX_PLOT = PLOT_NAMES
DPI = 100
DRAW_TIMEOUT_S = 120  # a drawing process silent this long is killed, and the plots drawn here
# What a build sends its drawing process: ``LOAD`` (one started ``lazy``: import matplotlib now,
# ``Plotter.load``), then ``DRAW``, the pickled inputs' length (8 bytes, little-endian) and
# the inputs. The process reads no further than the inputs' end, not to its stdin's end: workers
# forked from the build hold the pipe open too.
LOAD, DRAW = b"L", b"D"


@dataclass(frozen=True)
class Inputs:
    """What the plots show: each kept row's supervised tokens (rows of ``row_tokens``) and
    the ratio over all rows; each kept conversation's tokens; the source mix as ``(label,
    tokens)`` bars, largest first, or ``None`` (no mix plot)."""

    row_supervised: np.ndarray
    row_tokens: int
    ratio: float
    conversation_tokens: np.ndarray
    mix: Sequence[tuple[str, int]] | None


def plot_names(inputs: Inputs) -> list[str]:
    """The plots ``draw`` draws of ``inputs``: all but the mix where it has none."""
    return [name for name in PLOT_NAMES if name != MIX_PLOT or inputs.mix]


def draw(inputs: Inputs, apart: bool = False) -> dict[str, bytes]:
    """The plots' PNG bytes, by file name. ``apart`` (the drawing process, which runs no
    thread): each plot but the first is drawn at the same time in a child forked for it (a
    build waits for its plots once its rows are written: on 2 cores 0.20 s -> 0.07 s,
    with the drawing process's exit)."""
    import matplotlib.style
    from matplotlib.figure import Figure  # (only here: a build without a card never loads it)

    drawers = {
        SUPERVISED_PLOT: partial(_supervised, Figure, inputs),
        LENGTHS_PLOT: partial(_lengths, Figure, inputs),
        MIX_PLOT: partial(_mix, Figure, inputs.mix or []),  # (drawn where there is a mix)
    }
    names = plot_names(inputs)
    children = {}
    with matplotlib.style.context("default"):  # (matplotlib's defaults, not a matplotlibrc's: the same bytes anywhere)
        for name in names[1:] if apart and hasattr(os, "fork") else []:
            with suppress(OSError):  # (no pipe or process to spare: drawn here)
                children[name] = _forked(drawers[name])
        plots = {name: drawers[name]() for name in names if name not in children}
        for name, child in children.items():
            plots[name] = _taken(*child) or drawers[name]()  # (drawn here where its child failed)
    return {name: plots[name] for name in names}


def _forked(drawer: Callable[[], bytes]) -> tuple[int, int]:
    """A child forked to write ``drawer()`` to a pipe and exit: its pid and the pipe's read end."""
    read, write = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read)
        os.close(write)
        raise
    if pid == 0:
        status = 1
        try:
            os.close(read)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # (the build's pipe is its parent's alone)
            with os.fdopen(write, "wb") as pipe:
                pipe.write(drawer())
            status = 0
        finally:
            os._exit(status)  # (never this process's exit handlers, nor its buffered output)
    os.close(write)
    return pid, read


def _taken(pid: int, read: int) -> bytes | None:
    """What the child ``pid`` wrote to ``read``, where it exited cleanly."""
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    return data if status == 0 and data else None


_early: _Drawing | None = None  # the drawing process ``start_early`` started, until a Plotter takes it


def start_early(lazy: bool = False) -> None:
    """Start the drawing process now, for the next ``Plotter`` entered in this process;
    ``lazy``: it imports matplotlib only when asked (``Plotter.load``, or what to draw), for a
    build known to encode with many workers."""
    global _early
    if _early is None:
        _early = _spawn(lazy)


def discard_early() -> None:
    """End the drawing process ``start_early`` started, where no Plotter took it (the
    command stopped before its build began)."""
    global _early
    process, _early = _early, None
    if process is not None:
        process.kill()
        process.communicate()  # (its pipes closed, and it reaped)


class _Drawing(subprocess.Popen):
    """A drawing process (``_serve``); ``lazy``: it imports matplotlib only when asked."""

    lazy = False


def _spawn(lazy: bool = False) -> _Drawing | None:
    """A drawing process (``Plotter``); ``None`` where this process cannot start one."""
    if not sys.executable or getattr(sys, "frozen", False):
        return None
    # -P and this process's sys.path: the child imports the modules this process would
    serve = f"import sys; sys.path[:] = {sys.path!r}; from fixed_sft.plots import _serve; _serve({lazy})"
    try:
        process = _Drawing(
            [sys.executable, "-P", "-c", serve],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            process_group=0,
        )
    except OSError:
        return None
    process.lazy = lazy
    return process


class Plotter:
    """Draws a build's plots (``draw``), in the process ``start_early`` started, else in one
    started on entering unless this one has matplotlib loaded. That process reads one
    pickled ``Inputs`` on stdin (``DRAW``) and writes the pickled plots to stdout; it ends once it has,
    once its stdin closes (when this process dies), or when it is killed (on leaving, and
    after ``DRAW_TIMEOUT_S``). It runs in a process group of its own, so that a Ctrl-C meant
    for the build does not interrupt its import. Where it cannot start or fails, this
    process draws."""

    def __init__(self, many: bool = False) -> None:
        self.many = many  # (many workers: ``encodes``)
        self._process: subprocess.Popen | None = None
        self._drawing: tuple[Inputs, threading.Thread] | None = None  # (``start``)
        self._drawn: dict[str, bytes] | None = None

    def __enter__(self) -> Plotter:
        global _early
        self._process, _early = _early, None
        if self._process is None and "matplotlib.figure" not in sys.modules:
            self._process = _spawn()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def _stop(self) -> None:
        """End the drawing process, if it runs (and the thread that waits for it)."""
        process, self._process = self._process, None
        if process is not None:
            _kill(process)
        thread = self._drawing[1] if self._drawing is not None else None
        if thread is not None and thread.ident is not None:  # (started: its wait ends with the process)
            thread.join()
            if process is not None:
                process.wait()
        elif process is not None:
            process.communicate()

    def load(self) -> None:
        """Have the drawing process import matplotlib now, if it has not (a build that
        encodes nothing is soon at its plots)."""
        if self._process is not None and self._process.stdin is not None and self._drawing is None:
            with suppress(OSError, ValueError):  # (gone: this process draws)
                self._process.stdin.write(LOAD)
                self._process.stdin.flush()

    def encodes(self) -> None:
        """The build encodes: with many workers, a drawing process that imports matplotlib
        at once is replaced by a ``lazy`` one, so that its 45-50 MiB are not held beside
        the workers' while they encode."""
        process = self._process
        if self.many and isinstance(process, _Drawing) and not process.lazy and self._drawing is None:
            _kill(process)
            process.communicate()
            self._process = _spawn(lazy=True)

    def start(self, inputs: Inputs) -> None:
        """Have the process draw ``inputs`` now, while this one goes on (a build knows what
        its plots show once its rows are cut, before it has written them all); ``draw`` of
        the same inputs then takes those plots."""
        if self._process is None or self._drawing is not None:
            return
        thread = threading.Thread(target=self._wait, args=(self._process, inputs), daemon=True)
        self._drawing = (inputs, thread)
        thread.start()

    def _wait(self, process: subprocess.Popen, inputs: Inputs) -> None:
        """Send ``inputs`` to the drawing process and keep its plots (none where it fails)."""
        try:
            data = pickle.dumps(inputs)
            output, _ = process.communicate(DRAW + len(data).to_bytes(8, "little") + data, timeout=DRAW_TIMEOUT_S)
            plots = pickle.loads(output) if process.returncode == 0 and output else None
            self._drawn = plots if isinstance(plots, dict) else None
        except (OSError, ValueError, subprocess.TimeoutExpired, pickle.UnpicklingError, EOFError):
            self._drawn = None

    def draw(self, inputs: Inputs) -> dict[str, bytes]:
        """The plots of ``inputs`` (``draw``): those the process drew, else drawn here."""
        try:
            self.start(inputs)  # (unless started, or no process)
            if self._drawing is not None:
                started, thread = self._drawing
                thread.join()
                if self._drawn is not None and same(started, inputs):
                    return self._drawn
        finally:
            self._stop()
        return draw(inputs)


def _kill(process: subprocess.Popen) -> None:
    """Kill the drawing process and the children it forked to draw: the process group it
    leads (``_spawn``), else the process alone. One that exited cleanly has waited for its
    children: its pid may be another's by now."""
    if process.returncode == 0:
        return
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except OSError:  # (no such group: every process of it gone, or one not started by ``_spawn``)
        if process.poll() is None:
            process.kill()


def same(a: Inputs, b: Inputs) -> bool:
    """Whether two plots' inputs are equal (so draw the same plots)."""
    import numpy as np

    mix_a, mix_b = (None if m is None else [tuple(bar) for bar in m] for m in (a.mix, b.mix))
    return (
        (a.row_tokens, a.ratio, mix_a) == (b.row_tokens, b.ratio, mix_b)
        and np.array_equal(a.row_supervised, b.row_supervised)
        and np.array_equal(a.conversation_tokens, b.conversation_tokens)
    )


def _serve(lazy: bool = False) -> None:
    """The drawing process: load matplotlib (``lazy``: once stdin gives ``LOAD`` or
    ``DRAW``), draw the ``Inputs`` that ``DRAW`` gives, write the plots to stdout and exit;
    exit without drawing where stdin ends first (the build is gone, or needs none). It
    collects no garbage: it ends soon (~0.05 CPU-s less)."""
    gc.disable()
    stdin = sys.stdin.buffer
    if not lazy:
        _load()
    tag = stdin.read(1)
    if tag == LOAD:
        _load()
        tag = stdin.read(1)
    if tag != DRAW:
        return
    _load()  # (where not yet: a lazy process given no LOAD)
    header = _read(stdin, 8)
    size = int.from_bytes(header, "little")
    data = _read(stdin, size)
    if len(header) == 8 and len(data) == size:
        sys.stdout.buffer.write(pickle.dumps(draw(pickle.loads(data), apart=True)))
        sys.stdout.buffer.flush()
        os._exit(0)  # (the build waits for this process to end: not for its teardown, ~0.04 s)


def _read(stream: Any, size: int) -> bytes:
    """``size`` bytes of ``stream``, or fewer where it ends first."""
    parts, left = [], size
    while left and (part := stream.read(left)):
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def _load() -> None:
    import matplotlib.backends.backend_agg  # noqa: F401  (what savefig draws with)
    import matplotlib.figure  # noqa: F401


def _png(figure: Any) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()


def _histogram(axes: Any, values: np.ndarray, bins: np.ndarray) -> None:
    """``axes.hist(values, bins)`` drawn as one filled outline: the same pixels, without a
    patch per bin to lay out."""
    import numpy as np

    counts, _ = np.histogram(values, bins)
    axes.stairs(counts, bins, fill=True, color="#3b75af")


def _supervised(Figure: type, inputs: Inputs) -> bytes:
    import numpy as np

    ratios = np.asarray(inputs.row_supervised, dtype=np.float64) / inputs.row_tokens
    figure = Figure(figsize=(6.4, 3.6))
    axes = figure.add_subplot()
    _histogram(axes, ratios, np.linspace(0.0, 1.0, 51))
    axes.axvline(inputs.ratio, color="#c0392b", linestyle="--", label="all rows")
    axes.set(title="Supervised ratio per row", xlabel="supervised tokens / row tokens", ylabel="rows", xlim=(0, 1))
    axes.legend()
    figure.subplots_adjust(left=0.12, right=0.97, bottom=0.15, top=0.9)  # (tight_layout costs a draw)
    return _png(figure)


def _lengths(Figure: type, inputs: Inputs) -> bytes:
    """A histogram of the conversations' tokens, in bins even in log10 (drawn on a linear axis
    with a label per power of ten: a log axis's many tick labels take most of the drawing)."""
    import numpy as np

    logs = np.log10(np.maximum(np.asarray(inputs.conversation_tokens, dtype=np.float64), 1.0))
    low, high = (float(logs.min()), float(logs.max())) if len(logs) else (0.0, 1.0)
    high = max(high, low + 1.0)
    figure = Figure(figsize=(6.4, 3.6))
    axes = figure.add_subplot()
    _histogram(axes, logs, np.linspace(low, high, 50))
    powers = range(int(np.floor(low)), int(np.ceil(high)) + 1)
    axes.set_xticks(list(powers), [f"{10**p:,}" for p in powers])
    axes.set(title="Conversation length distribution", xlabel="tokens per conversation", ylabel="conversations")
    figure.subplots_adjust(left=0.12, right=0.97, bottom=0.15, top=0.9)
    return _png(figure)


def _mix(Figure: type, bars: Sequence[tuple[str, int]]) -> bytes:
    height = 0.9 + 0.3 * len(bars)
    figure = Figure(figsize=(6.4, height))
    axes = figure.add_subplot()
    names, tokens = zip(*reversed(bars))
    axes.barh(range(len(bars)), tokens, color="#3b75af")
    axes.set_yticks(range(len(bars)), [_label(name) for name in names], fontsize=8)
    axes.set(title="Source mix", xlabel="tokens in the rows")
    figure.subplots_adjust(left=0.4, right=0.97, bottom=0.55 / height, top=1 - 0.35 / height)
    return _png(figure)


def _label(text: str) -> str:
    """A source name as a plot label: one line, at most 40 characters; ``$`` is not mathtext."""
    text = " ".join(text.split())
    return (text if len(text) <= 40 else text[:39] + "…").replace("$", r"\$")

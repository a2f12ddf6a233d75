"""Where a pure function runs over a stream of tasks: in this process, or in worker processes; results in order.

An engine maps ``fn(state, *task)`` over tasks and yields the results in the tasks' order.
``state`` is what ``setup()`` returns: made once per process that runs tasks (a loaded
encoder, say), so a task carries only its own data. Both engines here are context
managers whose start-up (``setup``, or starting the workers) runs in a helper thread from
entering on, so that it overlaps the caller's first reads; ``map`` raises its errors.

* ``InProcess``: each task runs in this process when the caller asks for its result.
* ``ProcessPool``: the standard library's ``ProcessPoolExecutor``, ``setup`` its
  initializer; a task is sent while fewer than ``2 * workers`` are in flight and the
  caller's ``room`` says another fits. Its workers fork from multiprocessing's fork
  server (``forkserver_context``), or from the caller's process (``forked``).

Leaving either on Ctrl-C or SIGTERM waits for neither start-up (which may never end) nor
the tasks in flight: the program exits without them (``fixed_sft.cli.run``), and workers
end with it (each watches its parent). A distributed engine would give the same
``map`` over another executor.
"""

from __future__ import annotations

import fcntl
import gc
import os
import shutil
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import forkserver, get_context, parent_process, resource_tracker, util
from multiprocessing.connection import wait
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any, Protocol, TypeVar

from .exits import forget_folders, remove_on_exit

R = TypeVar("R")
MAX_WORKERS = 1024  # the most worker processes a build may ask for
START_HOLD_S = 0.05  # how long each worker started on entering is held by its start-up task
# A build of this many workers or more: what each process holds adds up, so its workers give
# their free memory back often (``memory.give_back_often``), and while it encodes its drawing
# process holds no matplotlib (``plots.Plotter.encodes``)
MANY_WORKERS = 8
Task = tuple[Any, ...]


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one), at most ``MAX_WORKERS``."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(cores, MAX_WORKERS)


def always(in_flight: Sequence[Any], weight: Any) -> bool:
    """The ``room`` of a caller that bounds nothing beyond the engine's own limit."""
    return True


def unweighed(task: Task) -> None:
    """The ``weigh`` of a caller whose ``room`` needs nothing of a task."""
    return None


class Engine(Protocol):
    """Maps a function over tasks, in order (module docstring)."""

    def __enter__(self) -> Engine: ...

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None: ...

    def map(
        self,
        fn: Callable[..., R],
        tasks: Iterable[Task],
        room: Callable[[Sequence[Any], Any], bool] = always,
        weigh: Callable[[Task], Any] = unweighed,
    ) -> Iterator[R]:
        """``fn(state, *task)`` for each task, in order; ``room(in_flight, weight)``: whether a
        task of ``weigh(task)`` may start while tasks of the weights ``in_flight`` have not
        been yielded (only a task's weight is kept while it runs, not the task)."""
        ...


def _start(setup: Callable[[], Any]) -> Future:
    """``setup()`` in a helper thread that ends when it returns."""
    starter = ThreadPoolExecutor(1, thread_name_prefix="start-engine")
    started = starter.submit(setup)
    starter.shutdown(wait=False)
    return started


class InProcess:
    """Runs each task in this process, when its result is asked for (so a caller that stops
    asking runs no more); ``room`` is not needed."""

    def __init__(self, setup: Callable[[], Any]):
        self.setup = setup
        self._started: Future | None = None

    def __enter__(self) -> InProcess:
        self._started = _start(self.setup)
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if kind is None or issubclass(kind, Exception):
            self._state().exception()  # wait until start-up is over

    def _state(self) -> Future:
        assert self._started is not None, "map runs inside the engine's with-block"
        return self._started

    def map(
        self,
        fn: Callable[..., R],
        tasks: Iterable[Task],
        room: Callable[[Sequence[Any], Any], bool] = always,
        weigh: Callable[[Task], Any] = unweighed,
    ) -> Iterator[R]:
        for task in tasks:
            yield fn(self._state().result(), *task)


class ProcessPool:
    """Runs tasks in up to ``workers`` processes made by ``context``; each runs ``setup``
    once as it starts (a failure is raised by its first task, so that the caller gets the
    error itself rather than a broken pool). A worker starts per core on entering, up to
    ``workers``; more start only when tasks wait for them (all at once where they fork
    from the caller's process: ``forked``)."""

    def __init__(self, workers: int, setup: Callable[[], Any], context: BaseContext):
        self.workers = workers
        self._pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker, initargs=(setup,))
        self._forks = context.get_start_method() == "fork"  # (every worker starts with the first task)
        self._started: Future | None = None

    def __enter__(self) -> ProcessPool:
        self._started = _start(self._start_workers)
        return self

    def _start_workers(self) -> None:
        """The pool starts one worker per task submitted while none is idle: submit one per
        core that holds its worker for ``START_HOLD_S`` (a worker that had already done its
        task would be idle, and take the next one instead of a new worker starting). A pool
        that forks from this process (``forked``) starts every worker at the first task,
        which then holds none (on 16 cores, a hold kept the first tasks 50-90 ms). With
        Ctrl-C and SIGTERM blocked in this thread: a worker forked here (``forked``) has
        them blocked until ``_init_worker`` has set its own handlers, so that neither
        reaches the handlers of the caller's it starts with."""
        signal.pthread_sigmask(signal.SIG_BLOCK, WORKER_SIGNALS)  # (this helper thread's alone)
        if self._forks:
            self._submit(time.sleep, 0)
            return
        for _ in range(min(self.workers, os.cpu_count() or 1)):
            self._submit(time.sleep, START_HOLD_S)

    def started(self) -> None:
        """Return once start-up is over (a failure is raised by the first task)."""
        self._start_up().exception()

    def _start_up(self) -> Future:
        assert self._started is not None, "map runs inside the engine's with-block"
        return self._started

    def _submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """The pool's ``submit``, which may start a worker: a fork server that ended before it
        forked one (killed, or out of memory) makes a broken pool, as a worker that ended does."""
        try:
            return self._pool.submit(fn, *args)
        except (EOFError, ConnectionError) as error:  # (multiprocessing's read of the new worker's pid)
            raise BrokenProcessPool(f"the workers' fork server ended ({error})") from None

    def submit(self, fn: Callable[..., R], *task: Any) -> Future:
        """``fn(state, *task)`` in a worker, apart from ``map``'s order: its result is the future's."""
        self._start_up().result()
        return self._submit(_run, fn, *task)

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if kind is not None and not issubclass(kind, Exception):  # Ctrl-C, SIGTERM
            if self._start_up().done():  # (a worker starting holds the pool's lock)
                self._pool.shutdown(wait=False, cancel_futures=True)
            return
        self._start_up().exception()  # wait until start-up is over
        self._pool.shutdown(cancel_futures=True)

    def map(
        self,
        fn: Callable[..., R],
        tasks: Iterable[Task],
        room: Callable[[Sequence[Any], Any], bool] = always,
        weigh: Callable[[Task], Any] = unweighed,
    ) -> Iterator[R]:
        pending: deque[tuple[Future, Any]] = deque()  # each task's future and weight

        def oldest() -> R:
            future, _ = pending.popleft()
            return future.result()

        try:
            for task in tasks:
                weight = weigh(task)
                while pending and (len(pending) >= 2 * self.workers or not room([w for _, w in pending], weight)):
                    yield oldest()
                self._start_up().result()
                pending.append((self._submit(_run, fn, *task), weight))
                del task  # (the executor holds it until it is sent)
            while pending:
                yield oldest()
        finally:
            for future, _ in pending:
                future.cancel()


def forked(workers: int, setup: Callable[[], Any]) -> ProcessPool:
    """A ``ProcessPool`` whose workers fork from this process as the pool starts: they hold
    what it holds at that moment (a later build's token store and order, say), so they
    need nothing loaded, and start without a fork server's wait. Each forgets this
    process's signal handlers and the folders it removes on exit."""
    return ProcessPool(workers, setup, get_context("fork"))


_state: Any = None  # in a worker: what its setup returned, or the exception it raised
WORKER_SIGNALS = {signal.SIGINT, signal.SIGTERM}  # a worker ignores the first and dies of the second


def _init_worker(setup: Callable[[], Any]) -> None:
    global _state
    gc.freeze()  # (what it inherits: a full collection would make every page of it the worker's own copy)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to handle: it stops the workers
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # (a worker forked from the caller has the caller's handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, WORKER_SIGNALS)  # (blocked as it was forked: ``_start_workers``)
    forget_folders()
    parent = parent_process()
    assert parent is not None  # a worker of the pool, which the caller's process started
    threading.Thread(target=_exit_when_gone, args=(parent.sentinel,), daemon=True).start()
    try:
        _state = setup()
    except Exception as error:
        _state = error


def _run(fn: Callable[..., R], *task: Any) -> R:
    if isinstance(_state, Exception):
        raise _state
    return fn(_state, *task)


def _exit_when_gone(parent_sentinel: int) -> None:
    """End this worker once the caller's process is gone (killed), rather than wait for
    work forever."""
    wait([parent_sentinel])
    os._exit(1)


# ---------------------------------------------------------------------------
# The fork server workers start from
# ---------------------------------------------------------------------------

_starting = threading.Lock()
# The server's and its workers' Arrow pool below pyarrow's: the C library's, as the one
# ``pa.set_memory_pool`` sets (``encode._worker_setup``), which Arrow's own code does not
# use (its Parquet reader and writer, say). A worker then holds less of what it freed: an
# 8-worker build of 80,000 conversations on 2 cores peaked at 74-79 MB of each worker's
# own memory, against 87-89, in as much time. Unless the caller names a pool.
ARROW_POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"


def forkserver_context(modules: list[str], environment: dict[str, str]) -> BaseContext:
    """The context that forks workers from multiprocessing's fork server, which is started
    now, having imported ``modules`` with ``environment`` added to this process's (what
    those modules read as they are imported), unless it runs already (one per process,
    kept for later callers). The server starts with Ctrl-C blocked, which it and the
    workers inherit (as multiprocessing's resource tracker starts): the caller handles
    Ctrl-C itself (it stops the workers), and a server interrupted while still importing
    would print a traceback. A Ctrl-C meanwhile reaches the caller once the server has
    started."""
    context = get_context("forkserver")
    context.set_forkserver_preload(modules)
    if ARROW_POOL_VARIABLE not in os.environ:
        environment = {ARROW_POOL_VARIABLE: "system", **environment}
    with _starting:  # one environment at a time
        _start_resource_tracker()  # (first: its start unblocks Ctrl-C)
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            os.environ.update(environment)  # the server's environment is this one, as it starts
            _own_temp_folder()
            forkserver.ensure_running()
        finally:
            for name in environment:
                os.environ.pop(name, None)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return context


TRACKER_WARNINGS = "ignore::UserWarning:multiprocessing.resource_tracker"


def _start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (the fork server's start would), which
    unlinks the semaphores a process leaves when it is gone, without its warning that it
    does (``TRACKER_WARNINGS``): a build that exits at once leaves it the pool's."""
    warnings = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [warnings, TRACKER_WARNINGS]))
    try:
        resource_tracker.ensure_running()
    finally:
        if warnings is None:
            del os.environ["PYTHONWARNINGS"]
        else:
            os.environ["PYTHONWARNINGS"] = warnings


OWNER_NAME = "fixed-sft.owner"  # in multiprocessing's temporary folder: locked while the build that made it runs
_owner: int | None = None  # that file, open (and locked) in this process


def _own_temp_folder() -> None:
    """Mark multiprocessing's temporary folder (``pymp-*`` in TMPDIR, which holds the fork
    server's socket, and which multiprocessing removes at exit) as this process's by a
    file in it that this process keeps locked; remove the folders so marked that no
    process holds locked any more: those of builds killed with SIGKILL, which could not
    remove them. Folders not so marked (other programs') are left alone."""
    global _owner
    if _owner is not None:
        return
    folder = Path(util.get_temp_dir())
    draft = folder / f".{OWNER_NAME}"
    owner = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    fcntl.flock(owner, fcntl.LOCK_EX)
    draft.rename(folder / OWNER_NAME)  # (locked before another build can find it)
    _owner = owner
    remove_on_exit(folder)
    for other in folder.parent.glob("pymp-*"):
        if other != folder and _abandoned(other):
            shutil.rmtree(other, ignore_errors=True)


def _abandoned(folder: Path) -> bool:
    """Whether ``folder`` holds an owner file that no process holds locked."""
    try:
        owner = os.open(folder / OWNER_NAME, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:  # not marked, or not this user's
        return False
    try:
        fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # locked: its build runs
        return False
    finally:
        os.close(owner)
    return True

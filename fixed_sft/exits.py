"""Exiting at once, as a second Ctrl-C does: ``exit_now`` ends the process with
``os._exit``, without the interpreter's shutdown (which joins threads and
multiprocessing's processes, and so waits on an encoder start-up or a worker that may
never end), once the folders registered with ``remove_on_exit`` (a build's temporary
folder, multiprocessing's) are removed. Worker processes and the fork server end on
their own once this process is gone (they watch it).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

_folders: list[Path] = []


def remove_on_exit(folder: Path) -> None:
    """Have ``exit_now`` remove ``folder``, for the rest of this process."""
    _folders.append(folder)


def forget_folders() -> None:
    """Remove none of the registered folders on exit: in a process forked from the one that
    registered them (its worker), which must not remove its parent's folders."""
    _folders.clear()


@contextmanager
def removed_on_exit(folder: Path) -> Iterator[None]:
    """Have ``exit_now`` remove ``folder`` while the block runs."""
    _folders.append(folder)
    try:
        yield
    finally:
        _folders.remove(folder)


def exit_now(code: int, message: str | None = None) -> NoReturn:
    """End this process with ``code`` once the registered folders are removed, the output
    flushed and ``message`` (if any) written to stderr. It may run in a signal handler,
    which interrupts the main thread anywhere (a write to stderr included)."""
    for folder in reversed(list(_folders)):
        shutil.rmtree(folder, ignore_errors=True)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, RuntimeError, ValueError):  # a closed pipe or file; a write this handler interrupted
            pass
    if message:
        try:
            os.write(2, f"{message}\n".encode())
        except OSError:
            pass
    os._exit(code)

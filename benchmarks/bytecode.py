"""Timed builds run as an installed program runs: with Python's bytecode compiled once, and kept.

Python keeps the bytecode of what it imports, so that a program's later runs do not compile
it again. An environment may forbid that (``PYTHONDONTWRITEBYTECODE``) and hold packages
installed without their bytecode: each process of each build then compiles what it imports.
On the 16-core machine lent here numpy alone then took 0.19-0.28 s to import, and the
build's imports 0.4 s more than with bytecode. ``keep()`` has this process and those it
starts keep bytecode in a folder of their own (``PYTHONPYCACHEPREFIX``), and fills it
before anything is timed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

FOLDER = Path(tempfile.gettempdir()) / f"fixed-sft-bench-pycache-{os.getuid()}"  # (this user's own)
# What a build imports: the package, its workers' and checkers' tokenizers and template
# renderer, its drawing process's matplotlib (each where installed).
MODULES = (
    "multiprocessing.popen_forkserver",
    "multiprocessing.popen_fork",
    "multiprocessing.synchronize",
    "matplotlib.figure",
    "matplotlib.backends.backend_agg",
    "PIL.PngImagePlugin",
    "tiktoken",
    "gigatoken",
    "transformers.utils.chat_template_utils",
    "huggingface_hub",
)
WARM = f"""
import importlib, pkgutil
import fixed_sft
for module in pkgutil.iter_modules(fixed_sft.__path__, "fixed_sft."):
    importlib.import_module(module.name)
for name in {MODULES!r}:
    try:
        importlib.import_module(name)
    except ImportError:
        pass
"""


def keep(folder: Path = FOLDER) -> None:
    """Keep bytecode in ``folder`` from now on, here and in every process started from here;
    first import there what a build imports, so that every timed build finds it compiled.
    The folder is made for this user alone; one that another user owns is refused."""
    folder.mkdir(mode=0o700, exist_ok=True)
    if folder.stat().st_uid != os.getuid() or folder.stat().st_mode & 0o022:
        sys.exit(f"{folder}: not this user's own folder; remove it, or keep bytecode elsewhere")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(folder)
    sys.dont_write_bytecode = False
    sys.pycache_prefix = str(folder)
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", WARM], check=True, cwd=root)

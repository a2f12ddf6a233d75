"""The workers' fork server, started before the build knows its encoder (light: imports no encoder).

A build of many workers starts its fork server as its command line is read (``start``):
the server imports the encoder's module while the build imports its own (0.4-0.7 s each on
the 16-core machine), then loads the Kimi tokenizer of the folder the command line names,
if it names one (``HINT_VARIABLE``: a guess, kept by ``tokenizer.load_kimi`` for those
files, so that the encoder the build names later loads at once), and waits. Once the
build has resolved its encoder, ``give`` writes it (and whether the workers want the
template renderer) into the server's file; the server imports the renderer where asked,
loads the encoder, and forks the workers from then on. A server given nothing ends with
the build (it watches the build's process meanwhile).
"""

from __future__ import annotations

import json
import os
import time
from multiprocessing import util
from pathlib import Path

from .engine import forkserver_context

BUILDER_VARIABLE = "FIXED_SFT_PRELOAD_BUILDER"  # the pid of the build's process, which starts the fork server
AWAIT_VARIABLE = "FIXED_SFT_PRELOAD_AWAIT"  # the file a fork server started early waits for (``give``)
HINT_VARIABLE = "FIXED_SFT_PRELOAD_HINT"  # the tokenizer folder, BPE, --cache-dir and --no-cache given, as JSON
ENCODER_MODULE = "fixed_sft.encode"  # what such a server imports first
WAIT_S = 0.005  # how often the server looks for its file

_awaited: Path | None = None  # in the build's process: the file its early server waits for, until given


def start(
    tokenizer: str | None = None, bpe: str | None = None, cache_dir: str | None = None, no_cache: bool = False
) -> None:
    """Start the workers' fork server now, importing ``ENCODER_MODULE``, which then loads
    the Kimi tokenizer of the folder ``tokenizer`` with ``bpe`` (where it holds
    ``tiktoken.model``; its parity checked as the store of ``cache_dir`` keeps it, unless
    ``no_cache``) and waits for ``give`` (where a fork server runs already in this
    process, ``give`` is not read)."""
    global _awaited
    if _awaited is not None:
        return
    path = Path(util.get_temp_dir()) / "encoder.json"  # (multiprocessing's folder, removed at exit)
    path.unlink(missing_ok=True)  # (an earlier server's, in this process)
    _awaited = path  # (first: a signal as the server starts must not leave it waiting for nothing)
    environment = {AWAIT_VARIABLE: str(path), BUILDER_VARIABLE: str(os.getpid())}
    if tokenizer is not None and (Path(tokenizer) / "tiktoken.model").is_file():
        environment[HINT_VARIABLE] = json.dumps([tokenizer, bpe, cache_dir, no_cache])
    forkserver_context([ENCODER_MODULE], environment)


def give(encoder: str, renderer: bool) -> None:
    """Name the encoder (``EncoderConfig.to_json``) to the fork server ``start``
    started, if it waits, and whether it imports the template renderer (once)."""
    global _awaited
    if _awaited is None:
        return
    draft = _awaited.with_suffix(".draft")
    draft.write_text(json.dumps({"encoder": encoder, "renderer": renderer}))
    draft.replace(_awaited)  # (the server reads it whole, or not yet)
    _awaited = None


def awaited(path: Path) -> tuple[str, bool]:
    """In the fork server: the encoder and whether to import the renderer, once given."""
    while not path.exists():
        time.sleep(WAIT_S)
    given = json.loads(path.read_text())
    return given["encoder"], given["renderer"]

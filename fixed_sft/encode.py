"""A chunk of the packing order -> token ids and loss masks (the parallel stage).

``encode_rows`` (one worker: in the builder's process) and ``encode_chunk`` (its
results packed for transfer from a worker process) are pure functions of the chunk
(source rows, in packing order) and the tokenizer: workers may run chunks in any order
or place, and the builder consumes the results in packing order.
The conversations of 1 in ``check_every`` source rows (``sampled``) are also encoded
through the rendered chat template; a difference stops the build when the build reaches
that conversation, not before (so a chunk's later rows cannot fail a build that ends earlier).

``Encoders`` runs them on an engine (``fixed_sft.engine``): in this process, or in
worker processes that fork from a server that has imported this module and loaded the
build's encoder once (named to it by ``PRELOAD_VARIABLE`` when it starts); a worker
whose build needs another encoder (another tokenizer, or the same folder's files since
changed) loads its own. The server, as it loads, and the workers end once the build's
process is gone.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from multiprocessing.context import BaseContext
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple, TypeVar

import numpy as np
import pyarrow as pa

from . import arrow, early
from .chat import ChatEncoder
from .conversation import Conversation, InvalidRow, conversation, is_unicode
from .encoding import RENDERER_MODULE, BatchEncoder, Encoder, TemplateMismatch
from .engine import MANY_WORKERS, InProcess, ProcessPool, Task, forkserver_context
from .errors import UsageError
from .hashes import sha256_file
from .hf_chat import HFChatEncoder, load_tokenizer
from .hf_chat import separator as hf_separator
from .memory import give_back_often, map_large_allocations
from .records import records
from .tokenizer import KimiTokenizer, TokenizerError, default_bpe, eos_id, eos_token, load_kimi
from .tool_declarations import ModelCheck, model_declarer

T = TypeVar("T")
R = TypeVar("R")


class Encoded(NamedTuple):
    """One conversation: its ids and mask, or the reason it is invalid; ``source_value``:
    its source row's ``source`` (as Tulu 3's rows name their subset), where a string."""

    source_index: int
    id: str | None
    ids: np.ndarray | None
    mask: np.ndarray | None
    invalid: str | None = None
    checked: bool = False
    source_value: str | None = None


MAX_SOURCE_CHARS = 256  # a longer ``source`` value names no subset, and is not read


def source_value(record: object) -> str | None:
    """A source record's ``source`` value, where it is a string of valid Unicode of at most
    ``MAX_SOURCE_CHARS`` characters (else ``None``: not read)."""
    value = record.get("source") if isinstance(record, dict) else None
    if isinstance(value, str) and len(value) <= MAX_SOURCE_CHARS and is_unicode(value):
        return value
    return None


@dataclass
class EncodedChunk:
    """A chunk's results packed for transfer between processes: per conversation its
    source index, row id, length (-1 when invalid, reason in ``invalid``) and check
    flag; the valid conversations' token ids and masks back to back. ``mismatch``, when
    set, is the ``TemplateMismatch`` of the conversation after the last one listed: it is
    raised where that conversation would be yielded."""

    indices: list[int]
    row_ids: list[str | None]
    source_values: list[str | None]
    lengths: np.ndarray
    checked: np.ndarray
    tokens: np.ndarray
    mask: np.ndarray
    invalid: dict[int, str]
    mismatch: TemplateMismatch | None = None
    chunk_bytes: int = 0  # the Arrow bytes of the chunk it came from

    def __iter__(self) -> Iterator[Encoded]:
        offset = 0
        for index, row_id, value, length, checked in zip(
            self.indices, self.row_ids, self.source_values, self.lengths.tolist(), self.checked.tolist()
        ):
            if length < 0:
                yield Encoded(index, row_id, None, None, self.invalid[index])
            else:
                end = offset + length
                yield Encoded(index, row_id, self.tokens[offset:end], self.mask[offset:end], None, checked, value)
                offset = end
        if self.mismatch is not None:
            raise self.mismatch


@dataclass(frozen=True)
class EncoderConfig:
    """What a process needs to build its own encoder (it travels to workers):
    ``tokenizer_sha256`` is the sha256 of each tokenizer file by name, as the build
    records it; ``family`` the tokenizer's (``fixed_sft.specs``: ``kimi`` or ``hf``);
    ``bpe`` the Kimi tokenizer's BPE (``fixed_sft.tokenizer.BPES``)."""

    tokenizer_dir: Path
    tokenizer_sha256: dict[str, str]
    loss_mask_type: str
    template_kwargs: dict
    family: str = "kimi"
    trust_remote_code: bool = False
    bpe: str = field(default_factory=default_bpe)
    declarations: tuple[str, str] | None = None  # the model's tool-declaration encoder: path, pinned sha256
    probes: str | None = None  # where the Kimi probes' outcome is kept (``fixed_sft.store.probes_path``), if anywhere

    def load(self) -> Encoder:
        """The encoder (the Kimi fast path, ``ChatEncoder``, or for a Hugging Face tokenizer
        ``HFChatEncoder``), its tokenizer loaded once per process for these files;
        ``TokenizerError`` for a tokenizer file whose sha256 is no longer
        the recorded one once it has been read."""
        encoder: Encoder
        if self.family == "hf":
            encoder = HFChatEncoder(self.hf_tokenizer(), self.template_kwargs, self.loss_mask_type)
        else:
            check = None
            if self.declarations is not None:
                try:
                    check = ModelCheck(model_declarer(Path(self.declarations[0]), self.declarations[1]))
                except (OSError, ValueError, SyntaxError) as error:
                    raise TokenizerError(f"the model's tool declarations cannot be checked: {error}") from None
            probes = Path(self.probes) if self.probes else None
            kept = probes.parent if probes else None  # (the store's ``kept_folder``)
            encoder = ChatEncoder(
                load_kimi(self.tokenizer_dir, self.bpe, kept), self.loss_mask_type, self.template_kwargs, check, probes
            )
        self._check_unchanged()
        return encoder

    def hf_tokenizer(self) -> Any:
        """The Hugging Face tokenizer of the folder (loaded once per process for these files)."""
        return load_tokenizer(self.tokenizer_dir, self.trust_remote_code, tuple(sorted(self.tokenizer_sha256.items())))

    def _check_unchanged(self) -> None:
        for name, digest in self.tokenizer_sha256.items():
            if sha256_file(self.tokenizer_dir / name) != digest:
                raise TokenizerError(
                    f"{self.tokenizer_dir / name} changed since the build read its sha256; run the build again"
                )

    def separator(self, token: str | None, loaded: KimiTokenizer | None = None) -> tuple[str, int]:
        """The token that follows each conversation and its id: ``token`` (``UsageError``
        unless it is a single token of the vocabulary), else the tokenizer's eos token;
        ``loaded``: the Kimi tokenizer of these files, where one is loaded already."""
        if self.family == "hf":
            tokenizer = self.hf_tokenizer()
            self._check_unchanged()
            try:
                return hf_separator(tokenizer, token)
            except ValueError as error:
                if token is None:
                    raise TokenizerError(f"{self.tokenizer_dir}: {error}; pass --separator TOKEN") from None
                raise UsageError(f"--separator {token!r} is not a single token of the vocabulary") from None
        if token is None:
            return eos_token(self.tokenizer_dir), eos_id(self.tokenizer_dir)
        try:
            return token, (loaded or load_kimi(self.tokenizer_dir, "tiktoken")).encoding.encode_single_token(token)
        except KeyError:
            raise UsageError(f"--separator {token!r} is not a single token of the vocabulary") from None

    def to_json(self) -> str:
        return json.dumps({**vars(self), "tokenizer_dir": str(self.tokenizer_dir)})

    @classmethod
    def from_json(cls, text: str) -> EncoderConfig:
        fields = json.loads(text)
        declarations = fields.get("declarations")
        declarations = None if declarations is None else tuple(declarations)
        return cls(**{**fields, "tokenizer_dir": Path(fields["tokenizer_dir"]), "declarations": declarations})


SAMPLE_MULTIPLIER = 0x9E3779B97F4A7C15  # odd, about 2**64 over the golden ratio


def sampled(indices: np.ndarray, every: int) -> np.ndarray:
    """Which of source rows ``indices`` the template check samples: 1 in ``every`` (0: none).
    Row ``i`` is sampled when ``i * SAMPLE_MULTIPLIER mod 2**64 < 2**64 // every``
    (Fibonacci hashing: evenly spread, without a period). The sample depends on the source
    row alone, not on the seed, row length or row count, so a later build of the same
    source finds its sampled conversations checked in the token store.

    >>> np.flatnonzero(sampled(np.arange(40), 8)).tolist()
    [0, 5, 13, 18, 26, 34, 39]
    """
    indices = np.asarray(indices, np.uint64)
    if every <= 1:
        return np.full(indices.shape, every == 1)
    return indices * np.uint64(SAMPLE_MULTIPLIER) < np.uint64(2**64 // every)


class Chunk(NamedTuple):
    """A chunk of the packing order: source rows as ``fixed_sft.bands`` cuts them, and how
    often conversations are checked: those of the rows ``sampled`` picks (``check_every``)
    are also encoded through the rendered template."""

    rows: pa.Table
    check_every: int = 0

    def checks(self) -> list[bool]:
        """Per row of the chunk, in order: whether it is checked (``sampled``, for all rows at once)."""
        return sampled(arrow.to_numpy(self.rows.column("index")), self.check_every).tolist()


def encode_rows(encoder: Encoder, chunk: Chunk) -> Iterator[Encoded]:
    """Encode a chunk's conversations one at a time, as they are asked for (a ``BatchEncoder``:
    all of the chunk's at once, when the first is asked for); a record that is not a valid
    conversation for the encoder's schema, or that the encoder refuses, is an invalid row;
    raise ``TemplateMismatch`` naming the row when a checked conversation differs, or the
    encoder cannot follow the template for it."""
    if isinstance(encoder, BatchEncoder):
        yield from _encode_batch(encoder, chunk)
        return
    yield from encode_records(encoder, records(chunk.rows), chunk.checks())


Record = tuple[int, dict | InvalidRow]  # a source row's index and its record (``fixed_sft.records.records``)


def encode_records(encoder: Encoder, rows: Iterable[Record], checks: Iterable[bool]) -> Iterator[Encoded]:
    """``encode_rows`` of rows read already (an encoder of one conversation at a time), each
    checked where ``checks`` says."""
    schema = encoder.schema
    for (index, record), check in zip(rows, checks):
        try:
            row_id, messages, tools = conversation(record, schema)
        except InvalidRow as error:
            yield Encoded(index, error.row_id, None, None, error.reason)
            continue
        try:
            ids, mask = encoder.encode_arrays(messages, tools)
        except InvalidRow as error:  # what only the encoder finds (tools it cannot declare)
            yield Encoded(index, row_id, None, None, error.reason)
            continue
        except TemplateMismatch as error:  # a template the encoder cannot follow for this conversation
            raise TemplateMismatch(f"source row {index} (id {row_id}): {error}") from None
        checked = _checked(encoder, check, index, row_id, messages, tools, ids, mask)
        yield checked._replace(source_value=source_value(record))


def _checked(
    encoder: Encoder,
    checked: bool,
    index: int,
    row_id: str | None,
    messages: list,
    tools: list | None,
    ids: np.ndarray,
    mask: np.ndarray,
) -> Encoded:
    """A conversation's ``Encoded``, checked against the template when ``checked``."""
    if checked:
        try:
            encoder.check(messages, ids, tools)
        except TemplateMismatch as error:
            raise type(error)(f"source row {index} (id {row_id}): {error}") from None
    return Encoded(index, row_id, ids, mask, None, checked)


def _encode_batch(encoder: BatchEncoder, chunk: Chunk) -> Iterator[Encoded]:
    """``encode_rows`` for a ``BatchEncoder``: the chunk's valid conversations encoded at once,
    yielded (and checked) one at a time."""
    parsed: list[tuple[int, Conversation | InvalidRow]] = []
    values: list[str | None] = []
    for index, record in records(chunk.rows):
        values.append(source_value(record))
        try:
            parsed.append((index, conversation(record, encoder.schema)))
        except InvalidRow as error:
            parsed.append((index, error))
    valid = [item for _, item in parsed if not isinstance(item, InvalidRow)]
    encoded = iter(encoder.encode_batch([item.messages for item in valid], [item.tools for item in valid]))
    for offset, ((index, item), check) in enumerate(zip(parsed, chunk.checks())):
        if isinstance(item, InvalidRow):
            yield Encoded(index, item.row_id, None, None, item.reason)
            continue
        result = next(encoded)
        if isinstance(result, InvalidRow):
            yield Encoded(index, item.id, None, None, result.reason)
            continue
        if not isinstance(result, tuple):  # a TemplateMismatch (ClockRead among them)
            raise type(result)(f"source row {index} (id {item.id}): {result}")
        checked = _checked(encoder, check, index, item.id, item.messages, item.tools, *result)
        yield checked._replace(source_value=values[offset])


def encode_chunk(encoder: Encoder, chunk: Chunk) -> EncodedChunk:
    """A chunk's conversations, packed for transfer (see ``EncodedChunk``): all of them,
    or those before the first whose template check fails, and that failure."""
    items: list[Encoded] = []
    mismatch = None
    try:
        for item in encode_rows(encoder, chunk):
            items.append(item)
    except TemplateMismatch as error:
        mismatch = error
    valid = [item for item in items if item.invalid is None]
    lengths = [-1 if item.ids is None else len(item.ids) for item in items]  # (no ids: the conversation is invalid)
    return EncodedChunk(
        indices=[item.source_index for item in items],
        row_ids=[item.id for item in items],
        source_values=[item.source_value for item in items],
        lengths=np.array(lengths, dtype=np.int64),
        checked=np.array([item.checked for item in items], dtype=bool),
        tokens=np.concatenate([item.ids for item in valid]) if valid else np.zeros(0, np.int32),
        mask=np.concatenate([item.mask for item in valid]) if valid else np.zeros(0, np.uint8),
        invalid={item.source_index: item.invalid for item in items if item.invalid is not None},
        mismatch=mismatch,
    )


# Chunks in flight to the workers hold at most this much Arrow data together (or one chunk): two
# chunks of CHUNK_BYTES (fixed_sft.build: a chunk holds at most that, or one row within
# MAX_CONVERSATION_BYTES, fixed_sft.bands), with room for their index columns. So at most two
# conversations near the bound are encoded at once, whatever the number of workers.
IN_FLIGHT_BYTES = 17 << 20
RELEASE_CHUNK_BYTES = 4 << 20

PRELOAD_VARIABLE = "FIXED_SFT_PRELOAD_ENCODER"  # an EncoderConfig as JSON, for the fork server only
RENDERS_VARIABLE = "FIXED_SFT_PRELOAD_RENDERS"  # set where the workers render (check conversations)


def ready_to_check(encoder: Encoder) -> None:
    """Import the template renderer and make the Kimi tokenizer's tiktoken twin (made only
    when asked for: ``KimiTokenizer.reference``), which a template check renders and encodes with."""
    importlib.import_module(RENDERER_MODULE)
    tokenizer = getattr(encoder, "tokenizer", None)
    if isinstance(tokenizer, KimiTokenizer):
        tokenizer.reference.encoding  # noqa: B018


def preload(
    text: str | None,
    builder: int | None = None,
    awaited: str | None = None,
    hint: str | None = None,
    renders: bool = False,
) -> tuple[str, Encoder] | None:
    """``text`` (``EncoderConfig.to_json``) and the encoder it names, loaded, and ready to
    check (``ready_to_check``) where the workers ``renders``; ``None`` for neither ``text``
    nor ``awaited``, or when loading fails (each worker then loads its own
    encoder, and reports the error). With ``awaited`` (a server started early:
    ``fixed_sft.early``), the text is what the build writes to that file, waited for, with
    whether the workers render; before it waits, the Kimi tokenizer that
    ``hint`` names is loaded (``_guess``). Meanwhile this process exits as soon as
    its parent is not ``builder`` (by default the parent it has now): the build is gone
    (killed, or stopped by a signal), and a template may take for ever to render."""
    if not text and not awaited:
        return None
    loaded = threading.Event()
    watcher = threading.Thread(target=_exit_unless_child_of, args=(builder or os.getppid(), loaded), daemon=True)
    watcher.start()
    try:
        if awaited:
            if hint:
                _guess(hint)
            text, renders = early.awaited(Path(awaited))
        assert text is not None
        encoder = EncoderConfig.from_json(text).load()
        if renders:
            ready_to_check(encoder)
        return text, encoder
    except Exception:  # an error here would end the fork server, and every worker start with it
        return None
    finally:
        loaded.set()
        watcher.join()  # (the fork server forks its workers from a single thread)


def _guess(hint: str) -> None:
    """Load the Kimi tokenizer of the folder and BPE that ``hint`` names (``early.HINT_VARIABLE``),
    while the build resolves its encoder: ``load_kimi`` keeps it for those files, so the
    encoder loads at once if the build names them (its parity ids kept in the store's folder
    that ``--cache-dir`` and ``--no-cache`` name). A guess that fails or misses costs
    only its time (the build's own error, if any, is the one said)."""
    from .store import kept_folder

    try:
        folder, bpe, cache_dir, no_cache = json.loads(hint)
        kept = None if no_cache else kept_folder(cache_dir)
        load_kimi(Path(folder), bpe, kept if kept and kept.is_dir() else None)  # (a guess makes no folder)
    except Exception:  # (a folder the build refuses, or never loads)
        pass


def _exit_unless_child_of(builder: int, loaded: threading.Event) -> None:
    while os.getppid() == builder:
        if loaded.wait(0.1):
            return
    os._exit(1)


def _lost_build(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
    """The fork server's ``sys.excepthook``: a build that vanished in the middle of a
    request (stopped as a worker started: the request's files end early) ends the server
    quietly, as the build ends too; any other error is printed as Python prints it."""
    if not issubclass(kind, (EOFError, ConnectionError)):
        sys.__excepthook__(kind, error, trace)


# set only while the fork server starts (``start_forkserver``); taken out of the environment its workers inherit
_builder = os.environ.pop(early.BUILDER_VARIABLE, None)
if _builder:  # (this process is the fork server)
    sys.excepthook = _lost_build
_awaited = os.environ.pop(early.AWAIT_VARIABLE, None)
_hint = os.environ.pop(early.HINT_VARIABLE, None)
_renders = bool(os.environ.pop(RENDERS_VARIABLE, None))
_preloaded = preload(
    os.environ.pop(PRELOAD_VARIABLE, None), int(_builder) if _builder else None, _awaited, _hint, _renders
)


def worker_encoder(config: EncoderConfig) -> Encoder | Exception:
    """The fork server's encoder if it is ``config``'s (the same JSON), else one loaded
    now; a failure to load is returned, to be raised by the worker's first chunk (so the
    caller gets the error itself rather than a broken pool)."""
    if _preloaded is not None and _preloaded[0] == config.to_json():
        return _preloaded[1]
    try:
        return config.load()
    except Exception as error:
        return error


def _worker_setup(config: EncoderConfig, many: bool = False) -> Encoder | Exception:
    """A worker's state: its encoder (``worker_encoder``), once its allocators are set as
    the build's process sets them (``many``: one of ``engine.MANY_WORKERS`` or more, which
    gives its free memory back often), with BPE on one thread (the workers are the parallelism)."""
    pa.set_memory_pool(pa.system_memory_pool())  # as ``system_allocator`` in the build's process
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    map_large_allocations()
    give_back_often(many)
    return worker_encoder(config)


def _encode_in_worker(encoder: Encoder, chunk: Chunk) -> EncodedChunk:
    """``encode_chunk`` in a worker, memory given back after a large chunk."""
    encoded = encode_chunk(encoder, chunk)
    encoded.chunk_bytes = chunk.rows.nbytes
    release_after(chunk.rows)
    return encoded


def _encode_here(encoder: Encoder, chunk: Chunk) -> Iterator[Encoded]:
    """``encode_rows`` in the build's process, memory given back after a large chunk."""
    yield from encode_rows(encoder, chunk)
    release_after(chunk.rows)


def release_after(chunk: pa.Table) -> None:
    """Give freed memory back to the OS after a chunk of at least ``RELEASE_CHUNK_BYTES``
    (the C allocator keeps what a large conversation's texts, ids and rendering freed,
    fragmented, under the next one's)."""
    if chunk.nbytes >= RELEASE_CHUNK_BYTES:
        pa.default_memory_pool().release_unused()  # (the system pool: malloc_trim, for all allocations)


WORKER_MODULES = [__name__, RENDERER_MODULE]  # what the fork server imports once, for every worker


def start_fork_server(config: EncoderConfig, renderer: bool = True) -> BaseContext:
    """The context ``Encoders`` forks its workers from: multiprocessing's fork server, started
    now unless it runs, importing this module (and, with ``renderer``, the template renderer)
    and loading ``config``'s encoder while this process goes on."""
    early.give(config.to_json(), renderer)  # (to a server started early, which waits for it)
    preload = {PRELOAD_VARIABLE: config.to_json(), early.BUILDER_VARIABLE: str(os.getpid())}
    if renderer:
        preload[RENDERS_VARIABLE] = "1"
    return forkserver_context(WORKER_MODULES if renderer else [__name__], preload)


class Encoders:
    """Where conversations are encoded (those ``sampled`` by ``check_every`` also through
    the template): in this process (``workers == 1``), one
    conversation at a time and only when asked, or in a ``fixed_sft.engine.ProcessPool``
    whose workers fork from a server that has imported this module and (unless not
    ``renderer``) the template renderer, and loaded the encoder, once (``PRELOAD_VARIABLE``)."""

    def __init__(self, config: EncoderConfig, workers: int, check_every: int, renderer: bool = True):
        self.config = config
        self.workers = workers
        self.check_every = check_every
        self.engine: InProcess | ProcessPool = InProcess(config.load)
        if workers > 1:
            # (without the renderer, a worker imports it when it first renders: to check a conversation)
            context = start_fork_server(config, renderer)
            self.engine = ProcessPool(workers, partial(_worker_setup, config, workers >= MANY_WORKERS), context)

    def __enter__(self) -> Encoders:
        self.engine.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self.engine.__exit__(kind, *exc)

    def submit(self, fn: Callable[[Encoder, T], R], task: T) -> Future:
        """``fn(encoder, task)`` in a worker, apart from ``run``'s order (workers only)."""
        assert isinstance(self.engine, ProcessPool), "a task apart runs in a worker"
        return self.engine.submit(fn, task)

    def run(self, fn: Callable[[Encoder, T], R], tasks: Iterable[T]) -> Generator[R, None, None]:
        """``fn(encoder, task)`` for each task, where the conversations are encoded; in order."""
        yield from self.engine.map(fn, ((task,) for task in tasks))

    def run_chunks(
        self,
        fn: Callable[[Encoder, T], R],
        tasks: Iterable[T],
        chunk: Callable[[T], Chunk],
        wanted: Callable[[], float],
    ) -> Generator[R, None, None]:
        """``run`` of tasks that each encode a ``chunk(task)``: workers get the next task only
        while the chunks in flight hold fewer than ``wanted()`` conversations (the caller's
        estimate of what it still needs) and, with it, at most ``IN_FLIGHT_BYTES`` of Arrow
        data (a larger chunk goes alone)."""

        def weigh(task: Task) -> tuple[int, int]:
            rows = chunk(task[0]).rows
            return rows.num_rows, rows.nbytes

        def room(in_flight: Sequence[tuple[int, int]], weight: tuple[int, int]) -> bool:
            return (
                sum(rows for rows, _ in in_flight) < wanted()
                and sum(size for _, size in in_flight) + weight[1] <= IN_FLIGHT_BYTES
            )

        yield from self.engine.map(fn, ((task,) for task in tasks), room, weigh)

    def encode(self, chunks: Iterable[pa.Table], wanted: Callable[[], float]) -> Generator[Encoded, None, None]:
        """Encoded conversations in the order of ``chunks`` (source rows); bounded by ``wanted``
        as ``run_chunks`` bounds its tasks."""
        tasks = (Chunk(rows, self.check_every) for rows in chunks)
        if isinstance(self.engine, InProcess):
            for conversations in self.engine.map(_encode_here, ((task,) for task in tasks)):
                yield from conversations
            return
        for encoded in self.run_chunks(_encode_in_worker, tasks, lambda chunk: chunk, wanted):
            yield from encoded
            if encoded.chunk_bytes >= RELEASE_CHUNK_BYTES:
                del encoded
                pa.default_memory_pool().release_unused()  # (as ``release_after``)

"""The token store: conversations' ids and masks from earlier builds, kept per source in the user's cache.

An entry of the store is a folder named by its key: the sha256 of what decides a
conversation's ids, mask, invalid reason and template check. That is the source files'
sha256s (in order), the tokenizer files' sha256s, the template variables, the mask type,
the tokenizer family and BPE, the pinned sha256 of the model's tool-declaration encoder
where a spec pins one, the versions of Python and of the libraries that read and encode,
and the code's encoding version (``ENCODING_VERSION`` and the bytes of the modules that
encode). A later build of the same source (another seed, row length or row count) takes
from it what earlier builds encoded, and encodes only the rest.

An entry holds segment files. Each is written whole by one build under a temporary name,
then renamed: readers see complete files only, and builds sharing a store never write the
same file. Each conversation in a segment carries a checksum of its record and bytes
(``_digest``); one that does not match (a flipped byte, a truncated file) is never used:
the build encodes it again and adds it anew, in a segment named to be read after every
segment the build found (``SegmentWriter``), so the newer copy is the one found next
time. A conversation is stored as having passed the template check only where its build
checked it. A sampled one (``encode.sampled``) stored without a passed check is given at
once and also encoded again, which checks it; the check is settled before the build
writes its manifest (``Stream``), and a failure stops the build as it would without the
store.

An entry also keeps the index of every row it holds, where a build has had them all
(``fixed_sft.kept``): a later build that packs in its workers reads that, not every
conversation, before it writes its rows.

The store is an optimisation only: a build's rows are the same with it, without it
(``--no-cache``) and whatever state it is in. A store that cannot be written is turned off
for the build, with a warning.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import socket
import struct
import sys
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import numpy as np
import xxhash

from .encode import Encoded, EncoderConfig, sampled
from .errors import BuildError
from .hashes import STALE_SECONDS, open_regular  # (a temporary file this old is a killed build's: removed)

# Bump when the segment format changes, or what an encoding depends on beyond the modules and
# libraries below. 2: records checked by XXH3-128, not sha256. 3: a segment names its entry.
ENCODING_VERSION = 3
# the modules whose code decides a conversation's ids, mask, invalid reason or template check
ENCODING_MODULES = (
    "arrow.py",
    "bands.py",
    "chat.py",
    "conversation.py",
    "encode.py",
    "encoding.py",
    "fields.py",
    "fill.py",
    "hf_chat.py",
    "records.py",
    "source.py",
    "store.py",
    "tokenizer.py",
    "tool_declarations.py",
)
# what encodes, and what reads the source's values (Parquet's to Python's, JSON's)
LIBRARIES = ("gigatoken", "jinja2", "numpy", "pyarrow", "tiktoken", "tokenizers", "transformers")
CACHE_VARIABLE = "FIXED_SFT_CACHE"
PROBES_FOLDER = "probes"  # in the store's folder: what encoders learn once (``kept_folder``)
MAGIC = b"FSFTTOK3"
TAG_BYTES = 16
# the magic, the entry's tag (``entry_tag``: a segment copied from another entry is not read),
# then the number of records (uint64)
HEADER_BYTES = len(MAGIC) + TAG_BYTES + 8
# one record per conversation; ``tokens`` is -1 for an invalid one; ``flags`` bit 0: passed the
# template check (or invalid: nothing to check); ``digest``: ``_digest`` of the record before it
# (``offset`` aside) and of its bytes
RECORD = np.dtype(
    [
        ("offset", "<i8"),
        ("index", "<i8"),
        ("tokens", "<i8"),
        ("meta", "<i8"),
        ("flags", "u1"),
        ("digest", "V16"),
    ]
)
RECORD_STRUCT = struct.Struct("<qqqqB16s")  # (the same, read one at a time)
HEAD = struct.Struct("<qqqB")  # what a record's digest covers: index, tokens, meta, flags
PASSED = 1
# A record of more tokens, or of more bytes of metadata, is not one a build wrote: a conversation
# holds at most MAX_CONVERSATION_BYTES (8 MiB), and a token at least a byte of it or of its template.
MAX_TOKENS = 1 << 25
MAX_META = 1 << 25
SEGMENT_BYTES = 16 << 20  # a build writes a segment once it has this many bytes of conversations
SEGMENT_CONVERSATIONS = 4096  # or this many conversations
DRAFT_PREFIX = ".tmp-"  # a segment being written: then its host, its writer's pid and a random part
WRITE_BUFFER_BYTES = 1 << 20  # a segment's small conversations are written to its file together
ROOM_BYTES = HEADER_BYTES + SEGMENT_CONVERSATIONS * RECORD.itemsize  # where a segment's bytes start


def _open_files() -> int:
    """Segment files a reader keeps open at once: a quarter of the process's limit on open
    files, from 4 to 4,096 (the rest are the build's). A fill writes a segment per task,
    and rows in packing order come from all of them (313 segments, 40,000 conversations,
    64 open: 31,990 opens).

    >>> 4 <= _open_files() <= 4096
    True
    """
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 64
    return 4096 if soft == resource.RLIM_INFINITY else min(4096, max(4, soft // 4))


OPEN_FILES = _open_files()
BLOCK_ROWS = 4096  # stored conversations a build reads at once (``Stream``): at most this many
BLOCK_BYTES = 16 << 20  # and of at most this many bytes of ids and masks (or one)


def default_dir() -> Path:
    """The store's folder: ``$FIXED_SFT_CACHE``, else ``$XDG_CACHE_HOME/fixed-sft``, else
    ``~/.cache/fixed-sft``."""
    if os.environ.get(CACHE_VARIABLE):
        return Path(os.environ[CACHE_VARIABLE])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "fixed-sft"
    return Path.home() / ".cache" / "fixed-sft"


def encoding_version() -> str:
    """The code's encoding version: ``ENCODING_VERSION``, the sha256 of the modules that
    encode (names and bytes), the versions of the libraries they encode with and Python's
    (its JSON reader and Unicode tables)."""
    package = Path(__file__).parent
    digest = hashlib.sha256(f"{ENCODING_VERSION}\0{sys.version}\0".encode())
    for name in ENCODING_MODULES:
        digest.update(name.encode() + b"\0" + (package / name).read_bytes() + b"\0")
    for library in LIBRARIES:
        try:
            version = importlib.metadata.version(library)
        except importlib.metadata.PackageNotFoundError:
            version = "-"
        digest.update(f"{library}={version}\0".encode())
    return digest.hexdigest()


def store_key(source_sha256: list[str], encoder: EncoderConfig) -> str:
    """The key of a source's entry for an encoder: sha256 over the inputs that decide its
    encodings (module docstring); not the folders the files are read from."""
    inputs = {"source": source_sha256, **_encoder_inputs(encoder)}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def kept_folder(root: str | Path | None) -> Path:
    """The folder of the store ``root`` (``None`` or empty: ``default_dir()``) that keeps what
    an encoder learns once: the Kimi probes' outcome (``probes_path``) and the reference's
    ids of the parity texts (``fixed_sft.tokenizer.load_kimi``)."""
    return Path(root or default_dir()) / PROBES_FOLDER


def probes_path(root: Path, encoder: EncoderConfig) -> Path:
    """Where the Kimi probes' outcome for ``encoder`` is kept in the store ``root``
    (``fixed_sft.chat.read_probes``): named by the sha256 of what a key holds beside the source."""
    name = hashlib.sha256(json.dumps(_encoder_inputs(encoder), sort_keys=True).encode()).hexdigest()
    return kept_folder(root) / f"{name}.json"


def _encoder_inputs(encoder: EncoderConfig) -> dict:
    """What decides an encoder's encodings (module docstring), the source aside."""
    return {
        "encoding": encoding_version(),
        "tokenizer": sorted(encoder.tokenizer_sha256.items()),
        "template_kwargs": encoder.template_kwargs,
        "loss_mask_type": encoder.loss_mask_type,
        "family": encoder.family,
        "trust_remote_code": encoder.trust_remote_code,
        "bpe": encoder.bpe if encoder.family != "hf" else None,
        # the model's tool-declaration encoder, where a spec pins it: what the declarations were checked against
        **({"declarations": encoder.declarations[1]} if encoder.declarations else {}),
    }


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


class SegmentWriter:
    """Writes conversations into an entry's ``folder`` as segments: each written whole under
    a temporary name, then renamed, once it holds ``SEGMENT_BYTES`` or
    ``SEGMENT_CONVERSATIONS`` (and at ``flush``). A conversation's bytes go to the file as
    it is added, after room for the most records a segment holds; its records fill that
    room at ``flush`` (the rest is left a hole): a writer holds no segment's bytes (16
    workers each held up to 16 MB). Any number of writers, in any processes,
    may write into one entry: their files never share a name. A segment's name starts with
    the clock's nanoseconds, or with one more than ``after`` where that is later: a store
    reads its segments in name order, so a conversation written again (its copy damaged)
    is found before that copy next time, even from a segment a clock ahead named. A segment
    that cannot be written turns the writer off (``writable``), with a warning."""

    def __init__(self, folder: Path, quiet: bool = False):
        self.folder = folder
        self.quiet = quiet  # (no warning: the caller gives it)
        self.after = 0  # the latest name stamp known in the folder (``TokenStore`` reads it)
        self.writable = True
        self.added = 0
        self._records: list[bytes] = []
        self._pending = 0
        self._draft: Path | None = None
        self._file: BinaryIO | None = None

    def add(self, item: Encoded) -> int:
        """Keep ``item``; the check flags it is stored with (``PASSED`` where it passed the template check)."""
        valid = item.ids is not None and item.mask is not None
        flags = PASSED if item.checked or not valid else 0
        if not self.writable:
            return flags
        meta = json.dumps([item.id, item.source_value, item.invalid]).encode()
        if item.ids is None or item.mask is None:
            tokens, parts = -1, [meta]
        else:
            tokens = len(item.ids)
            ids = np.ascontiguousarray(item.ids, dtype="<i4").tobytes()
            parts = [ids, np.ascontiguousarray(item.mask, dtype=np.uint8).tobytes(), meta]
        index = item.source_index
        digest = _digest(HEAD.pack(index, tokens, len(meta), flags), *parts)
        try:
            if self._file is None:
                self._draft = draft_path(self.folder)
                self._file = self._draft.open("wb", buffering=WRITE_BUFFER_BYTES)
                self._file.seek(ROOM_BYTES)
            for part in parts:
                self._file.write(part)
        except OSError as error:
            self._failed(error)
            return flags
        size = sum(len(part) for part in parts)
        self._records.append(RECORD_STRUCT.pack(ROOM_BYTES + self._pending, index, tokens, len(meta), flags, digest))
        self._pending += size
        if self._pending >= SEGMENT_BYTES or len(self._records) >= SEGMENT_CONVERSATIONS:
            self.flush()
        return flags

    def flush(self) -> None:
        """Write the conversations added since the last flush as one segment."""
        if self._file is None or self._draft is None:
            return
        following = self.after + 1 if self.after + 1 < LAST_STAMP else 0  # (none follows the last stamp)
        self.after = max(time.time_ns(), following)
        name = f"{self.after:020d}-{os.getpid()}-{os.urandom(4).hex()}.seg"
        try:
            self._file.seek(0)
            self._file.write(MAGIC + entry_tag(self.folder) + len(self._records).to_bytes(8, "little"))
            self._file.write(b"".join(self._records))
            self._file.close()
            self._draft.rename(self.folder / name)
            self.added += len(self._records)
        except OSError as error:
            self._failed(error)
        self._clear()

    def __enter__(self) -> SegmentWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        """Where a task ends with an error, its temporary file goes with it."""
        if kind is not None:
            self.turn_off()

    def turn_off(self) -> None:
        """Write nothing more: what is pending is dropped, with its temporary file."""
        self.writable = False
        if self._file is not None and self._draft is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._draft.unlink(missing_ok=True)
        self._clear()

    def _clear(self) -> None:
        """No segment pending."""
        self._file = self._draft = None
        self._records, self._pending = [], 0

    def _failed(self, error: OSError) -> None:
        if not self.quiet:
            warn(f"token store off: cannot write {self._draft} ({error.strerror or error})")
        self.turn_off()


class SegmentReader:
    """Reads stored conversations from the segment files ``paths`` (a list that may grow),
    each checked against its record's digest; keeps ``OPEN_FILES`` of them open at most."""

    def __init__(self, paths: Sequence[Path | str]):
        self.paths = paths
        self._files: OrderedDict[int, tuple[int, int]] = OrderedDict()  # segment: its descriptor and size

    def _open(self, number: int) -> tuple[int, int]:
        """Segment ``number``'s descriptor and size (as it was opened)."""
        opened = self._files.get(number)
        if opened is None:
            fd = os.open(self.paths[number], os.O_RDONLY | os.O_NONBLOCK)  # (never blocks: a FIFO put in its place)
            opened = self._files[number] = (fd, os.fstat(fd).st_size)
            if len(self._files) > OPEN_FILES:
                os.close(self._files.popitem(last=False)[1][0])
        else:
            self._files.move_to_end(number)
        return opened

    def read(self, number: int, slot: int, index: int) -> Encoded | None:
        """Source row ``index``, held by record ``slot`` of segment ``number`` (``checked``:
        it passed the template check); ``None`` where the record is not there or its bytes
        do not match."""
        raw = self.payload(number, HEADER_BYTES + slot * RECORD.itemsize, RECORD.itemsize)
        if raw is None:
            return None
        offset, stored, tokens, meta, flags, digest = RECORD_STRUCT.unpack(raw)
        if stored != index or not _sound(tokens, meta, offset, flags):
            return None
        payload = self.payload(number, offset, 5 * max(tokens, 0) + meta)
        if payload is None or _digest(HEAD.pack(index, tokens, meta, flags), payload) != digest:
            return None
        return _decode(index, tokens, payload, bool(flags & PASSED), _meta(payload[5 * max(tokens, 0) :]))

    def payload(self, number: int, offset: int, size: int) -> bytes | None:
        """``size`` bytes of segment ``number`` from ``offset``; ``None`` where it has fewer.
        Nothing is read past the file's end: a damaged record's size is not allocated."""
        try:
            fd = self._holding(number, offset + size)
            payload = b"" if fd is None else os.pread(fd, size, offset)
        except OSError:
            return None
        return payload if len(payload) == size else None

    def read_into(self, number: int, offset: int, size: int, buffers: Sequence[Any]) -> bool:
        """Fill ``buffers`` (writable, ``size`` bytes in all), one after the other, from
        ``offset`` of segment ``number``; ``False`` where it has fewer bytes."""
        try:
            fd = self._holding(number, offset + size)
            return fd is not None and os.preadv(fd, buffers, offset) == size
        except OSError:
            return False

    def _holding(self, number: int, end: int) -> int | None:
        """Segment ``number``'s descriptor, where it holds ``end`` bytes (it may have grown
        since it was opened); else ``None``."""
        fd, length = self._open(number)
        if end > length:
            length = os.fstat(fd).st_size  # (grown since it was opened, or damaged)
            self._files[number] = (fd, length)
        return fd if end <= length else None

    def close(self) -> None:
        for fd, _ in self._files.values():
            os.close(fd)
        self._files.clear()


class Located(NamedTuple):
    """Stored conversations, as their records place them: the segment files, and per
    conversation its source row, file (an index into ``paths``), offset, tokens, bytes of
    metadata, whether it passed the template check, and digest."""

    paths: tuple[str, ...]
    indices: np.ndarray
    numbers: np.ndarray
    offsets: np.ndarray
    tokens: np.ndarray
    metas: np.ndarray
    passed: np.ndarray
    digests: np.ndarray

    def compact(self) -> Located:
        """The same, naming only the files they are in (a task's to send to a worker)."""
        used, numbers = np.unique(self.numbers, return_inverse=True)
        return self._replace(paths=tuple(self.paths[n] for n in used.tolist()), numbers=numbers.reshape(-1))


class Damaged(Exception):
    """A stored conversation's bytes do not match its record: ``position`` in what was read."""

    def __init__(self, position: int) -> None:
        super().__init__(f"stored conversation {position} does not match its digest")
        self.position = position


class UnitReader:
    """Reads ``located`` conversations (in stream order) a stretch at a time into one buffer
    of tokens and one of mask values, each conversation followed by ``[EOS]`` (mask 0) and
    checked against its digest as ``TokenStore.lookup`` checks it. A conversation is read
    once: the one a stretch ends in is kept whole for the next, which may begin in it."""

    def __init__(self, reader: SegmentReader, located: Located, eos_id: int) -> None:
        self.reader, self.located, self.eos_id = reader, located, eos_id
        self.starts = np.concatenate([[0], np.cumsum(located.tokens + 1, dtype=np.int64)])  # (in the stream)
        self.fresh = 0  # the first conversation the last stretch read (those before it, an earlier one)
        self._last: tuple[int, np.ndarray, np.ndarray, Any] | None = None

    def take(
        self, low: int, high: int, window: tuple[int, int] | None = None
    ) -> tuple[np.ndarray, np.ndarray, list[tuple | None]]:
        """Stream positions ``window`` (``[start, end)``; all of them where ``None``) of
        conversations ``low..high`` (exclusive; from the one the last stretch ended in, or
        from one not read) as two buffers, and the metadata of each (``parse_metas``). A
        conversation that reaches out of the window is read whole (its digest covers it
        all) and only its part in the window kept: a conversation of many rows costs each
        stretch its share. ``Damaged`` where one does not match its digest."""
        begin, end = window if window is not None else (int(self.starts[low]), int(self.starts[high]))
        ids = np.empty(end - begin, "<i4")  # (the stored byte order, whatever the machine's)
        mask = np.empty(end - begin, np.uint8)
        metas: list[Any] = [None] * (high - low)
        self.fresh = low
        last = self._last
        if last is not None and last[0] == low:
            _place(ids, mask, int(self.starts[low]) - begin, last[1], last[2])
            metas[0] = last[3]
            self.fresh += 1
        at = self.located
        fresh = slice(self.fresh, high)
        read = np.lexsort((at.offsets[fresh], at.numbers[fresh]))  # (a file at a time: a reader keeps few open)
        columns = (at.numbers, at.offsets, at.indices, at.tokens, at.metas, at.passed, at.digests)
        metas_read: list[bytearray] = [bytearray()] * len(read)
        for k, start, number, offset, index, tokens, meta, passed, digest in zip(
            read.tolist(),
            self.starts[fresh][read].tolist(),
            *(column[fresh][read].tolist() for column in columns),
        ):
            inside = begin <= start and start + tokens < end  # (the conversation and its [EOS])
            unit_ids = ids[start - begin : start - begin + tokens] if inside else np.empty(tokens, "<i4")
            unit_mask = mask[start - begin : start - begin + tokens] if inside else np.empty(tokens, np.uint8)
            meta_bytes = bytearray(meta)
            buffers = [unit_ids, unit_mask, meta_bytes]
            if not self.reader.read_into(number, offset, 5 * tokens + meta, buffers):
                raise Damaged(self.fresh + k)
            if _digest(HEAD.pack(index, tokens, meta, PASSED if passed else 0), *buffers) != digest:
                raise Damaged(self.fresh + k)
            if not inside:
                _place(ids, mask, start - begin, unit_ids, unit_mask)
            if self.fresh + k == high - 1:
                self._last = (high - 1, unit_ids, unit_mask, None)
            metas_read[k] = meta_bytes
        metas[self.fresh - low :] = parse_metas(metas_read)
        if self._last is not None and self._last[0] == high - 1:
            self._last = (*self._last[:3], metas[-1])
        separators = self.starts[low + 1 : high + 1] - 1 - begin
        separators = separators[(separators >= 0) & (separators < end - begin)]
        ids[separators], mask[separators] = self.eos_id, 0
        return ids, mask, metas


def _place(ids: np.ndarray, mask: np.ndarray, at: int, unit_ids: np.ndarray, unit_mask: np.ndarray) -> None:
    """Copy the part of a conversation's tokens and mask that falls in buffers ``ids`` and
    ``mask``, where it starts at position ``at`` of them (negative: before them).

    >>> ids, mask = np.zeros(4, np.int32), np.zeros(4, np.uint8)
    >>> _place(ids, mask, -1, np.array([7, 8, 9]), np.array([1, 0, 1])); ids.tolist(), mask.tolist()
    ([8, 9, 0, 0], [0, 1, 0, 0])
    """
    low, high = max(at, 0), min(at + len(unit_ids), len(ids))
    if low < high:
        ids[low:high], mask[low:high] = unit_ids[low - at : high - at], unit_mask[low - at : high - at]


class TokenStore:
    """One entry of the store (``folder``), for a source of ``num_rows`` rows: which rows it
    holds (read from the segments' records when it opens: hints, each checked when used),
    ``lookup`` to take one, ``add`` to keep one (written a segment at a time, and at ``close``)."""

    def __init__(self, folder: Path, num_rows: int):
        self.folder = folder
        self.segments: list[Path] = []
        self.segment = np.full(num_rows, -1, np.int32)  # per source row: the segment holding it
        self.slot = np.zeros(num_rows, np.int32)  # and its record there
        self.passed = np.zeros(num_rows, bool)  # whether that record says it passed the check
        self.tokens = np.zeros(num_rows, np.int64)  # and the tokens that record says it has (-1: invalid)
        # and where that record says its bytes are, its metadata's length and its digest (what ``lookup`` reads by)
        self.offset = np.zeros(num_rows, np.int64)
        self.meta = np.zeros(num_rows, np.int32)
        self.digest = np.zeros(num_rows, "V16")
        self.writer = SegmentWriter(folder)
        self.taken = self.damaged = 0
        self._sample: tuple[int, np.ndarray] | None = None
        self._reader = SegmentReader(self.segments)
        self._load()

    @property
    def writable(self) -> bool:
        return self.writer.writable

    @property
    def added(self) -> int:
        return self.writer.added

    def turn_off(self, why: str) -> None:
        """Write no more for this build, with a warning saying ``why``."""
        if self.writable:
            warn(f"token store off: {why}")
            self.writer.turn_off()

    @classmethod
    def open(cls, root: Path, key: str, num_rows: int) -> TokenStore | None:
        """The entry ``key`` under ``root`` (created if need be); ``None``, with a warning,
        where the folder cannot be made or listed."""
        folder = root / "tokens" / key
        try:
            folder.mkdir(parents=True, exist_ok=True)
            return cls(folder, num_rows)
        except OSError as error:
            warn(f"token store off: cannot use {folder} ({error.strerror or error})")
            return None

    def _load(self) -> None:
        """Index the segments (oldest first: a later copy of a row replaces an earlier one,
        unless only the earlier passed the check and its bytes match its record); remove
        temporary files that are stale or whose writer is gone (``_abandoned``)."""
        now = time.time()
        for entry in sorted(os.scandir(self.folder), key=lambda e: e.name):
            if entry.name.startswith(DRAFT_PREFIX):
                try:
                    if now - entry.stat().st_mtime > STALE_SECONDS or _abandoned(entry.name):
                        os.unlink(entry.path)
                except OSError:
                    pass
                continue
            if not entry.name.endswith(".seg"):
                continue
            self.writer.after = max(self.writer.after, _stamp(entry.name))
            records = self._read_records(Path(entry.path))
            try:
                size = entry.stat().st_size
            except OSError:  # (gone since it was listed)
                records = None
            if records is None:
                continue
            number = len(self.segments)
            self.segments.append(Path(entry.path))
            indices, tokens = records["index"], records["tokens"]
            slots = np.arange(len(records), dtype=np.int32)
            keep = (indices >= 0) & (indices < len(self.segment))
            keep &= _sound(tokens, records["meta"], records["offset"], records["flags"])
            # (and its bytes within the file: a damaged count is never allocated)
            keep &= records["offset"] + 5 * np.maximum(tokens, 0) + records["meta"] <= size
            records, slots = records[keep], slots[keep]
            indices, passed = records["index"], (records["flags"] & PASSED).astype(bool)
            replace = passed | ~self.passed[indices] | (self.segment[indices] < 0)
            for k in np.flatnonzero(~replace).tolist():  # (few: a damaged copy encoded again, or builds at once)
                replace[k] = not self._intact(int(indices[k]))
            records, slots, indices, passed = records[replace], slots[replace], indices[replace], passed[replace]
            self.segment[indices] = number
            self.slot[indices] = slots
            self.passed[indices] = passed
            self.tokens[indices] = records["tokens"]
            self.offset[indices] = records["offset"]
            self.meta[indices] = records["meta"]
            self.digest[indices] = records["digest"]

    def _intact(self, index: int) -> bool:
        """Whether the copy of source row ``index`` held now has the bytes its record's digest says."""
        number, offset, tokens, meta = (int(c[index]) for c in (self.segment, self.offset, self.tokens, self.meta))
        payload = self._reader.payload(number, offset, 5 * max(tokens, 0) + meta)
        head = HEAD.pack(index, tokens, meta, PASSED if self.passed[index] else 0)
        return payload is not None and _digest(head, payload) == self.digest[index].tobytes()

    @staticmethod
    def _read_records(path: Path) -> np.ndarray | None:
        """A segment's records (those its file holds whole), or ``None`` for a file that is
        not a segment of the entry it is in (not a regular file: a FIFO, which would block;
        a link; another entry's segment, which would give another source's rows)."""
        try:
            opened = open_regular(path, follow_links=False)
            if opened is None:
                return None
            with opened as f:
                header = f.read(HEADER_BYTES)
                if (
                    len(header) < HEADER_BYTES
                    or header[: len(MAGIC)] != MAGIC
                    or header[len(MAGIC) : -8] != entry_tag(path.parent)
                ):
                    return None
                count = min(int.from_bytes(header[-8:], "little"), SEGMENT_CONVERSATIONS)  # (what a writer writes)
                size = os.fstat(f.fileno()).st_size
                count = min(count, (size - HEADER_BYTES) // RECORD.itemsize)
                return np.frombuffer(f.read(count * RECORD.itemsize), RECORD)
        except OSError:
            return None

    def lookup(self, index: int) -> Encoded | None:
        """Source row ``index`` as stored, its digest checked (``checked``: it passed the
        template check); ``None`` where it is not held, or its bytes do not match or hold no
        metadata of the stored kind (it is then forgotten)."""
        return self.lookup_many([index])[0]

    def lookup_many(self, indices: Sequence[int]) -> list[Encoded | None]:
        """``lookup`` of each of source rows ``indices``, at once: each by the record this
        store read as it opened (a record out of bounds is not held), in one read of its
        bytes; their metadata parsed together. Read a segment at a time, in offset order:
        rows in packing order come from more segments than the reader keeps open."""
        rows = np.asarray(indices, np.int64).reshape(-1)
        found: list[Encoded | None] = [None] * len(rows)
        held = np.flatnonzero(self.segment[rows] >= 0)
        held = held[np.lexsort((self.offset[rows[held]], self.segment[rows[held]]))]
        at_rows = rows[held]
        read: list[tuple[int, int, int, bytes, bool]] = []  # (position in indices, row, tokens, payload, passed)
        columns: list[np.ndarray] = [self.segment, self.offset, self.tokens, self.meta, self.passed, self.digest]
        for at, index, number, offset, tokens, meta, passed, digest in zip(
            held.tolist(), at_rows.tolist(), *(column[at_rows].tolist() for column in columns)
        ):
            flags = PASSED if passed else 0
            payload = self._reader.payload(number, offset, 5 * max(tokens, 0) + meta)
            if payload is None or _digest(HEAD.pack(index, tokens, meta, flags), payload) != digest:
                self.damaged += 1
                self.segment[index] = -1
                continue
            read.append((at, index, tokens, payload, passed))
        for (at, index, tokens, payload, passed), meta in zip(read, _metas(read)):
            item = _decode(index, tokens, payload, passed, meta)
            if item is None:
                self.damaged += 1
                self.segment[index] = -1
            else:
                self.taken += 1
            found[at] = item
        return found

    def locate(self, indices: np.ndarray) -> Located | None:
        """Where source rows ``indices`` are, as their records say (``UnitReader`` reads them
        by it); ``None`` where one is not held, or held as invalid."""
        rows = np.asarray(indices, np.int64)
        if len(rows) and (self.segment[rows].min() < 0 or self.tokens[rows].min() < 0):
            return None
        columns = (self.segment, self.offset, self.tokens, self.meta, self.passed, self.digest)
        return Located(tuple(map(str, self.segments)), rows, *(column[rows] for column in columns))

    def units(self, located: Located, eos_id: int) -> UnitReader:
        """A ``UnitReader`` of ``located`` (from ``locate``), reading with this store's open files."""
        return UnitReader(self._reader, located, eos_id)

    def forget(self, index: int) -> None:
        """Hold source row ``index`` no more: its stored bytes do not match (``Damaged``)."""
        self.damaged += 1
        self.segment[index] = -1

    def add(self, item: Encoded) -> None:
        """Keep ``item`` (a conversation as a build encoded it) unless the store holds it
        already (and passed its check, where ``item`` was checked)."""
        index = item.source_index
        if not self.writable or (self.segment[index] >= 0 and (self.passed[index] or not item.checked)):
            return
        flags = self.writer.add(item)
        self.segment[index] = -2  # (pending: not taken back by this build)
        self.passed[index] = bool(flags)

    def flush(self) -> None:
        """Write the conversations added since the last flush as one segment."""
        self.writer.flush()

    def close(self) -> None:
        """Write what is pending; close the segment files."""
        self.flush()
        self._reader.close()

    def refresh(self) -> None:
        """Write what is pending, then index the segments again: the rows this build added
        are then held as any other."""
        self.close()
        self.segments.clear()
        self.segment.fill(-1)
        self.slot.fill(0)
        self.passed.fill(False)
        self.tokens.fill(0)
        self._load()  # (offset, meta and digest: read where segment says a row is held)

    def compare(self, indices: np.ndarray, before: tuple[list[Path], np.ndarray, np.ndarray]) -> None:
        """Raise ``StoreMismatch`` for the first of source rows ``indices`` whose copy held
        before (``before``: the segment files, and per row its segment and record there)
        differs from the one held now, which was encoded again (to check it); rows held
        damaged, or not held now (their check failed), are passed over."""
        paths, segments, slots = before
        old = SegmentReader(paths)
        try:
            for index, number, slot in zip(indices.tolist(), segments.tolist(), slots.tolist()):
                stored = old.read(number, slot, index) if self.segment[index] >= 0 else None
                item = self.lookup(index) if stored is not None else None
                if stored is not None and item is not None and not same_encoding(stored, item):
                    raise StoreMismatch.of(index, self.folder)
        finally:
            old.close()

    def plan(self, check_every: int) -> tuple[np.ndarray, np.ndarray]:
        """Per source row: whether it is taken from the store, and whether it is read and
        encoded too (taken from the store but sampled by ``check_every``, without a passed
        check: encoded again to check it)."""
        held = self.segment >= 0
        check = self.sample(check_every) & held & ~self.passed
        return held, check

    def given(self, check_every: int) -> np.ndarray | None:
        """Per source row: whether a build takes it from the store without encoding it
        (``plan``: held, and not to be checked); ``None`` where the store holds none."""
        held, check = self.plan(check_every)
        return held & ~check if held.any() else None

    def sample(self, check_every: int) -> np.ndarray:
        """Per source row: whether the template check samples it (``encode.sampled``), made
        once per ``check_every`` (a build plans more than once)."""
        if self._sample is None or self._sample[0] != check_every:
            self._sample = (check_every, sampled(np.arange(len(self.segment)), check_every))
        return self._sample[1]

    def stream(self, order: np.ndarray, misses: Iterator[Encoded], check_every: int, again: Again) -> Stream:
        """The conversations of packing ``order`` (``Stream``), taken from the store as ``plan``
        says, the others from ``misses``."""
        held, check = self.plan(check_every)
        return Stream(self, order, held, check, misses, check_every, again)


Again = Callable[[int], Encoded]  # source row -> the row read and encoded alone


class StoreMismatch(BuildError):
    """A stored conversation whose digest matches differs from the same conversation encoded
    now: the key misses an input the encoding depends on."""

    @classmethod
    def of(cls, index: int, folder: Path) -> StoreMismatch:
        """The error for source row ``index`` of the entry ``folder``."""
        return cls(
            f"source row {index}: the token store's copy differs from its encoding now; remove {folder} and build again"
        )


class Stream:
    """The conversations of a build in packing order: the rows ``held`` from the store, the
    others from ``misses`` (which reads and encodes them, in order, and those of ``check``
    too), each encoded one added to the store. Stored rows are read a block ahead
    (``_blocks``, ``lookup_many``); one whose bytes do not match is encoded by
    ``again(index)``. A stored row sampled for the check that has not passed it is given at
    once, and its check is settled as ``misses`` reaches it: before the next row from
    ``misses``, or at ``finish``, which a build calls before it writes its manifest (a
    failing check stops the build, as without the store)."""

    def __init__(
        self,
        store: TokenStore,
        order: np.ndarray,
        held: np.ndarray,
        check: np.ndarray,
        misses: Iterator[Encoded],
        check_every: int,
        again: Again,
    ):
        self.store, self.order, self.held, self.check = store, order, held, check
        self.misses, self.again = misses, again
        self.sampled = store.sample(check_every)
        self.pending: deque[Encoded] = deque()  # stored rows given, whose check is to come from misses
        self.items = self._items()

    def __iter__(self) -> Iterator[Encoded]:
        return self.items

    def _items(self) -> Generator[Encoded, None, None]:
        store = self.store
        for block in _blocks(self.order, store.tokens):
            held = self.held[block]
            stored = iter(store.lookup_many(block[held]))  # (a block at a time: ``lookup_many``)
            for index, is_held in zip(block.tolist(), held.tolist()):
                checked = bool(self.sampled[index])
                item = next(stored) if is_held else None
                unchecked = item is not None and checked and item.invalid is None and not item.checked
                if is_held and not self.check[index] and (item is None or unchecked):
                    item = self.again(index)  # (damaged, or not as planned: the misses do not hold it)
                    store.add(item)
                elif item is None:
                    item = self._next_miss(index)
                elif self.check[index] and item.invalid is None:
                    self.pending.append(item)
                    item = item._replace(checked=True)
                elif item.checked != (checked and item.invalid is None):
                    item = item._replace(checked=checked and item.invalid is None)
                yield item
        self.finish()

    def _next_miss(self, index: int) -> Encoded:
        self.finish()
        item = next(self.misses)
        assert item.source_index == index, (item.source_index, index)
        self.store.add(item)
        return item

    def finish(self) -> None:
        """Settle the checks of the stored rows given so far; raise the first failure
        (``TemplateMismatch``, or ``StoreMismatch``)."""
        while self.pending:
            stored = self.pending.popleft()
            item = next(self.misses)
            assert item.source_index == stored.source_index, (item.source_index, stored.source_index)
            if not same_encoding(stored, item):
                raise StoreMismatch.of(item.source_index, self.store.folder)
            self.store.add(item)

    def close(self) -> None:
        self.items.close()
        close = getattr(self.misses, "close", None)
        if close is not None:
            close()


LAST_STAMP = 10**19  # name stamps are below it: 20 digits, with room after any clock's nanoseconds for centuries


def _stamp(name: str) -> int:
    """The stamp a segment's name starts with (``SegmentWriter``); 0 for a name without one.

    >>> _stamp("01796353815955302884-22985-3cebeeec.seg"), _stamp("old.seg"), _stamp("²" * 20 + "-1-a.seg")
    (1796353815955302884, 0, 0)
    >>> _stamp("9" * 20 + "-1-a.seg")  # (the names after it would take 21 digits)
    0
    """
    digits = name.split("-", 1)[0]
    stamp = int(digits) if digits.isascii() and digits.isdigit() and len(digits) == 20 else 0
    return stamp if stamp < LAST_STAMP else 0  # (one that leaves no room after it is no writer's)


def entry_tag(folder: Path) -> bytes:
    """The tag of the entry in ``folder`` (named by its key) that its segments carry.

    >>> len(entry_tag(Path("tokens/ab12"))), entry_tag(Path("a/ab12")) == entry_tag(Path("b/ab12"))
    (16, True)
    """
    return xxhash.xxh3_128(folder.name.encode()).digest()


def _digest(head: bytes, *body: Any) -> bytes:
    """A record's checksum: XXH3-128 of its head, then of its bytes (given whole, or in
    parts one after the other: the same checksum). It finds damage, as sha256 would at a
    fifth of the cost or less (a later build checks every byte it reads); like sha256
    stored beside the bytes, it proves nothing against someone who writes both (the
    template check and ``verify --rebuild`` do).

    >>> len(_digest(b"head", b"bytes")), _digest(b"head", b"bytes") == _digest(b"head", b"byteS")
    (16, False)
    >>> _digest(b"head", b"bytes") == _digest(b"head", b"by", b"tes")
    True
    """
    digest = xxhash.xxh3_128(head)
    for part in body:
        digest.update(part)
    return digest.digest()


def _blocks(order: np.ndarray, tokens: np.ndarray) -> Iterator[np.ndarray]:
    """The source rows of packing ``order``, a block at a time: 64 rows, then twice as many
    each block up to ``BLOCK_ROWS`` (a build of a few rows reads few ahead), each block of
    at most ``BLOCK_BYTES`` of stored bytes by ``tokens`` (or one row)."""
    start, size = 0, 64
    while start < len(order):
        block = order[start : start + size]
        ends = np.cumsum(5 * np.maximum(tokens[block], 0))
        block = block[: max(1, int(np.searchsorted(ends, BLOCK_BYTES, side="right")))]
        yield block
        start, size = start + len(block), min(2 * size, BLOCK_ROWS)


def same_encoding(stored: Encoded, item: Encoded) -> bool:
    """Whether a stored conversation is ``item``, its encoding now."""
    same = (item.id, item.source_value, item.invalid) == (stored.id, stored.source_value, stored.invalid)
    return same and (item.invalid is not None or (_equal(item.ids, stored.ids) and _equal(item.mask, stored.mask)))


def _equal(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    return a is not None and b is not None and np.array_equal(a, b)


def _metas(read: list[tuple[int, int, int, bytes, bool]]) -> list[tuple | None]:
    """The metadata of each of ``read``'s payloads (``parse_metas``)."""
    return parse_metas([payload[5 * max(tokens, 0) :] for _, _, tokens, payload, _ in read])


def parse_metas(metas: Sequence[bytes | bytearray]) -> list[tuple | None]:
    """Stored metadata: ``(id, source value, invalid reason)`` of each (``None`` for one that
    is not that), parsed as one JSON array."""
    try:
        parsed = json.loads(b"[" + b",".join(metas) + b"]")
    except ValueError:
        return [_meta(meta) for meta in metas]
    if len(parsed) != len(metas):  # (one that is not a single JSON value)
        return [_meta(meta) for meta in metas]
    return [_stored_kind(meta) for meta in parsed]


def _meta(data: bytes | bytearray) -> tuple | None:
    """One conversation's stored metadata (``parse_metas``)."""
    try:
        return _stored_kind(json.loads(data))
    except ValueError:
        return None


def _stored_kind(meta: object) -> tuple | None:
    """``meta`` as the metadata a build stores (a list of 3), or ``None``."""
    return tuple(meta) if isinstance(meta, list) and len(meta) == 3 else None


def draft_path(folder: Path) -> Path:
    """A new temporary file's path in an entry's ``folder``: ``DRAFT_PREFIX``, this host,
    this process's pid and a random part (``_abandoned`` reads them)."""
    return folder / f"{DRAFT_PREFIX}{socket.gethostname()}-{os.getpid()}-{os.urandom(8).hex()}"


def _abandoned(name: str) -> bool:
    """Whether a segment's temporary file (``DRAFT_PREFIX``, host, pid) was a process's of
    this host that is gone (killed: a process that fails removes its own). Another host's
    waits until it is stale. (A container of the same host name, whose pids this process
    cannot see, loses a segment it writes: its build warns and goes on without the store.)

    >>> mine = f"{DRAFT_PREFIX}{socket.gethostname()}-{os.getpid()}-00"
    >>> _abandoned(mine), _abandoned(f"{DRAFT_PREFIX}elsewhere-1-00")
    (False, False)
    >>> _abandoned(f"{DRAFT_PREFIX}{socket.gethostname()}-{'9' * 30}-00")  # (no process has that pid)
    True
    """
    host, _, rest = name[len(DRAFT_PREFIX) :].rpartition("-")[0].rpartition("-")
    if host != socket.gethostname() or not (rest.isascii() and rest.isdigit()):
        return False
    try:
        os.kill(int(rest), 0)
    except (ProcessLookupError, OverflowError):
        return True
    except OSError:  # (alive, another user's)
        pass
    return False


def _sound(tokens: Any, meta: Any, offset: Any, flags: Any) -> Any:
    """Whether a record's fields are within what a build writes (numbers, or numpy arrays of them)."""
    return (-1 <= tokens) & (tokens < MAX_TOKENS) & (0 <= meta) & (meta < MAX_META) & (offset >= 0) & (flags <= PASSED)


def _decode(index: int, tokens: int, payload: bytes, passed: bool, meta: tuple | None) -> Encoded | None:
    """A stored conversation's ``Encoded`` (``checked`` where it passed the template check),
    from its payload and its parsed ``meta``; ``None`` where ``meta`` is not valid."""
    if meta is None:
        return None
    row_id, value, invalid = meta
    if tokens < 0:
        return Encoded(index, row_id, None, None, invalid)
    ids = np.frombuffer(payload, "<i4", tokens).astype(np.int32, copy=False)
    mask = np.frombuffer(payload, np.uint8, tokens, 4 * tokens)
    return Encoded(index, row_id, ids, mask, None, passed, value)

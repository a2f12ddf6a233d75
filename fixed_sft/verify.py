"""A built folder -> the list of ways it differs from its manifest (empty when it matches).

Checks, in order: the manifest is a regular file no larger, and of no more values, than a
build's (``read_manifest``), reads, repeats no key, and has the format's fields and no other
(``manifest.read``), each of its type (``1`` is not ``1.0``), with each row hash 64 lowercase
hex digits, each count and size at least 0 and the seed within the order's; values derived from
others (tokens, padding, ratio, rows, the mask type) agree, and ``rows_sha256`` equals the hash
of its own row hashes, and the source mix's conversations and tokens add up to the stats'; the
dataset card's files (``card.files``) are regular files of the recorded sizes and sha256s, and
no card file lies beside them that it does not record; the card's YAML header is one a build
writes where loaders act on it (``card.header_problem``); no other data file lies in the folder
(``foreign_data``); the Parquet file exists with the recorded size and sha256, and has the
format's schema (so no value can wrap into a hash), down to each column's Parquet types, with
no key-value metadata but ``ARROW:schema``; its footer and page headers agree with the rows the
manifest lists before a page is decoded (``reader``: a file that disagrees is named and not
decoded); then a row group at a time, up to the first row past the manifest's: every row reads,
has ``row_tokens`` ids and mask values, no id negative, each mask value 0 or 1 as stored, and
hashes to its recorded row hash (the first bad row is named); the row count (the footer's) and
supervised-token count match; each row's ``metadata.row`` is its number and its segments, each
a non-empty span from a non-negative start, cover ``row_tokens`` tokens, no two in a row naming
one source row; the conversations the segments name (each run of segments naming one source
row, as a build lays them), and those in more than one row, are the stats' counts, and each
source row named is one of ``source.rows``. In a build with boundaries
(``params.emit_boundaries``; its format must then be ``fixed-sft/3``, else ``fixed-sft/2``),
the schema is the one with ``metadata.cu_seqlens``, each row's hash covers them, and they must
be 0 and the end of each of its segments. No value may be null but a segment's ``id``. What the
manifest says of how the rows were made (seed, source, tokenizer, checks, skipped rows) only a
rebuild proves.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import arrow
from .card import header_problem
from .fields import FieldError, loads, show
from .hashes import boundaries, open_regular, row_digest, rows_digest, sha256_file
from .manifest import Manifest, read
from .memory import system_allocator
from .output import CARD_FILES, CARD_NAME, MANIFEST_NAME, PARQUET_NAME, PROMPT, NullValue, first_null, format_of
from .reader import BOUNDARIES, Group, Refused, RowFile, SchemaDiffers
from .source import non_unicode


def verify(folder: str | Path) -> list[str]:
    """The ways built ``folder`` differs from its manifest (the checks of the module docstring); empty when none."""
    folder = Path(folder)
    if (shown := non_unicode(folder)) is not None:
        return [f"{shown}: the path is not valid UTF-8, which pyarrow cannot open; rename it"]
    if not folder.is_dir():
        return [f"{folder}: {'not a folder' if folder.exists() else 'no such folder'}"]
    if (folder / MANIFEST_NAME).exists() and not (folder / MANIFEST_NAME).is_file():
        return [f"{folder / MANIFEST_NAME}: not a file"]
    try:
        manifest = read(read_manifest(folder / MANIFEST_NAME))
        wrong = _check_row_hashes(manifest.row_sha256)
        if wrong:
            return [f"{folder / MANIFEST_NAME}: {wrong}"]
        expected = [bytes.fromhex(h) for h in manifest.row_sha256]  # (the hex strings take twice as much)
        manifest.row_sha256 = []
    except FileNotFoundError:
        return [f"{folder / MANIFEST_NAME}: missing"]
    except (ManifestRefused, FieldError) as error:
        return [f"{folder / MANIFEST_NAME}: {error}"]
    except (OSError, ValueError, TypeError, RecursionError) as error:
        return [f"{folder / MANIFEST_NAME}: unreadable ({described(error)})"]
    rows_sha256, parquet_info, stats = manifest.rows_sha256, manifest.parquet, manifest.stats
    row_tokens, bounded = manifest.params.row_tokens, manifest.params.emit_boundaries

    problems = _check_stats(manifest, len(expected), row_tokens)
    if manifest.format != format_of(bounded):
        kind = "with" if bounded else "without"
        problems.append(
            f"{MANIFEST_NAME}: format is {manifest.format}; a build {kind} boundaries is {format_of(bounded)}"
        )
    if rows_digest(expected) != rows_sha256:
        problems.append(
            f"{MANIFEST_NAME}: rows_sha256 does not match the hash of its row_sha256 list (edited manifest)"
        )
    if len(expected) != stats.rows:
        problems.append(f"{MANIFEST_NAME}: lists {len(expected)} row hashes but stats.rows is {stats.rows}")
    elif not stats.rows:
        problems.append(f"{MANIFEST_NAME}: stats.rows is 0, but a build holds at least one row")

    try:
        problems += _check_card(folder, manifest)
    except OSError as error:
        problems.append(f"{folder}: a card file is unreadable ({described(error)})")
    try:
        found = foreign_data(folder, pinned=manifest.card is not None)
    except Unwalkable as error:
        found = (Path(error.filename or folder), f"{error.strerror}, so what loaders read there is not known")
    if found is not None:
        problems.append(f"{non_unicode(found[0]) or found[0]}: {found[1]}")
    parquet = folder / PARQUET_NAME
    if not parquet.is_file():
        return problems + [f"{parquet}: {'not a file' if parquet.exists() else 'missing'}"]
    size = parquet.stat().st_size
    if size != parquet_info.bytes:
        problems.append(f"{parquet}: {size} bytes, manifest says {parquet_info.bytes}")
    elif sha256_file(parquet) != parquet_info.sha256:
        problems.append(f"{parquet}: sha256 differs from the manifest")
    checks = _RowChecks(expected, row_tokens, bounded)
    try:
        with system_allocator(), RowFile(parquet, len(expected), row_tokens, bounded) as rows:
            columns = VERIFIED + [BOUNDARIES] if bounded else VERIFIED
            for group in rows.groups(columns, limit=len(expected) + 1):  # (the rows after are not the manifest's)
                checks.add(group)
            checks.finish()
            count, read_all = rows.rows, checks.rows == rows.rows
    except SchemaDiffers as error:
        return problems + [f"{parquet}: {error}"]
    except (Refused, NullValue) as error:
        return problems + checks.problems() + [str(error)]
    except Exception as error:  # any read failure means a damaged file
        return problems + checks.problems() + [f"{parquet}: unreadable ({described(error)})"]
    problems += checks.problems("ids", "mask", "content")
    if count != len(expected):
        problems.append(f"{parquet}: {count} rows, manifest lists {len(expected)}")
    if read_all and checks.supervised != stats.supervised_tokens:
        problems.append(f"{parquet}: {checks.supervised} supervised tokens, manifest says {stats.supervised_tokens}")
    problems += checks.problems("untrained")
    if read_all and checks.trainable != stats.trainable_tokens:
        problems.append(f"{parquet}: {checks.trainable} trainable tokens, manifest says {stats.trainable_tokens}")
    problems += checks.problems("messages", "metadata")
    if read_all and not any(p.startswith("row ") for p in checks.problems("metadata")):
        if checks.counted.highest >= manifest.source.rows:
            problems.append(
                f"{parquet}: a segment names source row {checks.counted.highest}, "
                f"but source.rows is {manifest.source.rows}"
            )
        held = {"conversations": checks.conversations, "conversations_split": checks.split}
        problems += [
            f"{MANIFEST_NAME}: stats.{key} is {getattr(stats, key)}, the rows hold {value}"
            for key, value in held.items()
            if getattr(stats, key) != value
        ]
    return problems


# The columns verify reads (a segment's id it does not)
VERIFIED = [
    "messages.list.element.role",
    "messages.list.element.content",
    "metadata.input_ids.list.element",
    "metadata.loss_mask.list.element",
    "metadata.row",
    "metadata.segments.list.element.source_index",
    "metadata.segments.list.element.start",
    "metadata.segments.list.element.end",
]


class _RowChecks:
    """The checks of each row, a row group at a time: the first problem of each kind (named
    by its row), and the counts over the rows seen."""

    KINDS = ("ids", "mask", "content", "untrained", "messages", "metadata")

    def __init__(self, expected: list[bytes], row_tokens: int, bounded: bool = False):
        self.expected, self.row_tokens, self.bounded = expected, row_tokens, bounded
        self.first: dict[str, str] = {}
        self.rows = self.supervised = self.trainable = 0
        self.counted = Conversations()

    def problems(self, *kinds: str) -> list[str]:
        return [self.first[kind] for kind in kinds or self.KINDS if kind in self.first]

    def _note(self, kind: str, problem: str) -> None:
        self.first.setdefault(kind, problem)

    def add(self, group: Group) -> None:
        ids, mask, offsets = group.tokens()
        first, count = group.first, len(offsets) - 1
        cu = stored_boundaries(group.column("metadata"), first) if self.bounded else None
        if "ids" not in self.first and len(ids) and ids.min() < 0:  # (a trainer's embedding lookup fails on one)
            bad = np.flatnonzero(ids < 0)
            row = int(np.searchsorted(offsets, bad[0], side="right")) - 1
            self._note("ids", f"row {first + row}: an input_ids value is {ids[bad[0]]}, not a token id")
        if "mask" not in self.first and len(mask) and (bad := np.flatnonzero((mask < 0) | (mask > 1))).size:
            row = int(np.searchsorted(offsets, bad[0], side="right")) - 1
            self._note("mask", f"row {first + row}: a loss_mask value is {mask[bad[0]]}, not 0 or 1")
        if "content" not in self.first:
            self._check_content(ids, mask.astype(np.uint8), offsets, first, cu)
        self.rows += count
        self.supervised += int(np.count_nonzero(mask))
        supervised = mask != 0
        starts, ends = offsets[:-1], offsets[1:]
        per_row = np.zeros(count, np.int64)
        filled = np.flatnonzero(ends > starts)  # (reduceat takes each start's own value for an empty row)
        if len(filled):
            per_row[filled] = np.add.reduceat(supervised, starts[filled], dtype=np.int64) - supervised[starts[filled]]
        if len(untrained := np.flatnonzero(per_row == 0)):
            self._note(
                "untrained",
                f"row {first + untrained[0]}: no supervised token after token 0 (the format skips such rows)",
            )
        self.trainable += int(np.sum(per_row))
        if "messages" not in self.first and (problem := _check_messages(group.column("messages"), first)):
            self._note("messages", problem)
        if "metadata" not in self.first and (
            problem := check_metadata(group.column("metadata"), first, self.row_tokens)
            or (_check_boundaries(group.column("metadata"), first, cu) if cu is not None else None)
        ):
            self._note("metadata", problem)
        self.counted.add(group.column("metadata"))

    def _check_content(
        self,
        ids: np.ndarray,
        mask: np.ndarray,
        offsets: np.ndarray,
        first: int,
        cu: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        for n in range(len(offsets) - 1):
            lo, hi = offsets[n], offsets[n + 1]
            row = first + n
            if hi - lo != self.row_tokens:
                self._note("content", f"row {row}: {hi - lo} tokens, expected {self.row_tokens}")
                return
            bounds = None if cu is None else cu[0][cu[1][n] : cu[1][n + 1]]
            if row >= len(self.expected) or row_digest(ids[lo:hi], mask[lo:hi], bounds) != self.expected[row]:
                self._note("content", f"row {row}: content differs from its manifest hash")
                return

    def finish(self) -> None:
        self.counted.finish()

    @property
    def conversations(self) -> int:
        return self.counted.conversations

    @property
    def split(self) -> int:
        return self.counted.split


class Conversations:
    """The conversations rows' segments name, and those named by more than one, counted a
    row group at a time (``add`` each group's ``metadata``, then ``finish``): a build lays a
    conversation's segments one after another (in one row, or at the end of one and the
    start of the next), so each run of segments naming one source row is one conversation."""

    def __init__(self) -> None:
        self.conversations = self.split = 0
        self.highest = -1  # the highest source row a segment names
        self._last: object = None  # the source row of the last segment seen, and how many segments in a row name it
        self._run = 0

    def add(self, metadata: pa.StructArray) -> None:
        segments = pc.struct_field(metadata, "segments").flatten()
        indices = pc.struct_field(segments, "source_index")
        values = arrow.to_numpy(arrow.filled(indices, -1))  # (a null is noted by check_metadata)
        if not len(values):
            return
        self.highest = max(self.highest, int(values.max()))
        starts = np.flatnonzero(np.concatenate([[True], values[1:] != values[:-1]]))
        lengths = np.diff(np.concatenate([starts, [len(values)]]))
        if values[0] == self._last:  # the first run goes on from the last group's
            self._run += int(lengths[0])
            starts, lengths = starts[1:], lengths[1:]
        if len(starts):
            self._close_run()
            self.conversations += len(starts) - 1
            self.split += int(np.count_nonzero(lengths[:-1] > 1))
            self._run = int(lengths[-1])
        self._last = values[-1]

    def _close_run(self) -> None:
        if self._run:
            self.conversations += 1
            self.split += self._run > 1
        self._run = 0

    def finish(self) -> None:
        self._close_run()


def _check_messages(messages: pa.ListArray, first: int) -> str | None:
    """Each row's ``messages`` is the format's one placeholder message (``PROMPT``); the
    strings are dictionaries (``reader``), compared by their dictionary's entries."""
    if (row := first_null(messages)) is not None:
        return f"row {first + row}: messages is null"
    (prompt,) = PROMPT
    lengths = arrow.to_numpy(pc.list_value_length(messages))
    good = lengths == 1
    if good.all():  # then the flattened messages are the rows'
        flat = messages.flatten()
        good = arrow.to_numpy(flat.is_valid())
        for key, value in prompt.items():
            good &= _equals(flat.field(key), value) & arrow.to_numpy(flat.field(key).is_valid())
    if not good.all():
        return f"row {first + int(np.argmin(good))}: messages is not {PROMPT}"
    return None


def _equals(strings: pa.Array, value: str) -> np.ndarray:
    """Which of ``strings`` (a dictionary array, or plain) are ``value``, without decoding a dictionary."""
    if pa.types.is_dictionary(strings.type):
        entries = arrow.to_numpy(arrow.filled(pc.equal(strings.dictionary, arrow.scalar(value, pa.string())), False))
        indices = arrow.to_numpy(arrow.filled(strings.indices, 0))
        return entries[indices] if len(entries) else np.zeros(len(strings), bool)
    return arrow.to_numpy(arrow.filled(pc.equal(strings, arrow.scalar(value, pa.string())), False))


# A manifest lists a row hash per row: 70 bytes each as a build writes them (indent 1). The
# manifest of a build of MANIFEST_ROWS rows (8.2 billion tokens at 8192 a row) fits in
# MANIFEST_BYTES with 32 MiB to spare for the rest (skipped rows, source files); a larger
# file is not read. Parsing JSON takes far more memory than its bytes where values are small
# (``{}`` is 3 bytes and a 64-byte dict), so a manifest is parsed only when the objects and
# arrays it may hold (each ``{`` or ``[``) and the values (each ``,`` or ``:`` more) bound
# what parsing takes to MANIFEST_MEMORY: a build's manifest of MANIFEST_ROWS rows needs
# about 210 MiB by that count.
MANIFEST_ROWS = 1_000_000
MANIFEST_BYTES = MANIFEST_ROWS * 72 + (32 << 20)
MANIFEST_MEMORY = 384 << 20
_CONTAINER_COST, _VALUE_COST = 160, 64  # bytes of Python objects: a dict or list, and any value (str, number)


class ManifestRefused(ValueError):
    """A manifest not read: larger, or of more values, than a build's."""


def read_manifest(path: Path) -> Any:
    """The JSON document in manifest file ``path`` (read by ``fields.loads``), read only
    when it is a regular file of at most ``MANIFEST_BYTES`` whose count of values bounds
    parsing to ``MANIFEST_MEMORY``; ``ManifestRefused`` otherwise."""
    opened = open_regular(path)
    if opened is None:
        raise ManifestRefused("not a file")
    with opened as f:
        info = os.fstat(f.fileno())
        if info.st_size > MANIFEST_BYTES:
            raise ManifestRefused(
                f"{info.st_size} bytes, more than the {MANIFEST_BYTES} a manifest of "
                f"{MANIFEST_ROWS:,} rows takes; not read"
            )
        data = f.read(MANIFEST_BYTES + 1)
    if len(data) > MANIFEST_BYTES:  # (grown since)
        raise ManifestRefused(
            f"more than the {MANIFEST_BYTES} bytes a manifest of {MANIFEST_ROWS:,} rows takes; not read"
        )
    containers = data.count(b"{") + data.count(b"[")
    values = containers + data.count(b",") + data.count(b":") + 1
    need = _CONTAINER_COST * containers + _VALUE_COST * values + 2 * len(data)
    if need > MANIFEST_MEMORY:
        raise ManifestRefused(
            f"holds up to {containers} objects and arrays and {values} values: about "
            f"{need >> 20} MiB to parse, more than the {MANIFEST_MEMORY >> 20} MiB a manifest may "
            "take; not read"
        )
    text = data.decode("utf-8")
    del data
    return loads(text)


_HEX64 = re.compile("[0-9a-f]{64}")


def _check_row_hashes(hashes: list[str]) -> str | None:
    """The first entry of ``row_sha256`` that is not 64 lowercase hex digits, or ``None``."""
    bad = next((n for n, h in enumerate(hashes) if not _HEX64.fullmatch(h)), None)
    return None if bad is None else f"row_sha256[{bad}] is {show(hashes[bad])}, not 64 lowercase hex digits"


def _check_stats(manifest: Manifest, rows: int, row_tokens: int) -> list[str]:
    """Manifest values that follow from others must agree with them."""
    stats, params = manifest.stats, manifest.params
    tokens = rows * row_tokens
    derived: dict[str, tuple[int | float | str, int | float | str]] = {
        "stats.tokens": (stats.tokens, tokens),
        "stats.padding_tokens": (stats.padding_tokens, 0),
        "stats.supervised_token_ratio": (
            stats.supervised_token_ratio,
            stats.supervised_tokens / tokens if tokens else 0.0,
        ),
    }
    if params.rows != "all":
        derived["params.rows"] = (params.rows, rows)
    derived["loss_mask.type"] = (manifest.loss_mask.type, params.loss_mask_type)
    # a build without --skip-invalid stops at an invalid row: it skips none
    derived["the skipped_invalid rows"] = (len(manifest.skipped_invalid), stats.invalid_rows_skipped)
    if not params.skip_invalid:
        derived["stats.invalid_rows_skipped without skip_invalid"] = (stats.invalid_rows_skipped, 0)
    if (mix := manifest.source_mix) is not None:  # every kept conversation, and every token, has one source
        derived["the source_mix conversations"] = (sum(s.conversations for s in mix), stats.conversations)
        derived["the source_mix tokens"] = (sum(s.tokens for s in mix), stats.tokens)
    return [
        f"{MANIFEST_NAME}: {key} is {show(got)}, expected {show(want)}"
        for key, (got, want) in derived.items()
        if got != want
    ]


def _check_card(folder: Path, manifest: Manifest) -> list[str]:
    """The dataset card's files are the ones the manifest records (``card.files``: names
    of ``CARD_FILES``, ``README.md`` among them), each a regular file of the recorded size
    and sha256; a card file the manifest does not record is a difference too."""
    recorded = manifest.card.files if manifest.card is not None else {}
    problems = [
        f"{MANIFEST_NAME}: card.files names {show(name)}, not one of {', '.join(CARD_FILES)}"
        for name in recorded
        if name not in CARD_FILES
    ]
    if manifest.card is not None and CARD_NAME not in recorded:
        problems.append(f"{MANIFEST_NAME}: card.files lacks {CARD_NAME}")
    for name in CARD_FILES:
        path = folder / name
        if name not in recorded:
            if os.path.lexists(path):
                problems.append(f"{path}: a card file the manifest does not record")
            continue
        if not os.path.lexists(path):
            problems.append(f"{path}: missing")
        elif path.is_symlink() or not path.is_file():
            problems.append(f"{path}: not a regular file")
        elif (size := path.stat().st_size) != recorded[name].bytes:
            problems.append(f"{path}: {size} bytes, manifest says {recorded[name].bytes}")
        elif sha256_file(path) != recorded[name].sha256:
            problems.append(f"{path}: sha256 differs from the manifest")
        elif name == CARD_NAME and (problem := header_problem(path, manifest)) is not None:
            problems.append(f"{path}: {problem}")
    return problems


# What loaders take for rows in a folder. polars reads the files its glob names
# (``**/*.parquet``: hidden folders too); pyarrow, skipping what it cannot read, any Parquet
# file outside names that start with ``.`` or ``_``. ``datasets`` reads the files its card's
# ``configs`` names, else those with a dot-part of a format it reads rows from (not its image,
# audio, video or PDF folders), compressed too, outside names that start with ``.`` and
# folders that start with ``__``; it takes which files to load, or their features, from
# ``LOADER_FILES`` whatever the card says. A build's folder holds none but its own.
PARQUET_SUFFIXES = {".parquet", ".geoparquet", ".gpq"}
DATA_SUFFIXES = {
    *PARQUET_SUFFIXES,
    *(".arrow", ".feather", ".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".txt", ".tar", ".xml", ".h5", ".hdf5"),
    *(".lance", ".vortex", ".tsfile", ".eval", ".conll", ".conllu", ".fa", ".fasta", ".fna", ".faa", ".ffn"),
    *(".frn", ".afa", ".fq", ".fastq", ".gb", ".gbk", ".genbank", ".pdb", ".ent", ".cif", ".mmcif", ".md", ".toml"),
    *(".gz", ".bz2", ".xz", ".zst", ".lz4", ".zip"),
}
LOADER_FILES = (".huggingface.yaml", "dataset_infos.json")


class Unwalkable(OSError):
    """A part of the folder that ``foreign_data`` cannot read, so cannot tell what it holds."""


FOREIGN = "a data file the build did not write, which loaders of the folder read as rows"


def foreign_data(folder: Path, pinned: bool = True) -> tuple[Path, str] | None:
    """A file in ``folder`` or a folder under it that loaders would read as rows (or as
    which files to load, or their features) and the build did not write, or a link to a
    folder (which loaders may follow), and what it is; ``None`` where there is none. Anywhere, a name that
    ends in a ``PARQUET_SUFFIXES``; outside hidden names (``.cache``, ``.gitattributes``),
    a file with Parquet's bytes (the card's files too), and ``pinned`` aside (the card
    names its data: ``configs``), a name with a ``DATA_SUFFIXES`` part outside folders
    that start with ``__``. ``Unwalkable`` for a part it cannot read.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> for name in ("train.parquet", "manifest.json", "notes.txt", ".cache/x.parquet.lock", "__x__/y.csv"):
    ...     (folder / name).parent.mkdir(exist_ok=True)
    ...     (folder / name).touch()
    >>> foreign_data(folder) is None
    True
    >>> foreign_data(folder, pinned=False)[0].name
    'notes.txt'
    >>> (folder / ".cache" / "x.parquet").touch()
    >>> foreign_data(folder)[0].name
    'x.parquet'
    """
    for name in LOADER_FILES:
        if os.path.lexists(folder / name):
            return folder / name, "it tells loaders what to read, and the build did not write it"

    def unreadable(error: OSError) -> None:
        raise Unwalkable(error.errno, error.strerror, error.filename)

    try:
        for root, folders, files in os.walk(folder, onerror=unreadable):  # (links to folders not followed)
            at = Path(root)
            inside = at.relative_to(folder).parts
            hidden, dunder = (any(part.startswith(prefix) for part in inside) for prefix in (".", "__"))
            if not hidden and (link := next((n for n in sorted(folders) if (at / n).is_symlink()), None)):
                return at / link, "a link to a folder the build did not make, which loaders may follow to rows"
            folders.sort()
            for name in sorted(files):
                if at == folder and name in (PARQUET_NAME, MANIFEST_NAME):
                    continue
                path = at / name
                if Path(name).suffix.lower() in PARQUET_SUFFIXES:
                    return path, FOREIGN
                if hidden or name.startswith("."):
                    continue
                parts = {suffix.lower() for suffix in Path(name).suffixes}
                card = at == folder and name in CARD_FILES
                datasets_reads = not pinned and not card and not dunder
                if (datasets_reads and parts & DATA_SUFFIXES) or _parquet_bytes(path):
                    return path, FOREIGN
    except RecursionError:
        raise Unwalkable(0, "its folders nest too deep to be walked", str(folder)) from None
    return None


def _parquet_bytes(path: Path) -> bool:
    """Whether ``path`` is a regular file that starts as Parquet does (``Unwalkable`` where
    it cannot be read)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # (a FIFO is not opened)
            return False
        with open(path, "rb") as f:
            return f.read(4) == b"PAR1"
    except FileNotFoundError:  # (a dangling link)
        return False
    except OSError as error:
        raise Unwalkable(error.errno, error.strerror, str(path)) from None


def described(error: BaseException) -> str:
    """``TYPE: message`` on one line (pyarrow's messages may end in a newline)."""
    return f"{type(error).__name__}: {' '.join(str(error).split())}"


def check_metadata(metadata: pa.StructArray, first: int, row_tokens: int) -> str | None:
    """The first problem of rows ``metadata`` (row ``first`` on): a null, a ``metadata.row``
    that is not its row's number, a segment that is not a non-empty span from a
    non-negative start or names a negative source row, two segments in a row that name
    one source row, or segments that do not cover ``row_tokens``."""
    try:
        rows, segments = (pc.struct_field(metadata, key) for key in ("row", "segments"))
        spans = segments.flatten()
        fields = {key: pc.struct_field(spans, key) for key in ("source_index", "start", "end")}
    except Exception as error:  # a missing field means a damaged file
        return f"row {first}: metadata unreadable ({described(error)})"
    parents = arrow.to_numpy(pc.list_parent_indices(segments))
    checks = [
        ("metadata", metadata, None),
        ("metadata.row", rows, None),
        ("metadata.segments", segments, None),
        ("a metadata segment", spans, parents),
    ]
    checks += [(f"a metadata segment's {key}", values, parents) for key, values in fields.items()]
    for name, values, row_of in checks:  # a segment's id may be null (a source row without one)
        if (null := first_null(values)) is not None:  # struct_field keeps its parents' nulls
            return f"row {first + (null if row_of is None else row_of[null])}: {name} is null"
    numbers = arrow.to_numpy(rows)
    starts, ends = fields["start"], fields["end"]
    bad = np.flatnonzero(numbers != np.arange(first, first + len(numbers)))
    if len(bad):
        return f"row {first + bad[0]}: metadata.row is {numbers[bad[0]]}"
    spans = arrow.to_numpy(pc.subtract(ends, starts)).astype(np.int64)
    bad = np.flatnonzero((spans <= 0) | (arrow.to_numpy(starts) < 0))
    if len(bad):
        return f"row {first + parents[bad[0]]}: a metadata segment spans [{starts[bad[0]]}, {ends[bad[0]]})"
    indices = arrow.to_numpy(fields["source_index"])
    bad = np.flatnonzero(indices < 0)
    if len(bad):
        return f"row {first + parents[bad[0]]}: a metadata segment names source row {indices[bad[0]]}"
    bad = np.flatnonzero((indices[1:] == indices[:-1]) & (parents[1:] == parents[:-1]))
    if len(bad):  # (a conversation is one segment of a row: a trainer reading two would split it)
        return f"row {first + parents[bad[0]]}: two metadata segments in a row name source row {indices[bad[0]]}"
    covered = np.bincount(parents, weights=spans, minlength=len(numbers))
    bad = np.flatnonzero(covered != row_tokens)
    if len(bad):
        return f"row {first + bad[0]}: metadata.segments cover {int(covered[bad[0]])} tokens, not {row_tokens}"
    return None


def stored_boundaries(metadata: pa.StructArray, first: int) -> tuple[np.ndarray, np.ndarray]:
    """``(values, offsets)`` of rows ``metadata``'s ``cu_seqlens`` (row ``first`` on): their
    flat values and row offsets into them from 0; ``NullValue`` naming the row for a null."""
    column = metadata.field("cu_seqlens")
    if (row := first_null(column)) is not None:
        raise NullValue(f"row {first + row}: cu_seqlens is null")
    offsets = arrow.to_numpy(column.offsets)
    if (value := first_null(column.flatten())) is not None:
        row = int(np.searchsorted(offsets - offsets[0], value, side="right")) - 1
        raise NullValue(f"row {first + row}: a value in cu_seqlens is null")
    return arrow.to_numpy(column.flatten()), (offsets - offsets[0]).astype(np.int64)


def _check_boundaries(metadata: pa.StructArray, first: int, cu: tuple[np.ndarray, np.ndarray]) -> str | None:
    """The first row (row ``first`` on) whose ``cu_seqlens`` are not those of its segments
    (0, then the end of each segment in the row), or ``None``."""
    segments = pc.struct_field(metadata, "segments")
    spans = segments.flatten()
    lengths = pc.subtract(pc.struct_field(spans, "end"), pc.struct_field(spans, "start"))
    lengths = arrow.to_numpy(lengths).astype(np.int64)
    starts = arrow.to_numpy(segments.offsets) - segments.offsets[0].as_py()
    values, offsets = cu
    for n in range(len(metadata)):
        stored = values[offsets[n] : offsets[n + 1]]
        if not np.array_equal(stored, boundaries(lengths[starts[n] : starts[n + 1]])):
            return f"row {first + n}: metadata.cu_seqlens is not 0 and the end of each of its segments"
    return None


def published_comparison(manifest: dict, published: dict) -> list[tuple[str, object, object, bool]]:
    """``(key, built, published, equal)`` for each published value; the ratio is compared
    at the precision it was published with."""
    built = {
        "rows_sha256": manifest["rows_sha256"],
        "parquet_sha256": manifest["parquet"]["sha256"],
        "parquet_bytes": manifest["parquet"]["bytes"],
        "supervised_token_ratio": manifest["stats"]["supervised_token_ratio"],
        "padding_tokens": manifest["stats"]["padding_tokens"],
    }
    result = []
    for key, value in published.items():
        if key in built:
            mine = built[key]
            if key == "supervised_token_ratio":
                mine = round(mine, len(str(value).partition(".")[2]))
            result.append((key, mine, value, mine == value))
    return result

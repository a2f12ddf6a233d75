"""A source: its files, found, opened and checked, with their row counts and stamps.

A source is an ordered list of ``.parquet`` / ``.jsonl`` files in the Tulu schema
(``id``, ``messages`` = [{``role``, ``content``}], ...), with, for agentic conversations,
a ``tools`` column beside ``messages``. Row ``i`` is the i-th row of
the files taken in order (a folder's files sorted by path). A Hugging Face dataset is
downloaded at a pinned revision into the Hub cache first. ``fixed_sft.bands`` reads the
rows, and ``fixed_sft.records`` gives each row as a dict, which ``fixed_sft.conversation``
checks against the schema.
"""

from __future__ import annotations

import codecs
import errno
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .conversation import is_unicode
from .hub import HubUnreachable, download_dataset, is_hub_id, raise_cache_damage
from .pages import largest_page
from .reader import bare_metadata

SUFFIXES = (".parquet", ".jsonl")
COLUMNS = ("id", "messages", "tools")  # the Parquet columns a build encodes
# A string column a build also reads, for the dataset card's source mix only (Tulu 3's rows
# name their subset in it); it is not part of a row's size, and another type is not read.
SOURCE_COLUMN = "source"
# A file's ``source`` column is read where it holds strings and each of its column chunks at most
# this many bytes uncompressed (so that decoding it adds little); a larger one is not read, and
# its rows count as without a ``source``.
SOURCE_CHUNK_BYTES = 16 << 20
_DATA_PATTERNS = tuple(f"*{suffix}" for suffix in SUFFIXES)
# A file of a set of shards, as the Hub's datasets name them: ``data/train-00002-of-00006.parquet``.
# (older ``datasets`` releases add a fingerprint: ``train-00002-of-00006-9c4f1a2b3d.parquet``)
_SHARD = re.compile(r"(?P<stem>.+)-(?P<k>\d+)-of-(?P<n>\d+)(?:-[0-9a-f]+)?(?P<suffix>\.parquet|\.jsonl)")
_WILDCARDS = re.compile(r"[*?\[]|/$")  # (a pattern that chooses files by a glob, or a folder's)
# A file that holds rows a build does not read: compressed, or named in capitals. A folder's
# such file is refused, not left out, where the files are not chosen (``--source-files``).
_UNREAD = re.compile(r"\.(?:parquet|jsonl)(?:\.(?:gz|bz2|xz|zst|zstd|lz4|zip))?$", re.IGNORECASE)
# The largest Parquet page (uncompressed) of the columns a build reads: a reader decodes a whole
# page, taking about 4 times its size in memory with the values it gives, before any value of it
# (a source whose pages may be over fixed_sft.bands.SHARED_PAGE_BYTES is read a file at a time, not READ_THREADS).
# A larger page stops the build when the source is opened.
MAX_PAGE_BYTES = 64 << 20


class SourceError(Exception):
    """The source cannot be read (missing, unreachable, or not in the expected format)."""


class SourceUnreachable(SourceError):
    """A Hub dataset that neither the Hub nor its cache can give: ``problem``, then
    advice for a build."""

    def __init__(self, problem: str):
        super().__init__(
            f"{problem}. Without the Hub, download the files elsewhere and pass --source PATH (a .parquet/.jsonl "
            "file or a folder of them) with --source-revision REV and --source-license LICENSE, after NAME for a "
            "named build (README: 'Build offline')."
        )
        self.problem = problem


class Stamp(NamedTuple):
    """What a write to a file changes: its size or times; a file put in its place, its inode.
    The change time is the one a writer cannot set back (``touch -r`` sets the others)."""

    bytes: int
    mtime_ns: int
    ctime_ns: int
    inode: int

    @classmethod
    def of(cls, status: os.stat_result) -> Stamp:
        """The stamp of a file's ``os.stat`` (or ``os.fstat``) result."""
        return cls(status.st_size, status.st_mtime_ns, status.st_ctime_ns, status.st_ino)


def changed(path: Path) -> SourceError:
    """The error for a source file written to while the build read it."""
    return SourceError(f"{path} changed while the build read it; build from files that stay unchanged")


def check_stamp(path: Path, stamp: Stamp) -> None:
    """``changed(path)`` where the file's ``Stamp`` is not ``stamp``, or it is gone."""
    if stamp_if_any(path) != stamp:
        raise changed(path)


def unreadable(path: Path, error: OSError) -> SourceError:
    """The error for a source file the system would not let the build read."""
    return SourceError(f"{path}: cannot read ({error.strerror or error})")


@dataclass(frozen=True)
class Source:
    """Resolved source files and what the manifest says about them."""

    name: str
    revision: str | None
    license: str | None
    root: Path  # the folder the files were found in; the manifest's file paths are relative to it
    files: tuple[Path, ...]
    row_counts: tuple[int, ...]
    stamps: tuple[Stamp, ...]  # each file's when opened
    patterns: tuple[str, ...] | None = None  # the globs that chose the files (None: every data file)
    page_bytes: int = 0  # at least the largest Parquet page of the columns read (0: JSONL)
    source_columns: tuple[bool, ...] = ()  # per Parquet file: whether its ``source`` column is read

    @property
    def num_rows(self) -> int:
        return sum(self.row_counts)

    def check_unchanged(self) -> None:
        """Raise ``SourceError`` naming a file whose ``Stamp`` is not what it was when the
        source was opened: its rows, count and hash may be of two versions."""
        for path, stamp in zip(self.files, self.stamps):
            check_stamp(path, stamp)

    def locate(self, index: int) -> tuple[Path, int]:
        """The file holding global row ``index``, and the row's number in that file."""
        ends = np.cumsum(self.row_counts)
        k = int(np.searchsorted(ends, index, side="right"))
        return self.files[k], index - int(ends[k] - self.row_counts[k])


def open_source(
    source: str, revision: str | None = None, license: str | None = None, patterns: tuple[str, ...] | None = None
) -> Source:
    """Resolve ``source`` (a local file/folder, else a Hub dataset id), keep the data
    files whose path matches one of ``patterns`` (all when ``None``), and count their rows."""
    path = Path(source)
    if not path.exists():
        if not is_hub_id(source) or path.suffix in SUFFIXES:  # (a data file's name: a path, mistyped)
            raise SourceError(f"source {source!r}: no such file or folder")
        if not revision:
            raise SourceError(
                f"source {source!r} is not a local file or folder; as a Hub dataset id it needs --source-revision"
            )
        try:
            path, revision = download_dataset(source, revision, patterns or _DATA_PATTERNS)
        except HubUnreachable as error:
            raise SourceUnreachable(str(error)) from None
    files = _data_files(path, patterns)
    try:
        stamps = tuple(file_stamp(f) for f in files)
        counts = tuple(_count_rows(f) for f in files)
        page_bytes, source_columns = 0, ()
        if files[0].suffix == ".parquet":
            _check_parquet_types(files)
            page_bytes_each, source_columns = zip(*map(_check_parquet_file, files))
            page_bytes = max(page_bytes_each)
    except SourceError:
        raise_cache_damage(files, SourceError)  # a damaged cached file explains the error better
        raise
    folder = path if path.is_dir() else path.parent
    return Source(source, revision, license, folder, files, counts, stamps, patterns, page_bytes, source_columns)


def _small_source_column(file: pq.ParquetFile, meta: pq.FileMetaData) -> bool:
    """Whether ``file`` has a string ``source`` column whose chunks each hold at most
    ``SOURCE_CHUNK_BYTES`` uncompressed (``meta``: its bare metadata)."""
    schema = file.schema_arrow
    if SOURCE_COLUMN not in schema.names:
        return False
    kind = schema.field(SOURCE_COLUMN).type
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if kind not in (pa.string(), pa.large_string(), pa.string_view()):
        return False
    leaf = next(n for n in range(len(file.schema)) if file.schema.column(n).path == SOURCE_COLUMN)
    return all(
        meta.row_group(g).column(leaf).total_uncompressed_size <= SOURCE_CHUNK_BYTES for g in range(meta.num_row_groups)
    )


def stamp_if_any(path: Path) -> Stamp | None:
    """The ``Stamp`` of the file at ``path``; ``None`` where it cannot be read (gone, say)."""
    try:
        return file_stamp(path)
    except OSError:
        return None


def file_stamp(path: Path) -> Stamp:
    """The ``Stamp`` of the file at ``path`` (``OSError`` where it cannot be read)."""
    return Stamp.of(path.stat())


def _repeated_field(kind: pa.DataType) -> str | None:
    """A field name that some struct within ``kind`` holds twice (which no record can
    hold, as a JSON object's keys are one each), or ``None``.

    >>> _repeated_field(pa.list_(pa.struct([("role", pa.string()), ("role", pa.string())])))
    'role'
    >>> _repeated_field(pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))) is None
    True
    """
    if pa.types.is_struct(kind):
        names = [kind.field(k).name for k in range(kind.num_fields)]
        if len(set(names)) < len(names):
            return next(name for name in names if names.count(name) > 1)
        children = [kind.field(k).type for k in range(kind.num_fields)]
    elif pa.types.is_map(kind):
        children = [kind.key_type, kind.item_type]
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        children = [kind.value_type]
    else:
        return None
    return next((found for child in children if (found := _repeated_field(child)) is not None), None)


def _check_parquet_types(files: tuple[Path, ...]) -> None:
    """Every Parquet file has a ``messages`` column, of types that combine into one without
    changing a value (``_altered``: as ``string`` and ``large_string`` do, or message
    structs with other keys, whose missing keys are null, which counts as absent): a chunk
    of the packing order interleaves rows of every file; so do the ``tools`` columns of the
    files that have one. An ``id`` column holds strings or integers (their text is the id)."""
    combined: dict[str, pa.Schema] = {}
    for path in files:
        schema = pq.read_schema(path)
        if "messages" not in schema.names:
            raise SourceError(f"{path}: no 'messages' column")
        for name in ("id", "messages", "tools", "source"):
            if schema.names.count(name) > 1:
                raise SourceError(f"{path}: {schema.names.count(name)} columns are named {name!r}")
            if name in schema.names and (repeated := _repeated_field(schema.field(name).type)) is not None:
                raise SourceError(f"{path}: {name!r} has two fields named {repeated!r} in one struct")
        if "id" in schema.names and not _is_id_type(schema.field("id").type):
            raise SourceError(f"{path}: 'id' is {schema.field('id').type}; ids must be strings or integers")
        for name in ("messages", "tools"):
            if name not in schema.names:
                continue
            column = pa.schema([schema.field(name)])
            earlier = combined.get(name)
            try:
                combined[name] = (
                    column if earlier is None else pa.unify_schemas([earlier, column], promote_options="permissive")
                )
            except (pa.ArrowTypeError, pa.ArrowInvalid):
                assert earlier is not None  # the first file's schema is taken as it is: only a later one can fail
                raise SourceError(
                    f"{path}: {name!r} is {column.field(0).type}, which does not combine with the earlier "
                    f"files' {earlier.field(0).type}; the files of a source must agree"
                ) from None
            if earlier is not None and (why := _altered(earlier.field(0).type, column.field(0).type, name)):
                raise SourceError(
                    f"{path}: its {name!r} and the earlier files' cannot be read together unchanged ({why}); "
                    "the files of a source must agree"
                )


def _altered(earlier: pa.DataType, later: pa.DataType, name: str) -> str | None:
    """Why values of types ``earlier`` and ``later`` would not all read as they are once
    promoted to one type (``unify_schemas``, which takes them both): numbers of one kind
    read as another's (an integer as a float, a signed as an unsigned, a decimal), text as
    bytes, JSON text as strings, or, in what a template renders as JSON (the ``tools``, a
    message's ``tool_calls``: field ``name`` so far), an object given the other's keys
    (null) or their order. A missing or all-null value reads as null either way; ``None``
    where none changes.

    >>> args = lambda *keys: pa.struct([(k, pa.int64()) for k in keys])
    >>> _altered(pa.int32(), pa.float64(), "x"), _altered(args("a"), args("a", "b"), "messages")
    ('integers in one, floats in the other', None)
    >>> _altered(args("a"), args("a", "b"), "tool_calls")
    'tool_calls with other keys, or in another order'
    """
    if pa.types.is_null(earlier) or pa.types.is_null(later):
        return None
    extensions = [t.extension_name if isinstance(t, pa.BaseExtensionType) else None for t in (earlier, later)]
    if extensions[0] != extensions[1]:
        return f"{name} of JSON text in one, of other values in the other"
    if extensions[0] is not None:
        return _altered(earlier.storage_type, later.storage_type, name)
    if _is_list(earlier) and _is_list(later):
        return _altered(earlier.value_type, later.value_type, name)
    if pa.types.is_struct(earlier) and pa.types.is_struct(later):
        names = [earlier.field(k).name for k in range(earlier.num_fields)]
        others = [later.field(k).name for k in range(later.num_fields)]
        if name in RENDERED and names != others:
            return f"{name} with other keys, or in another order"
        for field in (later.field(k) for k in range(later.num_fields)):
            if field.name in names:
                inner = field.name if name not in RENDERED else name
                if why := _altered(earlier.field(field.name).type, field.type, inner):
                    return why
        return None
    kinds = (_kind(earlier), _kind(later))
    if kinds[0] != kinds[1] and None not in kinds:
        return f"{kinds[0]} in one, {kinds[1]} in the other"
    return None


def _kind(kind: pa.DataType) -> str | None:
    """What a scalar type's values read as, where promoting to another type changes them."""
    checks = (
        (pa.types.is_signed_integer, "integers"),
        (pa.types.is_unsigned_integer, "unsigned integers"),
        (pa.types.is_floating, "floats"),
        (pa.types.is_decimal, "decimals"),
        (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t), "text"),
        (lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t), "bytes"),
    )
    return next((what for check, what in checks if check(kind)), None)


RENDERED = ("tools", "tool_calls")  # (what a template may render as JSON: an object as it is, keys in order)


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)


def _is_rows(schema: pa.Schema) -> bool:
    """Whether a Parquet schema is a fixed-sft build's rows (``metadata`` with ``input_ids``,
    ``loss_mask`` and ``segments``), as a build's ``train.parquet`` or a copy of it has."""
    index = schema.get_field_index("metadata")
    kind = schema.field(index).type if index >= 0 else pa.null()
    names = {kind.field(i).name for i in range(kind.num_fields)} if pa.types.is_struct(kind) else set()
    return {"input_ids", "loss_mask", "segments"} <= names


def _check_parquet_file(path: Path) -> tuple[int, bool]:
    """At least the largest page (uncompressed) in the columns a build encodes (``id`` and
    ``messages``, ``tools``): the largest such column chunk's size, or where one is larger than
    ``MAX_PAGE_BYTES``, its largest page, read a page header at a time; ``SourceError``
    naming the row group and column for a page over ``MAX_PAGE_BYTES``. And whether the
    file's ``source`` column is read (``SOURCE_CHUNK_BYTES``)."""
    try:
        file = pq.ParquetFile(path)
        if _is_rows(file.schema_arrow):
            raise SourceError(f"{path} holds a fixed-sft build's rows (packed token ids), not conversations")
        meta = bare_metadata(path)  # (not ``file.metadata``: a column's, asked for, may abort the process)
        leaves = 0
        read: list[int] = []  # the column indices a build reads
        for field in file.schema_arrow:
            count = _leaves(field.type)
            if field.name in COLUMNS:
                read += range(leaves, leaves + count)
            leaves += count
        if leaves != meta.num_columns:  # a schema these rules do not map: every column is read as a whole
            read = list(range(meta.num_columns))
        bound = 0
        with path.open("rb") as f:
            for group in range(meta.num_row_groups):
                columns = meta.row_group(group).num_columns
                if columns != meta.num_columns:
                    raise SourceError(f"{path}: row group {group} has {columns} columns, its schema {meta.num_columns}")
                for column in read:
                    chunk = meta.row_group(group).column(column)
                    largest = chunk.total_uncompressed_size
                    if largest > MAX_PAGE_BYTES:
                        first = chunk.dictionary_page_offset if chunk.has_dictionary_page else None
                        largest = largest_page(f, first or chunk.data_page_offset, chunk.total_compressed_size)
                        if largest is None:  # headers that cannot be read: the reader reports the damage
                            largest = chunk.total_uncompressed_size
                        elif largest > MAX_PAGE_BYTES:
                            raise SourceError(
                                f"{path}: row group {group}, column {chunk.path_in_schema}: a page of {largest:,} "
                                f"bytes, over the {MAX_PAGE_BYTES:,} bytes (MAX_PAGE_BYTES) a build decodes at once "
                                "(a reader decodes whole pages, and pyarrow's writer puts up to 1,024 values in a "
                                "page); rewrite the file in smaller pages, as pyarrow.parquet.write_table(table, "
                                "path, write_batch_size=1) writes it, or as JSONL"
                            )
                    bound = max(bound, largest)
        return bound, _small_source_column(file, meta)
    except (pa.ArrowException, OSError, ValueError) as error:
        raise SourceError(f"{path}: not a readable Parquet file ({error})") from None


def _leaves(kind: pa.DataType) -> int:
    """The Parquet leaf columns an Arrow type is stored in."""
    if pa.types.is_struct(kind):
        return sum(_leaves(kind.field(k).type) for k in range(kind.num_fields))
    if pa.types.is_map(kind):
        return _leaves(kind.key_type) + _leaves(kind.item_type)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _leaves(kind.value_type)
    if pa.types.is_dictionary(kind):
        return _leaves(kind.value_type)
    return 1


def _is_id_type(kind: pa.DataType) -> bool:
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return (
        pa.types.is_null(kind)
        or pa.types.is_integer(kind)
        or kind in (pa.string(), pa.large_string(), pa.string_view())
    )


def _data_files(path: Path, patterns: tuple[str, ...] | None = None) -> tuple[Path, ...]:
    """A file, or a folder's .parquet/.jsonl files sorted by their path relative to the
    folder as a '/'-separated string (code point order), but for those under a name that
    starts with ``.`` (hidden, as the datasets library leaves them); with ``patterns``, those whose
    path (a file's: its name) matches one of them, as huggingface_hub's ``allow_patterns``
    match (``fnmatch``, where ``*`` also matches '/', and ``dir/`` means ``dir/*``). Each
    must be a regular file or a link to one: a FIFO or a link to nothing of such a name
    is refused, not skipped (a folder of such a name is searched for files). Without
    ``patterns``, a link to a folder is refused, as is a compressed data file or one whose
    suffix is in capitals (``_UNREAD``), and a folder that cannot be read: their rows would
    be left out unsaid."""
    from huggingface_hub.utils import filter_repo_objects

    def name(p: Path) -> str:
        return p.name if p == path else p.relative_to(path).as_posix()

    if not path.is_file() and not path.is_dir():
        raise _not_regular(path)
    found = [path] if path.is_file() else _walk(path, patterns is None)
    chosen = filter_repo_objects(found, allow_patterns=None if patterns is None else list(patterns), key=name)
    files = sorted(chosen, key=name)
    if not path.is_file():
        _no_builds_in(path, files)
        for p in files:
            if not p.is_symlink() and not p.is_file():
                raise _not_regular(p)
            try:
                p.stat()
            except OSError as error:  # (to nothing, or in a loop)
                missing = error.errno == errno.ENOENT
                reason = "to a file that does not exist" if missing else os.strerror(error.errno or 0)
                raise SourceError(f"{p}: a link that cannot be followed ({reason})") from None
            if not p.is_file():
                raise SourceError(f"{p}: a link to something that is not a file")
    if not files:
        matching = f" matching {' or '.join(patterns)}" if patterns is not None else ""
        hint = " (JSON Lines files are read named .jsonl)" if any(path.rglob("*.json")) else ""
        raise SourceError(f"no .parquet or .jsonl files{matching} in {path}{hint}")
    for f in files:
        if f.suffix not in SUFFIXES:
            raise SourceError(f"{f}: not a .parquet or .jsonl file")
        if (shown := non_unicode(f)) is not None:
            raise SourceError(f"{shown}: the path is not valid UTF-8, which a manifest cannot record; rename it")
    if len({f.suffix for f in files}) > 1:
        raise SourceError(f"{path} mixes .parquet and .jsonl files; use one format")
    globs = None if patterns is None else [pattern for pattern in patterns if _WILDCARDS.search(pattern)]
    if path.is_dir() and globs != []:  # (the files globs chose: a file named one by one is a choice)
        _whole_shard_sets(path, [name(f) for f in filter_repo_objects(files, allow_patterns=globs, key=name)])
    return tuple(files)


def _walk(path: Path, unchosen: bool) -> list[Path]:
    """The entries of folder ``path`` named as data files (``SUFFIXES``), but for folders
    (whose files are found in turn) and those under a hidden name, in one walk that does not
    go into hidden folders. Where the files are ``unchosen``, ``SourceError`` for an entry
    whose rows would be left out unsaid: a link to a folder (which is not searched), a
    file ``_UNREAD`` matches (compressed, or named in capitals), or a folder that cannot
    be read."""

    def unlisted(error: OSError) -> None:
        if unchosen:
            problem = unreadable(Path(error.filename or path), error)
            raise SourceError(f"{problem}: its files would be left out; choose the files with --source-files")

    found = []
    for root, folders, files in os.walk(path, onerror=unlisted):
        here = Path(root)
        for name in folders:
            if not name.startswith(".") and (here / name).is_symlink():
                if unchosen:
                    raise SourceError(
                        f"{here / name}: a link to a folder, whose files are not searched; link the files"
                    )
                if Path(name).suffix in SUFFIXES:
                    found.append(here / name)  # (refused below where chosen: not a file)
        folders[:] = [name for name in folders if not name.startswith(".") and not (here / name).is_symlink()]
        for name in files:
            if name.startswith("."):
                continue
            if Path(name).suffix in SUFFIXES:
                found.append(here / name)
            elif unchosen and _UNREAD.search(name):
                compressed = Path(name).suffix.lower() not in SUFFIXES
                why, how = ("compressed", "decompress it") if compressed else ("named in capitals", "rename it")
                raise SourceError(
                    f"{here / name}: {why}, so its rows are not read; {how}, or choose the files with --source-files"
                )
    return found


def _whole_shard_sets(path: Path, names: list[str]) -> None:
    """``SourceError`` naming a shard that ``names`` (files chosen by a glob, or all of a
    folder's) lack: where one is ``NAME-00001-of-00003.parquet``, shards 0 through 2 (or 1
    through 3) of 3 must all be there (a download or copy cut short would otherwise build
    from part of the data, as if it were all).

    >>> _whole_shard_sets(Path("d"), ["a-00000-of-00002.jsonl", "a-00001-of-00002.jsonl", "b.jsonl"])
    >>> _whole_shard_sets(Path("d"), [f"a-{k}-of-3.jsonl" for k in (1, 2, 3)])  # (numbered from 1)
    >>> try:
    ...     _whole_shard_sets(Path("d"), ["data/a-00000-of-00003.jsonl", "data/a-00002-of-00003.jsonl"])
    ... except SourceError as error:
    ...     print(str(error).split(":")[0])
    d lacks data/a-00001-of-00003.jsonl
    """
    sets: dict[tuple[str, str, str], dict[int, str]] = {}
    for name in names:
        if (shard := _SHARD.fullmatch(name)) is not None:
            sets.setdefault((shard["stem"], shard["n"], shard["suffix"]), {})[int(shard["k"])] = shard["k"]
    for (stem, n, suffix), held in sorted(sets.items()):
        count = int(n)
        first = 1 if 0 not in held and count in held else 0
        missing = [k for k in range(first, first + count) if k not in held]
        if missing:
            widths = {len(k) for k in held.values()}
            shown = f"{missing[0]:0{widths.pop()}d}" if len(widths) == 1 else str(missing[0])
            raise SourceError(
                f"{path} lacks {stem}-{shown}-of-{n}{suffix}: {count - len(missing)} of the {count} "
                "files of its set are there (name the files to build from some of them with --source-files)"
            )


def _no_builds_in(path: Path, files: list[Path]) -> None:
    """``SourceError`` where a file of source folder ``path`` lies in a fixed-sft build (the
    folder itself, or one inside it): its rows are packed tokens, not conversations."""
    from .folder import is_build

    folders = {f.parent for f in files}
    for folder in sorted({a for f in folders for a in (f, *f.parents) if a == path or path in a.parents}):
        if is_build(folder):
            where = "" if folder == path else f"; move it out of {path} or choose files with --source-files"
            raise SourceError(f"{folder} is a fixed-sft build, not a chat source{where}")


def _not_regular(path: Path) -> SourceError:
    """The error for a source path that is neither a regular file nor a folder (a FIFO,
    which opening would block on, a socket, a device), found by ``stat``, never opened."""
    mode = path.stat().st_mode
    kind = (
        "a FIFO"
        if stat.S_ISFIFO(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "a device"
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
        else "of another kind"
    )
    return SourceError(f"{path}: not a regular file ({kind})")


def _count_rows(path: Path) -> int:
    if path.suffix == ".parquet":
        try:
            return pq.ParquetFile(path).metadata.num_rows
        except (pa.ArrowException, OSError) as error:
            raise SourceError(f"{path}: not a readable Parquet file ({error})") from None
    lines = 0
    last = b"\n"
    try:
        with path.open("rb") as f:
            if f.read(len(codecs.BOM_UTF8)) != codecs.BOM_UTF8:  # (not part of the first line, as it is read)
                f.seek(0)
            while block := f.read(1 << 24):
                lines += block.count(b"\n")
                last = block[-1:]
    except OSError as error:
        raise unreadable(path, error) from None
    return lines + (last != b"\n")


def non_unicode(path: Path) -> str | None:
    """``path`` as text with its undecodable bytes shown as ``\\xNN``, when it is not valid
    UTF-8 (which neither pyarrow nor a JSON manifest takes); ``None`` when it is."""
    text = str(path)
    return None if is_unicode(text) else os.fsencode(text).decode("utf-8", "backslashreplace")

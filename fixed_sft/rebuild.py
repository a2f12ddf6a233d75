"""A build's manifest -> the same build run again from the inputs it records, compared.

The rebuild takes the manifest's parameters, its source (name, revision, license, file globs,
row count) and its tokenizer (spec name or repo, at the recorded revision), unless the caller
names where the source or tokenizer files are. Tokenizer files other than the recorded ones are
refused before building. The rows are proven to come from the recorded inputs when the
rebuild's manifest is the folder's, compared as JSON, and so is the provenance in the Parquet
file (its ``metadata`` column, with its boundaries where the build wrote them, read a row group
at a time; and the key-value metadata of each field of the Arrow schema it stores; the file's
own key-value metadata is refused by the reader); not compared for that: the reasons of skipped
rows (their wording is the code's), the names, globs and paths of inputs the caller gave, and
the separator a manifest from before it was recorded lacks (the rebuild then uses the eos
token, as that build did). Values the rebuild copies from the manifest (the build's name, the
license, revisions, the card's license) are the same by construction. The Parquet file's size
and hash, the dataset card's files, and ``code_sha256``, are compared for information: the same
rows may be encoded by another writer, plotted by another matplotlib, or built by other code;
the rest of ``code_version`` (package version, git commit) says which code ran, and is not
compared.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .build import ORDER_RULE, BuildConfig, BuildError, InvalidSourceRow, UsageError, build, code_version
from .fields import MISSING, FieldError, encode, same, show, value_at
from .folder import REBUILT, scratch_folder
from .hub import is_hub_id
from .manifest import FileHash, Manifest, read
from .memory import system_allocator
from .output import MANIFEST_NAME, PARQUET_NAME
from .params import RECORDED, flag, manifest_label, recorded_values
from .reader import BOUNDARIES, Group, Refused, RowFile
from .source import SourceError, SourceUnreachable
from .specs import ResolvedTokenizer, SpecError, resolve_tokenizer, tokenizer_specs
from .verify import described, read_manifest


class Compared(NamedTuple):
    """One value of the folder's manifest beside the rebuild's; ``proof``: the verdict
    depends on it."""

    key: str
    here: object
    rebuilt: object
    proof: bool

    @property
    def same(self) -> bool:
        return same(self.here, self.rebuilt)


def check_recorded(document: dict) -> Manifest:
    """``document`` as a ``Manifest`` (``manifest.read``); ``BuildError`` naming the first
    field that is missing, unknown or of another kind."""
    try:
        return read(document)
    except FieldError as error:
        raise BuildError(str(error)) from None


def recorded_config(
    document: dict, source: str | None = None, tokenizer: str | None = None, workers: int = 1
) -> BuildConfig:
    """The build ``manifest`` records (checked by ``check_recorded``), reading the source
    from ``source`` and the tokenizer from ``tokenizer`` when given, else from where the
    manifest says: a recorded path is relative to the current folder, and read only when it
    lies inside it (``_refuse_outside``); a tokenizer whose files matched no pinned spec,
    read from a folder, must be given."""
    if source == "" or tokenizer == "":
        raise UsageError("--source and --tokenizer must not be empty")
    manifest = check_recorded(document)
    if manifest.params.order != ORDER_RULE:
        raise BuildError(f"params.order is {show(manifest.params.order)}; this builder orders by {ORDER_RULE}")
    recorded, used = manifest.source, manifest.tokenizer
    if source is None:
        _refuse_outside("source", recorded.name, "--source PATH")
    hub_source = recorded.revision is not None and is_hub_id(recorded.name)  # a path may hold '/' too
    if source is None and not (Path(recorded.name).exists() or hub_source):
        raise UsageError(
            f"the manifest's source {recorded.name!r} is not here (a recorded path is relative to "
            "the current folder); pass --source PATH"
        )
    tokenizer, spec = recorded_tokenizer(manifest, tokenizer)
    values = recorded_values(manifest)
    values["no_card"] = manifest.card is None  # (the card's license is the one its build declared)
    values["card_license"] = manifest.card.license if manifest.card is not None else None
    if source is not None and Path(source).is_file():
        values["source_files"] = None  # a file named by the caller is the source, whatever the recorded globs chose
    config = BuildConfig(
        **{
            **values,
            "source": source or recorded.name,
            "tokenizer": tokenizer,
            "expected_tokenizer": spec,
            "allow_unpinned_tokenizer": not used.pinned,
            "workers": workers,
            "no_cache": True,  # (a rebuild proves the rows from the inputs alone)
        }
    )
    try:  # the manifest's values, named by their keys (the caller's --workers is the build's to check)
        replace(config, workers=1).validate(label=manifest_label)
    except UsageError as error:
        raise BuildError(f"the manifest records a parameter this builder refuses: {error}") from None
    return config


@contextmanager
def recorded_parameters(path: Path) -> Iterator[None]:
    """A parameter the manifest at ``path`` records that the builder refuses only once it
    reads the tokenizer (a separator not in its vocabulary, a loss mask not its own, a
    revision of files read from a folder): ``BuildError`` naming the manifest and the
    parameter's key there, not a flag the caller did not pass.

    >>> try:
    ...     with recorded_parameters(Path("m.json")):
    ...         raise UsageError("--separator 'a b' is not a single token of the vocabulary")
    ... except BuildError as error:
    ...     str(error).split(": ")[-1]
    "params.separator 'a b' is not a single token of the vocabulary"
    """
    try:
        yield
    except (UsageError, SpecError) as error:
        message = str(error)
        for name, key in RECORDED.items():
            message = message.replace(f"{flag(name)} ", f"{key} ")
        refused = "the manifest records a parameter this builder refuses: " if isinstance(error, UsageError) else ""
        raise BuildError(f"{path}: cannot rebuild: {refused}{message}") from None


def recorded_tokenizer(manifest: Manifest, tokenizer: str | None = None) -> tuple[str, str | None]:
    """Where to read the tokenizer ``manifest`` records: ``tokenizer`` when given, else the
    recorded spec, or the recorded Hub repo of files that matched no spec (``UsageError``
    for files that matched no spec and came from a folder); and the spec they must match."""
    used = manifest.tokenizer
    spec = used.name if used.name in {s["name"] for s in tokenizer_specs()} else None
    if tokenizer is None:
        if used.pinned or used.name is None:  # a pinned spec, or an unpinned Hub repo
            tokenizer = spec or used.repo
        if tokenizer is None:
            raise UsageError(
                "the manifest's tokenizer files are not a pinned spec's and may come from a local "
                "folder or another revision; pass --tokenizer FOLDER or HF_REPO"
            )
        if tokenizer != spec:
            _refuse_outside("tokenizer", tokenizer, "--tokenizer FOLDER")
    return tokenizer, spec


def resolve_recorded_tokenizer(
    tokenizer: str, revision: str | None, expected: str | None, recorded: dict[str, FileHash]
) -> ResolvedTokenizer:
    """The tokenizer files at ``tokenizer`` (``specs.resolve_tokenizer``), once they are the
    ``recorded`` ones (``BuildError`` naming those that differ). A folder's files are
    compared as they are: the recorded ``revision`` is the build's to check against them."""
    local = Path(tokenizer).is_dir()
    found = resolve_tokenizer(tokenizer, None if local else revision, expected=expected, allow_unpinned=True)
    other = [name for name, file in found.files.items() if encode(recorded.get(name)) != file]
    other += [name for name in recorded if name not in found.files]
    if other:
        raise BuildError(
            f"the tokenizer files in {found.directory} are not the ones the manifest records "
            f"({', '.join(other)} differ); pass --tokenizer FOLDER holding those"
        )
    return found


def _refuse_outside(what: str, name: str, flag: str) -> None:
    """Raise ``UsageError`` when ``name``, recorded by a manifest, is a path outside the
    current folder (absolute, through ``..``, or through a link that leads out of it): a
    stranger's manifest may record any path, and a rebuild reads one only when ``flag``
    names it. (A Hub id is a relative name that lies inside.)"""
    here = Path.cwd().resolve()
    path = Path(name)
    if "\0" in name:  # (no file system path holds one)
        raise UsageError(f"the manifest's {what} {name!r} is not a path; pass {flag} to name the one to read")
    if path.is_absolute() or not path.resolve().is_relative_to(here):
        raise UsageError(
            f"the manifest's {what} {name!r} is outside the current folder; a rebuild reads a recorded "
            f"path only inside it: pass {flag} to read it"
        )


def check_tokenizer_files(config: BuildConfig, recorded: dict[str, FileHash]) -> None:
    """Raise ``BuildError`` unless the rebuild's tokenizer files are the recorded ones. A build
    that ran a Hugging Face tokenizer's own code (its ``.py`` files are recorded) is not rebuilt:
    a rebuild runs no code a manifest names."""
    code = sorted(name for name in recorded if name.endswith(".py"))
    if code:
        raise BuildError(f"the build ran the tokenizer's own code ({', '.join(code)}), which a rebuild does not run")
    resolve_recorded_tokenizer(config.tokenizer, config.tokenizer_revision, config.expected_tokenizer, recorded)


# compared, but the verdict does not depend on them (the card's plots are of matplotlib's drawing)
INFORMATION = ("parquet", "card", "code_version")


def _view(manifest: dict, given_source: bool, given_tokenizer: bool) -> dict:
    """What a rebuild must reproduce: the whole manifest but ``INFORMATION``, the reasons
    of skipped rows (their wording is the code's), and the names, globs and paths of
    inputs the caller gave."""
    skipped = [
        {k: v for k, v in row.items() if k != "reason"} if isinstance(row, dict) else row
        for row in manifest["skipped_invalid"]
    ]
    view = {key: value for key, value in manifest.items() if key not in INFORMATION}
    return {
        **view,
        "source": source_view(manifest["source"], given_source),
        "tokenizer": tokenizer_view(manifest["tokenizer"], given_tokenizer),
        "skipped_invalid": skipped,
    }


def source_view(source: dict, given: bool) -> dict:
    """A manifest's ``source`` as a rebuild compares it: without its name, globs and file
    paths when the caller ``given`` the source."""
    source = {"file_patterns": None, **source}  # (manifests before globs lack the key)
    source = {key: value for key, value in source.items() if not (given and key in ("name", "file_patterns"))}
    source["files"] = [
        file if not given or not isinstance(file, dict) else {k: v for k, v in file.items() if k != "path"}
        for file in source["files"]
    ]
    return source


def tokenizer_view(tokenizer: dict, given: bool) -> dict:
    """A manifest's ``tokenizer`` as a rebuild compares it: without its name, repo and
    revision when the caller ``given`` the files."""
    return {key: value for key, value in tokenizer.items() if not (given and key in ("name", "repo", "revision"))}


class RowAt(NamedTuple):
    """Row ``number`` of a file's ``metadata`` column: the first where two files differ."""

    number: int
    row: dict


PROVENANCE = [
    "metadata.input_ids.list.element",
    "metadata.loss_mask.list.element",
    "metadata.row",
    *(f"metadata.segments.list.element.{key}" for key in ("source_index", "id", "start", "end")),
]


def _provenance(folder: Path, manifest: dict, rebuilt_folder: Path, rebuilt: dict) -> tuple[dict, dict]:
    """The provenance of the folder's Parquet file and of the rebuilt one (whose own
    key-value metadata ``RowFile`` refuses): the key-value metadata of each field of its
    Arrow schema, and the ``metadata`` column: the row count when the files' rows are the same,
    else the first row that differs (``RowAt``). The rows are read a row group at a time
    (``reader``), the folder's no further than a row past its manifest's."""
    files = []
    for path, recorded in ((folder / PARQUET_NAME, manifest), (rebuilt_folder / PARQUET_NAME, rebuilt)):
        bounded = recorded["params"].get("emit_boundaries", False)
        try:
            files.append(RowFile(path, len(recorded["row_sha256"]), recorded["params"]["row_tokens"], bounded))
        except (OSError, ValueError) as error:
            for file in files:
                file.__exit__()
            raise BuildError(
                str(error) if isinstance(error, Refused) else f"{path}: unreadable ({described(error)})"
            ) from None
    here, again = files
    with system_allocator(), here, again:
        views: list[dict[str, object]] = [{"field metadata": _field_metadata(file.arrow_schema)} for file in files]
        limit = len(manifest["row_sha256"]) + 1
        columns = PROVENANCE + [BOUNDARIES] if here.boundaries else PROVENANCE
        try:
            first = _first_difference(here.groups(columns, limit), again.groups(columns))
        except (OSError, ValueError) as error:
            raise BuildError(
                str(error) if isinstance(error, Refused) else f"{here.path}: unreadable ({described(error)})"
            ) from None
        if first is None:
            views[0]["rows"], views[1]["rows"] = here.rows, again.rows
        else:
            views[0]["rows"], views[1]["rows"] = first
    return views[0], views[1]


def _field_metadata(schema: pa.Schema) -> dict:
    """``{path: {key: value}}`` of every field, at any depth, that has key-value metadata."""
    found = {}

    def visit(field: pa.Field, path: str) -> None:
        if field.metadata:
            found[path] = {k.decode(errors="replace"): v.decode(errors="replace") for k, v in field.metadata.items()}
        kind = field.type
        children = (
            [kind.value_field]
            if isinstance(kind, (pa.ListType, pa.LargeListType))
            else [kind.field(n) for n in range(kind.num_fields)]
            if isinstance(kind, pa.StructType)
            else []
        )
        for child in children:
            visit(
                child,
                path
                if isinstance(kind, (pa.ListType, pa.LargeListType)) and child.metadata is None
                else f"{path}.{child.name}",
            )

    for field in schema:
        visit(field, field.name)
    return found


def _first_difference(here: Iterator[Group], again: Iterator[Group]) -> tuple[RowAt | None, RowAt | None] | None:
    """The first row whose ``metadata`` differs between two files' row groups (the rows
    of one file that the other lacks included), or ``None``."""
    a, b, seen = next(here, None), next(again, None), 0
    while a is not None and b is not None:
        lo, hi = max(a.first, b.first), min(a.first + a.rows, b.first + b.rows)
        x, y = (g.column("metadata").slice(lo - g.first, hi - lo) for g in (a, b))
        if (n := _first_row_difference(x, y)) is not None:
            return RowAt(lo + n, _row(x, n)), RowAt(lo + n, _row(y, n))
        seen = hi
        if a.first + a.rows == hi:
            a = next(here, None)
        if b.first + b.rows == hi:
            b = next(again, None)
    while a is not None and a.rows == 0:  # (empty row groups hold no row the other file lacks)
        a = next(here, None)
    while b is not None and b.rows == 0:
        b = next(again, None)
    if a is None and b is None:
        return None
    rest = a or b
    assert rest is not None  # (both None: returned above)
    row = RowAt(seen, _row(rest.column("metadata"), seen - rest.first))
    return (row, None) if a is not None else (None, row)


def _first_mismatch(a: np.ndarray, b: np.ndarray) -> int | None:
    n = min(len(a), len(b))
    bad = np.flatnonzero(a[:n] != b[:n])
    return int(bad[0]) if len(bad) else None if len(a) == len(b) else n


def _first(*positions: int | None) -> int | None:
    return min((p for p in positions if p is not None), default=None)


def _values_mismatch(a: pa.Array, b: pa.Array) -> int | None:
    """The first position where two arrays of one type differ (a null is only its own value)."""
    valid = _first_mismatch(*(np.asarray(x.is_valid()) for x in (a, b)))
    if pa.types.is_struct(a.type):
        return _first(valid, *(_values_mismatch(a.field(n), b.field(n)) for n in range(a.type.num_fields)))
    if pa.types.is_dictionary(a.type) or pa.types.is_string(a.type):
        # the strings' lengths first: where those agree, decoding both takes no more than the rebuilt ones
        lengths = _first_mismatch(*(_lengths(x) for x in (a, b)))
        cut = _first(valid, lengths)
        n = len(a) if cut is None else cut
        dense = [x.slice(0, n).cast(pa.string()) if pa.types.is_dictionary(x.type) else x.slice(0, n) for x in (a, b)]
        equal = pc.fill_null(pc.equal(*dense), True).to_numpy(zero_copy_only=False)
        return _first(cut, int(np.argmin(equal)) if not equal.all() else None)
    return _first(valid, _first_mismatch(*(pc.fill_null(x, 0).to_numpy(zero_copy_only=False) for x in (a, b))))


def _lengths(strings: pa.Array) -> np.ndarray:
    """Each string's length in bytes (0 for a null), without decoding a dictionary."""
    if pa.types.is_dictionary(strings.type):
        entries = pc.fill_null(pc.binary_length(strings.dictionary), 0).to_numpy(zero_copy_only=False)
        indices = pc.fill_null(strings.indices, 0).to_numpy(zero_copy_only=False)
        return entries[indices] if len(entries) else np.zeros(len(strings), np.int64)
    return pc.fill_null(pc.binary_length(strings), 0).to_numpy(zero_copy_only=False)


def _first_row_difference(a: pa.StructArray, b: pa.StructArray) -> int | None:
    """The first row where two ``metadata`` arrays of as many rows differ."""
    found = [
        _first_mismatch(*(np.asarray(x.is_valid()) for x in (a, b))),
        _values_mismatch(a.field("row"), b.field("row")),
    ]
    bounded = all(x.type.get_field_index("cu_seqlens") >= 0 for x in (a, b))
    for key in ("input_ids", "loss_mask", "segments", *(("cu_seqlens",) if bounded else ())):
        x, y = a.field(key), b.field(key)
        valid = _first_mismatch(np.asarray(x.is_valid()), np.asarray(y.is_valid()))
        lengths = [pc.fill_null(pc.list_value_length(v), -1).to_numpy(zero_copy_only=False) for v in (x, y)]
        rows = _first(valid, _first_mismatch(*lengths))
        upto = len(a) if rows is None else rows  # rows of the same lengths: their values line up
        ends = np.cumsum(np.maximum(lengths[0][:upto], 0))
        values = [v.slice(0, upto).flatten() for v in (x, y)]
        value = _values_mismatch(*values)
        found += [rows, None if value is None else int(np.searchsorted(ends, value, side="right"))]
    return _first(*found)


def _row(metadata: pa.StructArray, n: int) -> dict:
    """Row ``n`` of ``metadata`` as a dict, each segment's id cut to 200 characters (cut in
    the dictionary, so a long entry is not copied for each segment naming it)."""
    row = metadata.slice(n, 1)
    segments = row.field("segments")
    spans = segments.flatten()
    if segments.null_count == 0 and len(spans):
        ids = spans.field("id")
        if pa.types.is_dictionary(ids.type):
            ids = pa.DictionaryArray.from_arrays(ids.indices, pc.utf8_slice_codeunits(ids.dictionary, 0, 200))
        ids = pc.utf8_slice_codeunits(ids.cast(pa.string()), 0, 200)
        fields = [ids if f.name == "id" else spans.field(f.name) for f in spans.type]
        spans = pa.StructArray.from_arrays(fields, names=[f.name for f in spans.type], mask=spans.is_null())
        lists = pa.ListArray.from_arrays(pa.array([0, len(spans)], pa.int32()), spans)
        row = pa.StructArray.from_arrays(
            [lists if f.name == "segments" else row.field(f.name) for f in row.type],
            names=[f.name for f in row.type],
            mask=row.is_null(),
        )
    return row.to_pylist()[0]


def comparison(
    manifest: dict,
    rebuilt: dict,
    folder: Path,
    rebuilt_folder: Path,
    given_source: bool = False,
    given_tokenizer: bool = False,
) -> list[Compared]:
    """The folder's manifest and Parquet provenance beside the rebuild's (see the module
    docstring for what is compared, and how)."""
    here, again = _view(manifest, given_source, given_tokenizer), _view(rebuilt, given_source, given_tokenizer)
    if "separator" not in manifest["params"]:  # a manifest from before it was recorded: the eos token, rebuilt so
        again["params"] = {key: value for key, value in again["params"].items() if key != "separator"}
    if "source_mix" not in manifest and "card" not in manifest:  # a manifest from before the source mix was recorded
        again.pop("source_mix", None)
    # a manifest from before the sample was by source row: its build checked other conversations
    by_position = "sample" not in manifest["template_check"]
    return [
        *(
            Compared(
                key, here.get(key, MISSING), again.get(key, MISSING), not (by_position and key == "template_check")
            )
            for key in {**here, **again}
        ),
        Compared("provenance", *_provenance(folder, manifest, rebuilt_folder, rebuilt), True),
        Compared("parquet", manifest["parquet"], rebuilt["parquet"], False),
        Compared("card", manifest.get("card", MISSING), rebuilt.get("card", MISSING), False),
        Compared(
            "code_sha256",
            value_at(manifest, ("code_version", "code_sha256")),
            rebuilt["code_version"]["code_sha256"],
            False,
        ),
    ]


def rebuild(
    folder: Path, source: str | None = None, tokenizer: str | None = None, workers: int = 1, progress: bool = False
) -> list[Compared]:
    """Rebuild ``folder``'s manifest into a temporary folder (in the system's, deleted
    after) and compare (see ``comparison``)."""
    folder = Path(folder)
    try:
        manifest = read_manifest(folder / MANIFEST_NAME)
    except (OSError, ValueError, RecursionError) as error:
        raise BuildError(f"{folder / MANIFEST_NAME}: cannot read it ({error})") from None
    try:
        config = recorded_config(manifest, source, tokenizer, workers)
    except BuildError as error:
        raise BuildError(f"{folder / MANIFEST_NAME}: cannot rebuild: {error}") from None
    with recorded_parameters(folder / MANIFEST_NAME):
        check_tokenizer_files(config, check_recorded(manifest).tokenizer.files)
    with scratch_folder() as scratch:
        out = scratch / REBUILT
        try:
            with recorded_parameters(folder / MANIFEST_NAME):
                rebuilt = build(config, out, progress)
        except SourceUnreachable as error:  # the build's advice names flags a rebuild does not need
            raise SourceError(
                f"{error.problem}. Without the Hub, download its files at that revision elsewhere "
                "and pass --source PATH"
            ) from None
        except InvalidSourceRow as error:  # the recorded build read the row without stopping
            same_code = value_at(manifest, ("code_version", "code_sha256")) == code_version()["code_sha256"]
            other = "its source was another" if same_code else "its source or its code (code_sha256) was another"
            raise BuildError(f"{error.problem}; the recorded build did not stop at this row, so {other}") from None
        return comparison(manifest, rebuilt, folder, out, source is not None, tokenizer is not None)


def difference(here: object, rebuilt: object, path: str = "") -> str:
    """The first place where two JSON-like values differ, with both values there."""
    if isinstance(here, dict) and isinstance(rebuilt, dict):
        key = next(k for k in {**here, **rebuilt} if not same(here.get(k, MISSING), rebuilt.get(k, MISSING)))
        return difference(here.get(key, MISSING), rebuilt.get(key, MISSING), f"{path}.{key}" if path else str(key))
    if isinstance(here, RowAt) and isinstance(rebuilt, RowAt) and here.number == rebuilt.number:
        return difference(here.row, rebuilt.row, f"{path}[{here.number}]")
    if isinstance(here, RowAt) or isinstance(rebuilt, RowAt):  # a row one file lacks
        row = here if isinstance(here, RowAt) else rebuilt
        assert isinstance(row, RowAt)  # (one of the two is)
        number = row.number
        return f"{path}[{number}]: {'a row' if here else 'none'} here, {'a row' if rebuilt else 'none'} rebuilt"
    if isinstance(here, list) and isinstance(rebuilt, list):
        if len(here) != len(rebuilt):
            return f"{path or 'list'}: {len(here)} items here, {len(rebuilt)} rebuilt"
        n = next(n for n, (a, b) in enumerate(zip(here, rebuilt)) if not same(a, b))
        return difference(here[n], rebuilt[n], f"{path}[{n}]")
    return f"{path + ': ' if path else ''}{show(here)} here, {show(rebuilt)} rebuilt"


def report(results: list[Compared]) -> tuple[bool, list[str]]:
    """Whether every ``proof`` value is the same, and a line per value: same, or where it differs."""
    agrees = {r.key: r.same for r in results}  # each compared once: the provenance holds every row
    proven = all(agrees[r.key] for r in results if r.proof)
    provenance = next(r for r in results if r.key == "provenance")  # (its rows, and the file's metadata)
    here, rebuilt = (v.get("rows") if isinstance(v, dict) else v for v in (provenance.here, provenance.rebuilt))
    rows = agrees["rows_sha256"] and same(here, rebuilt)
    verdict = (
        "gives the same rows and manifest"
        if proven
        else "gives the same rows, but not what the manifest or the file's metadata says of them"
        if rows
        else "does not give the same rows"
    )
    lines = [f"the rebuild from the recorded inputs {verdict}"]
    for r in results:
        info = "" if r.proof else " (for information)"
        if agrees[r.key] and r.key == "params":  # (the rebuild's are the manifest's own)
            lines.append(f"  {r.key}: the manifest's, rebuilt with (rows_sha256 shows whether the build had them)")
        elif agrees[r.key]:
            lines.append(f"  {r.key}: same{info}")
        elif r.key == "parquet" and rows:
            lines.append(
                f"  {r.key}: differs{info} ({difference(r.here, r.rebuilt)}): the same rows and "
                "provenance, encoded otherwise (by another pyarrow, say)"
            )
        else:
            lines.append(f"  {r.key}: differs{info} ({difference(r.here, r.rebuilt)})")
    return proven, lines

"""A build's chosen rows -> each proven from the recorded inputs, re-encoding only the conversations they need.

``verify DIR --rebuild --rows SPEC`` (SPEC: ``parse_rows``). The inputs are taken and checked as
the full rebuild takes them (``rebuild.recorded_config``): the tokenizer files must be the
recorded ones, the template variables and the separator are the manifest's, and the source
files are hashed and compared with ``source.files``. Then only the source rows the chosen
rows need are read (a Parquet file's row groups that hold one, a JSONL file's lines) and
encoded, the sampled ones checked too (``encode.sampled``: where the build checked them).

For each chosen row K it proves:

- its ids and mask are its segments' slices of the re-encoded units put together, each unit
  a conversation's ids and then the separator, and the hash of that row is the manifest's
  ``row_sha256[K]``; each segment's id is its source row's;
- its segments follow the packing order (the seed's permutation, the rows of
  ``skipped_invalid`` left out): a segment after another starts at 0 and the one before ends
  at its unit's end, and the source rows between them in the order are all listed in
  ``skipped_invalid``, each re-read with its recorded id and found invalid, or a duplicate: valid, with an id that
  a row read holds earlier in the packing order. A valid conversation listed must be a
  duplicate: its reason names the source row that used the id first, which is read too
  and must have it. A reason that names none (``LEGACY_DUPLICATE``, as builds wrote it
  before) leaves the duplicate not proven, and so the rows, unless the rows checked run
  from row 0 past it (every conversation before it is then read, so the earlier copy
  must be among them); no two of the conversations read and held share an id;
- K begins where row K - 1 ends in the stream (where K - 1 is not checked, as the file holds
  it: its last segment must name a unit a row may hold, with that unit's id, start at the
  unit's token 0 where the row holds other segments, as packing cuts rows, and its tokens
  and mask there must be the unit's; the rest of it is not re-encoded; row 0 at the
  stream's start), and row K + 1 where K ends (likewise, its first segment ending at its
  unit's end): the same conversation, cut at the same token, or the next one from its
  start; or, past rows the build dropped (no supervised token after token 0), whole such
  rows, re-encoded, no more of them than ``stats.rows_skipped``. So a check of rows
  ``0-N`` proves every cut up to row N, and a row taken out of the file, or two rows
  swapped, is caught by a check of a row beside the change, however the rows beside name
  their segments, unless the tokens there are the same either way (a row beside that ends
  with a conversation's first N tokens, where the row moved in begins at token N of a
  conversation that begins alike; likewise at the ends); a neighbour whose tokens are
  forged too fails its own check;
- checked rows further apart are in packing order; within one conversation, the stream
  between them holds exactly the rows between, and rows dropped;
- the last row of a build of a row count leaves ``stats.tail_tokens_dropped`` of its unit; the
  last row of ``rows: "all"`` leaves only dropped rows and a final partial row of
  ``stats.tail_tokens_dropped`` tokens; where every row is checked, the rows dropped are
  ``stats.rows_skipped``.

It does not prove where the stream reaches a row when the rows before it are not all checked
(which conversation, and at which token, follows from the lengths of all the conversations
before it and the rows dropped); that no conversation held repeats
the id of one outside the rows read; the stats, ``template_check``, ``source_mix`` and the rows
of ``skipped_invalid`` outside the checked rows. The full ``--rebuild`` proves them all.
A sample's seed is drawn at random unless given (``RowsSpec``), and reported.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from .bands import read_rows
from .build import (  # (the build's pool: its hashing is not waited for on Ctrl-C)
    BuildError,
    UsageError,
    _cancelling_pool,
    encoder_setup,
    hash_threads,
    recorded_files,
    source_record,
    template_kwargs,
)
from .encode import Chunk, Encoded, encode_rows
from .encoding import Encoder, TemplateMismatch
from .fields import encode, same
from .hashes import boundaries, row_digest, sha256_file
from .manifest import Manifest
from .memory import system_allocator
from .order import permutation, positions
from .output import MANIFEST_NAME, PARQUET_NAME
from .pack import Segment
from .parallel import first_user
from .reader import Refused, RowFile
from .rebuild import (
    Compared,
    check_recorded,
    check_tokenizer_files,
    difference,
    recorded_config,
    recorded_parameters,
    source_view,
    tokenizer_view,
)
from .source import SourceError, SourceUnreachable, open_source
from .verify import described, read_manifest

# (at most 20 digits: 2**64 has 20, and int() refuses strings of over 4,300 digits)
_ITEM = re.compile(r"([0-9]{1,20})(?:-([0-9]{1,20}))?")
_SAMPLE = re.compile(r"sample:([0-9]{1,20})(?::([0-9]{1,20}))?")
STORED = [
    "metadata.input_ids.list.element",
    "metadata.loss_mask.list.element",
    "metadata.row",
    *(f"metadata.segments.list.element.{key}" for key in ("source_index", "id", "start", "end")),
]


LEGACY_DUPLICATE = "duplicate id"  # a duplicate's skip reason before builds named its first user


@dataclass(frozen=True)
class RowsSpec:
    """Rows to check: ``ranges`` of row numbers (each first to last, inclusive), or a
    ``sample`` of that many rows drawn with ``seed`` (``None``: one drawn at random as the
    check starts, so that no one who edits a build knows which rows it checks)."""

    ranges: tuple[tuple[int, int], ...] = ()
    sample: int | None = None
    seed: int | None = None

    def drawn(self) -> RowsSpec:
        """This spec, a sample's seed drawn where it has none."""
        if self.sample is None or self.seed is not None:
            return self
        return RowsSpec(sample=self.sample, seed=secrets.randbits(64))

    def __str__(self) -> str:
        if self.sample is not None:
            return f"sample:{self.sample}" + ("" if self.seed is None else f":{self.seed}")
        return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in self.ranges)


def parse_rows(text: str) -> RowsSpec:
    """``--rows SPEC``: row numbers and inclusive ranges, comma-separated (``0,17,100-120``), or
    ``sample:N`` (``sample:N:SEED``); ``UsageError`` for anything else."""
    if text.startswith("sample:"):
        match = _SAMPLE.fullmatch(text)
        if match is None or int(match[1]) == 0 or (match[2] is not None and int(match[2]) >= 2**64):
            raise UsageError(f"--rows {text!r}: expected sample:N or sample:N:SEED (N at least 1, SEED below 2**64)")
        return RowsSpec(sample=int(match[1]), seed=None if match[2] is None else int(match[2]))
    ranges = []
    for item in text.split(","):
        match = _ITEM.fullmatch(item)
        if match is None or (match[2] is not None and int(match[2]) < int(match[1])):
            raise UsageError(
                f"--rows {text!r}: expected row numbers and ranges such as 0,17,100-120 (first-last, "
                "inclusive), or sample:N"
            )
        ranges.append((int(match[1]), int(match[2] if match[2] is not None else match[1])))
    return RowsSpec(ranges=tuple(ranges))


def chosen_rows(spec: RowsSpec, rows: int) -> np.ndarray:
    """The row numbers ``spec`` chooses among a build's ``rows``, sorted, each once; a sample
    is the rows ``k`` of the ``N`` smallest ``key(seed, k)`` (the packing order's key,
    ``fixed_sft.order``; a spec without a seed draws one: ``RowsSpec.drawn``), all rows when
    the build has no more than ``N``. ``UsageError`` for a row past the build's last."""
    if spec.sample is not None:
        seed = spec.drawn().seed
        assert seed is not None  # (drawn)
        return np.sort(permutation(seed, rows)[: spec.sample])
    check_in_range(spec, rows)
    return np.unique(np.concatenate([np.arange(first, last + 1) for first, last in spec.ranges]))


def check_in_range(spec: RowsSpec, rows: int) -> None:
    """``UsageError`` where ``spec`` names a row past the last of a build's ``rows`` (a
    sample names none).

    >>> check_in_range(parse_rows("0,5-9"), 10)
    >>> check_in_range(parse_rows("3-10"), 10)
    Traceback (most recent call last):
    fixed_sft.errors.UsageError: --rows: row 10 is past the build's last row, 9
    """
    for _, last in spec.ranges:
        if last >= rows:
            raise UsageError(f"--rows: row {last} is past the build's last row, {rows - 1}")


class StoredRow(NamedTuple):
    """A row as ``train.parquet`` holds it."""

    ids: np.ndarray
    mask: np.ndarray
    segments: list[Segment]


@dataclass
class SpotCheck:
    """The outcome: the rows checked, the inputs beside the manifest's, each row's first
    problem (none: the row is proven), and the source rows in ``skipped_invalid`` between
    checked segments that are valid conversations (duplicates, not proven)."""

    rows: list[int]
    inputs: list[Compared]
    problems: dict[int, str]
    duplicates: list[int] = field(default_factory=list)
    dropped: int = 0  # the rows dropped in the stretches of the stream proven (beside checked rows)
    spec: RowsSpec = RowsSpec()  # the rows asked for, a sample's seed drawn
    every: bool = False  # whether they are all the build's rows

    @property
    def same(self) -> bool:
        """Whether the rows are proven: the inputs the same, no row's problem, no duplicate left unproven."""
        return all(c.same for c in self.inputs) and not self.problems and not self.duplicates


def spot_check(folder: Path, spec: RowsSpec, source: str | None = None, tokenizer: str | None = None) -> SpotCheck:
    """Check the rows ``spec`` chooses of ``folder`` against the inputs its manifest records
    (or ``source`` and ``tokenizer`` where given), as the module docstring says."""
    folder = Path(folder)
    try:
        document = read_manifest(folder / MANIFEST_NAME)
    except (OSError, ValueError, RecursionError) as error:
        raise BuildError(f"{folder / MANIFEST_NAME}: cannot read it ({error})") from None
    try:
        config = recorded_config(document, source, tokenizer)
    except BuildError as error:
        raise BuildError(f"{folder / MANIFEST_NAME}: cannot rebuild: {error}") from None
    manifest = check_recorded(document)
    spec = spec.drawn()
    rows = chosen_rows(spec, manifest.stats.rows)
    with recorded_parameters(folder / MANIFEST_NAME):
        check_tokenizer_files(config, manifest.tokenizer.files)
        setup = encoder_setup(config, load=True)
    encoder = setup.loaded
    assert encoder is not None  # (loaded: load=True)
    with system_allocator():
        stored = _stored_rows(folder / PARQUET_NAME, manifest, rows)
        around = np.concatenate([rows - 1, rows + 1])
        around = np.setdiff1d(around[(around >= 0) & (around < manifest.stats.rows)], rows)
        neighbours = _stored_rows(folder / PARQUET_NAME, manifest, around)  # (their segments: their rows not proven)
        try:
            opened = open_source(config.source, config.source_revision, config.source_license, config.source_files)
        except SourceUnreachable as error:
            raise SourceError(
                f"{error.problem}. Without the Hub, download its files at that revision elsewhere "
                "and pass --source PATH"
            ) from None
        with _cancelling_pool(hash_threads(len(opened.files))) as hashing:
            if opened.num_rows != manifest.source.rows:
                raise BuildError(
                    f"source {opened.name} has {opened.num_rows} rows; the manifest records {manifest.source.rows}"
                )
            hashes = [hashing.submit(sha256_file, path) for path in opened.files]
            order = permutation(config.seed, opened.num_rows)
            stream = _Stream(manifest, order, positions(order), setup.separator_id)
            needed = stream.needed(stored, neighbours)
            chunk = read_rows(opened, stream.rank, needed)
            for part in chunk.chunks(max(chunk.num_rows, 1)):
                stream.encode(encoder, part, config.check_every)
            stream.first_with_ids()
            files = recorded_files(opened, hashes)
    recorded = {key: encode(getattr(manifest, key)) for key in ("source", "tokenizer", "loss_mask")}
    given_source, given_tokenizer = source is not None, tokenizer is not None
    inputs = [
        Compared(
            "source",
            source_view(recorded["source"], given_source),
            source_view(encode(source_record(opened, files)), given_source),
            True,
        ),
        Compared(
            "tokenizer",
            tokenizer_view(recorded["tokenizer"], given_tokenizer),
            tokenizer_view(encode(setup.tokenizer.manifest()), given_tokenizer),
            True,
        ),
        Compared(
            "loss_mask",
            recorded["loss_mask"],
            {"type": config.loss_mask_type, "template_kwargs": template_kwargs(config, setup.tokenizer)},
            True,
        ),
    ]
    if manifest.params.separator is not None:
        inputs.append(Compared("params.separator", manifest.params.separator, setup.separator, True))
    problems = {}
    for number in rows.tolist():
        if (problem := stream.check(number, stored, neighbours)) is not None:
            problems[number] = problem
    every = 0 < len(rows) == manifest.stats.rows  # (rows: sorted, each once; the stream read to its end)
    read = _read_to(rows, stored, stream.rank)
    if every and not problems and stream.dropped != manifest.stats.rows_skipped:
        problems[int(rows[-1])] = (
            f"the stream up to it drops {stream.dropped} rows, stats.rows_skipped says {manifest.stats.rows_skipped}"
        )
    unfounded = sorted(i for i in stream.duplicates if every or stream.rank[i] < read)
    if not problems and unfounded:  # (every conversation before them that a row holds or drops is read)
        listed = ", ".join(map(str, unfounded))
        problems[int(rows[-1]) if every else _prefix(rows) - 1] = (
            f"skipped_invalid lists source rows {listed} as duplicates, but no conversation before them in the "
            "packing order has their ids"
        )
        stream.duplicates -= set(unfounded)
    return SpotCheck(rows.tolist(), inputs, problems, sorted(stream.duplicates), stream.dropped, spec, every)


def _prefix(rows: np.ndarray) -> int:
    """How many of the checked ``rows`` (sorted, each once) run on from row 0.

    >>> _prefix(np.array([0, 1, 2, 5])), _prefix(np.array([1, 2]))
    (3, 0)
    """
    return int(np.count_nonzero(rows == np.arange(len(rows))))


def _read_to(rows: np.ndarray, stored: dict[int, StoredRow], rank: np.ndarray) -> int:
    """The packing position up to which the check reads every conversation a row holds or
    drops, and every one ``skipped_invalid`` lists: the last segment's of the rows checked
    from row 0 on (0: none)."""
    prefix = _prefix(rows)
    segments = stored[prefix - 1].segments if prefix else []
    return int(rank[segments[-1].index]) if segments and 0 <= segments[-1].index < len(rank) else 0


def _stored_rows(path: Path, manifest: Manifest, rows: np.ndarray) -> dict[int, StoredRow]:
    """Rows ``rows`` of the build's Parquet file, reading only the row groups that hold them."""
    stored: dict[int, StoredRow] = {}
    try:
        bounded = manifest.params.emit_boundaries
        with RowFile(path, len(manifest.row_sha256), manifest.params.row_tokens, bounded) as file:
            for group in file.groups(STORED, only=rows):
                ids, mask, offsets = group.tokens()
                segments = group.column("metadata").field("segments")
                for number in rows[(rows >= group.first) & (rows < group.first + group.rows)].tolist():
                    n = number - group.first
                    spans = [Segment(s["source_index"], s["id"], s["start"], s["end"]) for s in segments[n].as_py()]
                    stored[number] = StoredRow(
                        ids[offsets[n] : offsets[n + 1]], mask[offsets[n] : offsets[n + 1]], spans
                    )
    except (OSError, ValueError) as error:
        raise BuildError(
            str(error) if isinstance(error, Refused) else f"{path}: unreadable ({described(error)})"
        ) from None
    return stored


Point = tuple[int, int]  # a place in the stream: a source row's unit, and a token of it


class Link(NamedTuple):
    """A stretch of the stream a row is proven against: from ``a`` to ``b`` (``None``: the
    stream's start, its end), where at most ``drops`` rows may be dropped; ``declared``:
    the unchecked row beside it whose end (``a``) or start (``b``) the file gives."""

    where: str
    a: Point | None
    b: Point | None
    drops: int
    declared: int | None = None


class _Stream:
    """The packing order, the re-encoded units of the source rows read, and the checks of
    stored rows against them."""

    def __init__(self, manifest: Manifest, order: np.ndarray, rank: np.ndarray, separator_id: int):
        self.order, self.rank, self.separator_id = order, rank, separator_id
        self.row_tokens = manifest.params.row_tokens
        self.rows = manifest.stats.rows
        self.rows_skipped = manifest.stats.rows_skipped
        self.tail = manifest.stats.tail_tokens_dropped if manifest.params.rows != "all" else None
        self.tail_of_all = manifest.stats.tail_tokens_dropped if manifest.params.rows == "all" else None
        self.hashes = manifest.row_sha256
        self.bounded = manifest.params.emit_boundaries  # (the row hash then covers each row's cu_seqlens)
        skipped = manifest.skipped_invalid if manifest.params.skip_invalid else []
        self.skipped = np.unique(np.array([row.index for row in skipped], np.int64))  # (else a build stops at one)
        self.reasons = {row.index: row.reason for row in skipped}
        self.skipped_ids = {row.index: row.id for row in skipped}
        self.named = {  # of each duplicate skipped, the source row its reason says used its id first
            index: first
            for index, reason in self.reasons.items()
            if (first := first_user(reason)) is not None and self._in_range(first)
        }
        self.encoded: dict[int, Encoded] = {}
        self.failed: dict[int, str] = {}  # a source row whose template check fails: the build would have stopped
        self.duplicates: set[int] = set()
        self.first_of: dict[str, int] = {}  # of each id, the held source row first in packing order
        self.dropped = 0  # rows the checked stretches of the stream show dropped

    def _in_range(self, index: int) -> bool:
        return 0 <= index < len(self.order)

    def _between(self, a: int | None, b: int | None) -> np.ndarray:
        """The source rows strictly between rows ``a`` and ``b`` in packing order (``None``:
        the stream's start, its end); none where ``b`` is not after ``a``."""
        lo = 0 if a is None else int(self.rank[a]) + 1
        return self.order[lo : max(lo, len(self.order) if b is None else int(self.rank[b]))]

    def _split(self, between: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``between``'s rows listed in ``skipped_invalid``, and the others."""
        listed = np.isin(between, self.skipped)
        return between[listed], between[~listed]

    def _links(self, number: int, stored: dict[int, StoredRow], beside: dict[int, StoredRow]) -> list[Link]:
        """The stretches of the stream row ``number`` is proven against: between each two of
        its segments (no token, no row dropped); from where the row before ends, where it is
        checked (or row 0: from the stream's start), else as the file holds it (``beside``);
        to where the row after begins, where it is not checked, as the file holds it (the
        last row of ``rows: "all"``: to the stream's end)."""
        segments = stored[number].segments
        first, last = segments[0], segments[-1]
        links = [
            Link(f"between segments {i - 1} and {i}", (a.index, a.end), (b.index, b.start), 0)
            for i, (a, b) in enumerate(zip(segments, segments[1:]), 1)
        ]
        before = stored.get(number - 1) or beside.get(number - 1)
        if number == 0:
            links.insert(0, Link("from the stream's start", None, (first.index, first.start), self.rows_skipped))
        elif before is not None and before.segments:  # (a row's own stretches first, where it is not checked)
            end = before.segments[-1]
            held = number - 1 in stored
            where = f"from row {number - 1}'s end" + ("" if held else ", as the file holds it")
            declared = None if held else number - 1
            link = Link(where, (end.index, end.end), (first.index, first.start), self.rows_skipped, declared)
            links.insert(len(links) * (not held), link)
        after = beside.get(number + 1)
        if number + 1 not in stored and after is not None and after.segments:
            start = after.segments[0]
            where = f"to row {number + 1}'s start, as the file holds it"
            links.append(Link(where, (last.index, last.end), (start.index, start.start), self.rows_skipped, number + 1))
        elif self.tail_of_all is not None and number == self.rows - 1:
            links.append(Link("to the stream's end", (last.index, last.end), None, self.rows_skipped))
        return links

    def needed(self, stored: dict[int, StoredRow], beside: dict[int, StoredRow]) -> np.ndarray:
        """The source rows to read: the stored rows' segments', the ends of the stretches
        ``_links`` proves them against, and the rows between those ends (a stretch too long
        for the rows it may drop needs none)."""
        wanted: list[np.ndarray] = []
        for number, row in stored.items():
            wanted.append(np.array([s.index for s in row.segments if self._in_range(s.index)], np.int64))
            if not row.segments:
                continue
            for _, a, b, drops, _ in self._links(number, stored, beside):
                ends = [p[0] for p in (a, b) if p is not None and self._in_range(p[0])]
                wanted.append(np.array(ends, np.int64))
                if b is not None and not self._in_range(b[0]):
                    continue
                if a is not None and (not self._in_range(a[0]) or (b is not None and a[0] == b[0])):
                    continue
                listed, others = self._split(self._between(None if a is None else a[0], None if b is None else b[0]))
                wanted.append(listed)
                wanted.append(np.array([self.named[i] for i in listed.tolist() if i in self.named], np.int64))
                if len(others) <= (drops + (b is None)) * self.row_tokens:
                    wanted.append(others)
        return np.unique(np.concatenate([np.zeros(0, np.int64), *wanted]))

    def encode(self, encoder: Encoder, chunk: pa.Table, check_every: int) -> None:
        """Encode the source rows of ``chunk``, the sampled ones checked too (as the build checks them)."""
        indices = chunk.column("index").to_pylist()
        for k, index in enumerate(indices):
            try:
                for item in encode_rows(encoder, Chunk(chunk.slice(k, 1), check_every)):
                    self.encoded[index] = item
            except TemplateMismatch as error:
                self.failed[index] = f"the template check fails, which stops a build ({error})"

    def first_with_ids(self) -> None:
        """Once every row is encoded: note, of each id, the source row earliest in packing
        order that a row holds (the encoded valid rows not in ``skipped_invalid``: segments'
        and dropped rows' conversations), which a build keeps and whose later copies it skips."""
        held = [i for i, item in self.encoded.items() if item.ids is not None and item.id is not None]
        held = [i for i in held if not (self.skipped.size and np.isin(i, self.skipped))]
        for index in sorted(held, key=lambda i: int(self.rank[i])):
            row_id = self.encoded[index].id
            assert row_id is not None  # (held: rows with ids)
            self.first_of.setdefault(row_id, index)

    def _repeated(self, index: int) -> str | None:
        """Why a row may not hold source row ``index``: an earlier copy of its id is held."""
        row_id = self.encoded[index].id
        first = self.first_of.get(row_id) if row_id is not None else None
        if first is None or first == index:
            return None
        return (
            f"source row {first}, earlier in the packing order, has its id {row_id!r}, "
            "so a build skips this one as a duplicate"
        )

    def _unit(self, index: int) -> tuple[np.ndarray, np.ndarray] | str:
        """Source row ``index``'s unit (ids and mask, the separator last), or why it has none."""
        if index in self.failed:
            return f"source row {index}: {self.failed[index]}"
        item = self.encoded[index]
        if item.ids is None or item.mask is None:
            return f"source row {index} is not a valid conversation ({item.invalid})"
        return np.append(item.ids, self.separator_id).astype(np.int32), np.append(item.mask, 0).astype(np.uint8)

    def _skip_problem(self, index: int) -> str | None:
        """Why ``skipped_invalid`` may not list source row ``index`` (``None``: it may)."""
        if index in self.failed:
            return f"source row {index}, in skipped_invalid: {self.failed[index]}"
        item = self.encoded[index]
        if (recorded := self.skipped_ids.get(index)) != item.id:
            return f"source row {index} is in skipped_invalid with id {recorded!r}, but re-read its id is {item.id!r}"
        if item.invalid is not None:
            return None
        if item.id is None:
            return f"source row {index} is in skipped_invalid, but is a valid conversation without an id"
        reason = self.reasons.get(index, "")
        if reason != LEGACY_DUPLICATE and index not in self.named:
            return (
                f"source row {index} is in skipped_invalid as {reason!r}, but is a valid conversation, "
                "which a build skips only as a duplicate of a source row it names"
            )
        named = self.named.get(index)
        if named is not None and (problem := self._first_user_problem(named, item.id)) is not None:
            return f"source row {index} is in skipped_invalid as a duplicate of id {item.id!r} first used by {problem}"
        first = self.first_of.get(item.id)
        if first is None:
            self.duplicates.add(index)  # (skipped as a duplicate id: its earlier copy is not among the rows read)
        elif self.rank[first] > self.rank[index]:
            return (
                f"source row {index} is in skipped_invalid, a duplicate of id {item.id!r}, but the copy a row "
                f"holds, source row {first}, comes later in the packing order"
            )
        return None

    def _first_user_problem(self, named: int, row_id: str) -> str | None:
        """Why source row ``named`` cannot be the one that used ``row_id`` first: a row must
        hold it (a valid conversation, not skipped), with that id."""
        first = self.encoded.get(named)
        if named in self.failed or first is None or first.ids is None:
            return f"source row {named}, which is not a conversation a row holds"
        if self.skipped.size and np.isin(named, self.skipped):
            return f"source row {named}, which skipped_invalid lists too"
        if first.id != row_id:
            return f"source row {named}, whose id is {first.id!r}"
        return None

    def _stretch(self, a: Point | None, b: Point | None, drops: int, kept: int = 0) -> tuple[str | None, int]:
        """The problem with the stream from ``a`` (``None``: its start) to ``b`` (``None``: its
        end), and the rows dropped there. Cut into rows, it holds ``kept`` rows with a
        supervised token after their first (rows the build kept, not checked here) and at
        most ``drops`` others (rows it dropped); to the end, then the final partial row of
        ``stats.tail_tokens_dropped`` tokens."""
        pieces: list[tuple[np.ndarray, np.ndarray]] = []
        if a is not None and b is not None and a[0] == b[0]:
            if b[1] < a[1]:
                return f"source row {b[0]} goes on at token {b[1]}, before token {a[1]}, where it stopped", 0
            unit = self._unit(b[0])
            assert not isinstance(unit, str)  # (a segment's unit: checked valid before)
            pieces.append((unit[0][a[1] : b[1]], unit[1][a[1] : b[1]]))
        else:
            if a is not None and b is not None and self.rank[b[0]] <= self.rank[a[0]]:
                return (
                    f"source row {b[0]} (packing position {self.rank[b[0]]}) comes before source row "
                    f"{a[0]} (position {self.rank[a[0]]}) in the packing order",
                    0,
                )
            listed, others = self._split(self._between(None if a is None else a[0], None if b is None else b[0]))
            if len(others) > (drops + kept + (b is None)) * self.row_tokens:
                if b is None:
                    return f"{len(others)} source rows follow it in the packing order: more than a partial row", 0
                return (
                    f"source row {others[0]} (packing position {self.rank[others[0]]}) comes between them, "
                    "and neither a segment nor skipped_invalid names it",
                    0,
                )
            for index in listed.tolist():
                if (problem := self._skip_problem(index)) is not None:
                    return problem, 0
            ends = [] if a is None else [(a[0], a[1], None)]
            last = [] if b is None else [(b[0], 0, b[1])]
            for index, start, end in [*ends, *((i, 0, None) for i in others.tolist()), *last]:
                unit = self._unit(index)
                if isinstance(unit, str):
                    return unit, 0
                if (b is None or index != b[0]) and (a is None or index != a[0]) and (problem := self._repeated(index)):
                    return f"source row {index}: {problem}", 0
                pieces.append((unit[0][start:end], unit[1][start:end]))
        mask = np.concatenate([np.zeros(0, np.uint8), *(m for _, m in pieces)])
        size = self.row_tokens
        rows, partial = divmod(len(mask), size)
        if b is None and partial != self.tail_of_all:
            tail = self.tail_of_all
            return f"the stream ends {partial} tokens after whole rows, stats.tail_tokens_dropped says {tail}", 0
        if b is not None and partial:
            return f"{len(mask)} tokens of the stream lie between them, not whole rows of {size}", 0
        where = "between them" if b is not None else "after it"
        trained = sum(bool(mask[k * size + 1 : (k + 1) * size].any()) for k in range(rows))
        if trained != kept and not kept:
            return f"a row of the stream {where} has supervised tokens after its first, which a build keeps", 0
        if trained != kept:
            return f"{trained} rows of the stream {where}, not {kept}, have supervised tokens after their first", 0
        if rows - kept > drops:
            return f"{rows - kept} rows of the stream lie {where}, more than stats.rows_skipped leaves", 0
        return None, rows - kept

    def _declared(self, row: int, held: StoredRow, end: bool) -> str | None:
        """Why the file's row ``row`` (not checked) cannot end (``end``; else begin) as its last
        (first) segment says: that segment must name a unit a row may hold, with its id; where
        the row holds others, start at the unit's token 0 (the first: end at the unit's end),
        as packing cuts rows (one alone covers the row: ``verify`` checks it before); and the
        row's tokens and mask there must be that unit's (its provenance is not in its hash)."""
        segment = held.segments[-1] if end else held.segments[0]
        index, token = (segment.index, segment.end) if end else (segment.index, segment.start)
        side = "ends" if end else "begins"
        if not self._in_range(index):
            return f"row {row} {side} in source row {index}, but the source has {len(self.order)} rows"
        unit = self._unit(index)
        if isinstance(unit, str):
            return f"row {row} {side} in source row {index}, which a row cannot hold: {unit}"
        if self.skipped.size and np.isin(index, self.skipped):
            return f"row {row} {side} in source row {index}, which skipped_invalid lists"
        if not (0 < token <= len(unit[0]) if end else 0 <= token < len(unit[0])):
            return f"row {row} {side} at token {token} of source row {index}, whose unit holds {len(unit[0])} tokens"
        if not same(segment.id, self.encoded[index].id):
            held_id = self.encoded[index].id
            return f"row {row} {side} in source row {index} with id {segment.id!r}, but its id is {held_id!r}"
        size = segment.end - segment.start
        if len(held.segments) > 1 and end and segment.start != 0:
            return (
                f"row {row}'s last segment starts at token {segment.start} of source row {index}, but a "
                "conversation after another in a row starts at 0"
            )
        if len(held.segments) > 1 and not end and segment.end != len(unit[0]):
            return (
                f"row {row}'s first segment ends at token {segment.end} of source row {index}, before its unit's end "
                f"({len(unit[0])}), but another segment follows it"
            )
        part = slice(len(held.ids) - size, None) if end else slice(0, size)
        if not 0 < size <= len(held.ids) or not (
            np.array_equal(held.ids[part], unit[0][segment.start : segment.end])
            and np.array_equal(held.mask[part], unit[1][segment.start : segment.end])
        ):
            return f"row {row}'s tokens where it {side} are not source row {index}'s, {segment.start} to {segment.end}"
        return None

    def check(self, number: int, stored: dict[int, StoredRow], beside: dict[int, StoredRow]) -> str | None:
        """The first problem of stored row ``number`` (``None``: it is proven); ``beside``: the
        rows next to the checked ones, as the file holds them."""
        row = stored[number]
        segments = row.segments
        if not segments:
            return "it has no segments"
        pieces = []
        for i, s in enumerate(segments):
            at = f"segment {i} (source row {s.index}, tokens {s.start} to {s.end})"
            if not self._in_range(s.index):
                return f"{at}: the source has {len(self.order)} rows"
            if self.skipped.size and np.isin(s.index, self.skipped):
                return f"{at}: skipped_invalid lists source row {s.index}"
            unit = self._unit(s.index)
            if isinstance(unit, str):
                return f"{at}: {unit}"
            if not same(s.id, self.encoded[s.index].id):
                return f"{at}: its id is {s.id!r}, source row {s.index}'s is {self.encoded[s.index].id!r}"
            if (problem := self._repeated(s.index)) is not None:
                return f"{at}: {problem}"
            if not 0 <= s.start < s.end <= len(unit[0]):
                return f"{at}: source row {s.index}'s unit holds {len(unit[0])} tokens"
            if i > 0 and s.start != 0:
                return f"{at}: starts at {s.start}, but a conversation after another in a row starts at 0"
            if i < len(segments) - 1 and s.end != len(unit[0]):
                return f"{at}: ends before its unit's end ({len(unit[0])}), but another segment follows it"
            pieces.append((unit[0][s.start : s.end], unit[1][s.start : s.end]))
        for where, a, b, drops, declared in self._links(number, stored, beside):
            if declared is not None:  # (a row beside it, as the file holds it)
                if (problem := self._declared(declared, beside[declared], end=declared < number)) is not None:
                    return f"{where}: {problem}"
            elif a is not None and not self._in_range(a[0]):
                continue  # (the checked row before names a row the source lacks: its own check says so)
            problem, dropped = self._stretch(a, b, max(0, drops - self.dropped) if drops else 0)
            if problem is not None:
                return f"{where}: {problem}"
            self.dropped += dropped
        ids = np.concatenate([np.zeros(0, np.int32), *(p[0] for p in pieces)])
        mask = np.concatenate([np.zeros(0, np.uint8), *(p[1] for p in pieces)])
        if (problem := _first_difference(row.ids, row.mask, ids, mask)) is not None:
            return problem
        cu = boundaries([s.end - s.start for s in segments]) if self.bounded else None
        if row_digest(ids, mask, cu) != bytes.fromhex(self.hashes[number]):
            return f"the re-encoded row's hash is not row_sha256[{number}]"
        if (problem := self._order_after_earlier(number, stored)) is not None:
            return problem
        if self.tail is not None and number == self.rows - 1:
            last = segments[-1]
            left = len(self._unit(last.index)[0]) - last.end
            if left != self.tail:
                return f"its last segment leaves {left} tokens of its unit, stats.tail_tokens_dropped says {self.tail}"
        return None

    def _order_after_earlier(self, number: int, stored: dict[int, StoredRow]) -> str | None:
        """Where the checked row before ``number`` is not ``number - 1``: the problem when
        ``number`` does not come after it in the stream; within one conversation, when the
        stream between them does not hold exactly the rows between (each with a supervised
        token after its first), and no more dropped rows than ``stats.rows_skipped``."""
        earlier = [k for k in stored if k < number - 1]
        if not earlier or number - 1 in stored:
            return None
        k = max(earlier)
        if not stored[k].segments or not stored[number].segments:
            return None  # (a row without segments: its own check says so)
        a, b = stored[k].segments[-1], stored[number].segments[0]
        if not self._in_range(a.index):
            return None
        if a.index == b.index:
            problem, _ = self._stretch((a.index, a.end), (b.index, b.start), self.rows_skipped, number - k - 1)
            if problem is not None:
                return f"from row {k}'s end: {problem}"
        elif self.rank[b.index] <= self.rank[a.index]:
            return (
                f"source row {b.index}, where it starts, comes before source row {a.index}, where row {k} "
                "ends, in the packing order"
            )
        return None


def _first_difference(
    ids: np.ndarray, mask: np.ndarray, rebuilt_ids: np.ndarray, rebuilt_mask: np.ndarray
) -> str | None:
    """Where the stored row first differs from the re-encoded one."""
    if len(ids) != len(rebuilt_ids):
        return f"it holds {len(ids)} tokens, its segments {len(rebuilt_ids)}"
    for name, here, again in (("input_ids", ids, rebuilt_ids), ("loss_mask", mask, rebuilt_mask)):
        bad = np.flatnonzero(here.astype(np.int64) != again.astype(np.int64))
        if len(bad):
            p = int(bad[0])
            return f"{name} differ at position {p}: {int(here[p])} stored, {int(again[p])} re-encoded"
    return None


def report(result: SpotCheck) -> tuple[bool, list[str]]:
    """Whether the rows are proven, and a line per input compared and per row."""
    verdict = "proves them" if result.same else "does not prove them"
    count = f"{len(result.rows)} row{'s' if len(result.rows) != 1 else ''}"
    drawn = f" (--rows {result.spec} draws them again)" if result.spec.sample is not None else ""
    lines = [f"the spot check of {count}{drawn} from the recorded inputs {verdict}"]
    for c in result.inputs:
        lines.append(f"  {c.key}: same" if c.same else f"  {c.key}: differs ({difference(c.here, c.rebuilt)})")
    for number in result.rows:
        problem = result.problems.get(number)
        lines.append(f"  row {number}: same" if problem is None else f"  row {number}: differs ({problem})")
    if result.duplicates:
        shown = ", ".join(map(str, result.duplicates[:5])) + (", ..." if len(result.duplicates) > 5 else "")
        lines.append(
            f"  skipped as duplicate ids, not proven: source rows {shown} (their reasons name no earlier "
            "copy, as builds wrote them before; check the rows from row 0 past them, or --rebuild without --rows)"
        )
    left = "where a row after an unchecked one is cut, ids repeated from rows not read, the stats"
    if result.every:  # (every cut and conversation read: the stats but rows_skipped and the tail are left)
        left = "the stats but rows_skipped and tail_tokens_dropped"
    left += ", template_check, source_mix, skipped_invalid outside the rows read"
    lines.append(f"  not proven by a spot check: {left}; --rebuild without --rows proves them")
    return result.same, lines

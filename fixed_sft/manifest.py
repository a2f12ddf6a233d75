"""The typed manifest: ``manifest.json`` as dataclasses, written by a build and read strictly.

Its keys and their meaning are in data/README.md; the dataclasses below hold them in the
order a build writes them, so ``encode`` gives the same JSON a build always wrote. ``read``
is the one way verify and rebuild take a manifest: every key named here, of its type
(``fields.decode``: nothing coerced), no other key, and each count in 0 .. 2**63 - 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from .fields import FieldError, NonEmptyStrings, Within, decode, encode, omitted
from .output import BOUNDARIES_FORMAT, FORMAT, PARQUET_NAME

Format = Literal["fixed-sft/2", "fixed-sft/3"]  # the second: with boundaries (``params.emit_boundaries``)
ParquetName = Literal["train.parquet"]
THIS_FORMAT: Format = "fixed-sft/2"
PARQUET: ParquetName = "train.parquet"
assert get_args(Format) == (FORMAT, BOUNDARIES_FORMAT) and FORMAT == THIS_FORMAT
assert get_args(ParquetName) == (PARQUET_NAME,) == (PARQUET,)

Count = Annotated[int, Within(0, 2**63 - 1, "0 .. 2**63 - 1")]  # a count, or a size
Seed = Annotated[int, Within(0, 2**64 - 1, "0 .. 2**64 - 1")]  # the order's seed (fixed_sft.order)
RowCount = Annotated[int, Within(1, 2**63 - 1, "1 .. 2**63 - 1")]
Globs = Annotated[list[str], NonEmptyStrings()]


@dataclass
class CodeVersion:
    """The code that built: package version, format, ``code_sha256``, in a git checkout its
    commit, and the Kimi tokenizer's BPE (``gigatoken 0.10.0``; its ids are tiktoken's)."""

    fixed_sft: str
    format: Format
    code_sha256: str | None = None  # (the first builds lack it)
    git_commit: str | None = omitted()
    git_dirty: bool | None = omitted()
    bpe: str | None = omitted()  # (manifests before it, and other tokenizers, lack it)


@dataclass
class Params:
    """The parameters the rows depend on."""

    rows: RowCount | Literal["all"]
    row_tokens: Count
    seed: Seed
    order: str
    loss_mask_type: str
    skip_invalid: bool
    separator: str | None = omitted()  # the token after each conversation (manifests before it: the eos token)
    emit_boundaries: bool = omitted(False)  # each row's ``metadata.cu_seqlens`` (written only when true)


@dataclass
class SourceFile:
    """A source file: its path (relative, with ``/``), size and sha256."""

    path: str
    bytes: Count
    sha256: str


@dataclass(kw_only=True)
class SourceRecord:
    """The source: as named, its revision, license, file globs, row count and files."""

    name: str
    revision: str | None
    license: str | None
    file_patterns: None | Globs = None  # (manifests before globs lack it: every file)
    rows: Count
    files: list[SourceFile]


@dataclass
class FileHash:
    """A file's size and sha256."""

    bytes: Count
    sha256: str


@dataclass
class Tokenizer:
    """The tokenizer files, the spec they were checked against, and how they differ from it."""

    name: str | None
    repo: str | None
    revision: str | None
    files: dict[str, FileHash]
    pinned: bool
    mismatches: list[str] = omitted([])


@dataclass
class LossMask:
    """The mask type and the template variables used."""

    type: str
    template_kwargs: dict[str, Any]


@dataclass
class TemplateCheck:
    """1 in ``every`` conversations checked against the rendered template (0: none);
    ``checked``: how many; ``sample``: which, ``source_row`` for those of the source rows
    ``encode.sampled`` picks (manifests before it lack it: the conversations at packing
    positions that are multiples of ``every``)."""

    every: Count
    checked: Count
    sample: Literal["source_row"] | None = omitted()


@dataclass
class Stats:
    """What the rows hold."""

    rows: Count
    tokens: Count
    supervised_tokens: Count
    supervised_token_ratio: float
    trainable_tokens: Count
    padding_tokens: Count
    conversations: Count
    conversations_split: Count
    rows_skipped: Count
    tail_tokens_dropped: Count
    invalid_rows_skipped: Count


@dataclass
class SkippedRow:
    """A source row skipped as invalid: its index, id and why."""

    index: Count
    id: str | None
    reason: str


@dataclass
class ParquetFile:
    """``train.parquet``: its size and sha256."""

    path: ParquetName
    bytes: Count
    sha256: str


@dataclass
class SourceShare:
    """The kept rows' conversations and tokens from source rows of one ``source`` value
    (``None``: rows without a string ``source``)."""

    source: str | None
    conversations: Count
    tokens: Count


@dataclass
class Card:
    """The dataset card beside the rows: the license it declares, and the size and sha256
    of each of its files (``README.md`` and its plots: ``output.CARD_FILES``)."""

    license: str
    files: dict[str, FileHash]


@dataclass(kw_only=True)
class Manifest:
    """A build's ``manifest.json``; ``source_mix`` and ``card`` are absent where the build
    recorded none (a source without a ``source`` column, ``--no-card``, earlier builds)."""

    format: Format
    name: str
    code_version: CodeVersion
    params: Params
    source: SourceRecord
    tokenizer: Tokenizer
    loss_mask: LossMask
    template_check: TemplateCheck
    stats: Stats
    source_mix: list[SourceShare] | None = omitted()
    skipped_invalid: list[SkippedRow]
    parquet: ParquetFile
    card: Card | None = omitted()
    rows_sha256: str
    row_sha256: list[str]

    def to_json(self) -> dict[str, Any]:
        """The manifest as the JSON object a build writes."""
        document: dict[str, Any] = encode(self)
        return document


def read(document: Any) -> Manifest:
    """``document`` (parsed JSON) as a ``Manifest``; ``FieldError`` naming the first key that
    is missing, unknown or of another kind, or a count outside 0 .. 2**63 - 1."""
    if not isinstance(document, dict):
        raise FieldError("not a JSON object")
    return decode(Manifest, document)

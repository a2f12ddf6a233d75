"""The one typed definition of a build's parameters: ``BuildConfig``, and what derives from it.

Each field of ``BuildConfig`` carries its type, its default, its range rule, the flag
that sets it (``--row-tokens`` for ``row_tokens``), whether a named build spec may set it,
and where the manifest records it (``params.row_tokens``). The CLI's build flags, the
keys a build spec may hold (``BuildSpec``), the range messages in each spelling and the
rebuild's recorded config are derived from these fields, not listed again.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from .chat import MASK_TYPES as KIMI_MASK_TYPES
from .engine import MAX_WORKERS, usable_cores
from .errors import UsageError
from .fields import hints
from .hf_chat import MASK_TYPES as HF_MASK_TYPES
from .manifest import Globs, Manifest
from .tokenizer import BPES

MAX_ROW_TOKENS = 1 << 20


class Range:
    """A parameter's range rule: ``problem(label, value)`` says how a value outside it is wrong."""

    def problem(self, label: str, value: Any) -> str | None:
        raise NotImplementedError


@dataclass(frozen=True)
class Between(Range):
    """An integer in ``low .. high`` (``high_text``: how the bound is written, if not in digits)."""

    low: int
    high: int
    high_text: str = ""

    def problem(self, label: str, value: Any) -> str | None:
        if self.low <= value <= self.high:
            return None
        return f"{label} must be between {self.low} and {self.high_text or self.high}, got {value}"


@dataclass(frozen=True)
class AtLeast(Range):
    """An integer of at least ``low`` (``None`` passes: all), named by ``what``, and at most
    2**63 - 1, as a manifest records a count."""

    low: int
    what: str

    def problem(self, label: str, value: Any) -> str | None:
        if value is None or self.low <= value <= 2**63 - 1:
            return None
        return (
            f"{label} must be {self.what}, got {value}"
            if value < self.low
            else f"{label} must be at most 2**63 - 1, got {value}"
        )


@dataclass(frozen=True)
class OneOf(Range):
    """One of ``known`` (or ``None``, where ``optional``)."""

    known: tuple[str, ...]
    optional: bool = False

    def problem(self, label: str, value: Any) -> str | None:
        if value in self.known or (value is None and self.optional):
            return None
        return f"unknown {label} {value!r} (known: {', '.join(self.known)})"


class JsonObject(Range):
    """A JSON object, or ``None``; none of ``reserved`` among its keys."""

    def __init__(self, reserved: tuple[str, ...] = ()):
        self.reserved = reserved

    def problem(self, label: str, value: Any) -> str | None:
        shown = value if isinstance(value, str) else json.dumps(value)
        if value is not None and not isinstance(value, dict):
            return f"{label} must be a JSON object, got {shown}"
        taken = [key for key in self.reserved if value is not None and key in value]
        if taken:
            return f"{label} may not set {taken[0]!r}: the renderer sets it ({', '.join(self.reserved)})"
        return None


# what transformers' renderer passes its template, or takes as its own arguments, and what the Kimi
# tokenizer passes it (tools_ts_str, from the tools): not template variables
RENDERER_ARGUMENTS = (
    "messages",
    "tools",
    "documents",
    "add_generation_prompt",
    "conversations",
    "chat_template",
    "continue_final_message",
    "return_assistant_tokens_mask",
    "tools_ts_str",
)


class LicenseId(Range):
    """A license id as the Hugging Face Hub writes them (``odc-by``, ``apache-2.0``), or ``None``."""

    def problem(self, label: str, value: Any) -> str | None:
        if value is None or re.fullmatch(r"[a-z0-9][a-z0-9.+-]*", value):
            return None
        return f"{label} must be a license id such as odc-by or apache-2.0 (lowercase), got {value!r}"


class NonEmpty(Range):
    """A non-empty tuple of non-empty strings, or ``None``."""

    def problem(self, label: str, value: Any) -> str | None:
        return None if value is None or (value and all(value)) else f"{label} must not be empty"


ALL = "all"  # how specs, flags and manifests write ``rows=None``: the whole source


def param(
    default: Any = dataclasses.MISSING,
    *,
    help: str = "",
    flag: bool = True,
    spec: bool = False,
    recorded: str | None = None,
    range: Range | None = None,
    json: Any = None,
    metavar: str | None = None,
    flag_default: Callable[[], Any] | None = None,
) -> Any:
    """A ``BuildConfig`` field: ``help`` (``{default}`` is filled in) for its flag, if it has one
    (``flag``); whether a build spec may set it (``spec``), the manifest key path that records
    it (``recorded``), its ``range`` rule, its JSON type in a spec or manifest where it is not
    the field's own (``json``), and the flag's default where a flag left out does not mean
    the spec's value or the field's default (``flag_default``, called when the parser is made)."""
    meta = {
        "help": help,
        "flag": flag,
        "spec": spec,
        "recorded": recorded,
        "range": range,
        "json": json,
        "metavar": metavar,
        "flag_default": flag_default,
    }
    return field(default=default, metadata=meta)


def flag(name: str) -> str:
    """The flag that sets parameter ``name``: ``--row-tokens``."""
    return "--" + name.replace("_", "-")


@dataclass
class BuildConfig:
    """A build's parameters (the CLI's flags; defaults: the default build's)."""

    name: str = param(flag=False, recorded="name")
    source: str = param(
        help="Hub dataset id, or a local .parquet/.jsonl file or folder (Tulu schema)",
        spec=True,
        recorded="source.name",
        metavar="HF_ID|FILE|FOLDER",
    )
    source_revision: str | None = param(
        None,
        help="dataset revision (required with a Hub id given by --source)",
        spec=True,
        recorded="source.revision",
        metavar="REV",
    )
    source_license: str | None = param(
        None, help="license recorded in the manifest", spec=True, recorded="source.license", metavar="LICENSE"
    )
    source_files: tuple[str, ...] | None = param(  # globs choosing the source's files (None: all)
        None,
        help="read only the source's files whose path matches GLOB, such as 'data/train-*' (repeatable; "
        "default: every .parquet/.jsonl file)",
        spec=True,
        recorded="source.file_patterns",
        range=NonEmpty(),
        json=Globs,
        metavar="GLOB",
    )
    tokenizer: str = param(
        "kimi-k2.6",
        help="tokenizer spec name (fixed_sft/tokenizer_specs/), Hub repo id, or "
        "local folder (default: the named build's, else {default}, downloaded from the Hub)",
        spec=True,
        metavar="SPEC|HF_REPO|FOLDER",
    )
    tokenizer_revision: str | None = param(
        None, help="tokenizer revision (default: the spec's pinned one)", recorded="tokenizer.revision", metavar="REV"
    )
    loss_mask_type: str = param(
        "kimi_k25",
        help="loss mask type: kimi_k25 (the Kimi tokenizer's; default) or assistant (a Hugging Face "
        "tokenizer's: its generation blocks, else what each assistant message adds to the text)",
        spec=True,
        recorded="params.loss_mask_type",
        range=OneOf((*KIMI_MASK_TYPES, *HF_MASK_TYPES)),
        metavar="TYPE",
    )
    separator: str | None = param(
        None,
        help="the token after each conversation, a single token of the vocabulary (default: the tokenizer's eos_token)",
        recorded="params.separator",
        metavar="TOKEN",
    )
    bpe: str | None = param(  # None: gigatoken where it is installed, else tiktoken
        None,
        help="the Kimi tokenizer's BPE: gigatoken (fast, its ids checked against tiktoken's at load and "
        "with --check-every) or tiktoken (default: gigatoken when installed, else tiktoken)",
        range=OneOf(BPES, optional=True),
        metavar="|".join(BPES),
    )
    trust_remote_code: bool = param(
        False, help="let transformers run a Hugging Face tokenizer's own code (the Kimi path runs none; default: off)"
    )
    template_kwargs: dict[str, Any] | None = param(  # None: the tokenizer spec's
        None,
        help="chat template variables, a JSON object (default: the named build's, else the tokenizer spec's: "
        '{{"thinking": true, "preserve_thinking": false}})',
        spec=True,
        recorded="loss_mask.template_kwargs",
        range=JsonObject(RENDERER_ARGUMENTS),
        metavar="JSON",
    )
    rows: int | None = param(
        6400,
        help="rows to build, or 'all' (default: the named build's, else {default})",
        spec=True,
        recorded="params.rows",
        range=AtLeast(1, "a positive number or 'all'"),
        json=int | Literal["all"],
        metavar="N|all",
    )  # None: pack the whole source
    row_tokens: int = param(
        8192,
        help="tokens per row (default: the named build's, else {default})",
        spec=True,
        recorded="params.row_tokens",
        range=Between(2, MAX_ROW_TOKENS),
        metavar="N",
    )
    seed: int = param(
        42,
        help="order seed (default: the named build's, else {default})",
        spec=True,
        recorded="params.seed",
        range=Between(0, 2**64 - 1, "2**64 - 1"),
        metavar="N",
    )
    workers: int = param(
        1,
        help="encoding processes (default: the cores this process may use)",
        range=Between(1, MAX_WORKERS),
        flag_default=usable_cores,
        metavar="N",
    )
    check_every: int = param(
        64,
        help="check the conversations of 1 in N source rows against the rendered template (0: off; default {default})",
        recorded="template_check.every",
        range=AtLeast(0, "non-negative"),
        metavar="N",
    )
    skip_invalid: bool = param(False, help="skip invalid source rows and record them", recorded="params.skip_invalid")
    emit_boundaries: bool = param(
        False,
        help="add each row's conversation boundaries, metadata.cu_seqlens (format fixed-sft/3; the row hash "
        "covers them; default: off)",
        recorded="params.emit_boundaries",
    )
    allow_unpinned_tokenizer: bool = param(
        False, help="build with tokenizer files that differ from their spec, and record it"
    )
    no_card: bool = param(False, help="write no dataset card (README.md and its plots) beside the rows")
    card_license: str | None = param(
        None,
        help="the license the dataset card declares, a Hub license id (default: odc-by for an ODC-By source "
        "such as Tulu 3, the source's license where it is such an id, else other, or unknown without one)",
        range=LicenseId(),
        metavar="LICENSE",
    )
    cache_dir: str | None = param(
        None,
        help="the token store's folder: conversations tokenized by earlier builds, reused (default: "
        "$FIXED_SFT_CACHE, else $XDG_CACHE_HOME/fixed-sft, else ~/.cache/fixed-sft)",
        metavar="DIR",
    )
    no_cache: bool = param(False, help="neither read nor write the token store (the rows are the same)")
    expected_tokenizer: str | None = param(None, flag=False)  # the spec a tokenizer folder must match
    source_rows: int | None = param(None, flag=False, spec=True, recorded="source.rows")  # the count, when known

    def validate(self, label: Callable[[str], str] = flag) -> None:
        """Raise ``UsageError`` for the first parameter outside its range rule, calling it by
        ``label(key)`` (by default the flag that sets it)."""
        for item in dataclasses.fields(self):
            rule: Range | None = item.metadata.get("range")
            if rule is not None and (problem := rule.problem(label(item.name), getattr(self, item.name))):
                raise UsageError(problem)


PARAMS = {item.name: item for item in dataclasses.fields(BuildConfig)}
FLAGS = [name for name, item in PARAMS.items() if item.metadata["flag"]]  # in the order of ``--help``
SPEC_KEYS = [name for name, item in PARAMS.items() if item.metadata["spec"]]
RECORDED = {name: item.metadata["recorded"] for name, item in PARAMS.items() if item.metadata["recorded"]}


def json_kind(name: str) -> Any:
    """Parameter ``name``'s type as JSON writes it (in a spec or a manifest)."""
    return PARAMS[name].metadata["json"] or hints(BuildConfig)[name]


def takes_all(name: str) -> bool:
    """Whether parameter ``name`` is written ``"all"`` where its value is ``None`` (as ``rows``)."""
    return Literal["all"] in get_args(json_kind(name))


def from_json(name: str, value: Any) -> Any:
    """Parameter ``name``'s value from its spec, flag or manifest value: ``"all"`` is ``None``
    (``takes_all``), a list of globs a tuple."""
    if value == ALL and takes_all(name):
        return None
    return tuple(value) if isinstance(value, list) else value


def to_json(name: str, value: Any) -> Any:
    """Parameter ``name``'s value as a spec or manifest writes it (``from_json`` undone)."""
    if value is None and takes_all(name):
        return ALL
    return list(value) if isinstance(value, tuple) else value


def recorded_values(manifest: Manifest) -> dict[str, Any]:
    """The parameters ``manifest`` records, each where ``RECORDED`` says."""
    return {
        name: from_json(name, functools.reduce(getattr, path.split("."), manifest)) for name, path in RECORDED.items()
    }


def manifest_label(name: str) -> str:
    """How a manifest names parameter ``name``: its key path, such as ``params.seed``."""
    return RECORDED.get(name, name)


def _spec_fields() -> list[tuple[str, Any, Any]]:
    """``BuildSpec``'s fields: each parameter a spec may set (``source`` required, the rest
    may be null or absent), then ``published``, ``name`` and ``description``."""
    fields: list[tuple[str, Any, Any]] = []
    for name in SPEC_KEYS:
        kind = json_kind(name)
        if PARAMS[name].default is dataclasses.MISSING:  # (``source``: a spec must name it)
            fields.append((name, kind, field()))
        else:
            fields.append((name, kind if _nullable(kind) else kind | None, field(default=None)))
    fields.append(("published", dict[str, Any] | None, field(default=None)))
    fields += [("name", Any, field(default=None)), ("description", Any, field(default=None))]
    return fields


def _nullable(kind: Any) -> bool:
    return type(None) in getattr(kind, "__args__", ())


# A named build's spec (fixed_sft/builds/NAME.json): the parameters a spec may set, null
# meaning not given; ``published``: values published for the build; ``name`` and
# ``description`` for information.
BuildSpec = dataclasses.make_dataclass("BuildSpec", _spec_fields(), kw_only=True)

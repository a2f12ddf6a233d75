"""A build folder -> what a person reads of it: a summary of the build, or one row decoded.

The summary counts the rows, tokens, supervised tokens and conversations from the rows
themselves, a row group at a time (``reader``), and says where a count, or the Parquet
file's sha256, is not the manifest's (``Summary.agrees``); the skipped rows, the source mix
and the card are the manifest's. A row is shown only where it hashes to its manifest
entry (``row_sha256``: else its text is not the build's). It is decoded with the build's
tokenizer, resolved as ``verify --rebuild`` resolves it (the recorded spec or repo, or
``--tokenizer FOLDER``; its files must be the recorded ones) but from the Hugging Face
cache alone. Its supervised tokens are marked (in colour on a terminal, else between
``[[`` and ``]]``), and each segment starts with a line naming its source row and id.
Control characters of the text are shown as escapes (``\\x1b``), so a row cannot drive
the terminal; the HTML page escapes every text it shows.
"""

from __future__ import annotations

import html
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from .errors import BuildError, UsageError
from .fields import FieldError
from .hashes import boundaries, row_digest, sha256_file
from .manifest import Manifest, read
from .output import MANIFEST_NAME, PARQUET_NAME
from .reader import Refused, RowFile
from .verify import Conversations, ManifestRefused, check_metadata, described, read_manifest

ROW_COLUMNS = [
    "metadata.input_ids.list.element",
    "metadata.loss_mask.list.element",
    "metadata.row",
    *(f"metadata.segments.list.element.{key}" for key in ("source_index", "id", "start", "end")),
]
SUMMARY_COLUMNS = ["metadata.loss_mask.list.element", "metadata.segments.list.element.source_index"]
OPEN, CLOSE = "[[", "]]"  # around supervised text, where there is no colour
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def open_build(folder: Path) -> Manifest:
    """The manifest of build folder ``folder``; ``BuildError`` (one line) for a folder
    without a manifest, or whose manifest does not read. Other files in the folder are
    not its concern (``verify`` names data files the build did not write)."""
    if not folder.is_dir():
        raise BuildError(f"{folder}: {'not a folder' if folder.exists() else 'no such folder'}")
    if not os.path.lexists(folder / MANIFEST_NAME):
        raise BuildError(f"{folder} is not a build folder (it has no {MANIFEST_NAME})")
    try:
        return read(read_manifest(folder / MANIFEST_NAME))
    except (ManifestRefused, FieldError) as error:
        raise BuildError(f"{folder / MANIFEST_NAME}: {error}") from None
    except (OSError, ValueError, TypeError, RecursionError) as error:
        raise BuildError(f"{folder / MANIFEST_NAME}: unreadable ({described(error)})") from None


def _rows(folder: Path, manifest: Manifest) -> RowFile:
    path = folder / PARQUET_NAME
    try:
        return RowFile(path, len(manifest.row_sha256), manifest.params.row_tokens, manifest.params.emit_boundaries)
    except Refused as error:
        raise BuildError(str(error)) from None
    except (OSError, ValueError) as error:
        raise BuildError(f"{path}: unreadable ({described(error)})") from None


def _unreadable(folder: Path, error: Exception) -> BuildError:
    return BuildError(str(error) if isinstance(error, Refused) else f"{folder / PARQUET_NAME}: {described(error)}")


@dataclass
class Summary:
    """The summary's lines, and whether every count from the rows is the manifest's."""

    lines: list[str]
    agrees: bool


def summary(folder: Path) -> Summary:
    """The summary of a build (module docstring)."""
    manifest = open_build(folder)
    stats, row_tokens = manifest.stats, manifest.params.row_tokens
    rows = tokens = supervised = 0
    counted = Conversations()
    try:
        with _rows(folder, manifest) as file:
            for group in file.groups(SUMMARY_COLUMNS):
                metadata = group.column("metadata")
                mask = pc.list_flatten(pc.struct_field(metadata, "loss_mask")).to_numpy(zero_copy_only=False)
                rows, tokens = rows + group.rows, tokens + len(mask)
                supervised += int(np.count_nonzero(mask))
                counted.add(metadata)
            counted.finish()
        digest = sha256_file(folder / PARQUET_NAME)
    except (Refused, OSError, ValueError) as error:
        raise _unreadable(folder, error) from None

    same_file = digest == manifest.parquet.sha256
    agrees = same_file

    def figure(value: int, recorded: int) -> str:
        nonlocal agrees
        if value == recorded:
            return f"{value:,}"
        agrees = False
        return f"{value:,} (the manifest says {recorded:,}: run verify)"

    ratio = supervised / tokens if tokens else 0.0
    lines = [
        f"{folder}: {manifest.name} ({manifest.format}), rows_sha256 {manifest.rows_sha256}",
        f"rows: {figure(rows, stats.rows)} of {row_tokens:,} tokens",
        f"tokens: {figure(tokens, stats.tokens)}",
        f"supervised tokens: {figure(supervised, stats.supervised_tokens)}, ratio {ratio:.4f}",
        f"conversations: {figure(counted.conversations, stats.conversations)}, "
        f"split across rows: {figure(counted.split, stats.conversations_split)}",
        f"rows skipped: {stats.rows_skipped:,} without a supervised token after token 0, "
        f"{stats.invalid_rows_skipped:,} invalid source rows",
        f"source: {manifest.source.name}" + (f" @ {manifest.source.revision}" if manifest.source.revision else ""),
        f"{PARQUET_NAME}: sha256 "
        + (
            f"{digest}, the manifest's"
            if same_file
            else f"{digest} (the manifest says {manifest.parquet.sha256}: run verify)"
        ),
    ]
    if manifest.source_mix is None:
        lines.append("source mix: not recorded (the source rows have no source column, or the build is older)")
    else:
        lines.append("source mix (conversations, tokens, share of tokens):")
        mix = sorted(manifest.source_mix, key=lambda s: (-s.tokens, s.source is None, s.source or ""))
        width = max(len(visible(s.source or "(none)")) for s in mix)
        for share in mix:
            name = visible(share.source or "(none)")
            lines.append(
                f"  {name:<{width}}  {share.conversations:>9,}  {share.tokens:>13,}  "
                f"{share.tokens / max(stats.tokens, 1):>7.2%}"
            )
    card = manifest.card
    lines.append("card: none" if card is None else f"card: {', '.join(card.files)} (license {visible(card.license)})")
    return Summary(lines, agrees)


@dataclass
class Piece:
    """Consecutive tokens of one segment that are all supervised, or all not, and their text."""

    segment: int
    supervised: bool
    text: str


@dataclass
class RowView:
    """Row ``number`` of a build, decoded: its segments (``source_index``, ``id``, ``start``,
    ``end``) and its text in pieces."""

    name: str
    number: int
    rows: int
    ids: np.ndarray
    mask: np.ndarray
    segments: list[dict]
    pieces: list[Piece]

    def boundary(self, n: int) -> str:
        """The line that opens segment ``n``."""
        segment = self.segments[n]
        span = segment["end"] - segment["start"]
        row_id = "no id" if segment["id"] is None else f"id {visible(segment['id'])}"
        return (
            f"segment {n}: source row {segment['source_index']} ({row_id}), its tokens "
            f"{segment['start']}..{segment['end'] - 1} ({span} here)"
        )

    def title(self) -> str:
        supervised = int(np.count_nonzero(self.mask))
        return (
            f"{self.name}: row {self.number} of {self.rows}, {len(self.ids):,} tokens, "
            f"{supervised:,} supervised ({supervised / max(len(self.ids), 1):.4f}), {len(self.segments)} segments"
        )


def visible(text: str) -> str:
    """``text`` with its control characters (but newline and tab) as ``\\xNN`` escapes."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def decoder(manifest: Manifest, tokenizer: str | None, command: str = "inspect") -> Callable[[list[int]], str]:
    """Token ids -> text with the build's tokenizer, from the Hugging Face cache or
    ``tokenizer`` (module docstring); ``BuildError`` or ``UsageError`` (one line, naming
    ``command``) where it cannot be had."""
    from .hub import offline
    from .rebuild import recorded_tokenizer, resolve_recorded_tokenizer
    from .source import SourceError
    from .specs import HF, SpecError

    name, spec = recorded_tokenizer(manifest, tokenizer)
    revision = manifest.tokenizer.revision if tokenizer is None else None
    try:
        with offline():
            found = resolve_recorded_tokenizer(name, revision, spec, manifest.tokenizer.files)
    except (SpecError, SourceError) as error:
        raise BuildError(f"{error} ({command} reads the Hugging Face cache alone)") from None
    if found.family == HF:
        from .hf_chat import load_tokenizer

        hf = load_tokenizer(found.directory)

        def decode(ids: list[int]) -> str:
            return str(hf.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))

    else:
        from .tokenizer import load_kimi

        encoding = load_kimi(found.directory, "tiktoken").encoding

        def decode(ids: list[int]) -> str:
            return encoding.decode_bytes(ids).decode("utf-8", errors="replace")

    def safe(ids: list[int]) -> str:
        """The text of ``ids``; an id the vocabulary lacks is shown as ``<id N>``."""
        try:
            return decode(ids)
        except (KeyError, ValueError, OverflowError, TypeError):
            if len(ids) == 1:
                return f"<id {ids[0]}>"
            return "".join(safe([i]) for i in ids)

    return safe


def read_row(folder: Path, manifest: Manifest, number: int) -> tuple[np.ndarray, np.ndarray, list[dict]]:
    """Row ``number``'s ids, mask and segments, read from its row group (``BuildError``
    where the file does not hold it, its segments do not cover its ``row_tokens`` ids, or it
    does not hash to ``row_sha256[number]``)."""
    try:
        with _rows(folder, manifest) as file:
            if number >= file.rows:
                raise BuildError(f"{folder / PARQUET_NAME} holds {file.rows} rows, not row {number}: run verify")
            group = file.group_of(number, ROW_COLUMNS)
    except (Refused, OSError, ValueError) as error:
        raise _unreadable(folder, error) from None
    row = group.column("metadata").slice(number - group.first, 1)
    ids = pc.list_flatten(row.field("input_ids")).to_numpy(zero_copy_only=False)
    mask = pc.list_flatten(row.field("loss_mask")).to_numpy(zero_copy_only=False)
    size = manifest.params.row_tokens
    problem = check_metadata(row, number, size)
    if problem is None and not len(ids) == len(mask) == size:
        problem = f"row {number}: {len(ids)} ids and {len(mask)} mask values, not {size}"
    segments = row.field("segments").to_pylist()[0]
    if problem is None:
        cu = boundaries([s["end"] - s["start"] for s in segments]) if manifest.params.emit_boundaries else None
        if row_digest(ids.astype(np.int32), mask.astype(np.uint8), cu).hex() != manifest.row_sha256[number]:
            problem = f"row {number}: content differs from its manifest hash"
    if problem is not None:  # (decoded as it is, it would show other text than a trainer reads)
        raise BuildError(f"{folder / PARQUET_NAME}: {problem}: run verify")
    return ids, mask, segments


TOKEN_COLUMNS = ["metadata.input_ids.list.element", "metadata.loss_mask.list.element"]


def token_hashes(folder: Path, manifest: Manifest) -> list[bytes]:
    """Each row's hash of its ids and mask alone (``hashes.row_digest`` without boundaries),
    read a row group at a time (``BuildError`` where the file cannot be read)."""
    digests = []
    try:
        with _rows(folder, manifest) as file:
            for group in file.groups(TOKEN_COLUMNS):
                metadata = group.column("metadata")
                ids, mask = (
                    pc.list_flatten(metadata.field(name)).to_numpy(zero_copy_only=False)
                    for name in ("input_ids", "loss_mask")
                )
                width = len(ids) // max(group.rows, 1)
                digests += [row_digest(ids[k : k + width], mask[k : k + width]) for k in range(0, len(ids), width)]
    except (Refused, OSError, ValueError) as error:
        raise _unreadable(folder, error) from None
    return digests


SEGMENT_COLUMNS = [f"metadata.segments.list.element.{key}" for key in ("source_index", "id", "start", "end")]


def segments(folder: Path, manifest: Manifest) -> Iterator[list[dict]]:
    """Each row's segments in order, read a row group at a time (``BuildError`` where the
    file cannot be read)."""
    try:
        with _rows(folder, manifest) as file:
            for group in file.groups(SEGMENT_COLUMNS):
                yield from group.column("metadata").field("segments").to_pylist()
    except (Refused, OSError, ValueError) as error:
        raise _unreadable(folder, error) from None


def row_view(folder: Path, number: int, tokenizer: str | None = None) -> RowView:
    """Row ``number`` of build ``folder``, decoded (``UsageError`` for a row it lacks)."""
    manifest = open_build(folder)
    count = len(manifest.row_sha256)
    if not 0 <= number < count:
        raise UsageError(f"row {number} is out of range: {folder} has rows 0 to {count - 1}")
    ids, mask, segments = read_row(folder, manifest, number)
    decode = decoder(manifest, tokenizer)
    pieces, at = [], 0
    for n, segment in enumerate(segments):
        span = max(0, segment["end"] - segment["start"])
        ends = np.flatnonzero(np.diff(mask[at : at + span] != 0)) + 1  # where the mask changes
        for lo, hi in zip([0, *ends.tolist()], [*ends.tolist(), span]):
            if hi > lo:
                pieces.append(Piece(n, bool(mask[at + lo]), decode(ids[at + lo : at + hi].tolist())))
        at += span
    return RowView(manifest.name, number, count, ids, mask, segments, pieces)


def plain(view: RowView) -> str:
    """The row as plain text: supervised text between ``[[`` and ``]]``."""
    lines, text, segment = [view.title()], list[str](), -1
    for piece in view.pieces:
        if piece.segment != segment:
            if text:
                lines.append("".join(text))
                text = []
            segment = piece.segment
            lines += ["", f"==== {view.boundary(segment)} ===="]
        shown = visible(piece.text)
        text.append(f"{OPEN}{shown}{CLOSE}" if piece.supervised else shown)
    if text:
        lines.append("".join(text))
    return "\n".join(lines) + "\n"


def print_coloured(view: RowView, console: object | None = None) -> None:
    """The row on a terminal (rich): supervised text in green, each segment under a rule."""
    from rich.console import Console
    from rich.rule import Rule
    from rich.text import Text

    out = console if isinstance(console, Console) else Console(highlight=False)
    out.print(Text(view.title(), style="bold"))
    text, segment = Text(), -1
    for piece in view.pieces:
        if piece.segment != segment:
            if segment >= 0:
                out.print(text)
                text = Text()
            segment = piece.segment
            out.print(Rule(Text(view.boundary(segment)), style="cyan"))
        text.append(visible(piece.text), style="bold green" if piece.supervised else "dim")
    out.print(text)


PAGE_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; }
pre { white-space: pre-wrap; word-break: break-all; font-family: ui-monospace, monospace; font-size: 13px; }
.supervised { background: #d4f4d4; color: #063; }
.context { color: #555; }
.boundary { display: block; margin: 1em 0 0.3em; padding: 2px 6px; background: #e8eef8; color: #234; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 2px 8px; text-align: left; }
"""


def page(view: RowView) -> str:
    """The row as one standalone HTML page: every text escaped, supervised text highlighted."""
    e = html.escape
    rows = "".join(
        f"<tr><td>{n}</td><td>{s['source_index']}</td><td>{'' if s['id'] is None else e(s['id'])}</td>"
        f"<td>{s['start']}</td><td>{s['end']}</td></tr>"
        for n, s in enumerate(view.segments)
    )
    body, segment = [], -1
    for piece in view.pieces:
        if piece.segment != segment:
            segment = piece.segment
            body.append(f'<span class="boundary">{e(view.boundary(segment))}</span>')
        kind = "supervised" if piece.supervised else "context"
        body.append(f'<span class="{kind}">{e(visible(piece.text))}</span>')
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{e(view.title())}</title>'
        f"<style>{PAGE_STYLE}</style></head><body>\n"
        f"<h1>{e(view.title())}</h1>\n"
        '<p>Supervised tokens (loss mask 1) are <span class="supervised">highlighted</span>.</p>\n'
        "<table><tr><th>segment</th><th>source row</th><th>id</th><th>start</th><th>end</th></tr>"
        f"{rows}</table>\n<pre>{''.join(body)}</pre>\n</body></html>\n"
    )

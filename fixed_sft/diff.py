"""Two build folders -> where they differ: manifest fields, the first differing row and token, the text around it.

Each folder is first verified against its manifest (``fixed_sft.verify``): rows are compared
by their hashes, so a folder whose rows are not those its manifest hashes is refused,
naming its first difference. The manifests are then compared key by key, as JSON (``1`` is
not ``1.0``); a list of objects is compared item by item and a list of row hashes as a
count of the rows that differ.
The first row whose hash differs is read from both Parquet files: the first token where
the ids or the mask differ, the segments (source row and id) that hold it in each, and
the tokens around it decoded with each build's tokenizer (its files from the Hugging Face
cache or ``--tokenizer``; shown as ids where none can be had). A row only one build has
is named as such. Where every row has the same tokens but the files differ, the first row
whose segments differ is named (the row hashes cover tokens, not provenance). Where a
build has boundaries (``--emit-boundaries``: its row hashes cover them too), rows are
compared by the hashes of their ids and masks alone, read from both files, and where
those are all the same, the first row whose boundaries differ is named.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import inspect_rows
from .errors import BuildError, UsageError
from .fields import same, show
from .inspect_rows import decoder, open_build, token_hashes, visible
from .manifest import Manifest
from .verify import verify

CONTEXT_TOKENS = 12  # tokens shown on each side of the first differing token


KeyPath = tuple[str | int, ...]  # keys and list positions from the top of a JSON document


def fields(a: Any, b: Any, path: KeyPath = ()) -> list[KeyPath]:
    """The paths where JSON values ``a`` and ``b`` differ (module docstring); a key may hold
    dots (a file name), so a path is a tuple, shown dotted.

    >>> fields({"x": 1, "y": [1, 2]}, {"x": 1.0, "y": [1, 3], "z": True})
    [('x',), ('y',), ('z',)]
    >>> fields({"s": [{"k": 1}, {"k": 2}]}, {"s": [{"k": 1}, {"k": 3}]})
    [('s', 1, 'k')]
    """
    if isinstance(a, dict) and isinstance(b, dict):
        found = []
        for key in [*a, *(k for k in b if k not in a)]:
            if key not in a or key not in b:
                found.append((*path, key))
            else:
                found += fields(a[key], b[key], (*path, key))
        return found
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and all(isinstance(x, dict) for x in a + b):
        return [p for k, (x, y) in enumerate(zip(a, b)) for p in fields(x, y, (*path, k))]
    return [] if same(a, b) else [path]


@dataclass
class Row:
    """One build's row: ids, mask and segments."""

    ids: np.ndarray
    mask: np.ndarray
    segments: list[dict]

    def segment_at(self, token: int) -> dict | None:
        """The segment that holds token ``token`` of the row."""
        at = 0
        for segment in self.segments:
            at += max(0, segment["end"] - segment["start"])
            if token < at:
                return segment
        return None


def read_row(folder: Path, manifest: Manifest, number: int) -> Row:
    """Row ``number`` of ``folder`` (``BuildError`` where the file does not hold it)."""
    return Row(*inspect_rows.read_row(folder, manifest, number))


def first_token(a: Row, b: Row) -> int:
    """The first token where the rows' ids or masks differ (the shorter row's length when
    one is a prefix of the other)."""
    n = min(len(a.ids), len(b.ids))
    differs = np.flatnonzero((a.ids[:n] != b.ids[:n]) | (a.mask[:n] != b.mask[:n]))
    return int(differs[0]) if len(differs) else n


def _around(folder: Path, manifest: Manifest, row: Row, token: int, tokenizer: str | None, said: set[str]) -> str:
    """The tokens around ``token``, decoded (the differing one between ``⟦`` and ``⟧``), or as
    ids and why (a reason in ``said`` already given is not given again)."""
    lo, hi = max(0, token - CONTEXT_TOKENS), min(len(row.ids), token + CONTEXT_TOKENS + 1)
    pieces = [row.ids[lo:token].tolist(), row.ids[token : token + 1].tolist(), row.ids[token + 1 : hi].tolist()]
    try:
        decode = decoder(manifest, tokenizer, "diff")
    except (BuildError, UsageError) as error:
        why = "as above" if str(error) in said else str(error)
        said.add(str(error))
        return f"ids {pieces[0]} ⟦{pieces[1]}⟧ {pieces[2]} (not decoded: {why})"
    before, at, after = (visible(decode(ids)) for ids in pieces)
    return f"{before!r} ⟦{at!r}⟧ {after!r}"


def diff(a: Path, b: Path, tokenizer: str | None = None) -> tuple[bool, list[str]]:
    """Whether builds ``a`` and ``b`` hold the same rows and manifest, and the lines that
    say where they differ (module docstring)."""
    first, second = open_build(a), open_build(b)
    for folder in (a, b):
        problems = verify(folder)
        if problems:
            raise BuildError(f"{folder} does not match its manifest ({problems[0]}): diff compares sound builds")
    one, two = first.to_json(), second.to_json()
    hashes_a, hashes_b = one.pop("row_sha256"), two.pop("row_sha256")
    lines = []
    changed = fields(one, two)
    for path in changed:
        lines.append(f"manifest {'.'.join(map(str, path))}: {_value(one, path)} | {_value(two, path)}")
    hashed, apart = "row hashes", [k for k, (x, y) in enumerate(zip(hashes_a, hashes_b)) if x != y]
    if first.params.emit_boundaries or second.params.emit_boundaries:  # (a row's hash covers its boundaries)
        hashes_a, hashes_b = token_hashes(a, first), token_hashes(b, second)
        hashed = "rows' ids and masks"
    rows = [k for k, (x, y) in enumerate(zip(hashes_a, hashes_b)) if x != y]
    if len(hashes_a) != len(hashes_b):
        lines.append(f"rows: {a} has {len(hashes_a)}, {b} has {len(hashes_b)}")
    if rows:
        number = rows[0]
        lines.append(
            f"{hashed}: {len(rows)} of {min(len(hashes_a), len(hashes_b))} rows differ; the first is row {number}"
        )
        row_a, row_b = read_row(a, first, number), read_row(b, second, number)
        token = first_token(row_a, row_b)
        lines.append(f"row {number}, token {token}: first differing id or mask")
        said: set[str] = set()
        for name, folder, manifest, row in ((a, a, first, row_a), (b, b, second, row_b)):
            if token >= len(row.ids):
                lines.append(f"  {name}: the row ends before token {token}")
                continue
            segment = row.segment_at(token)
            where = "" if segment is None else f" (source row {segment['source_index']}, id {segment['id']})"
            lines.append(f"  {name}: id {int(row.ids[token])}, mask {int(row.mask[token])}{where}")
            lines.append(f"    {_around(folder, manifest, row, token, tokenizer, said)}")
    else:
        shorter = min(len(hashes_a), len(hashes_b))
        if len(hashes_a) != len(hashes_b):
            lines.append(f"the first {shorter} rows are the same")
        elif hashed != "row hashes" and apart:  # (the recorded hashes differ: the boundaries do)
            both = first.params.emit_boundaries and second.params.emit_boundaries
            lines.append(
                f"{hashed}: the same in every row; "
                + (
                    f"row {apart[0]} is the first whose boundaries differ"
                    if both
                    else "one build's row hashes cover its boundaries too"
                )
            )
        if one.get("parquet") != two.get("parquet"):
            lines += _provenance(a, first, b, second)
    return not lines, lines or [f"same: {a} and {b} hold the same rows and manifest"]


def _provenance(a: Path, first: Manifest, b: Path, second: Manifest) -> list[str]:
    """Where the files of two builds whose common rows have the same tokens first differ
    in a row's segments (the row hashes do not cover them), if they do."""
    for number, (x, y) in enumerate(zip(inspect_rows.segments(a, first), inspect_rows.segments(b, second))):
        if x != y:
            return [
                f"row {number}: the same tokens, other segments (source rows and ids)",
                f"  {a}: {_spans(x)}",
                f"  {b}: {_spans(y)}",
            ]
    return []


def _spans(segments: list[dict]) -> str:
    """A row's segments, shown short."""
    return "; ".join(f"source row {s['source_index']} ({s['id']}) tokens {s['start']}-{s['end']}" for s in segments)


def _value(document: dict, path: KeyPath) -> str:
    """The value at ``path`` of ``document``, shown short (``absent`` where it has none)."""
    value: Any = document
    for key in path:
        if isinstance(value, list) and isinstance(key, int) and key < len(value):
            value = value[key]
        elif isinstance(value, dict) and key in value:
            value = value[key]
        else:
            return "absent"
    return show(value)

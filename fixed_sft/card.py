"""A finished build's figures -> its dataset card: ``README.md`` in the Hugging Face dataset-card
convention, and the PNG plots it shows, written beside the rows.

The card's YAML header declares the license, the source dataset, the tokenizer, the size
category and the Parquet file as the ``default`` config's ``train`` split; its text gives the
source's license and the attribution it requires, the manifest's key figures, the source mix
(where the source rows have a ``source`` column) and how to verify the rows. The card holds
no date, path or version of the builder's machine, and the plots are drawn by matplotlib's
Agg backend with their metadata fixed, so the same build writes the same bytes. The license
is the one given, else ``odc-by`` for an ODC-By source (Tulu 3's), the source's license where
it is one of ``HUB_LICENSES``, ``other`` for another license, and ``unknown`` without one.
The ODC-By attribution is owed by the source, whatever license the card declares: it is
written for a source recorded as ODC-By, or that is Tulu 3. Text from the inputs (the
source's name, revision and license, the separator) is shown in code spans that no line
break or backtick of it can end.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .manifest import Card, FileHash, Manifest, SourceShare
from .output import CARD_NAME, PARQUET_NAME, naming
from .plots import LENGTHS_PLOT, MIX_PLOT, SUPERVISED_PLOT, Inputs, Plotter, draw, plot_names

if TYPE_CHECKING:
    from huggingface_hub import DatasetCardData

# Source licenses as the manifest may record them (lowercased) -> the Hub's license ids.
HUB_LICENSES = {
    "odc-by-1.0": "odc-by",
    "odc-by": "odc-by",
    "odbl": "odbl",
    "apache-2.0": "apache-2.0",
    "mit": "mit",
    "cc0-1.0": "cc0-1.0",
    "cc-by-4.0": "cc-by-4.0",
    "cc-by-sa-4.0": "cc-by-sa-4.0",
    "cc-by-nc-4.0": "cc-by-nc-4.0",
}
LICENSE_NAMES = {
    "odc-by": ("Open Data Commons Attribution License (ODC-By) v1.0", "https://opendatacommons.org/licenses/by/1-0/")
}
TULU3 = "allenai/tulu-3-sft-mixture"
MIX_BARS = 20  # the largest sources drawn; the rest as one bar


@dataclass
class Figures:
    """What the card plots beyond the manifest: each kept row's supervised tokens, in row
    order, and each kept conversation's tokens (its ids, without the separator)."""

    row_supervised: Sequence[int]
    conversation_tokens: Sequence[int]


def card_license(given: str | None, source_license: str | None) -> str:
    """The license the card declares (rule: module docstring)."""
    if given is not None:
        return given
    if source_license is None:
        return "unknown"
    return HUB_LICENSES.get(source_license.lower(), "other")


def write_card(
    folder: Path,
    manifest: Manifest,
    figures: Figures,
    license: str,
    upstream: str | None,
    plotter: Plotter | None = None,
) -> Card:
    """Write the card and its plots into ``folder``; return what the manifest records of
    them. ``upstream``: the Hub dataset the source rows come from, where known; ``plotter``:
    where the plots are drawn (default: in this process)."""
    inputs = plot_inputs(
        manifest.source_mix, manifest.params.row_tokens, manifest.stats.supervised_token_ratio, figures
    )
    if plotter is not None:
        plotter.start(inputs)  # (the text is written while they are drawn)
    text = card_text(manifest, license, upstream, plot_names(inputs)).encode()
    plots = plotter.draw(inputs) if plotter is not None else draw(inputs)
    files = {CARD_NAME: text, **plots}
    recorded = {}
    for name, data in files.items():
        _write(folder / name, data)
        recorded[name] = FileHash(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    return Card(license=license, files=recorded)


def plot_inputs(mix: list[SourceShare] | None, row_tokens: int, ratio: float, figures: Figures) -> Inputs:
    """What the plots show of a build whose manifest records ``mix``, ``row_tokens`` and the
    supervised token ratio ``ratio``: the ``MIX_BARS`` largest sources, the rest as one bar."""
    shares = _mix_shares(mix)
    bars = [("(none)" if s.source is None else s.source, s.tokens) for s in shares[:MIX_BARS]]
    if len(shares) > MIX_BARS:
        bars.append((f"{len(shares) - MIX_BARS} other sources", sum(s.tokens for s in shares[MIX_BARS:])))
    return Inputs(
        row_supervised=np.asarray(figures.row_supervised, dtype=np.int64),
        row_tokens=row_tokens,
        ratio=ratio,
        conversation_tokens=np.asarray(figures.conversation_tokens, dtype=np.int64),
        mix=bars or None,
    )


def _mix_shares(mix: list[SourceShare] | None) -> list[SourceShare]:
    """The source mix, the largest share of tokens first (ties by name, rows without a source last)."""
    return sorted(mix or [], key=lambda s: (-s.tokens, s.source is None, s.source or ""))


def _write(path: Path, data: bytes) -> None:
    with naming(path), path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def size_category(rows: int) -> str:
    """The Hub's size category of a dataset of ``rows`` rows."""
    bounds = [(1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M")]
    bounds += [(10_000_000, "1M<n<10M"), (100_000_000, "10M<n<100M"), (1_000_000_000, "100M<n<1B")]
    return next((name for bound, name in bounds if rows < bound), "1B<n<10B")


def import_soon() -> None:
    """Import what ``header`` writes with (huggingface_hub's card data: 15-30 ms) in a
    thread, now: a build that then waits for the rows to be written has it at no cost."""
    threading.Thread(target=_import_header, daemon=True).start()


def _import_header() -> None:
    with suppress(ImportError):
        from huggingface_hub import DatasetCardData  # noqa: F401


def header(manifest: Manifest, license: str, upstream: str | None) -> str:
    """The card's YAML header (without its ``---`` lines), written by huggingface_hub."""
    return header_values(manifest, license, upstream).to_yaml()


def header_values(manifest: Manifest, license: str, upstream: str | None) -> DatasetCardData:
    """The values of the card's YAML header."""
    from huggingface_hub import DatasetCardData

    tokenizer = manifest.tokenizer
    return DatasetCardData(
        license=license,
        pretty_name=manifest.name,
        source_datasets=[upstream] if upstream else None,
        task_categories=["text-generation"],
        size_categories=[size_category(manifest.stats.rows)],
        tags=["sft", "packed", "fixed-sft"],
        configs=[{"config_name": "default", "data_files": [{"split": "train", "path": PARQUET_NAME}]}],
        tokenizer=tokenizer.repo or tokenizer.name,
    )


HEADER_BYTES = 1 << 16  # a card's YAML header ends within this many bytes (a build's: under 1,000)


def header_problem(path: Path, manifest: Manifest) -> str | None:
    """Why the card ``path``'s YAML header is not one a build of ``manifest`` writes, where
    loaders act on it: a key the card does not write (``dataset_info``'s features, say),
    ``configs`` naming other data than the build's Parquet file, or a license other than
    ``card.license``. ``None`` where it is; its other values are the card's text. The
    header is found in the file's first ``HEADER_BYTES`` bytes as ``RepoCard.load`` (which
    ``datasets`` uses) finds it, line ends as written; a BOM, which a build does not write,
    is no header. No value of it is shown (YAML's aliases may make one of any size)."""
    import codecs

    from huggingface_hub import RepoCard
    from huggingface_hub.repocard import REGEX_YAML_BLOCK

    with path.open("rb") as f:
        head = f.read(HEADER_BYTES)
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(head, final=len(head) < HEADER_BYTES)
    except UnicodeDecodeError:
        return "it is not UTF-8, as a card is"
    block = REGEX_YAML_BLOCK.search(text)
    if block is None or (not block.group(4) and len(head) == HEADER_BYTES):  # (cut at the limit, it may go on)
        return f"it has no YAML header within its first {HEADER_BYTES} bytes"
    try:
        found = RepoCard(text).data.to_dict()
    except Exception as error:  # (YAML's errors, of several classes)
        return f"its YAML header does not read ({type(error).__name__})"
    license = manifest.card.license if manifest.card is not None else None
    written = header_values(manifest, license or "unknown", "upstream").to_dict()
    if (other := next((key for key in found if key not in written), None)) is not None:
        return f"its YAML header holds {str(other)[:80]!r}, which the card does not write"
    if found.get("configs") != written["configs"]:
        return f"its YAML header's configs do not name {PARQUET_NAME} alone as the train split"
    if found.get("license") != license:
        return f"its YAML header's license is not {license!r}, the manifest's"
    return None


def card_text(manifest: Manifest, license: str, upstream: str | None, plots: Sequence[str]) -> str:
    """``README.md``: the YAML header, then the card's sections (module docstring)."""
    stats, params, source, tokenizer = manifest.stats, manifest.params, manifest.source, manifest.tokenizer
    revision = f" at revision `{_code(source.revision)}`" if source.revision else ""
    tokenizer_name = tokenizer.repo or tokenizer.name or "a local tokenizer"
    tokenizer_at = f"`{tokenizer_name}`" + (f" at revision `{tokenizer.revision}`" if tokenizer.revision else "")
    hashed_bounds = " and then its `cu_seqlens` (int32, little-endian)" if params.emit_boundaries else ""
    columns = ", `cu_seqlens`: 0, then the end of each segment in the row" if params.emit_boundaries else ""
    separator = _code(str(params.separator))
    lines = [
        "---",
        header(manifest, license, upstream).rstrip("\n"),
        "---",
        "",
        f"# {manifest.name}",
        "",
        f"{stats.rows:,} rows of exactly {params.row_tokens:,} tokens of supervised fine-tuning data, packed by "
        f"fixed-sft from `{_code(source.name)}`{revision}, rendered with the chat template of "
        f"{tokenizer_at} and masked by `{params.loss_mask_type}` (assistant tokens only). Each row is "
        f"conversations, each followed by `{separator}`, cut at exactly {params.row_tokens:,} tokens; "
        "nothing is padded. The tokens are in `train.parquet`, in its `metadata` column (`input_ids`, "
        f"`loss_mask`, `row`, `segments`{columns}); `manifest.json` holds the parameters and a SHA-256 hash of "
        "every row.",
        "",
        "## License and attribution",
        "",
        *_license_lines(license, source.license, upstream),
        "",
        "## Figures",
        "",
        "From `manifest.json`:",
        "",
        "| figure | value |",
        "|---|---|",
        f"| rows | {stats.rows:,} |",
        f"| tokens per row | {params.row_tokens:,} |",
        f"| tokens | {stats.tokens:,} |",
        f"| supervised tokens | {stats.supervised_tokens:,} |",
        f"| supervised token ratio | {stats.supervised_token_ratio!r} |",
        f"| trainable tokens | {stats.trainable_tokens:,} |",
        f"| padding tokens | {stats.padding_tokens:,} |",
        f"| conversations | {stats.conversations:,} |",
        f"| conversations split across rows | {stats.conversations_split:,} |",
        f"| rows skipped (no supervised token after token 0) | {stats.rows_skipped:,} |",
        f"| invalid source rows skipped | {stats.invalid_rows_skipped:,} |",
        f"| source rows | {source.rows:,} |",
        f"| seed | {params.seed} |",
        f"| rows_sha256 | `{manifest.rows_sha256}` |",
        f"| train.parquet sha256 | `{manifest.parquet.sha256}` |",
        f"| train.parquet bytes | {manifest.parquet.bytes:,} |",
        "",
        f"![Supervised ratio per row]({SUPERVISED_PLOT})",
        "",
        f"![Conversation length distribution]({LENGTHS_PLOT})",
        "",
        "## Source mix",
        "",
        *_mix_lines(manifest, MIX_PLOT in plots),
        "",
        "## Verify",
        "",
        "With fixed-sft installed, where `DIR` is this folder:",
        "",
        "```bash",
        "generate-fixed-sft verify DIR            # the rows, the file and this card against manifest.json",
        "generate-fixed-sft verify DIR --rebuild  # and a build from the recorded inputs, compared",
        "```",
        "",
        "`rows_sha256` is the SHA-256 of the rows' hashes in order, each the SHA-256 of the row's ids "
        f"(int32, little-endian) followed by its mask (uint8){hashed_bounds}; it depends on the rows alone.",
        "",
    ]
    return "\n".join(lines)


def _license_lines(license: str, source_license: str | None, upstream: str | None) -> list[str]:
    name, url = LICENSE_NAMES.get(license, (None, None))
    declared = f"[{name}]({url})" if name else f"`{license}`"
    recorded = (
        f"the source's recorded license is `{_code(source_license)}`" if source_license else "the source records none"
    )
    lines = [f"This card declares the license {declared}; {recorded}."]
    if HUB_LICENSES.get((source_license or "").lower()) == "odc-by" or upstream == TULU3:
        origin = f"[{upstream}](https://huggingface.co/datasets/{upstream})" if upstream else "its source dataset"
        lines += [
            "",
            f"These rows are derived from {origin}, which is licensed under ODC-By 1.0. The license requires "
            f"attribution: any use or redistribution of these rows must credit {upstream or 'the source dataset'} "
            "and keep this notice.",
        ]
    if upstream == TULU3:
        lines += [
            "",
            "The Tulu 3 SFT mixture is released by the Allen Institute for AI (Ai2) for research and educational "
            "use under Ai2's Responsible Use Guidelines. Its subsets include outputs of third-party models and "
            "data under their own licenses and terms, which also apply to the rows built from them; see the "
            "mixture's own dataset card.",
        ]
    if license in ("other", "unknown"):
        lines += ["", "Check the source's own terms before using or sharing these rows."]
    return lines


def _mix_lines(manifest: Manifest, plotted: bool) -> list[str]:
    mix = manifest.source_mix
    if not mix:
        return ["The source rows have no `source` column, so the mix is not recorded."]
    tokens = max(manifest.stats.tokens, 1)
    lines = [
        "Conversations and tokens in the rows per value of the source rows' `source` column "
        "(tokens include each conversation's separator):",
        "",
        "| source | conversations | tokens | share of tokens |",
        "|---|---|---|---|",
    ]
    for share in _mix_shares(manifest.source_mix):
        name = "(none)" if share.source is None else f"`{_cell(share.source)}`"
        lines.append(f"| {name} | {share.conversations:,} | {share.tokens:,} | {share.tokens / tokens:.2%} |")
    if plotted:
        lines += ["", f"![Source mix]({MIX_PLOT})"]
    return lines


def _code(text: str) -> str:
    """Text in a code span of a paragraph: no line break or backtick ends it."""
    return " ".join(text.split()).replace("`", "'")


def _cell(text: str) -> str:
    """Text in a Markdown table cell, inside a code span: no line break, pipe or backtick breaks the table."""
    return " ".join(text.split()).replace("|", "\\|").replace("`", "'")

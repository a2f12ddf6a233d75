"""A build's manifest -> the same build run again from the inputs it records, compared.

The rebuild takes the manifest's parameters, its source (name, revision, license, row
count) and its tokenizer (spec name or repo, at the recorded revision), unless the caller
names where the source or tokenizer files are. The rows are proven to come from the
recorded inputs when the rebuild read files with the recorded hashes and made rows with
the same ``rows_sha256`` and stats. The Parquet bytes and the code are compared too, for
information: the same rows may be encoded by another writer, or built by other code.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import replace
from pathlib import Path

from .build import FORMAT, ORDER_RULE, BuildConfig, BuildError, UsageError, build
from .output import MANIFEST_NAME
from .source import SourceError, SourceUnreachable, is_hub_id
from .specs import tokenizer_specs

PROOF = ("rows_sha256", "stats", "source files", "tokenizer files")  # what must be the same


def recorded_config(manifest: dict, source: str | None = None, tokenizer: str | None = None,
                    workers: int = 1) -> BuildConfig:
    """The build ``manifest`` records, reading the source from ``source`` and the
    tokenizer from ``tokenizer`` when given (else from where the manifest says)."""
    if manifest["format"] != FORMAT or manifest["params"]["order"] != ORDER_RULE:
        raise BuildError(f"the manifest is format {manifest['format']} with order {manifest['params']['order']}; "
                         f"this builder makes {FORMAT} with {ORDER_RULE}")
    recorded = manifest["source"]
    if source is None and not (Path(recorded["name"]).exists() or is_hub_id(recorded["name"])):
        raise UsageError(f"the manifest's source {recorded['name']!r} is not here; pass --source PATH "
                         "(its files are compared with the manifest's hashes)")
    params, used = manifest["params"], manifest["tokenizer"]
    specs = {spec["name"] for spec in tokenizer_specs()}
    spec = used["name"] if used["name"] in specs else None
    if tokenizer is None:
        tokenizer = spec or used["repo"]
        if tokenizer is None:
            raise UsageError("the manifest's tokenizer was read from a local folder; pass --tokenizer FOLDER "
                             "(its files are compared with the manifest's hashes)")
    config = BuildConfig(
        name=manifest["name"],
        source=source or recorded["name"],
        source_revision=recorded["revision"],
        source_license=recorded["license"],
        source_files=tuple(recorded["file_patterns"]) if recorded.get("file_patterns") is not None else None,
        source_rows=recorded["rows"],
        tokenizer=tokenizer,
        tokenizer_revision=used["revision"],
        expected_tokenizer=spec,
        allow_unpinned_tokenizer=not used["pinned"],
        loss_mask_type=params["loss_mask_type"],
        rows=None if params["rows"] == "all" else params["rows"],
        row_tokens=params["row_tokens"],
        seed=params["seed"],
        skip_invalid=params["skip_invalid"],
        check_every=manifest["template_check"]["every"],
        workers=workers,
    )
    try:
        replace(config, workers=1).validate()  # the manifest's values; the caller's --workers is the build's to check
    except UsageError as error:
        raise BuildError(f"the manifest records a parameter this builder refuses: {error}") from None
    return config


def comparison(manifest: dict, rebuilt: dict) -> list[tuple[str, object, object, bool]]:
    """``(key, folder's, rebuilt, equal)`` for the values a rebuild is judged by
    (``PROOF``), then the Parquet file and the code. Source files are compared by
    content and order (their paths depend on where they were found)."""

    def values(m: dict) -> dict:
        return {
            "rows_sha256": m["rows_sha256"],
            "stats": m["stats"],
            "source files": [(f["sha256"], f["bytes"]) for f in m["source"]["files"]],
            "tokenizer files": m["tokenizer"]["files"],
            "parquet": (m["parquet"]["sha256"], m["parquet"]["bytes"]),
            "code_sha256": m["code_version"]["code_sha256"],
        }

    theirs, mine = values(manifest), values(rebuilt)
    return [(key, theirs[key], mine[key], theirs[key] == mine[key]) for key in theirs]


def rebuild(folder: Path, source: str | None = None, tokenizer: str | None = None, workers: int = 1,
            progress: bool = False) -> list[tuple[str, object, object, bool]]:
    """Rebuild ``folder``'s manifest into a temporary folder (deleted after) and compare
    (see ``comparison``)."""
    manifest = json.loads((Path(folder) / MANIFEST_NAME).read_text(encoding="utf-8"))
    try:
        config = recorded_config(manifest, source, tokenizer, workers)
    except (KeyError, TypeError) as error:  # verify reads fewer fields than a rebuild needs
        raise BuildError(f"{Path(folder) / MANIFEST_NAME}: cannot read the build it records "
                         f"({type(error).__name__}: {error})") from None
    with tempfile.TemporaryDirectory(prefix="fixed-sft-rebuild-") as scratch:
        try:
            rebuilt = build(config, Path(scratch) / "rebuilt", progress)
        except SourceUnreachable as error:  # the build's advice names flags a rebuild does not need
            raise SourceError(f"cannot get dataset {error.repo_id}@{error.revision} from the Hugging Face Hub or its "
                              f"cache ({error.reason}). Without the Hub, download its files at that revision "
                              "elsewhere and pass --source PATH") from None
    return comparison(manifest, rebuilt)

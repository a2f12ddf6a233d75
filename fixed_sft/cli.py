"""Command line: ``build`` (the default) and ``verify``.

Exit codes: 0 success; 1 build failure or verify mismatch; 2 usage error.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

USAGE_ERROR, FAILURE = 2, 1


def _rows(value: str) -> int | None:
    if value == "all":
        return None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'all', got {value!r}") from None


def parser() -> argparse.ArgumentParser:
    from .specs import DEFAULT_BUILD

    top = argparse.ArgumentParser(
        prog="generate_fixed_sft.py",
        description="Build fixed-length packed SFT datasets with a SHA-256 manifest, and verify them.",
    )
    commands = top.add_subparsers(dest="command", required=True)

    build = commands.add_parser("build", help="build a dataset (the default command)")
    build.add_argument("name", nargs="?", help=f"named build in data/builds/ (default: {DEFAULT_BUILD})")
    build.add_argument("--out", type=Path, help="output folder (default: out/NAME)")
    build.add_argument("--source", help="Hub dataset id, or a local .parquet/.jsonl file or folder (Tulu schema)")
    build.add_argument("--source-revision", help="dataset revision (required for a Hub id not in the spec)")
    build.add_argument("--source-license", help="license recorded in the manifest")
    build.add_argument("--tokenizer", help="tokenizer spec name (tokenizers/), Hub repo id, or local folder")
    build.add_argument("--tokenizer-revision", help="tokenizer revision (default: the spec's pinned one)")
    build.add_argument("--loss-mask-type", help="loss mask type (kimi_k25)")
    build.add_argument("--rows", type=_rows, default=argparse.SUPPRESS, help="rows to build, or 'all'")
    build.add_argument("--row-tokens", type=int, help="tokens per row")
    build.add_argument("--seed", type=int, help="order seed")
    build.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="encoding processes (default: all cores)")
    build.add_argument("--check-every", type=int, default=64, help="check 1 in N conversations against the rendered template (0: off)")
    build.add_argument("--skip-invalid", action="store_true", help="skip invalid source rows and record them")
    build.add_argument("--allow-unpinned-tokenizer", action="store_true", help="build with tokenizer files that differ from their spec, and record it")
    build.add_argument("--trust-remote-code", action="store_true", help="accepted for compatibility; no remote code is run")
    build.add_argument("--quiet", action="store_true", help="no progress bar")

    verify = commands.add_parser("verify", help="check a built folder against its manifest")
    verify.add_argument("folder", type=Path)
    verify.add_argument("--published", metavar="NAME", help="also compare with a named build's published values")
    return top


def _config(args: argparse.Namespace):
    from .build import BuildConfig, UsageError
    from .specs import DEFAULT_BUILD, SpecError, build_spec

    name = args.name or (DEFAULT_BUILD if args.source is None else None)
    try:
        spec = build_spec(name) if name else {}
    except SpecError as error:
        raise UsageError(str(error)) from None
    source = args.source or spec.get("source")
    own_source = args.source is not None
    return BuildConfig(
        name=name or "custom",
        source=source,
        source_revision=args.source_revision or (None if own_source else spec.get("source_revision")),
        source_license=args.source_license or (None if own_source else spec.get("source_license")),
        tokenizer=args.tokenizer or spec.get("tokenizer", "kimi-k2.6"),
        tokenizer_revision=args.tokenizer_revision,
        expected_tokenizer=spec.get("tokenizer", "kimi-k2.6"),
        loss_mask_type=args.loss_mask_type or spec.get("loss_mask_type", "kimi_k25"),
        rows=args.rows if "rows" in args else spec.get("rows", 6400),
        row_tokens=args.row_tokens if args.row_tokens is not None else spec.get("row_tokens", 8192),
        seed=args.seed if args.seed is not None else spec.get("seed", 42),
        workers=args.workers,
        check_every=args.check_every,
        skip_invalid=args.skip_invalid,
        allow_unpinned_tokenizer=args.allow_unpinned_tokenizer,
        published=spec.get("published"),
    ), Path(args.out or Path("out") / (name or "custom"))


def _report_published(manifest: dict, published: dict, name: str) -> bool:
    from .verify import published_comparison

    print(f"published values of {name} ({published.get('by', 'unknown builder')}):")
    results = published_comparison(manifest, published)
    for key, mine, theirs, equal in results:
        print(f"  {key}: {'match' if equal else 'MISMATCH'} (this build {mine}, published {theirs})")
    return all(equal for *_, equal in results)


def _build(args: argparse.Namespace) -> int:
    from .build import build

    config, out = _config(args)
    manifest = build(config, out, progress=not args.quiet)
    stats = manifest["stats"]
    print(
        f"built {out}: {stats['rows']} rows x {config.row_tokens} tokens, "
        f"supervised ratio {stats['supervised_token_ratio']:.4f}, rows_sha256 {manifest['rows_sha256']}"
    )
    if config.published:
        _report_published(manifest, config.published, config.name)
    return 0


def _verify(args: argparse.Namespace) -> int:
    import json

    from .specs import build_spec
    from .verify import verify

    problems = verify(args.folder)
    for problem in problems:
        print(f"MISMATCH {problem}")
    ok = not problems
    if ok:
        print(f"ok: {args.folder} matches its manifest")
    if args.published:
        manifest = json.loads((args.folder / "manifest.json").read_text(encoding="utf-8")) if ok else None
        if manifest is None:
            print("published values not compared: the folder does not match its own manifest")
        else:
            published = build_spec(args.published).get("published")
            if not published:
                print(f"{args.published} has no published values")
                return FAILURE
            ok = _report_published(manifest, published, args.published) and ok
    return 0 if ok else FAILURE


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")  # no "PyTorch was not found" notice
    if not argv or argv[0] not in ("build", "verify", "-h", "--help"):
        argv.insert(0, "build")
    args = parser().parse_args(argv)
    try:
        return _build(args) if args.command == "build" else _verify(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        code = _exit_code(error)
        if code is None and os.environ.get("FIXED_SFT_DEBUG"):
            raise
        detail = str(error) if code else f"internal error ({type(error).__name__}: {error}); FIXED_SFT_DEBUG=1 shows the traceback"
        print(f"error: {detail}", file=sys.stderr)
        return code or FAILURE


def _exit_code(error: Exception) -> int | None:
    from .build import BuildError, UsageError
    from .chat import TemplateMismatch
    from .source import SourceError
    from .specs import SpecError

    if isinstance(error, UsageError):
        return USAGE_ERROR
    if isinstance(error, (BuildError, SourceError, SpecError, TemplateMismatch)):
        return FAILURE
    return None

"""Command line: ``build`` (the default), ``verify`` (with ``--rebuild``: also rebuild
from the recorded inputs and compare), ``inspect`` (a build's summary, or a row decoded),
``diff`` (where two builds differ), ``pin-tokenizer`` (write a tokenizer spec), ``export``
(a trainer's packed layout) and ``push`` (upload to the Hub).

Exit codes: 0 success; 1 build failure, verify mismatch, or an inspected folder whose rows
are not what its manifest says; 2 usage error; 130 interrupted (Ctrl-C); 143 terminated
(SIGTERM). The first Ctrl-C or SIGTERM stops the command, which unwinds (workers stopped,
its temporary folder removed); a later one, or one once the command is over, exits at once
(``exits.exit_now``), with the first one's code.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import BrokenExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, get_args, get_origin

from .exits import exit_now

if TYPE_CHECKING:
    from .params import BuildConfig

USAGE_ERROR, FAILURE = 2, 1
INTERRUPTED, TERMINATED = 130, 143  # 128 + SIGINT, 128 + SIGTERM
# A build of this many workers, on as many cores, starts their fork server before its own imports
# (``_start_early``): on the 16-core machine each side imports for 0.4-0.7 s.
EARLY_WORKERS = 8


class Terminated(BaseException):
    """SIGTERM: the build stops as on Ctrl-C (workers stopped, nothing half-written)."""


SIGNALS: dict[int, tuple[int, str]] = {
    signal.SIGINT: (INTERRUPTED, "interrupted"),
    signal.SIGTERM: (TERMINATED, "terminated"),
}


class _Stop:
    """The handler of Ctrl-C and SIGTERM: while the command runs, the first one raises
    ``KeyboardInterrupt`` or ``Terminated`` where the command is, so that it unwinds;
    any later one, and one once the command is over, exits at once with the first one's
    code, rather than interrupt that unwinding (or the interpreter's shutdown) and leave
    it half done."""

    said = False  # whether the exit's line is written, by any handler's command (one line, whichever)

    def __init__(self, over: bool = False):
        self.over = over
        self.first: int | None = None

    def __call__(self, signum: int, frame: object) -> None:
        if not self.over and self.first is None:
            self.first = signum
            raise KeyboardInterrupt if signum == signal.SIGINT else Terminated
        code, message = SIGNALS[self.first or signum]
        exit_now(code, None if _Stop.said else message)


def _owns_signals() -> bool:
    return threading.current_thread() is threading.main_thread()  # only the main thread may set handlers


def _rows(value: str) -> int | None:
    if value == "all":
        return None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'all', got {value!r}") from None


def _json(value: str) -> Any:
    """A flag's JSON value; the text itself where it is not JSON, unless it opens as a JSON
    object or array does (then why it is not)."""
    from .fields import loads

    try:
        return loads(value)
    except ValueError as error:
        if value.lstrip().startswith(("{", "[")):
            raise argparse.ArgumentTypeError(f"not JSON ({error})") from None
        return value


def _add_build_flags(build: argparse.ArgumentParser) -> None:
    """A flag per ``BuildConfig`` parameter that has one (``params``), its type and help from
    the parameter. A flag left out is absent from the parsed arguments (the named build's
    value, else the parameter's default, applies), unless its parameter gives the flag a default."""
    from .fields import hints
    from .params import FLAGS, PARAMS, BuildConfig, flag, takes_all

    kinds = hints(BuildConfig)
    for name in FLAGS:
        meta, kind = PARAMS[name].metadata, kinds[name]
        options: dict[str, Any] = {
            "default": meta["flag_default"]() if meta["flag_default"] else argparse.SUPPRESS,
            "help": meta["help"].format(default=PARAMS[name].default),
        }
        members = (kind, *get_args(kind))
        if kind is bool:
            options["action"] = "store_true"
        elif any(get_origin(member) is tuple for member in members):
            options["action"] = "append"  # (repeatable)
        elif takes_all(name):  # a number or 'all'
            options["type"] = _rows
        elif any(member is dict or get_origin(member) is dict for member in members):
            options["type"] = _json  # (a value that is not an object: refused by the parameter's range)
        elif int in members:
            options["type"] = int
        if meta["metavar"]:
            options["metavar"] = meta["metavar"]
        build.add_argument(flag(name), **options)


def parser() -> argparse.ArgumentParser:
    """The commands (``build``, ``verify``, ``inspect``, ``diff``, ``pin-tokenizer``, ``export``, ``push``)."""
    from .specs import DEFAULT_BUILD

    top = _Parser(
        prog="generate_fixed_sft.py",
        description="Build fixed-length packed SFT datasets with a SHA-256 manifest, and verify them.",
    )
    commands = top.add_subparsers(dest="command", required=True)

    build = commands.add_parser("build", help="build a dataset (the default command)")
    build.add_argument(
        "name", nargs="?", metavar="NAME", help=f"named build in fixed_sft/builds/ (default: {DEFAULT_BUILD})"
    )
    build.add_argument("--out", type=Path, metavar="DIR", help="output folder (default: out/NAME)")
    _add_build_flags(build)
    build.add_argument("--quiet", action="store_true", help="no progress bars and no closing summary")

    verify = commands.add_parser("verify", help="check a built folder against its manifest")
    verify.add_argument("folder", type=Path, metavar="DIR", help="the build folder")
    verify.add_argument("--published", metavar="NAME", help="also compare with a named build's published values")
    verify.add_argument(
        "--rebuild", action="store_true", help="also rebuild from the inputs the manifest records, and compare"
    )
    verify.add_argument(
        "--source", metavar="PATH|HF_ID", help="with --rebuild: where the source is, if not where the manifest says"
    )
    verify.add_argument(
        "--tokenizer",
        metavar="FOLDER|HF_REPO",
        help="with --rebuild: where the tokenizer files are, if not the manifest's spec or repo",
    )
    verify.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="with --rebuild: encoding processes (default: the cores this process may use)",
    )
    verify.add_argument("--quiet", action="store_true", help="with --rebuild: no progress bar")
    verify.add_argument(
        "--rows",
        metavar="SPEC",
        help="with --rebuild: check only these rows (0,17,100-120, or sample:N), re-encoding just what they need",
    )
    verify.add_argument(
        "--sample", type=int, metavar="K", help="with --rebuild: check K rows drawn as --rows sample:K draws them"
    )

    inspect = commands.add_parser("inspect", help="summarize a build, or show one of its rows decoded")
    inspect.add_argument("folder", type=Path, metavar="DIR", help="the build folder")
    inspect.add_argument("--row", type=int, metavar="K", help="show row K decoded, its supervised tokens marked")
    inspect.add_argument(
        "--tokenizer",
        metavar="FOLDER|HF_REPO",
        help="with --row: where the tokenizer files are, if not the manifest's spec or repo in the Hub cache",
    )
    inspect.add_argument("--html", type=Path, metavar="FILE", help="with --row: write the row as one HTML page")

    compare = commands.add_parser("diff", help="where two builds differ: manifest fields, first row and token")
    compare.add_argument("first", type=Path, metavar="A", help="a build folder")
    compare.add_argument("second", type=Path, metavar="B", help="the build folder to compare it with")
    compare.add_argument(
        "--tokenizer",
        metavar="FOLDER|HF_REPO",
        help="where the tokenizer files are, to decode the tokens around the first difference",
    )

    pin = commands.add_parser("pin-tokenizer", help="write a tokenizer spec that builds check the files against")
    pin.add_argument("tokenizer", metavar="REPO|FOLDER", help="a Hub repo id, or a folder of tokenizer files")
    pin.add_argument(
        "--revision",
        metavar="REV",
        help="the repo's revision (required for a repo; a folder's commit, unless a Hub cache)",
    )
    pin.add_argument("--repo", metavar="OWNER/NAME", help="for a folder: the Hub repo its files are of")
    pin.add_argument("--name", help="the spec's name (default: the repo's name, lowercased)")
    pin.add_argument("--template-kwargs", metavar="JSON", help="template variables, a JSON object (default: {})")
    pin.add_argument(
        "--loss-mask-type", metavar="TYPE", help="the mask type the spec goes with (default: the tokenizer family's)"
    )
    pin.add_argument("--trust-remote-code", action="store_true", help="pin (and load) the tokenizer's own code")
    pin.add_argument(
        "--out", type=Path, metavar="FOLDER", help="write NAME.json there (default: fixed_sft/tokenizer_specs/)"
    )

    export = commands.add_parser("export", help="write a verified build in a trainer's packed layout")
    export.add_argument("folder", type=Path, metavar="DIR", help="the build folder")
    export.add_argument("--to", required=True, choices=["trl", "megatron-bridge"], help="the trainer's layout")
    export.add_argument("out", type=Path, metavar="OUT", help="the Parquet file to write (must not exist)")

    push = commands.add_parser("push", help="upload a verified build to a Hugging Face Hub dataset repo")
    push.add_argument("folder", type=Path, metavar="DIR", help="the build folder")
    push.add_argument("--repo", required=True, metavar="OWNER/NAME", help="the dataset repo (created if missing)")
    push.add_argument("--private", action="store_true", help="create the repo private")
    push.add_argument("--force", action="store_true", help="push to a repo that already holds other files")
    push.add_argument("--quiet", action="store_true", help="no upload progress bar")
    return top


def _config(args: argparse.Namespace) -> tuple[BuildConfig, Path, dict | None]:
    """The build's parameters (the named spec's, overridden by the flags given), its
    output folder, and the values published for the named build."""
    from .params import FLAGS, SPEC_KEYS, BuildConfig, UsageError, from_json
    from .specs import BUILDS, DEFAULT_BUILD, SpecError, build_spec

    name = args.name or (DEFAULT_BUILD if getattr(args, "source", None) is None else None)
    try:
        spec = build_spec(name) if name else {}
    except SpecError as error:
        raise UsageError(str(error)) from None
    values = {key: from_json(key, spec[key]) for key in SPEC_KEYS if spec.get(key) is not None}
    if name:  # the spec's own values must be in range, whatever flags override them
        try:
            BuildConfig(name=name, **values).validate(label=str)  # (named by the spec's keys)
        except UsageError as error:
            raise UsageError(f"{BUILDS / name}.json: {error}") from None
    if "source" in args:  # another source: the spec's revision, license, files and size do not apply
        values = {
            k: v
            for k, v in values.items()
            if k not in ("source_revision", "source_license", "source_files", "source_rows")
        }
    if "tokenizer" in values:
        values["expected_tokenizer"] = values["tokenizer"]
    values.update({key: from_json(key, getattr(args, key)) for key in FLAGS if key in args})
    if values.get("no_cache") and values.get("cache_dir") is not None:
        raise UsageError("--cache-dir names a token store that --no-cache turns off; give one")
    config = BuildConfig(name=name or "custom", **values)
    return config, Path(args.out or Path("out") / config.name), spec.get("published")


def _report_published(manifest: dict, published: dict, name: str) -> bool:
    from .verify import published_comparison

    results = published_comparison(manifest, published)
    same = all(equal for *_, equal in results)
    print(
        f"{'the same as' if same else 'not the same as'} the values published for {name} "
        f"by {published.get('by', 'an unknown builder')}:"
    )
    for key, mine, theirs, equal in results:
        print(f"  {key}: {'same' if equal else 'differs'} (these rows {mine}, published {theirs})")
    return same


def _build(args: argparse.Namespace) -> int:
    from .build import build

    config, out, published = _config(args)
    start = time.monotonic()
    earlier = _earlier_rows(out)
    gc.freeze()  # (what the imports made outlives the build: the collector need not go over it, ~0.1 CPU-s)
    try:
        with _hub_bars(not args.quiet or not _may_download(config)):  # (a download's bars: huggingface_hub's own)
            manifest = build(config, out, progress=not args.quiet)
    finally:
        gc.unfreeze()  # (what was garbage then is collected, where main() is called again)
    stats = manifest["stats"]
    print(
        f"built {out}: {stats['rows']} rows x {config.row_tokens} tokens, "
        f"supervised ratio {stats['supervised_token_ratio']:.4f}, rows_sha256 {manifest['rows_sha256']}"
    )
    if earlier is not None and earlier != manifest["rows_sha256"]:
        print(f"  (it replaced the earlier build there, of other rows: rows_sha256 {one_line(earlier)})")
    if not args.quiet:
        _print_summary(manifest, time.monotonic() - start)
    if published:
        _report_published(manifest, published, config.name)
    return 0


def _earlier_rows(out: Path) -> str | None:
    """The ``rows_sha256`` of the build at ``out`` that a build would replace, where one is
    (``fixed_sft.verify``, which imports pyarrow.compute, only then: 25-30 ms)."""
    from .folder import is_build
    from .output import MANIFEST_NAME

    if not is_build(out):
        return None
    from .verify import read_manifest

    try:
        rows = read_manifest(out / MANIFEST_NAME).get("rows_sha256")
    except (OSError, ValueError, RecursionError, AttributeError):
        return None
    return rows if isinstance(rows, str) else None


def summary(manifest: dict, seconds: float) -> list[tuple[str, str]]:
    """The closing summary of a build: what its manifest says, figure by figure."""
    stats, params = manifest["stats"], manifest["params"]
    return [
        ("rows", f"{stats['rows']:,} x {params['row_tokens']:,} tokens = {stats['tokens']:,}"),
        ("supervised tokens", f"{stats['supervised_tokens']:,} ({stats['supervised_token_ratio']:.2%})"),
        ("trainable tokens", f"{stats['trainable_tokens']:,}"),
        ("conversations", f"{stats['conversations']:,} ({stats['conversations_split']:,} split across rows)"),
        ("rows skipped (nothing to train)", f"{stats['rows_skipped']:,}"),
        ("invalid source rows skipped", f"{stats['invalid_rows_skipped']:,}"),
        ("tail tokens dropped", f"{stats['tail_tokens_dropped']:,}"),
        ("seed", str(params["seed"])),
        ("rows_sha256", manifest["rows_sha256"]),
        ("time", f"{seconds:.1f} s"),
    ]


def _print_summary(manifest: dict, seconds: float) -> None:
    """``summary`` as a table on a terminal (rich), else as plain ``name  value`` lines."""
    rows = summary(manifest, seconds)
    if not sys.stdout.isatty():
        width = max(len(name) for name, _ in rows)
        print("\n".join(f"{name.ljust(width)}  {value}" for name, value in rows))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for name, value in rows:
        table.add_row(name, value)
    Console().print(table)


def _verify(args: argparse.Namespace) -> int:
    from .build import UsageError
    from .output import MANIFEST_NAME
    from .rebuild import rebuild, report
    from .specs import SpecError, build_spec
    from .verify import read_manifest, verify

    if args.sample is not None:
        if args.rows is not None:
            raise UsageError("--rows and --sample name the rows to check two ways; give one")
        if args.sample < 1:
            raise UsageError(f"--sample is {args.sample}: check at least 1 row")
        args.rows = f"sample:{args.sample}"
    if not args.rebuild and (
        args.source or args.tokenizer or args.workers is not None or args.quiet or args.rows is not None
    ):
        raise UsageError(
            "--source, --tokenizer, --workers, --quiet, --rows and --sample are for a rebuild; add --rebuild"
        )
    if args.workers is not None:  # (the caller's flag: a usage error before any hashing)
        from .params import PARAMS

        if problem := PARAMS["workers"].metadata["range"].problem("--workers", args.workers):
            raise UsageError(problem)
    spec = None
    if args.rows is not None:
        from .spot import check_in_range, parse_rows

        spec = parse_rows(args.rows)
        try:  # (a row past the build's last is a usage error before any check; a manifest unsound, verify's)
            rows = read_manifest(args.folder / MANIFEST_NAME)["stats"]["rows"]
        except (OSError, ValueError, RecursionError, LookupError, TypeError):
            rows = None
        if isinstance(rows, int) and not isinstance(rows, bool) and rows > 0:
            check_in_range(spec, rows)
    published = None
    if args.published is not None:
        try:
            published = build_spec(args.published).get("published")
        except SpecError as error:
            raise UsageError(str(error)) from None
        if not published:
            raise UsageError(f"build {args.published} has no published values")
    problems = verify(args.folder)
    for problem in problems:
        print(f"MISMATCH {one_line(problem)}")  # (a file's name may hold any character)
    if problems:
        if published:
            print("published values not compared: the folder does not match its own manifest")
        return FAILURE
    print(f"ok: {args.folder} matches its manifest")
    same = True
    if published:
        manifest = read_manifest(args.folder / MANIFEST_NAME)
        same = _report_published(manifest, published, args.published)
    if spec is not None:
        from .spot import report as spot_report
        from .spot import spot_check

        proven, lines = spot_report(spot_check(args.folder, spec, args.source, args.tokenizer))
        print("\n".join(lines))
        same = proven and same
    elif args.rebuild:
        from .engine import usable_cores

        workers = usable_cores() if args.workers is None else args.workers
        proven, lines = report(rebuild(args.folder, args.source, args.tokenizer, workers, not args.quiet))
        print("\n".join(lines))
        same = proven and same
    return 0 if same else FAILURE


def _inspect(args: argparse.Namespace) -> int:
    from .errors import UsageError
    from .inspect_rows import page, plain, print_coloured, row_view, summary
    from .output import naming

    if args.row is None:
        if args.tokenizer is not None or args.html is not None:
            raise UsageError("--tokenizer and --html are for a row; add --row K")
        found = summary(args.folder)
        print("\n".join(found.lines))
        return 0 if found.agrees else FAILURE
    view = row_view(args.folder, args.row, args.tokenizer)
    if args.html is not None:
        from .folder import writing_new

        with writing_new(args.html) as part, naming(args.html):
            part.write_text(page(view), encoding="utf-8")
        print(f"wrote {args.html}: {view.title()}")
    elif sys.stdout.isatty():
        print_coloured(view)
    else:
        sys.stdout.write(plain(view))
    return 0


def _diff(args: argparse.Namespace) -> int:
    from .diff import diff

    same, lines = diff(args.first, args.second, args.tokenizer)
    print("\n".join(lines))
    return 0 if same else 1


def _pin(args: argparse.Namespace) -> int:
    from .errors import UsageError
    from .fields import loads
    from .specs import pin_tokenizer, write_tokenizer_spec

    kwargs = None
    if args.template_kwargs is not None:
        try:
            value = loads(args.template_kwargs)
        except ValueError as error:
            raise UsageError(f"--template-kwargs is not JSON ({error})") from None
        from .params import RENDERER_ARGUMENTS, JsonObject

        problem = JsonObject(RENDERER_ARGUMENTS).problem("--template-kwargs", value)
        if problem is not None or not isinstance(value, dict):
            raise UsageError(problem or "--template-kwargs must be a JSON object, got null")
        kwargs = value
    if args.out is not None and not args.out.is_dir():
        raise UsageError(f"--out {args.out}: {'not a folder' if args.out.exists() else 'no such folder'}")
    spec = pin_tokenizer(
        args.tokenizer, args.revision, args.repo, args.name, kwargs, args.loss_mask_type, args.trust_remote_code
    )
    path = write_tokenizer_spec(spec, args.out)
    print(f"pinned {spec['repo']}@{spec['revision']} ({spec['family']}, {len(spec['files'])} files) in {path}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from .export import export

    done = export(args.folder, args.to, args.out)
    print(
        f"exported {done.path} ({args.to}): {done.rows} rows, {done.segments} conversation pieces, "
        f"{done.trained_tokens} tokens trained within them (the build: {done.trainable_tokens} trainable)"
    )
    return 0


def _may_download(config: BuildConfig) -> bool:
    """Whether a build of ``config`` may download from the Hub: its source or its tokenizer
    is not a local path (a Hub id, or a named build's)."""
    return not all(value is not None and Path(value).exists() for value in (config.source, config.tokenizer))


@contextmanager
def _hub_bars(shown: bool) -> Iterator[None]:
    """huggingface_hub's download and upload bars, off inside the block unless ``shown``
    (where they are, huggingface_hub's bars, ~15 ms of imports, are not imported here)."""
    if shown:
        yield
        return
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    quieted = not are_progress_bars_disabled()
    if quieted:
        disable_progress_bars()
    try:
        yield
    finally:
        if quieted:
            enable_progress_bars()


def _push(args: argparse.Namespace) -> int:
    from .push import push

    with _hub_bars(not args.quiet):
        done = push(args.folder, args.repo, private=args.private, force=args.force)
    print(f"pushed {args.folder} to {done.url} in commit {done.commit}: {', '.join(done.files)}")
    if done.deleted:
        print(f"  and deleted the card files the build lacks: {', '.join(done.deleted)}")
    return 0


def main(argv: list[str] | None = None, early: bool = False) -> int:
    """Run the command line (``build`` when no command is named); return the exit code.
    From the main thread, Ctrl-C and SIGTERM are handled by ``_Stop`` meanwhile. With
    ``early`` (the program itself: ``run``), a build starts its drawing process, and with many
    workers their fork server, first (``_start_early``): a caller that goes on after ``main``
    would keep processes that wait."""
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")  # no "PyTorch was not found" notice
    # No BLAS here: without this, each process that imports numpy (this one, the workers' fork
    # server, the plots' process) starts a thread per core that spins ~0.1 s (0.1 CPU-s a
    # process on 2 cores, 15 threads a process on 16).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if not argv or argv[0] not in (*COMMANDS, "-h", "--help"):
        argv.insert(0, "build")
    stop, _Stop.said = _Stop(), False
    previous = {signum: signal.signal(signum, stop) for signum in SIGNALS} if _owns_signals() else {}
    try:
        return _command(argv, stop, early)
    except (KeyboardInterrupt, Terminated) as stopped:
        code, message = SIGNALS[signal.SIGINT if isinstance(stopped, KeyboardInterrupt) else signal.SIGTERM]
        _Stop.said = True  # (first: a signal from here on exits without a second line)
        print(message, file=sys.stderr)
        return code
    except Exception as error:
        exit_code = _exit_code(error)
        if exit_code is None and os.environ.get("FIXED_SFT_DEBUG"):
            raise
        detail = (
            _describe(error)
            if exit_code
            else (f"internal error ({type(error).__name__}: {error}); FIXED_SFT_DEBUG=1 shows the traceback")
        )
        print(f"error: {one_line(detail)}", file=sys.stderr)
        return exit_code or FAILURE
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class _Parser(argparse.ArgumentParser):
    """A parser whose usage errors are one line, as the others are (``--help`` shows the usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")


class _SilentParser(argparse.ArgumentParser):
    """A parser that raises ``ArgumentError`` for every error (an ambiguous abbreviation
    too), printing nothing: the build's parser names the error."""

    def error(self, message: str) -> NoReturn:
        raise argparse.ArgumentError(None, message)


def _start_early(argv: list[str]) -> None:
    """Start, before the build's imports, the process that draws the card's plots
    (``plots.start_early``; not with ``--no-card``), and the workers' fork server
    (``fixed_sft.early``) for a build of at least ``EARLY_WORKERS`` workers (``--workers``,
    else the cores) on as many cores: with fewer, a build that then forks no worker would
    pay the server's imports. The server is told ``--tokenizer``, ``--bpe``, ``--cache-dir``
    and ``--no-cache``, to load that tokenizer meanwhile."""
    if argv[:1] != ["build"]:
        return
    early = _SilentParser(add_help=False, exit_on_error=False)
    early.add_argument("-h", "--help", action="store_true")  # (``--he`` too: the parser prints the help)
    early.add_argument("--workers", type=int)  # (read as the parser reads them, abbreviated or not)
    early.add_argument("--tokenizer")
    early.add_argument("--bpe")
    early.add_argument("--cache-dir")
    early.add_argument("--no-cache", action="store_true")
    early.add_argument("--no-card", action="store_true")
    try:
        given = early.parse_known_args(argv[1:])[0]
    except argparse.ArgumentError:
        return  # (the parser names the error)
    if given.help:
        return
    from .engine import MANY_WORKERS, usable_cores

    cores = usable_cores()
    workers = cores if given.workers is None else given.workers
    if not given.no_card:
        from .plots import start_early

        start_early(lazy=workers >= MANY_WORKERS and given.no_cache)  # (one that encodes: ``Plotter.encodes``)
    if min(workers, cores) >= EARLY_WORKERS:
        from .early import start

        start(given.tokenizer, given.bpe, given.cache_dir, given.no_cache)


def _empty(argv: list[str], valued: set[str]) -> str | None:
    """The flag of ``valued`` (those that take a value), or ``an argument``, given an empty
    value: no value of any command may be empty (an unset shell variable, say), where a
    path would be read as ``.``.

    >>> valued = {"--source", "--rows", "--separator"}
    >>> _empty(["build", "--source", "", "--rows", "2"], valued), _empty(["verify", "--source=", "x"], valued)
    ('--source', '--source')
    >>> _empty(["verify", ""], valued), _empty(["verify", "--rebuild", ""], valued), _empty(["x", "--sou", ""], valued)
    ('an argument', 'an argument', '--sou')
    >>> _empty(["build", "--source", "data"], valued) is None, _empty(["build", "--separator=="], valued) is None
    (True, True)
    """
    for k, value in enumerate(argv):
        flag, equals, given = value.partition("=")
        if flag.startswith("--") and equals and not given:
            return flag
        if value == "":
            before = argv[k - 1] if k else ""
            # (a flag as given, or as argparse reads an abbreviation of one: the one it starts)
            named = [flag for flag in valued if flag.startswith(before)] if before.startswith("--") else []
            return before if before in valued or len(named) == 1 else "an argument"
    return None


def _valued(parser: argparse.ArgumentParser, command: str | None = None) -> set[str]:
    """The flags of ``parser`` and of its ``command`` that take a value."""
    flags = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            if command in action.choices:
                flags |= _valued(action.choices[command])
        elif action.option_strings and action.nargs != 0:
            flags |= set(action.option_strings)
    return flags


def _parse(argv: list[str]) -> argparse.Namespace:
    """``parser``'s reading of ``argv``. An argument the command does not take is named with
    that command's usage, and the command's closest flag: ``--rows-tokens``, ``--row-tokens``."""
    import difflib

    top = parser()
    if (empty := _empty(argv, _valued(top, argv[0] if argv else None))) is not None:
        from .errors import UsageError

        raise UsageError(f"{empty} must not be empty")
    args, extra = top.parse_known_args(argv)
    from .specs import BUILDS

    name = getattr(args, "name", None) if args.command == "build" else None
    if name is not None and not (BUILDS / f"{name}.json").is_file():  # (a command's name mistyped, say)
        close = difflib.get_close_matches(name, list(COMMANDS), n=1)
        if close:
            top.error(f"no command or build named {name!r} (did you mean {close[0]}?)")
        from .source import SUFFIXES

        if os.path.exists(name) or Path(name).suffix in SUFFIXES:  # (a source given where a name goes)
            top.error(f"no build named {name!r}; a source file or folder is given with --source: --source {name}")
    if extra:
        [commands] = [action for action in top._actions if isinstance(action, argparse._SubParsersAction)]
        command: argparse.ArgumentParser = commands.choices[args.command]
        flags = [flag for action in command._actions for flag in action.option_strings]
        close = difflib.get_close_matches(extra[0].split("=", 1)[0], flags, n=1)
        command.error(f"unrecognized arguments: {' '.join(extra)}" + (f" (did you mean {close[0]}?)" if close else ""))
    return args


def _command(argv: list[str], stop: _Stop, early: bool = False) -> int:
    try:
        if early:
            _start_early(argv)
        args = _parse(argv)  # (imports, which Ctrl-C may interrupt too)
        return COMMANDS[args.command](args)
    finally:
        stop.over = True  # a signal from here on exits at once (``main`` catches what one raised up to here)
        plots = sys.modules.get("fixed_sft.plots") if early else None
        if plots is not None:
            plots.discard_early()  # (a command line or build that stopped before the build took it)


COMMANDS = {
    "build": _build,
    "verify": _verify,
    "inspect": _inspect,
    "diff": _diff,
    "pin-tokenizer": _pin,
    "export": _export,
    "push": _push,
}


def run() -> NoReturn:
    """The program (``generate_fixed_sft.py``, ``generate-fixed-sft``): ``main``, then
    exit. A signal once the command is over (the interpreter shutting down) exits at once
    with its code (but for the last moments: ``_ignore_signals``); so does an interrupted
    command, rather than wait in that shutdown for threads and workers that are still
    stopping (an encoder start-up may never end): they end with this process."""
    atexit.register(_ignore_signals)  # (the first exit function registered runs last)
    after = _Stop(over=True)
    for signum in SIGNALS:
        signal.signal(signum, after)
    code = main(early=True)
    if code in (INTERRUPTED, TERMINATED):
        exit_now(code)
    gc.freeze()  # (the exit frees what is left: the interpreter's last collection need not go over it, ~40 ms)
    sys.exit(code)


def _ignore_signals() -> None:
    """The last exit function: past it, Python puts back the default handlers (by which a
    signal would kill the process, exit -2) as it frees its modules. Nothing is left to
    stop then; a signal is ignored, and the exit code is the command's."""
    for signum in SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


# Control characters but the tab, as ``\\xNN``: quoted from the data, they would reach the terminal as commands.
_CONTROLS = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0)) if code != 0x09}


def one_line(text: str) -> str:
    """``text`` as one line: an error is one line on stderr, and it may quote values from the
    data (an id, a path) or a library's message that hold line breaks (any that
    ``str.splitlines`` splits at), each shown as ``\\n``, and other control characters (an
    escape sequence), each shown as ``\\xNN``.

    >>> print(one_line("row 2 (id a\\nerror: b\\u2028c): bad\\n"))
    row 2 (id a\\nerror: b\\nc): bad
    >>> print(one_line("role 'x\\x1b[2J' unknown"))
    role 'x\\x1b[2J' unknown
    """
    return "\\n".join(text.splitlines()).translate(_CONTROLS)


def _exit_code(error: Exception) -> int | None:
    from .build import BuildError, UsageError
    from .chat import TemplateMismatch
    from .source import SourceError
    from .specs import SpecError
    from .tokenizer import TokenizerError

    if isinstance(error, UsageError):
        return USAGE_ERROR
    if isinstance(error, (BuildError, SourceError, SpecError, TemplateMismatch, TokenizerError, OSError)):
        return FAILURE  # (an OSError: what the system refused, such as a file it may not read)
    if isinstance(error, BrokenExecutor):
        return FAILURE
    return None


def _describe(error: Exception) -> str:
    if isinstance(error, OSError) and error.filename is not None:
        return f"{error.filename}: {error.strerror}"
    if isinstance(error, BrokenExecutor):
        return "a worker process ended abruptly (killed by a signal, or by the system when out of memory)"
    return str(error)

"""Long fuzz run of the chat-encoding and packing properties (tests/strategies.py).

    python benchmarks/fuzz.py --examples 10000 [--seed S] [--jobs J]

Each example is one random conversation (arbitrary unicode, special-token strings,
long runs, many turns) checked against the independent transformers-based
reference (ids, mask, supervised tokens == assistant bodies), then packed with up
to 4 more random conversations into rows of a random ``row_tokens`` (exact row
length, rows re-join to the ``[EOS]``-joined stream). Hypothesis generates the
examples from ``--seed`` (deterministic for a given seed and job count) and, on a
failure, shrinks it: the minimal failing example is printed and the exit code is 1.

Prints progress, then a last line ``fuzz: N passed, F failed``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

DEFAULT_TOKENIZER = ROOT.parent / "shared" / "tokenizers" / "kimi-k2.6"


def run_job(job: int, examples: int, seed: int, tokenizer_dir: str, progress_every: int, tagged: bool = False) -> dict:
    """Run ``examples`` hypothesis examples with ``seed``; return counts and, on
    failure, the minimal failing example's description."""
    import strategies as S
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed
    from reference_kimi import ReferenceKimi

    from fixed_sft.chat import ChatEncoder
    from fixed_sft.tokenizer import KimiTokenizer

    encoder = ChatEncoder(KimiTokenizer(tokenizer_dir))
    reference = ReferenceKimi(tokenizer_dir)
    state = {"passed": 0, "failing": None, "shrinking": False, "start": time.perf_counter(), "check_s": 0.0}
    tag = f"[job {job}] " if tagged else ""

    @hypothesis_seed(seed)
    @settings(
        max_examples=examples,
        database=None,
        deadline=None,
        derandomize=False,
        report_multiple_bugs=False,
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @given(example=S.examples())
    def fuzz(example):
        started = time.perf_counter()
        try:
            S.check_example(encoder, reference, example)
        except BaseException as error:  # noqa: BLE001 - a crash is a failure too
            # Hypothesis replays the shrunk example last, so this ends as the minimal one.
            state["failing"] = (example, f"{type(error).__name__}: {error}", traceback.format_exc())
            state["shrinking"] = True
            raise
        finally:
            state["check_s"] += time.perf_counter() - started
        if not state["shrinking"]:
            state["passed"] += 1
            if state["passed"] % progress_every == 0:
                elapsed = time.perf_counter() - state["start"]
                print(
                    f"{tag}{state['passed']}/{examples} passed, {1000 * elapsed / state['passed']:.1f} ms/example",
                    flush=True,
                )

    failed = 0
    try:
        fuzz()
    except BaseException:  # noqa: BLE001
        failed = 1
    result = {
        "job": job,
        "passed": state["passed"],
        "failed": failed,
        "seconds": time.perf_counter() - state["start"],
        "check_seconds": state["check_s"],
    }
    if failed:
        example, message, trace = state["failing"] or (None, "unknown", "")
        result["failure"] = _describe_failure(S, example, message, trace, seed, job)
    return result


def _describe_failure(S, example, message: str, trace: str, seed: int, job: int) -> str:
    lines = [f"minimal failing example (seed {seed}, job {job}):"]
    if example is not None:
        conversation, packed, row_tokens = example
        lines.append(f"  conversation: {S.describe(conversation)}")
        lines.append(f"  packed with {len(packed) - 1} more conversation(s), row_tokens={row_tokens}")
        for k, other in enumerate(packed):
            if other is not conversation:
                lines.append(f"    [{k}] {S.describe(other)}")
        full = repr(example)
        if len(full) <= 4000:
            lines.append(f"  repr: {full}")
    lines.append(f"  error: {message[:2000]}")
    lines.append("  traceback:\n" + "\n".join("    " + line for line in trace.rstrip().splitlines()[-12:]))
    return "\n".join(lines)


def _job(args: tuple) -> dict:
    return run_job(*args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=10_000, help="examples to run (default 10000)")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    parser.add_argument("--jobs", type=int, default=1, help="processes; job k uses seed S*1000+k (default 1)")
    parser.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER), help="Kimi-K2.6 tokenizer folder")
    parser.add_argument("--progress-every", type=int, default=500, help="print progress every N examples")
    args = parser.parse_args(argv)
    if args.examples < 1 or args.jobs < 1:
        parser.error("--examples and --jobs must be positive")
    if not (Path(args.tokenizer) / "tiktoken.model").is_file():
        parser.error(f"no tokenizer files at {args.tokenizer}")

    started = time.perf_counter()
    print(
        f"fuzz: {args.examples} examples, seed {args.seed}, {args.jobs} job(s), tokenizer {args.tokenizer}", flush=True
    )
    if args.jobs == 1:
        results = [run_job(0, args.examples, args.seed, args.tokenizer, args.progress_every)]
    else:
        shares = [args.examples // args.jobs + (k < args.examples % args.jobs) for k in range(args.jobs)]
        work = [
            (k, n, args.seed * 1000 + k, args.tokenizer, args.progress_every, True) for k, n in enumerate(shares) if n
        ]
        with multiprocessing.get_context("spawn").Pool(len(work)) as pool:
            results = pool.map(_job, work)

    passed = sum(r["passed"] for r in results)
    failed = sum(r["failed"] for r in results)
    elapsed = time.perf_counter() - started
    checked = sum(r["check_seconds"] for r in results)
    for r in results:
        if r.get("failure"):
            print(r["failure"], flush=True)
    print(
        f"time: {elapsed:.1f} s wall, {1000 * elapsed * args.jobs / max(passed + failed, 1):.1f} ms/example per job "
        f"({1000 * checked / max(passed + failed, 1):.1f} ms checking, the rest generating)"
    )
    print(f"fuzz: {passed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""A first build's workers, their fork server started before the build's imports against after them, whole process.

Writes a synthetic source (``pairs.write_source``: ``--corpus short`` for short dialogs; a
fill task per row group) and times pairs of first builds (``--rows all``, each from an
empty store but for the template probes, each in a fresh process as the program runs it),
the two ways alternating: the fork server started as the command line is read
(``fixed_sft.early``; ``cli.EARLY_WORKERS`` at its value) and started once the build knows
its encoder (``EARLY_WORKERS`` past any worker count). Both ways must give the same rows,
else the script exits 1; it exits 2 where the workers or cores are fewer than
``EARLY_WORKERS``. Prints the median and range of each and the ratio of the medians.

    python benchmarks/bench_early.py [--conversations 64000] [--corpus tulu|short] [--workers 16] [--repeats 2]
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pairs

WAYS = {
    "early": "from fixed_sft import cli",
    "after the imports": "from fixed_sft import cli; cli.EARLY_WORKERS = 1 << 62",
}


def main() -> int:
    args = pairs.arguments(__doc__.splitlines()[0], conversations=64000).parse_args()

    from fixed_sft.cli import EARLY_WORKERS

    if not pairs.enough(args.workers, EARLY_WORKERS, "the early start"):
        return 2
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        source = pairs.write_source(folder, args.conversations, args.corpus)
        common = ["--source", str(source), "--tokenizer", str(args.tokenizer), "--row-tokens", "4096", "--seed", "1"]
        common += ["--workers", str(args.workers), "--no-card", "--quiet"]
        probes = folder / "probes"  # (a build of one row keeps the template probes: every build below starts with them)
        pairs.build([*common, "--rows", "1", "--cache-dir", str(probes), "--out", str(folder / "warm")], WAYS["early"])

        def run(name: str, way: str, repeat: int) -> str:
            out = folder / f"{name}-{repeat}".replace(" ", "-")
            store = folder / f"store-{out.name}"
            shutil.copytree(probes / "probes", store / "probes")
            return pairs.build([*common, "--rows", "all", "--cache-dir", str(store), "--out", str(out)], way)

        times, same = pairs.alternate(WAYS, args.repeats, run)
    title = f"{args.conversations:,} {args.corpus} conversations, a first build at {args.workers} workers"
    return pairs.report(title, times, same, args)


if __name__ == "__main__":
    sys.exit(main())

"""The write pass's parts: several row groups a part against one, in a later build at 16 workers, whole process.

Writes a synthetic source (``pairs.write_source``: ``--corpus short`` for short dialogs),
fills the token store with a first build (``--rows all``), then times pairs of later
builds at other seeds, packed in their workers (``build.STORED_PACKING_TOKENS`` and
``STORED_PACKING_CORES`` set to 0), each in a fresh process as the program runs it, the
two ways alternating: parts of as many row groups as ``parallel.groups_per_part`` gives,
and a row group a part (``parallel.WRITE_TASKS`` past any row count). Each part costs the
build's process a round trip and a join. Both ways must give the same rows, else the
script exits 1; it exits 2 with fewer workers or cores than packing in the workers needs.

    python benchmarks/bench_parts.py [--conversations 256000] [--corpus tulu|short] [--workers 16] [--repeats 3]
"""

from __future__ import annotations

import sys

import pairs

APART = "import fixed_sft.build as build; build.STORED_PACKING_TOKENS = build.STORED_PACKING_CORES = 0"
WAYS = {
    "a row group a part": f"{APART}; import fixed_sft.parallel as parallel; parallel.WRITE_TASKS = 1 << 62",
    "several a part": APART,
}


def main() -> int:
    parser = pairs.arguments(__doc__.splitlines()[0], conversations=256000)
    args = parser.parse_args()

    from fixed_sft.build import PARALLEL_PACKING_WORKERS

    if not pairs.enough(args.workers, PARALLEL_PACKING_WORKERS, "packing in the workers"):
        return 2
    times, same = pairs.later_builds(args, WAYS, APART)
    title = f"{args.conversations:,} {args.corpus} conversations, a later build at {args.workers} workers"
    return pairs.report(title, times, same, args)


if __name__ == "__main__":
    sys.exit(main())

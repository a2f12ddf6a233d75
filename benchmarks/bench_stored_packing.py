"""A build that encodes nothing: packed in workers forked from its process against in its own process, whole process.

Writes a synthetic source (``pairs.write_source``: ``--corpus short`` for short dialogs),
fills the token store with a first build (``--rows all``), then times pairs of later
builds at other seeds, each in a fresh process as the program runs it, the two ways
alternating: in workers forked from the build's process (``build.STORED_PACKING_TOKENS``
and ``STORED_PACKING_CORES`` set to 0, so from 4 cores) and in its own process, straight
from the store (``fixed_sft.direct``; the tokens set past any source). Both ways must give
the same rows, else the script exits 1; it exits 2 with fewer workers or cores than
packing in the workers needs. Prints the median and range of each and the ratio of the
medians: the figures the two constants rest on.

    python benchmarks/bench_stored_packing.py [--conversations 40000] [--corpus tulu|short]
        [--workers 16] [--repeats 2] [--json OUT]
"""

from __future__ import annotations

import sys

import pairs

WAYS = {
    "workers": "import fixed_sft.build as build; build.STORED_PACKING_TOKENS = build.STORED_PACKING_CORES = 0",
    "own process": "import fixed_sft.build as build; build.STORED_PACKING_TOKENS = 1 << 62",
}


def main() -> int:
    parser = pairs.arguments(__doc__.splitlines()[0], conversations=40000)
    parser.add_argument("--row-tokens", type=int, default=4096)
    args = parser.parse_args()

    from fixed_sft.build import PARALLEL_PACKING_WORKERS

    if not pairs.enough(args.workers, PARALLEL_PACKING_WORKERS, "packing in the workers"):
        return 2
    times, same = pairs.later_builds(args, WAYS, WAYS["workers"], args.row_tokens)
    title = f"{args.conversations:,} {args.corpus} conversations, a later build at {args.workers} workers"
    return pairs.report(title, times, same, args)


if __name__ == "__main__":
    sys.exit(main())

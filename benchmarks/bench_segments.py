"""Reading stored conversations in packing order from a store of many segments: CPU and file opens.

Writes a token store entry of ``--conversations`` synthetic conversations (random lengths of
up to 2,000 tokens; no tokenizer needed) in segments of ``--per-segment`` conversations, as
a fill writes a segment per task, then reads them all in the packing order of a seed, a
block of 1,024 at a time (``TokenStore.lookup_many``, as a build packing one conversation
at a time reads them), with readers that keep 64 files open (the earlier limit) and with
``store.OPEN_FILES`` (a quarter of the open-file limit). Prints the CPU seconds and the
files opened, median of ``--repeats``.

    python benchmarks/bench_segments.py [--conversations 40000] [--per-segment 128] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from fixed_sft import store as store_module  # noqa: E402
from fixed_sft.encode import Encoded  # noqa: E402
from fixed_sft.order import permutation  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=40000)
    parser.add_argument("--per-segment", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    n = args.conversations
    opened = [0]
    real_open = os.open

    def counting(*call: object, **named: object) -> int:
        opened[0] += 1
        return real_open(*call, **named)  # type: ignore[arg-type]

    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        store_module.SEGMENT_CONVERSATIONS = args.per_segment
        writer = store_module.SegmentWriter(folder)
        lengths = np.random.default_rng(0).integers(1, 2000, n)
        for i, length in enumerate(lengths.tolist()):
            mask = np.zeros(length, np.uint8)
            mask[length // 2 :] = 1
            writer.add(Encoded(i, f"row-{i}", np.arange(length, dtype=np.int32), mask, None, True, "synthetic"))
        writer.flush()
        segments = len(list(folder.glob("*.seg")))
        order = permutation(1, n).tolist()
        os.open = counting  # type: ignore[assignment]  (the store's reader opens segments with it)
        print(f"{n:,} conversations in {segments} segments, read in packing order, blocks of 1,024")
        for limit in (64, store_module.OPEN_FILES):
            store_module.OPEN_FILES = limit
            seconds, opens = [], []
            for _ in range(args.repeats):
                store = store_module.TokenStore(folder, n)
                opened[0] = 0
                start = time.process_time()
                for block in range(0, n, 1024):
                    store.lookup_many(order[block : block + 1024])
                seconds.append(time.process_time() - start)
                opens.append(opened[0])
                store.close()
            print(
                f"  {limit:>5} files kept open: {statistics.median(seconds):.3f} CPU-s "
                f"({min(seconds):.3f}-{max(seconds):.3f}), {statistics.median(opens):,.0f} files opened"
            )
        os.open = real_open
    return 0


if __name__ == "__main__":
    sys.exit(main())

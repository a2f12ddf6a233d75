"""Peak memory of ``verify`` on folders made to take a machine down, beside normal ones.

Writes, in a temporary folder, folders that verify must refuse cheaply:
- ``bomb``: a manifest of one row of 8,192 tokens (the file's size and hash recorded), and a
  ``train.parquet`` holding one row of ``--bomb-tokens`` zeros, dictionary-encoded and
  compressed to a few kB;
- ``forged bomb``: the same file with its footer saying each column holds what the manifest's
  row needs (so only the page headers tell);
- ``largest manifest``: the manifest of ``verify.MANIFEST_ROWS`` rows (read: it is one a
  build may write) beside a file of one row;
- ``sparse manifest``: a 3 GB ``manifest.json`` that takes no disk;
- ``small-values manifest``: a manifest just under the size cap of ``{}`` values (3 bytes of
  JSON, a 64-byte dict each);

and folders it must verify: ``normal`` (``--rows`` rows of 8,192 tokens, random ids and
mask), ``largest row group`` (64 rows of 131,072 tokens: one row group of
``output.GROUP_VALUES`` tokens, the most a build writes in one) and ``widest row group
read`` (120 such rows in one row group: the most verify decodes at once, ``reader.DECODE_BYTES``,
beyond what a build writes). Each is verified in a fresh
process (``resource.getrusage``: peak RSS); a process that only imports ``fixed_sft.verify``
is the floor. Prints a table of peak RSS (MiB) and wall time, median and range over repeats.

    python benchmarks/bench_verify_memory.py [--rows 1024] [--bomb-tokens 400000000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]
CASES = {
    "import only": None,
    "normal": "normal",
    "largest row group": "largest",
    "widest row group read": "widest",
    "largest manifest": "manifest",
    "bomb": "bomb",
    "forged bomb": "forged",
    "sparse manifest": "sparse",
    "small-values manifest": "values",
}
if __name__ == "__main__" and sys.argv[1:2] == ["--write"]:  # (the folders are written in a process of their own:
    # Linux counts a process's peak RSS from before it started another program, so the
    # process that starts the measured ones must stay small)
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fixed_sft import thrift
    from fixed_sft.hashes import row_digest, rows_digest, sha256_file
    from fixed_sft.output import FORMAT, GROUP_VALUES, MANIFEST_NAME, PARQUET_NAME, PROMPT, SCHEMA, RowWriter
    from fixed_sft.pack import Row, Segment
    from fixed_sft.verify import MANIFEST_BYTES, MANIFEST_ROWS

VERIFY = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
from fixed_sft.verify import verify
start = time.perf_counter()
problems = verify(sys.argv[2]) if len(sys.argv) > 2 else None
print(json.dumps({"peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "seconds": time.perf_counter() - start, "problems": problems}))
"""


def manifest_for(rows: list[Row], row_tokens: int, parquet: Path) -> dict:
    """The manifest of a folder of ``rows`` (each one segment of its own source row)."""
    digests = [row_digest(row.ids, row.mask) for row in rows]
    supervised = sum(int(np.count_nonzero(row.mask)) for row in rows)
    trainable = sum(int(np.count_nonzero(row.mask[1:])) for row in rows)
    tokens = len(rows) * row_tokens
    return {
        "format": FORMAT,
        "name": "bench",
        "code_version": {"fixed_sft": "bench", "format": FORMAT, "code_sha256": "0" * 64},
        "params": {
            "rows": len(rows),
            "row_tokens": row_tokens,
            "seed": 0,
            "order": "splitmix64-key-v1",
            "loss_mask_type": "kimi_k25",
            "skip_invalid": False,
        },
        "source": {
            "name": "bench",
            "revision": None,
            "license": None,
            "file_patterns": None,
            "rows": len(rows),
            "files": [],
        },
        "tokenizer": {"name": None, "repo": None, "revision": None, "files": {}, "pinned": False},
        "loss_mask": {"type": "kimi_k25", "template_kwargs": {}},
        "template_check": {"every": 0, "checked": 0},
        "stats": {
            "rows": len(rows),
            "tokens": tokens,
            "supervised_tokens": supervised,
            "supervised_token_ratio": supervised / tokens,
            "trainable_tokens": trainable,
            "padding_tokens": 0,
            "conversations": len(rows),
            "conversations_split": 0,
            "rows_skipped": 0,
            "tail_tokens_dropped": 0,
            "invalid_rows_skipped": 0,
        },
        "skipped_invalid": [],
        "parquet": {"path": PARQUET_NAME, "bytes": parquet.stat().st_size, "sha256": sha256_file(parquet)},
        "rows_sha256": rows_digest(digests),
        "row_sha256": [d.hex() for d in digests],
    }


def write_folder(folder: Path, rows: int, row_tokens: int, seed: int, group_values: int | None = None) -> None:
    """A folder that verifies: ``rows`` random rows of ``row_tokens`` tokens (row groups of
    at most ``group_values`` tokens, where given, instead of a build's)."""
    import fixed_sft.output

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    made = []
    fixed_sft.output.GROUP_VALUES = group_values or GROUP_VALUES
    writer = RowWriter(folder / PARQUET_NAME)
    for n in range(rows):
        mask = rng.integers(0, 2, row_tokens, dtype=np.uint8)
        mask[1] = 1
        row = Row(rng.integers(0, 163_840, row_tokens, dtype=np.int32), mask, (Segment(n, None, 0, row_tokens),))
        writer.write(row)
        made.append(row)
    writer.close()
    fixed_sft.output.GROUP_VALUES = GROUP_VALUES
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest_for(made, row_tokens, folder / PARQUET_NAME), indent=1))


def write_bomb(folder: Path, tokens: int, forge: bool) -> None:
    """A manifest of one row of 8192 tokens beside a file of one row of ``tokens`` zeros;
    with ``forge``, the footer says its columns hold 8192 values."""
    write_folder(folder, 1, 8192, seed=1)
    zeros = pa.array(np.zeros(tokens, np.int32))
    metadata = pa.StructArray.from_arrays(
        [
            pa.ListArray.from_arrays(pa.array([0, tokens], pa.int32()), zeros),
            pa.ListArray.from_arrays(pa.array([0, tokens], pa.int32()), zeros.cast(pa.uint8())),
            pa.array([0], pa.int64()),
            pa.array(
                [[{"source_index": 0, "id": None, "start": 0, "end": 8192}]], SCHEMA.field("metadata").type[3].type
            ),
        ],
        fields=list(SCHEMA.field("metadata").type),
    )
    table = pa.Table.from_arrays([pa.array([PROMPT], SCHEMA.field("messages").type), metadata], schema=SCHEMA)
    del zeros, metadata
    parquet = folder / PARQUET_NAME
    pq.write_table(table, parquet, compression="zstd", use_dictionary=True)
    del table
    if forge:
        data = parquet.read_bytes()
        length = int.from_bytes(data[-8:-4], "little")
        footer = thrift.Reader(data[-8 - length : -8]).struct()
        (group,) = thrift.get(footer, 4)[1]
        for chunk in thrift.get(group, 1)[1][2:4]:  # metadata.input_ids, metadata.loss_mask
            meta = thrift.get(chunk, 3)
            meta[:] = [(f, k, 8192 if f == 5 else v) for f, k, v in meta]  # ColumnMetaData.num_values
        encoded = thrift.write_struct(footer)
        parquet.write_bytes(data[: -8 - length] + encoded + len(encoded).to_bytes(4, "little") + b"PAR1")
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    manifest["parquet"].update(bytes=parquet.stat().st_size, sha256=sha256_file(parquet))
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1))


def write_largest_manifest(folder: Path) -> None:
    """A manifest of ``verify.MANIFEST_ROWS`` row hashes (the largest a build of that many
    rows writes, read whole) beside a file of one row: verify reads the manifest, then
    names the rows that differ."""
    write_folder(folder, 1, 8192, seed=6)
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    digests = [hashlib.sha256(n.to_bytes(8, "little")).digest() for n in range(MANIFEST_ROWS)]
    manifest["row_sha256"] = [d.hex() for d in digests]
    manifest["rows_sha256"] = rows_digest(digests)
    tokens = MANIFEST_ROWS * 8192
    manifest["params"]["rows"] = manifest["stats"]["rows"] = MANIFEST_ROWS
    manifest["stats"].update(tokens=tokens, supervised_token_ratio=manifest["stats"]["supervised_tokens"] / tokens)
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1))


def write_sparse_manifest(folder: Path) -> None:
    write_folder(folder, 1, 8192, seed=2)
    with (folder / MANIFEST_NAME).open("r+b") as f:
        f.truncate(3 << 30)


def write_small_values_manifest(folder: Path) -> None:
    write_folder(folder, 1, 8192, seed=3)
    count = (MANIFEST_BYTES - 2) // 3
    with (folder / MANIFEST_NAME).open("wb") as f:
        f.write(b"[")
        for _ in range(count // 1_000_000):
            f.write(b"{}," * 1_000_000)
        f.write(b"{}," * (count % 1_000_000 - 1) + b"{}]")


def write(base: Path, rows: int, bomb_tokens: int) -> None:
    write_folder(base / "normal", rows, 8192, seed=0)
    write_folder(base / "largest", 64, 131_072, seed=4)
    # the widest row group verify reads: what its columns take decoded (reader.WIDTH) just under DECODE_BYTES
    write_folder(base / "widest", 120, 131_072, seed=5, group_values=120 * 131_072)
    write_bomb(base / "bomb", bomb_tokens, forge=False)
    write_bomb(base / "forged", bomb_tokens, forge=True)
    write_largest_manifest(base / "manifest")
    write_sparse_manifest(base / "sparse")
    write_small_values_manifest(base / "values")
    print(
        ", ".join(
            f"{name} {(base / name / PARQUET_NAME).stat().st_size:,}"
            for name in ("normal", "largest", "widest", "bomb", "forged")
        )
    )


def measure(folder: Path | None) -> dict:
    command = [sys.executable, "-c", VERIFY, str(ROOT)] + ([str(folder)] if folder else [])
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    if sys.argv[1:2] == ["--write"]:
        write(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1024, help="rows of the normal folder (8192 tokens each)")
    parser.add_argument("--bomb-tokens", type=int, default=400_000_000, help="tokens of the bomb's one row")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-verify-") as scratch:
        base = Path(scratch)
        started = time.perf_counter()
        sizes = subprocess.run(
            [sys.executable, __file__, "--write", scratch, str(args.rows), str(args.bomb_tokens)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        print(f"wrote the folders in {time.perf_counter() - started:.0f} s; train.parquet bytes: {sizes}")
        results = {
            name: [measure(folder and base / folder) for _ in range(args.repeats)] for name, folder in CASES.items()
        }
    print(f"\n{'case':<24}{'peak RSS MiB: median':>22}{'range':>16}{'seconds':>10}  verify says")
    for name, runs in results.items():
        peaks = [r["peak_mib"] for r in runs]
        seconds = statistics.median(r["seconds"] for r in runs)
        problems = runs[0]["problems"]
        said = "-" if problems is None else "ok" if not problems else problems[-1].split(": ", 1)[-1][:70]
        print(
            f"{name:<24}{statistics.median(peaks):>22.0f}{min(peaks):>9.0f} - {max(peaks):<5.0f}{seconds:>10.2f}  "
            f"{said}"
        )


if __name__ == "__main__":
    main()

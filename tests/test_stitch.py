"""Parquet parts of whole row groups, joined by their bytes, are the file ``RowWriter`` writes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from fixed_sft.output import RowWriter, rows_per_group, write_part
from fixed_sft.pack import Row, Segment
from fixed_sft.stitch import Stitcher, footer


def _rows(count: int, width: int, seed: int) -> list[Row]:
    rng = np.random.default_rng(seed)
    rows = []
    for n in range(count):
        cut = int(rng.integers(1, width))
        segments = (Segment(2 * n, f"id-{n}", 5, 5 + cut), Segment(2 * n + 1, None, 0, width - cut))
        ids = rng.integers(0, 160_000, width).astype(np.int32)
        rows.append(Row(ids, (rng.random(width) < 0.6).astype(np.uint8), segments))
    return rows


def _stitched(tmp_path: Path, rows: list[Row], boundaries: bool, groups: int = 1) -> bytes:
    part_rows = rows_per_group(len(rows[0].ids)) * groups
    stitcher = Stitcher(tmp_path / "stitched.parquet")
    for first in range(0, len(rows), part_rows):
        part = tmp_path / f"part-{first}.parquet"
        write_part(part, rows[first : first + part_rows], first, boundaries)
        stitcher.append(part)
    stitcher.close()
    assert not list(tmp_path.glob("part-*"))  # (each removed once copied)
    data = (tmp_path / "stitched.parquet").read_bytes()
    assert stitcher.sha256 == hashlib.sha256(data).hexdigest()  # (hashed as the parts were appended)
    return data


@pytest.mark.parametrize(
    ("count", "width", "boundaries", "groups"),
    [
        (300, 64, False, 1),
        (300, 64, True, 1),
        (1, 8, False, 1),
        (128, 16, False, 1),
        (5, 70_000, True, 1),
        (700, 64, False, 3),  # (parts of 3 row groups of 128 rows; the last group holds 60)
        (250, 16, True, 2),  # (one part of 2 row groups)
    ],
)
def test_parts_join_into_the_writers_file(
    tmp_path: Path, count: int, width: int, boundaries: bool, groups: int
) -> None:
    rows = _rows(count, width, seed=count + width)
    writer = RowWriter(tmp_path / "written.parquet", boundaries)
    for row in rows:
        writer.write(row)
    writer.close()
    written = (tmp_path / "written.parquet").read_bytes()
    assert _stitched(tmp_path, rows, boundaries, groups) == written
    table = pq.read_table(tmp_path / "stitched.parquet")
    assert table.column("metadata").combine_chunks().field("row").to_pylist() == list(range(count))
    assert pq.ParquetFile(tmp_path / "stitched.parquet").num_row_groups == -(-count // rows_per_group(width))


def test_parts_join_the_same_where_the_kernel_cannot_copy_between_files(tmp_path: Path, monkeypatch) -> None:
    """Without ``copy_file_range`` between the files (another file system, say), the parts
    are copied through the process, into the same bytes."""
    import errno
    import os

    def refused(*args: object) -> int:
        raise OSError(errno.EXDEV, "cross-device link")

    rows = _rows(300, 64, seed=5)
    joined = _stitched(tmp_path, rows, False)
    monkeypatch.setattr(os, "copy_file_range", refused)
    (tmp_path / "stitched.parquet").unlink()
    assert _stitched(tmp_path, rows, False) == joined


def test_a_part_that_is_not_parquet_is_refused(tmp_path: Path) -> None:
    (tmp_path / "part.parquet").write_bytes(b"PAR1 not a footer PAR1")
    with pytest.raises(ValueError, match="not a Parquet file"):
        footer(tmp_path / "part.parquet")


def test_parts_join_where_the_kernel_cannot_copy(tmp_path: Path, monkeypatch) -> None:
    import errno
    import os

    def unsupported(*args):
        raise OSError(errno.EXDEV, "cross-device")

    rows = _rows(300, 64, seed=1)
    writer = RowWriter(tmp_path / "written.parquet")
    for row in rows:
        writer.write(row)
    writer.close()
    monkeypatch.setattr(os, "copy_file_range", unsupported)
    assert _stitched(tmp_path, rows, False) == (tmp_path / "written.parquet").read_bytes()


def test_no_row_group_is_written_after_one_that_failed(tmp_path, monkeypatch):
    """Row groups queue behind the writer's thread; once one fails, the groups queued
    after it are not written, and the error names the file."""
    import errno
    import threading

    import pyarrow.parquet as pq

    from fixed_sft import output
    from fixed_sft.output import WriteFailed

    release, calls = threading.Event(), []

    def failing(self, table, *args, **kwargs):
        calls.append(table.num_rows)
        release.wait(5)  # (the caller queues the next groups meanwhile)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", failing)
    width = 16
    group = rows_per_group(width)
    monkeypatch.setattr(output, "QUEUED_VALUES", 3 * group * width)  # (3 groups queued at most)
    writer = RowWriter(tmp_path / "o.parquet")
    rows = _rows(3 * group, width, seed=1)
    for row in rows:
        writer.write(row)  # (3 groups handed over, none written yet: no wait)
    release.set()
    with pytest.raises(WriteFailed, match=r"cannot write .*o\.parquet: No space left on device"):
        writer.close()
    writer.abort()
    assert calls == [group]


@pytest.mark.parametrize("way", ["written", "stitched"])
def test_every_byte_is_sent_to_disk_as_it_is_hashed(tmp_path: Path, monkeypatch, way: str) -> None:
    """The hash of a file as it grows also starts the writeback of the bytes it hashed, so
    that the closing fsync waits for little: every byte of the file, once, in order."""
    from fixed_sft import hashes

    started: list[tuple[int, int]] = []
    monkeypatch.setattr(hashes, "_SYNC_FILE_RANGE", lambda fd, offset, length, flags: started.append((offset, length)))
    rows = _rows(700, 64, seed=3)
    if way == "stitched":
        data = _stitched(tmp_path, rows, False, groups=2)
    else:
        writer = RowWriter(tmp_path / "written.parquet")
        for row in rows:
            writer.write(row)
        writer.close()
        data = (tmp_path / "written.parquet").read_bytes()
    assert len(started) > 2 and all(length > 0 for _, length in started)  # (0 would mean: to the end)
    assert [offset for offset, _ in started] == list(np.cumsum([0] + [length for _, length in started[:-1]]))
    assert sum(length for _, length in started) == len(data)


def test_parts_wait_for_few_copies_and_a_failed_copy_stops_the_next_append(tmp_path: Path, monkeypatch) -> None:
    """At most ``WAITING_PARTS`` parts wait on disk for their copy as parts are appended, and
    a copy that fails is raised by an append soon after, not only by ``close``."""
    import errno
    import time

    from fixed_sft import stitch

    real = stitch._copy_part
    failing: set[str] = set()

    def slow(part: Path, *args: object) -> None:
        time.sleep(0.02)
        if part.name in failing:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(part, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(stitch, "_copy_part", slow)
    rows = _rows(128 * 12, 16, seed=4)
    group = rows_per_group(16)
    stitcher = Stitcher(tmp_path / "stitched.parquet")
    for number, first in enumerate(range(0, len(rows), group)):
        part = tmp_path / f"part-{number}.parquet"
        write_part(part, rows[first : first + group], first, False)
        stitcher.append(part)
        assert len(list(tmp_path.glob("part-*"))) <= stitch.WAITING_PARTS
    stitcher.close()
    assert not list(tmp_path.glob("part-*"))

    failing.add("part-1.parquet")
    stitcher = Stitcher(tmp_path / "failed.parquet")
    with pytest.raises(OSError, match="No space left"):
        for number, first in enumerate(range(0, len(rows), group)):
            part = tmp_path / f"part-{number}.parquet"
            write_part(part, rows[first : first + group], first, False)
            stitcher.append(part)
    assert number <= stitch.WAITING_PARTS + 1  # (raised by an append, before the last)
    stitcher.abort()

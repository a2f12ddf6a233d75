"""Arrow arrays from buffers are pyarrow's own arrays, and a build never loads pandas."""

from __future__ import annotations

import doctest
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic import conversations, write_parquet

import fixed_sft.arrow
from fixed_sft import arrow

TYPES = [pa.int8(), pa.uint8(), pa.int32(), pa.int64(), pa.uint64(), pa.bool_()]


def test_the_rules_as_doctests() -> None:
    result = doctest.testmod(fixed_sft.arrow)
    assert result.attempted >= 6 and result.failed == 0


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.integers(0, 127), max_size=40),
    type_at=st.integers(0, len(TYPES) - 1),
    nulls=st.lists(st.booleans(), max_size=40),
    cut=st.integers(0, 40),
)
def test_numbers_are_pa_arrays(values: list[int], type_at: int, nulls: list[bool], cut: int) -> None:
    kind = TYPES[type_at]
    valid = np.array([not (i < len(nulls) and nulls[i]) for i in range(len(values))], bool)
    as_type = bool if kind == pa.bool_() else int
    expected = pa.array([as_type(v) if ok else None for v, ok in zip(values, valid)], kind)
    made = arrow.numbers(np.array(values, np.int64), kind, valid=valid)
    made.validate(full=True)
    assert made.equals(expected) and made.null_count == expected.null_count
    plain = arrow.numbers(values, kind)[cut:]  # (a slice: an offset into the buffer)
    assert (
        arrow.to_numpy(plain).tolist()
        == pa.array(map(as_type, values), kind)[cut:].to_numpy(zero_copy_only=False).tolist()
    )
    assert arrow.to_numpy(pa.chunked_array([plain, plain], kind)).tolist() == 2 * plain.to_pylist()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(max_size=8)), max_size=20))
def test_strings_are_pa_arrays(values: list[str | None]) -> None:
    made = arrow.strings(values)
    made.validate(full=True)
    assert made.equals(pa.array(values, pa.string()))


def test_what_the_buffers_cannot_hold_is_refused() -> None:
    with pytest.raises(ValueError, match="integer or boolean"):
        arrow.numbers([1.5], pa.float32())
    with pytest.raises(ValueError, match="no nulls"):
        arrow.to_numpy(pa.array([1, None]))
    assert arrow.to_numpy(pa.array([1.5], pa.float32())).dtype == np.float32  # (left to pyarrow)


def test_a_build_loads_no_pandas(kimi_dir, tmp_path) -> None:
    write_parquet(conversations(60, seed=5), tmp_path / "source", rows_per_file=6)  # (a fill task per file)
    script = (
        "import sys; from fixed_sft.cli import main; "
        "code = main(sys.argv[1:]); assert 'pandas' not in sys.modules, 'pandas loaded'; sys.exit(code)"
    )
    for workers in ("1", "2", "8"):
        args = ["build", "--source", str(tmp_path / "source"), "--tokenizer", str(kimi_dir), "--rows", "all"]
        args += ["--row-tokens", "256", "--workers", workers, "--no-card", "--out", str(tmp_path / f"out-{workers}")]
        if workers == "8":  # (a store to fill, the probes kept: its workers give sampled rows to checkers)
            shutil.copytree(Path(os.environ["FIXED_SFT_CACHE"]) / "probes", tmp_path / "store" / "probes")
            args += ["--cache-dir", str(tmp_path / "store")]
        # (-X importtime reaches the workers too: their imports are listed on stderr)
        command = [sys.executable, "-X", "importtime", "-c", script, *args]
        result = subprocess.run(command, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-2000:]
        imported = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "import time" in line]
        assert "fixed_sft.bands" in imported and "pandas" not in imported
        verify = [sys.executable, "-c", script, "verify", str(tmp_path / f"out-{workers}")]
        assert subprocess.run(verify, capture_output=True, text=True).returncode == 0


def test_a_later_build_into_a_new_folder_loads_no_compute_functions(kimi_dir, tmp_path) -> None:
    """pyarrow.compute (25-30 ms to import) is not on the path of a build from the token
    store: it reads an earlier build's manifest (with ``fixed_sft.verify``, which needs
    it) only where one is there to be replaced."""
    write_parquet(conversations(20, seed=5), tmp_path / "source", rows_per_file=10)
    script = (
        "import sys; from fixed_sft.cli import main; code = main(sys.argv[1:]); "
        "print(sorted(m for m in ('pyarrow.compute', 'fixed_sft.verify') if m in sys.modules)); sys.exit(code)"
    )
    args = ["build", "--source", str(tmp_path / "source"), "--tokenizer", str(kimi_dir), "--rows", "all"]
    args += ["--row-tokens", "256", "--workers", "1", "--no-card", "--quiet", "--cache-dir", str(tmp_path / "store")]
    loaded = []
    for seed, out in (("1", "first"), ("2", "later"), ("3", "later")):  # (the last replaces the one before)
        command = [sys.executable, "-c", script, *args, "--seed", seed, "--out", str(tmp_path / out)]
        result = subprocess.run(command, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-2000:]
        loaded.append(result.stdout.splitlines()[-1])
    assert loaded[1:] == ["[]", "['fixed_sft.verify', 'pyarrow.compute']"]

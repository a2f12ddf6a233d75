"""Built rows are readable without this project: by pyarrow, datasets and polars (miles: test_miles)."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import synthetic

from fixed_sft.build import BuildConfig, build


@pytest.fixture(scope="module")
def built(tmp_path_factory, kimi_dir):
    folder = tmp_path_factory.mktemp("formats")
    synthetic.write_parquet(synthetic.conversations(300, seed=4), folder / "src.parquet")
    config = BuildConfig(
        name="f",
        source=str(folder / "src.parquet"),
        tokenizer=str(kimi_dir),
        rows=10,
        row_tokens=512,
        seed=2,
        workers=1,
    )
    return folder / "out", build(config, folder / "out")


def test_rows_sha256_recomputed_with_pyarrow_and_hashlib(built):
    """data/README.md's definition, using nothing but pyarrow and hashlib."""
    out, manifest = built
    metadata = pq.read_table(out / "train.parquet").column("metadata")
    digests = []
    for ids, mask in zip(
        pc.struct_field(metadata, "input_ids").to_pylist(), pc.struct_field(metadata, "loss_mask").to_pylist()
    ):
        ids_bytes = b"".join(i.to_bytes(4, "little", signed=True) for i in ids)
        digests.append(hashlib.sha256(ids_bytes + bytes(mask)).digest())
    assert [d.hex() for d in digests] == manifest["row_sha256"]
    assert hashlib.sha256(b"".join(digests)).hexdigest() == manifest["rows_sha256"]


def test_readable_by_datasets(built):
    import datasets

    out, manifest = built
    ds = datasets.load_dataset("parquet", data_files=str(out / "train.parquet"), split="train")
    assert len(ds) == 10
    first = ds[0]
    assert first["messages"] == [{"role": "user", "content": ""}]
    assert len(first["metadata"]["input_ids"]) == len(first["metadata"]["loss_mask"]) == 512
    assert first["metadata"]["segments"][0]["start"] == 0


def test_readable_by_polars(built):
    import polars as pl

    out, manifest = built
    frame = pl.read_parquet(out / "train.parquet")
    ids = frame.select(pl.col("metadata").struct.field("input_ids")).to_series()
    mask = frame.select(pl.col("metadata").struct.field("loss_mask")).to_series()
    assert ids.list.len().to_list() == [512] * 10
    assert sum(mask.list.sum().to_list()) == manifest["stats"]["supervised_tokens"]


def test_ids_fit_int32(built):
    out, _ = built
    ids = pc.list_flatten(pc.struct_field(pq.read_table(out / "train.parquet").column("metadata"), "input_ids"))
    assert 0 <= pc.min(ids).as_py() and pc.max(ids).as_py() < 163_840
    assert np.asarray(ids).dtype == np.int32


def test_parquet_is_zstd_compressed(built):
    """data/README.md: the Parquet bytes depend on the writer (pyarrow version, zstd)."""
    out, _ = built
    meta = pq.ParquetFile(out / "train.parquet").metadata
    assert {
        meta.row_group(g).column(c).compression for g in range(meta.num_row_groups) for c in range(meta.num_columns)
    } == {"ZSTD"}


def test_parquet_writer_settings(built):
    """The settings the Parquet bytes depend on, beside the codec: no column statistics,
    ``ROWS_PER_GROUP`` rows a group, no dictionary, the ids' bytes split into planes."""
    from fixed_sft.output import ROWS_PER_GROUP

    out, manifest = built
    meta = pq.ParquetFile(out / "train.parquet").metadata
    columns = [meta.row_group(g).column(c) for g in range(meta.num_row_groups) for c in range(meta.num_columns)]
    assert not any(column.is_stats_set for column in columns)
    rows = manifest["stats"]["rows"]
    assert [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] == [
        min(ROWS_PER_GROUP, rows - start) for start in range(0, rows, ROWS_PER_GROUP)
    ]
    assert not any("RLE_DICTIONARY" in column.encodings for column in columns)
    assert [column.path_in_schema for column in columns if "BYTE_STREAM_SPLIT" in column.encodings] == [
        "metadata.input_ids.list.element"
    ] * meta.num_row_groups


def test_boundaries_are_readable_and_give_position_ids(tmp_path, kimi_dir):
    """A build with --emit-boundaries, read by datasets and polars: each row's cu_seqlens
    (int32, as flash-attn's varlen functions take them) are 0 and its segments' ends, and
    data/README.md's one line gives position_ids that restart at 0 at each segment."""
    import datasets
    import polars as pl

    synthetic.write_parquet(synthetic.conversations(300, seed=4), tmp_path / "src.parquet")
    config = BuildConfig(
        name="f",
        source=str(tmp_path / "src.parquet"),
        tokenizer=str(kimi_dir),
        rows=4,
        row_tokens=512,
        seed=2,
        workers=1,
        emit_boundaries=True,
    )
    build(config, tmp_path / "out")
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "out" / "train.parquet"), split="train")
    frame = pl.read_parquet(tmp_path / "out" / "train.parquet")
    column = frame.select(pl.col("metadata").struct.field("cu_seqlens")).to_series()
    assert column.dtype == pl.List(pl.Int32)
    for row, from_polars in zip(ds, column.to_list()):
        row = row["metadata"]
        assert row["cu_seqlens"] == from_polars
        ends = np.cumsum([0] + [s["end"] - s["start"] for s in row["segments"]]).tolist()
        assert row["cu_seqlens"] == ends and ends[-1] == 512
        cu = np.asarray(row["cu_seqlens"])
        position_ids = np.arange(cu[-1]) - np.repeat(cu[:-1], np.diff(cu))
        expected = [p for s in row["segments"] for p in range(s["end"] - s["start"])]
        assert position_ids.tolist() == expected and (position_ids[cu[:-1]] == 0).all()

"""Built rows are readable without this project: by pyarrow, datasets, polars, and miles."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from types import SimpleNamespace

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
    config = BuildConfig(name="f", source=str(folder / "src.parquet"), tokenizer=str(kimi_dir), rows=10,
                         row_tokens=512, seed=2, workers=1)
    return folder / "out", build(config, folder / "out")


def test_rows_sha256_recomputed_with_pyarrow_and_hashlib(built):
    """data/README.md's definition, using nothing but pyarrow and hashlib."""
    out, manifest = built
    messages = pq.read_table(out / "train.parquet").column("messages")
    digests = []
    for ids, mask in zip(pc.struct_field(messages, "input_ids").to_pylist(),
                         pc.struct_field(messages, "loss_mask").to_pylist()):
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
    assert len(first["messages"]["input_ids"]) == len(first["messages"]["loss_mask"]) == 512
    assert first["metadata"]["segments"][0]["start"] == 0


def test_readable_by_polars(built):
    import polars as pl

    out, manifest = built
    frame = pl.read_parquet(out / "train.parquet")
    ids = frame.select(pl.col("messages").struct.field("input_ids")).to_series()
    mask = frame.select(pl.col("messages").struct.field("loss_mask")).to_series()
    assert ids.list.len().to_list() == [512] * 10
    assert sum(mask.list.sum().to_list()) == manifest["stats"]["supervised_tokens"]


@dataclass
class Sample:
    """The fields of miles' Sample that the rollout reads or writes."""

    prompt: object = ""
    metadata: dict = field(default_factory=dict)
    tokens: list = field(default_factory=list)
    response_length: int = 0
    loss_mask: list | None = None
    reward: object = None


def test_miles_pretokenized_rollout(built):
    """Read rows as miles does, then run the shipped rollout function on them."""
    import pretokenized_sft_rollout

    out, _ = built
    samples = []
    for batch in pq.ParquetFile(out / "train.parquet").iter_batches():
        for row in batch.to_pylist():
            samples.append([Sample(prompt=row.get("messages"), metadata=row.get("metadata") or {})])

    class Buffer:
        def get_samples(self, n):
            return samples[:n]

    groups = pretokenized_sft_rollout.generate_rollout(SimpleNamespace(rollout_batch_size=10), 0, Buffer())
    assert len(groups) == 10
    for group in groups:
        (sample,) = group
        ids = sample.prompt["input_ids"]
        mask = sample.prompt["loss_mask"]
        assert sample.tokens == ids
        # miles reads a response's log-probs at [len - response_length - 1, len - 1): it needs a token before it
        assert 1 <= sample.response_length < len(ids)
        assert sample.loss_mask == mask[-sample.response_length :]
        assert not any(mask[1 : len(ids) - sample.response_length])  # every predictable supervised token is in it
        assert sample.reward == 0
        assert sample.metadata["segments"]


@pytest.mark.parametrize(
    ("mask", "response_length"), [([1, 1, 0, 1], 3), ([0, 0, 1, 0], 2), ([1, 0, 0, 0], 3), ([0, 0, 0, 1], 1)]
)
def test_rollout_response_needs_a_token_before_it(mask, response_length):
    """A row that starts inside an assistant turn: its response starts at token 1, since
    token 0 cannot be predicted."""
    import pretokenized_sft_rollout

    sample = Sample(prompt={"input_ids": [5, 6, 7, 8], "loss_mask": mask})
    pretokenized_sft_rollout.apply_row(sample)
    assert sample.response_length == response_length
    assert sample.loss_mask == mask[-response_length:]


def test_rollout_rejects_a_non_row():
    import pretokenized_sft_rollout

    with pytest.raises(ValueError, match="not a fixed-sft row .a list."):
        pretokenized_sft_rollout.apply_row(Sample(prompt=[{"role": "user", "content": "x"}]))
    with pytest.raises(ValueError, match="not a fixed-sft row .a str.: .*global dataset on"):
        pretokenized_sft_rollout.apply_row(Sample(prompt=""))  # what miles gives without its global dataset


def test_ids_fit_int32(built):
    out, _ = built
    ids = pc.list_flatten(pc.struct_field(pq.read_table(out / "train.parquet").column("messages"), "input_ids"))
    assert 0 <= pc.min(ids).as_py() and pc.max(ids).as_py() < 163_840
    assert np.asarray(ids).dtype == np.int32


@pytest.mark.parametrize("row", [{"input_ids": [5, 6, 7], "loss_mask": [0, 1]}, {"input_ids": [5, 6], "loss_mask": [0, 0]}])
def test_rollout_rejects_mismatched_or_unsupervised_rows(row):
    import pretokenized_sft_rollout

    with pytest.raises(ValueError, match="mismatched ids/mask or no supervised token"):
        pretokenized_sft_rollout.apply_row(Sample(prompt=row))


def test_rollout_rejects_a_dict_without_the_row_keys():
    import pretokenized_sft_rollout

    with pytest.raises(ValueError, match="not a fixed-sft row .a dict."):
        pretokenized_sft_rollout.apply_row(Sample(prompt={"input_ids": [5, 6]}))


def test_rollout_has_no_evaluation_mode():
    import pretokenized_sft_rollout

    class Buffer:
        def get_samples(self, n):
            return [[Sample(prompt={"input_ids": [5, 6], "loss_mask": [0, 1]})]]

    with pytest.raises(ValueError, match="no evaluation mode"):
        pretokenized_sft_rollout.generate_rollout(SimpleNamespace(rollout_batch_size=1), 0, Buffer(), evaluation=True)


def test_parquet_is_zstd_compressed(built):
    """data/README.md: the Parquet bytes depend on the writer (pyarrow version, zstd)."""
    out, _ = built
    meta = pq.ParquetFile(out / "train.parquet").metadata
    assert {meta.row_group(g).column(c).compression
            for g in range(meta.num_row_groups) for c in range(meta.num_columns)} == {"ZSTD"}


def test_parquet_writer_settings(built):
    """The settings the Parquet bytes depend on, beside the codec: no column statistics,
    ``ROWS_PER_GROUP`` rows a group, dictionary-encoded ids and nothing else."""
    from fixed_sft.output import ROWS_PER_GROUP

    out, manifest = built
    meta = pq.ParquetFile(out / "train.parquet").metadata
    columns = [meta.row_group(g).column(c) for g in range(meta.num_row_groups) for c in range(meta.num_columns)]
    assert not any(column.is_stats_set for column in columns)
    rows = manifest["stats"]["rows"]
    assert [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] == \
        [min(ROWS_PER_GROUP, rows - start) for start in range(0, rows, ROWS_PER_GROUP)]
    assert [column.path_in_schema for column in columns if "RLE_DICTIONARY" in column.encodings] == \
        ["messages.input_ids.list.element"] * meta.num_row_groups

"""Shared fixtures. The Kimi-K2.6 tokenizer files are read from ../shared (never copied)."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

import matplotlib.figure  # noqa: F401  (loaded: builds in the test processes draw their plots here, not in a
import pytest  # process of their own each, as fixed_sft.plots.Plotter does where matplotlib is not loaded)

ROOT = Path(__file__).resolve().parent.parent
KIMI_DIR = ROOT.parent / "shared" / "tokenizers" / "kimi-k2.6"
DEEPSEEK_DIR = ROOT.parent / "shared" / "tokenizers" / "deepseek-v4"
sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="module", autouse=True)
def _module_token_store(tmp_path_factory):
    """Builds made by a module's fixtures keep their token store in a folder of the module's
    (never the user's cache)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FIXED_SFT_CACHE", str(tmp_path_factory.mktemp("token-store")))
        yield


@pytest.fixture(autouse=True)
def token_store(tmp_path_factory, monkeypatch) -> Path:
    """Each test's builds start from an empty token store of their own, shared by that test's
    builds (and by the processes it starts); the folder."""
    folder = tmp_path_factory.mktemp("token-store")
    monkeypatch.setenv("FIXED_SFT_CACHE", str(folder))
    return folder


@pytest.fixture(scope="session")
def kimi_dir() -> Path:
    if not (KIMI_DIR / "tiktoken.model").is_file():
        missing = f"Kimi-K2.6 tokenizer files not found at {KIMI_DIR}: put the project's shared/ folder beside it"
        if os.environ.get("CI"):  # CI has ../shared: there a missing file is a failure
            pytest.fail(missing)
        pytest.skip(missing)
    return KIMI_DIR


@pytest.fixture(scope="session")
def deepseek_dir() -> Path:
    """A real Hugging Face fast tokenizer (tokenizer.json, tokenizer_config.json) without a chat template."""
    if not (DEEPSEEK_DIR / "tokenizer.json").is_file():
        missing = f"DeepSeek-V4 tokenizer files not found at {DEEPSEEK_DIR}: put the project's shared/ folder beside it"
        if os.environ.get("CI"):
            pytest.fail(missing)
        pytest.skip(missing)
    return DEEPSEEK_DIR


@pytest.fixture(scope="session")
def tokenizer(kimi_dir):
    from fixed_sft.tokenizer import KimiTokenizer

    return KimiTokenizer(kimi_dir)


@pytest.fixture(scope="session")
def encoder(tokenizer):
    from fixed_sft.chat import ChatEncoder

    return ChatEncoder(tokenizer)


@pytest.fixture(scope="session")
def reference(kimi_dir):
    from reference_kimi import ReferenceKimi

    return ReferenceKimi(kimi_dir)


def cache_link(snapshot: Path, name: str, blob: bytes, etag: str | None = None) -> Path:
    """Lay out ``snapshot/NAME`` as huggingface_hub caches a file stored with Git LFS: a
    link to ``../blobs/ETAG`` holding ``blob`` (``snapshot`` is ``REPO/snapshots/COMMIT``;
    ``etag`` defaults to the blob's sha256)."""
    target = snapshot.parent.parent / "blobs" / (etag or hashlib.sha256(blob).hexdigest())
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(blob)
    link = snapshot / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(target, link.parent))
    return link


def edit_footer(path: Path, edit: Callable[[list], None]) -> None:
    """Rewrite the Parquet file ``path`` with ``edit`` applied to its footer's fields (as
    ``fixed_sft.thrift`` reads them)."""
    from fixed_sft import thrift

    data = path.read_bytes()
    length = int.from_bytes(data[-8:-4], "little")
    footer = thrift.Reader(data[-8 - length : -8]).struct()
    edit(footer)
    written = thrift.write_struct(footer)
    path.write_bytes(data[: -8 - length] + written + len(written).to_bytes(4, "little") + b"PAR1")


def shorten_size_statistics(path: Path) -> None:
    """Rewrite the Parquet file ``path`` with size statistics of one level (a definition
    level histogram of one count) for its first column in row group 0, short of its
    schema's levels: pyarrow reads its values, but aborts the process where that column's
    metadata is asked for (``RowGroupMetaData.column``)."""
    from fixed_sft import thrift

    def edit(footer: list) -> None:
        column = thrift.get(thrift.get(thrift.get(footer, 4)[1][0], 1)[1][0], 3)
        column[:] = [f for f in column if f[0] != 16] + [(16, thrift.STRUCT, [(3, thrift.LIST, (thrift.I64, [0]))])]

    edit_footer(path, edit)

"""Shared fixtures. The Kimi-K2.6 tokenizer files are read from ../shared (never copied)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KIMI_DIR = ROOT.parent / "shared" / "tokenizers" / "kimi-k2.6"
sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def kimi_dir() -> Path:
    if not (KIMI_DIR / "tiktoken.model").is_file():
        pytest.fail(f"Kimi-K2.6 tokenizer files not found at {KIMI_DIR}; tests need ../shared beside the project")
    return KIMI_DIR


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

"""gigatoken, the fast BPE, gives tiktoken's ids on every corpus of the suite, and a difference stops its use."""

from __future__ import annotations

import itertools

import gigatoken
import numpy as np
import pytest
import synthetic
from reference_kimi import ReferenceKimi

from fixed_sft.chat import BPEMismatch, ChatEncoder, TemplateMismatch, agentic_probes
from fixed_sft.tokenizer import PARITY_TEXTS, KimiTokenizer, TokenizerError

# Each corpus the suite builds or encodes (tests/synthetic.py), by name.
CORPORA = {
    "conversations(1200, seed=5)": lambda: synthetic.conversations(1200, seed=5),
    "conversations(400, seed=11)": lambda: synthetic.conversations(400, seed=11),
    "conversations(200, seed=2)": lambda: synthetic.conversations(200, seed=2),
    "conversations(200, seed=2, adversarial)": lambda: synthetic.conversations(200, seed=2, adversarial=True),
    "conversations(300, seed=9, adversarial)": lambda: synthetic.conversations(300, seed=9, adversarial=True),
    "conversations(150, seed=7)": lambda: synthetic.conversations(150, seed=7),
    "conversations(100, seed=8)": lambda: synthetic.conversations(100, seed=8),
    "conversations(50, seed=1)": lambda: synthetic.conversations(50, seed=1),
    "hard_conversations(0)": lambda: synthetic.hard_conversations(0),
    "hard_conversations(1)": lambda: synthetic.hard_conversations(1),
}


def _strings(value: object) -> list[str]:
    """Every string in a row (contents, reasoning, names, tool calls and tools), keys included."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for key, item in value.items() for s in (*_strings(key), *_strings(item))]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


def _differing(tokenizer: KimiTokenizer, texts: list[str]) -> list[str]:
    return [
        text[:60]
        for text in texts
        if not np.array_equal(tokenizer.encode_to_numpy(text), tokenizer.reference.encode_to_numpy(text))
    ]


def test_the_default_bpe_is_gigatoken_with_tiktoken_as_its_reference(tokenizer):
    assert (tokenizer.bpe, tokenizer.reference.bpe) == ("gigatoken", "tiktoken")
    assert tokenizer._fast is not None and tokenizer.reference._fast is None
    assert tokenizer.reference.reference is tokenizer.reference


@pytest.mark.parametrize("name", CORPORA)
def test_gigatoken_gives_tiktokens_ids_on_every_text_of_a_corpus(tokenizer, name):
    texts = _strings(CORPORA[name]())
    assert len(texts) > 10
    assert _differing(tokenizer, texts) == []


def test_gigatoken_gives_tiktokens_ids_on_the_hard_strings(tokenizer, kimi_dir):
    texts = [*synthetic.hard_strings(0), *synthetic.hard_strings(1), *PARITY_TEXTS]
    assert _differing(tokenizer, texts) == []
    independent = ReferenceKimi(kimi_dir)  # (tests/reference_kimi.py: the model's rules over tiktoken, restated)
    assert all(tokenizer.encode(text) == independent.encode(text) for text in texts)


@pytest.mark.parametrize("name", ["conversations(200, seed=2, adversarial)", "hard_conversations(0)"])
def test_gigatokens_conversations_equal_the_template_encoded_by_tiktoken(encoder, name):
    """The build's template check, on every conversation: the fast path with gigatoken
    against the rendered template encoded with tiktoken."""
    for row in CORPORA[name]():
        ids, _ = encoder.encode_arrays(row["messages"], row.get("tools"))
        encoder.check(row["messages"], ids, row.get("tools"))


def test_gigatoken_equals_tiktoken_on_the_agentic_probes(encoder):
    for _, messages, tools in agentic_probes():
        text = encoder.render(messages, tools=tools)
        assert not encoder.tokenizer.differs_from_reference(text)


def _wrong_where(marker: str):
    """gigatoken's ``encode``, but with the first id of any text holding ``marker`` changed."""
    encode = gigatoken.Tokenizer.encode

    def wrong(self, text):
        ids = encode(self, text)
        if marker in text and len(ids):
            ids = ids.copy()
            ids[0] = 163600 if ids[0] != 163600 else 163601
        return ids

    return wrong


def test_a_tokenizer_whose_gigatoken_differs_on_a_parity_text_is_refused(kimi_dir, monkeypatch):
    monkeypatch.setattr(gigatoken.Tokenizer, "encode", _wrong_where("THEY'RE"))
    with pytest.raises(
        TokenizerError, match=r"gigatoken's ids differ from tiktoken's on .*; build with --bpe tiktoken$"
    ):
        KimiTokenizer(kimi_dir)
    assert KimiTokenizer(kimi_dir, "tiktoken").bpe == "tiktoken"  # the flag the error names loads them


def test_an_encoder_whose_gigatoken_differs_on_a_probe_is_refused_naming_the_bpe(kimi_dir, monkeypatch):
    monkeypatch.setattr(gigatoken.Tokenizer, "encode", _wrong_where("probe 1"))
    tokenizer = KimiTokenizer(kimi_dir)  # (no parity text holds the marker)
    with pytest.raises(BPEMismatch, match=r"^gigatoken's ids of the rendered chat template differ .*--bpe tiktoken$"):
        ChatEncoder(tokenizer)
    ChatEncoder(KimiTokenizer(kimi_dir, "tiktoken"))  # the same files with the reference BPE


def test_the_check_names_a_difference_of_the_bpe(encoder, monkeypatch):
    messages = [{"role": "user", "content": "what is a marker?"}, {"role": "assistant", "content": "this one"}]
    ids, _ = encoder.encode_arrays(messages)
    monkeypatch.setattr(gigatoken.Tokenizer, "encode", _wrong_where("marker"))
    wrong, _ = encoder.encode_arrays(messages)
    assert not np.array_equal(wrong, ids)
    with pytest.raises(BPEMismatch, match="--bpe tiktoken$"):
        encoder.check(messages, wrong)
    encoder.check(messages, ids)  # (the reference is tiktoken's: unchanged)
    with pytest.raises(TemplateMismatch) as caught:  # a difference the BPE does not make is the template's
        encoder.check([{"role": "user", "content": "other"}], ids)
    assert type(caught.value) is TemplateMismatch


def _growing_memory(monkeypatch, step: int) -> None:
    """Resident memory that grows by ``step`` bytes at each look, and a look every 1,000 characters."""
    from fixed_sft import tokenizer as module

    looks = itertools.count(1 << 40, step)
    monkeypatch.setattr(module, "_resident_bytes", lambda: next(looks))
    monkeypatch.setattr(module, "FAST_BPE_CHECK_CHARS", 1000)


def test_gigatoken_is_renewed_once_memory_has_grown_by_its_cache_bound(kimi_dir, monkeypatch):
    from fixed_sft.tokenizer import FAST_BPE_CACHE_BYTES

    text = "a text of a few words, long enough to count " * 40
    _growing_memory(monkeypatch, FAST_BPE_CACHE_BYTES // 4)
    tokenizer = KimiTokenizer(kimi_dir, "gigatoken")
    loaded = [tokenizer._fast]
    for _ in range(8):
        assert np.array_equal(tokenizer.encode_to_numpy(text), tokenizer.reference.encode_to_numpy(text))
        if tokenizer._fast is not loaded[-1]:
            loaded.append(tokenizer._fast)
    assert len(loaded) == 3  # each fourth look: memory has grown by the bound since the last load

    _growing_memory(monkeypatch, 0)  # memory that does not grow: the same gigatoken throughout
    steady = KimiTokenizer(kimi_dir, "gigatoken")
    first = steady._fast
    for _ in range(8):
        steady.encode_to_numpy(text)
    assert steady._fast is first


def test_a_tiktoken_model_changed_under_a_build_stops_gigatokens_renewal(kimi_dir, tmp_path, monkeypatch):
    import shutil

    from fixed_sft.tokenizer import FAST_BPE_CACHE_BYTES

    folder = tmp_path / "tok"
    shutil.copytree(kimi_dir, folder)
    _growing_memory(monkeypatch, FAST_BPE_CACHE_BYTES)
    tokenizer = KimiTokenizer(folder, "gigatoken")
    model = folder / "tiktoken.model"
    model.write_bytes(model.read_bytes() + b"\n")
    with pytest.raises(TokenizerError, match=r"tiktoken.model changed since it was loaded; run the build again$"):
        tokenizer.encode_to_numpy("x" * 2000)


def _kept_parity(folder):
    [path] = folder.glob("parity-*.json")
    return path


def test_parity_kept_in_a_folder_spares_tiktokens_ranks_until_asked_for(kimi_dir, tmp_path):
    """A gigatoken tokenizer checks its parity against the ids kept for the same files: it then
    makes no tiktoken ranks or encoding until the reference is asked for, and encodes the same."""
    first = KimiTokenizer(kimi_dir, "gigatoken", tmp_path)  # (tiktoken's ids, kept once checked)
    assert first._reference is not None and _kept_parity(tmp_path)
    kept = KimiTokenizer(kimi_dir, "gigatoken", tmp_path)
    assert kept._encoding is None and kept._reference is None
    text = PARITY_TEXTS[2] + " <|im_end|> " + PARITY_TEXTS[-1]
    assert np.array_equal(kept.encode_to_numpy(text), first.encode_to_numpy(text))
    assert kept.eos_id == first.eos_id and kept._specials == first._specials
    assert np.array_equal(kept.reference.encode_to_numpy(text), first.reference.encode_to_numpy(text))
    assert kept.reference.bpe == "tiktoken" and kept.vocab_size == first.vocab_size


def test_kept_parity_ids_are_checked_never_trusted(kimi_dir, tmp_path):
    """Kept ids whose sha256 does not match, that gigatoken does not give, or with a rank
    count the added tokens refute, are not used: tiktoken gives the ids again, which are
    kept anew; gigatoken is refused only where it differs from tiktoken itself."""
    from fixed_sft.hashes import read_checked_json, write_checked_json

    KimiTokenizer(kimi_dir, "gigatoken", tmp_path)
    path = _kept_parity(tmp_path)
    body = read_checked_json(path)
    path.write_text(path.read_text().replace(f'"ranks": {body["ranks"]}', f'"ranks": {body["ranks"] + 1}'))
    damaged = KimiTokenizer(kimi_dir, "gigatoken", tmp_path)
    assert damaged._reference is not None and read_checked_json(path) == body

    wrong = {**body, "ids": [ids if i != 1 else [*ids[:-1], ids[-1] + 1] for i, ids in enumerate(body["ids"])]}
    for kept in (wrong, {**body, "ranks": body["ranks"] - 1}):  # (other ids; specials one id early)
        write_checked_json(path, kept)
        tokenizer = KimiTokenizer(kimi_dir, "gigatoken", tmp_path)
        assert tokenizer._reference is not None and read_checked_json(path) == body
        assert tokenizer._specials == damaged._specials


def test_kept_parity_is_keyed_by_the_files_the_code_and_tiktokens_version(kimi_dir, tmp_path, monkeypatch):
    import shutil

    import tiktoken

    from fixed_sft import tokenizer as module

    folder = tmp_path / "tok"
    shutil.copytree(kimi_dir, folder)
    kept = tmp_path / "kept"
    KimiTokenizer(folder, "gigatoken", kept)
    config = folder / "tokenizer_config.json"
    config.write_text(config.read_text().replace('"[EOS]"', '"[END]"'))
    KimiTokenizer(folder, "gigatoken", kept)
    monkeypatch.setattr(tiktoken, "__version__", "0.0.0")
    KimiTokenizer(folder, "gigatoken", kept)
    monkeypatch.setattr(module, "_code_sha256", lambda: "other rules")  # (this module's code changed)
    KimiTokenizer(folder, "gigatoken", kept)
    assert len(list(kept.glob("parity-*.json"))) == 4
    assert module._parity_path(kept, "x", {}) != module._parity_path(kept, "y", {})


def test_a_checker_readies_the_reference_before_its_first_check(kimi_dir, tmp_path):
    """A checker's warm-up makes the tiktoken twin that its checks encode with, while the
    fill's first rows are read (a tokenizer whose parity is kept makes it only when asked)."""
    from types import SimpleNamespace

    from fixed_sft.fill import ready_to_check

    KimiTokenizer(kimi_dir, "gigatoken", tmp_path)
    kept = KimiTokenizer(kimi_dir, "gigatoken", tmp_path)
    assert kept._reference is None
    ready_to_check(SimpleNamespace(tokenizer=kept), None)  # type: ignore[arg-type]
    assert kept._reference is not None and kept._reference._encoding is not None

"""Text encoding equals the Kimi rules, checked against the independent reference."""

from __future__ import annotations

import random

import pytest
from reference_kimi import split_long_runs

from fixed_sft.tokenizer import MAX_RUN, WINDOW_CHARS, split_runs

GOLDEN_PROMPT = [163587, 2482, 163601, 19180, 163586, 163588, 69702, 163601, 163606]
GOLDEN_CHAT = [
    163594,
    14062,
    163601,
    39966,
    163586,
    163587,
    2482,
    163601,
    19180,
    220,
    163586,
    1459,
    163586,
    163588,
    69702,
    163601,
    163606,
    163607,
    18699,
    0,
    163586,
]
GOLDEN_MASK = [0] * 16 + [1] * 5
GOLDEN_MESSAGES = [
    {"role": "system", "content": "SYS"},
    {"role": "user", "content": "Hello <|im_end|> there"},
    {"role": "assistant", "content": "Hi!"},
]


def test_golden_generation_prompt(encoder, reference):
    text = encoder.render([{"role": "user", "content": "Hello"}], add_generation_prompt=True)
    assert encoder.tokenizer.encode(text) == GOLDEN_PROMPT
    assert reference.chat_ids([{"role": "user", "content": "Hello"}], add_generation_prompt=True) == GOLDEN_PROMPT


def test_golden_chat_and_mask(encoder, reference):
    ids, mask = encoder.encode(GOLDEN_MESSAGES)
    assert ids == GOLDEN_CHAT
    assert mask == GOLDEN_MASK
    assert reference.chat_ids(GOLDEN_MESSAGES) == GOLDEN_CHAT
    assert reference.chat_mask(GOLDEN_MESSAGES) == GOLDEN_MASK


def test_special_ids(tokenizer):
    assert tokenizer.vocab_size == 163_840
    assert (tokenizer.added["[BOS]"], tokenizer.eos_id, tokenizer.added["<|im_end|>"]) == (163584, 163585, 163586)
    assert len(tokenizer.added) == 23
    assert tokenizer.encode("<|reserved_token_163600|>") == [163600]
    assert tokenizer.encode("[EOS]<think>") == [163585, 163606]


def _runs_text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 6)):
        kind = rng.choice([" ", "\t", "\n", "\u3000", "a", "字", "😀", "ab cd "])
        parts.append(kind * rng.choice([1, 7, MAX_RUN - 1, MAX_RUN, MAX_RUN + 1, 2 * MAX_RUN + 3, 60_000]))
    return "".join(parts)


@pytest.mark.parametrize("seed", range(12))
def test_split_runs_matches_per_character_rule(seed):
    text = _runs_text(random.Random(seed))
    windows = [text[w : w + WINDOW_CHARS] for w in range(0, len(text), WINDOW_CHARS)]
    assert [part for window in windows for part in split_runs(window)] == split_long_runs(text)


def test_whitespace_is_str_isspace():
    from fixed_sft.tokenizer import _whitespace_codepoints

    spaces = set(_whitespace_codepoints().tolist())
    assert spaces == {c for c in range(0x110000) if chr(c).isspace()}


def test_hard_strings_match_reference(tokenizer, reference):
    from synthetic import hard_strings

    for text in hard_strings(0):
        assert tokenizer.encode(text) == reference.encode(text), repr(text[:80])


def test_over_400k_chars_windows(tokenizer, reference):
    text = ("word " * 90_000) + ("x" * 30_000) + ("日本語" * 10_000)
    assert len(text) > 400_000
    assert tokenizer.encode(text) == reference.encode(text)


def test_reserved_token_cut_by_a_window_is_text(tokenizer, reference):
    token = "<|reserved_token_163700|>"
    text = "a" * (MAX_RUN - 5) + token
    ids = tokenizer.encode(text)
    assert ids == reference.encode(text)
    assert 163700 not in ids


def test_reserved_token_in_a_long_text_is_its_id(tokenizer, reference):
    """A text past ``MAX_RUN`` takes the cut path, where special-token text still becomes its id."""
    text = "word " * 6000 + "<|reserved_token_163700|> end"
    assert len(text) > MAX_RUN
    ids = tokenizer.encode(text)
    assert ids == reference.encode(text)
    assert 163700 in ids


def test_overlapping_special_names_are_found():
    from fixed_sft.tokenizer import _overlap

    assert _overlap(["[EOS]", "<|im_end|>", "<think>", "</think>"]) is None
    assert _overlap(["[EOS]", "x[EOS]y"]) == ("[EOS]", "x[EOS]y")
    assert _overlap(["<a|", "<b|"]) is None
    assert _overlap(["<a|", "|b>"]) == ("<a|", "|b>")
    assert _overlap(["<a|", "a|b>"]) == ("<a|", "a|b>")  # "<a|b>": both names match, overlapping


@pytest.mark.parametrize("edit", [{"163606": "[EOS]x"}, {"163606": "S]<"}])
def test_tokenizer_with_overlapping_names_is_refused(kimi_dir, tmp_path, edit):
    import json

    from fixed_sft.tokenizer import KimiTokenizer, TokenizerError

    for name in ("tiktoken.model", "chat_template.jinja"):
        (tmp_path / name).symlink_to(kimi_dir / name)
    config = json.loads((kimi_dir / "tokenizer_config.json").read_text())
    for token_id, content in edit.items():
        config["added_tokens_decoder"][token_id]["content"] = content
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(TokenizerError, match="overlap"):
        KimiTokenizer(tmp_path)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "plain",
        "a<b[c]",
        "x<|reserved_token_163700|>[EOS]y",
        "[EOS" + "]" * 3,
        "<|im_end|>" * 3,
        "< |im_end|>",
        "a" * (MAX_RUN - 7) + "<think>",
        "a" * MAX_RUN + "<think>",
        "a\ud800b",
        "\ud83d\ude00",
        "\udfff[EOS]\ud800",
    ],
)
def test_numpy_and_list_encodings_agree(tokenizer, reference, text):
    array = tokenizer.encode_to_numpy(text)
    assert array.dtype.name == "uint32" and not array.flags.writeable
    assert array.tolist() == tokenizer.encode(text) == reference.encode(text)


def test_the_format_spec_states_the_split_pattern_in_use():
    from pathlib import Path

    from fixed_sft.tokenizer import PATTERN

    spec = (Path(__file__).resolve().parent.parent / "data" / "README.md").read_text(encoding="utf-8")
    block = spec.split("The split pattern is the alternation, in this order, of:")[1].split("```")[1]
    assert "|".join(line[3:] for line in block.split("\n") if line.strip()) == PATTERN


def test_a_changed_tiktoken_model_at_the_same_path_is_read_again(kimi_dir, tmp_path):
    """tiktoken caches a file by its path; a file changed in place must not be served stale."""
    import shutil

    from fixed_sft.tokenizer import KimiTokenizer, TokenizerError

    folder = tmp_path / "tok"
    shutil.copytree(kimi_dir, folder)
    model, good = folder / "tiktoken.model", (folder / "tiktoken.model").read_bytes()
    assert KimiTokenizer(folder).encode("hello there") == KimiTokenizer(kimi_dir).encode("hello there")
    model.write_bytes(b"garbage line\n")
    with pytest.raises(TokenizerError, match="not a tiktoken BPE file"):
        KimiTokenizer(folder)
    model.write_bytes(good)
    assert KimiTokenizer(folder).encode("hello there") == KimiTokenizer(kimi_dir).encode("hello there")


def test_a_folder_is_loaded_once_per_process_until_its_files_change(kimi_dir, tmp_path):
    """``load_kimi`` shares one tokenizer per folder and files, and reads a file changed at
    the same path again: never a stale tokenizer."""
    import json
    import shutil

    from fixed_sft.tokenizer import TokenizerError, load_kimi

    folder = tmp_path / "tok"
    shutil.copytree(kimi_dir, folder)
    first = load_kimi(folder, "gigatoken")
    assert load_kimi(folder, "gigatoken") is first
    assert load_kimi(folder, "tiktoken") is first.reference
    assert load_kimi(kimi_dir, "gigatoken") is not first  # (another folder)
    model, good = folder / "tiktoken.model", (folder / "tiktoken.model").read_bytes()
    model.write_bytes(b"garbage line\n")
    with pytest.raises(TokenizerError, match="not a tiktoken BPE file"):
        load_kimi(folder, "gigatoken")
    model.write_bytes(good)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["eos_token"] = "<|im_end|>"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    changed = load_kimi(folder, "gigatoken")
    assert changed is not first and changed.eos_id == changed.added["<|im_end|>"] != first.eos_id
    (folder / "chat_template.jinja").write_text("{{ messages }}")
    assert load_kimi(folder, "tiktoken").chat_template == "{{ messages }}"
    assert load_kimi(folder, "gigatoken").reference is load_kimi(folder, "tiktoken")  # (its ranks shared)
    assert load_kimi(folder, "gigatoken").encode("hello there") == first.encode("hello there")


def _edited_config(kimi_dir, folder, edit):
    import json

    folder.mkdir()
    for name in ("tiktoken.model", "chat_template.jinja"):
        (folder / name).symlink_to(kimi_dir / name)
    config = json.loads((kimi_dir / "tokenizer_config.json").read_text())
    edit(config)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("token_id", [163583, 163840, 170000])
def test_an_added_token_outside_the_special_ids_is_refused(kimi_dir, tmp_path, token_id):
    """Added tokens must have ids 163584..163839: one outside is not a tiktoken special
    token, so the one-call path and the step-by-step path would encode it differently."""
    from fixed_sft.tokenizer import KimiTokenizer, TokenizerError

    entry = {
        "content": "<|extra|>",
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "single_word": False,
        "special": True,
    }
    folder = _edited_config(
        kimi_dir, tmp_path / "tok", lambda config: config["added_tokens_decoder"].update({str(token_id): entry})
    )
    with pytest.raises(TokenizerError, match=r"an added token's id is outside 163584\.\.163839"):
        KimiTokenizer(folder)


def test_special_tokens_written_as_added_token_objects_reach_the_template_as_text(kimi_dir, tmp_path):
    """``eos_token`` written as transformers' added-token object is passed to the
    template as its ``content``, as ``apply_chat_template`` passes it."""
    from fixed_sft.tokenizer import KimiTokenizer

    def edit(config):
        config["eos_token"] = {"content": config["eos_token"], "lstrip": False, "rstrip": False, "special": True}

    tokenizer = KimiTokenizer(_edited_config(kimi_dir, tmp_path / "tok", edit))
    assert tokenizer.special_tokens["eos_token"] == "[EOS]"
    assert tokenizer.eos_id == 163585


def test_a_long_text_is_encoded_in_pieces_that_join_to_its_ids(tokenizer, reference):
    """A text past a window, with added tokens between its runs, comes as pieces of at most
    a window each (one per added token) whose concatenation is its ids, as arrays."""
    import numpy as np

    from fixed_sft.tokenizer import KimiTokenizer

    text = ("word " * 30_000 + "<|im_end|>" + "x" * (MAX_RUN + 3) + "[EOS]" + " tail <|reserved_token_163700|>") * 3
    assert len(text) > WINDOW_CHARS
    calls = []
    original = KimiTokenizer.encode
    try:
        KimiTokenizer.encode = lambda self, t: calls.append(t) or original(self, t)
        pieces = list(tokenizer.encode_pieces(text))
    finally:
        KimiTokenizer.encode = original
    assert not calls and all(isinstance(p, np.ndarray) and p.dtype == np.uint32 for p in pieces)
    assert len(pieces) > 6 and max(map(len, pieces)) <= WINDOW_CHARS
    assert np.concatenate(pieces).tolist() == tokenizer.encode(text) == reference.encode(text)

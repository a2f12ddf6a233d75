"""The fast path equals the rendered template and the independent reference."""

from __future__ import annotations

import pytest

import synthetic
from fixed_sft.chat import ChatEncoder, TemplateMismatch

SPECIALS = ["<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "[EOS]", "[BOS]", "<think>",
            "</think>", "<|reserved_token_163700|>", "<|im_", "<|tool_calls_section_begin|>", "[PAD]"]


def _edge_conversations() -> list[list[dict]]:
    cases = [
        [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}],
        [{"role": "assistant", "content": "first"}],
        [{"role": "system", "content": "s"}],
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "q2"}],
        [{"role": "system", "content": " \n "}, {"role": "user", "content": "\r\n\t"}, {"role": "assistant", "content": "  "}],
    ]
    for special in SPECIALS:
        cases.append([{"role": "user", "content": f"a{special}b"}, {"role": "assistant", "content": f"{special} x {special}"}])
    return cases


def test_edge_cases_match_reference(encoder, reference):
    for messages in _edge_conversations():
        ids, mask = encoder.encode(messages)
        assert ids == reference.chat_ids(messages), messages
        assert mask == reference.chat_mask(messages), messages


def test_generated_corpus_matches_reference(encoder, reference):
    for row in synthetic.conversations(150, seed=7):
        ids, mask = encoder.encode(row["messages"])
        assert ids == reference.chat_ids(row["messages"]), row["id"]
        assert mask == reference.chat_mask(row["messages"]), row["id"]


def test_hard_conversations_match_template(encoder, reference):
    for row in synthetic.hard_conversations(0):
        ids, mask = encoder.encode(row["messages"])
        assert ids == reference.chat_ids(row["messages"]), row["id"]
        assert mask == reference.chat_mask(row["messages"]), row["id"]


def test_fast_path_equals_own_render_path(encoder):
    for row in synthetic.conversations(400, seed=11):
        ids, _ = encoder.encode(row["messages"])
        encoder.check(row["messages"], ids)


def test_mask_marks_assistant_bodies_only(encoder):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    ids, mask = encoder.encode(messages)
    supervised = [t for t, m in zip(ids, mask) if m]
    assert supervised == [163606, 163607, *encoder.tokenizer.encode("yo"), 163586]


def test_check_catches_a_difference(encoder):
    messages = [{"role": "user", "content": "hi"}]
    ids, _ = encoder.encode(messages)
    with pytest.raises(TemplateMismatch):
        encoder.check(messages, ids[:-1])


def test_unknown_mask_type_is_refused(tokenizer):
    with pytest.raises(ValueError, match="unknown loss mask type"):
        ChatEncoder(tokenizer, "llama3")

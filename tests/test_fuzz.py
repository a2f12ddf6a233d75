"""Property tests (hypothesis, derandomized): the fast chat path equals the independent
reference on arbitrary conversations, the mask supervises exactly the assistant bodies,
and packing real encoded conversations keeps the stream. Strategies and checks live in
tests/strategies.py (shared with benchmarks/fuzz.py, which runs 10,000+ examples)."""

from __future__ import annotations

import strategies as S
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

COMMON = dict(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)


@settings(derandomize=True, max_examples=150, **COMMON)
@given(conversation=S.messages())
def test_chat_matches_reference(encoder, reference, conversation):
    S.check_conversation(encoder, reference, conversation)


@settings(derandomize=True, max_examples=40, **COMMON)
@given(
    conversation=st.lists(
        st.fixed_dictionaries({"role": st.sampled_from(S.ROLES), "content": st.sampled_from(S.SPECIAL_STRINGS)}),
        min_size=1,
        max_size=30,
    )
)
def test_many_turns_of_special_strings(encoder, reference, conversation):
    S.check_conversation(encoder, reference, conversation)


@settings(derandomize=True, max_examples=30, **COMMON)
@given(
    conversation=st.lists(
        st.fixed_dictionaries({"role": st.sampled_from(S.ROLES), "content": st.sampled_from(S.LONG_STRINGS)}),
        min_size=1,
        max_size=2,
    )
)
def test_long_runs(encoder, reference, conversation):
    S.check_conversation(encoder, reference, conversation)


@settings(derandomize=True, max_examples=100, **COMMON)
@given(text=st.lists(S.piece, max_size=12).map("".join))
def test_text_encoding_matches_reference(tokenizer, reference, text):
    assert tokenizer.encode(text) == reference.encode(text)


@settings(derandomize=True, max_examples=100, **COMMON)
@given(case=S.packing_cases())
def test_packing_keeps_the_stream(encoder, case):
    conversations, row_tokens = case
    S.check_packing(encoder, conversations, row_tokens)


@settings(derandomize=True, max_examples=60, **COMMON)
@given(example=S.examples())
def test_combined_example(encoder, reference, example):
    """The benchmark's unit of work (benchmarks/fuzz.py)."""
    S.check_example(encoder, reference, example)

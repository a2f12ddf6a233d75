"""Hypothesis strategies and property checks shared by tests/test_fuzz.py and
benchmarks/fuzz.py (which puts tests/ on sys.path).

Conversations: 1..``MAX_TURNS`` messages of roles system/user/assistant in any
order; each content is a concatenation of pieces drawn from arbitrary unicode
(no surrogates; astral characters and combining marks included), special-token
strings and fragments of them, odd whitespace, and rarely one of a few pre-built
long strings (runs longer than the tokenizer's 25,000-character run limit, and
runs that end exactly at it).

Properties (``check_conversation``, ``check_packing``):

* the fast path (``ChatEncoder.encode``) gives the reference's ids and mask
  (``ReferenceKimi.chat_ids`` / ``chat_mask``);
* the supervised tokens are exactly, in order, each assistant message's
  ``<think></think>`` + encode(content) + ``<|im_end|>``;
* ``Packer`` cuts the ``[EOS]``-joined stream of units into rows of exactly
  ``row_tokens``, re-joined rows equal the stream (ids and mask), the remainder
  is the row still being filled, and each row's segments rebuild it.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

MAX_RUN = 25_000
MAX_TURNS = 12

SPECIAL_STRINGS = (
    "<|im_end|>",
    "[EOS]",
    "[BOS]",
    "[PAD]",
    "[UNK]",
    "[EOT]",
    "<think>",
    "</think>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
    "<|tool_calls_section_begin|>",
    "<|media_pad|>",
    "<|reserved_token_163700|>",
    "<|reserved_token_163589|>",
    "<|reserved_token_163839|>",
    "<|reserved_token_99|>",  # not a special: plain text
    "<|im_",
    "im_end|>",
    "<|",
    "|>",
    "[EO",
    "S]",
    "<think",
    "</thin",
    "<|reserved_token_",
    "<|<|im_end|>|>",
    "<<think>>",
    "{{ bos_token }}",
    "{% if %}",
)

ODD_WHITESPACE = (
    " ",
    "  ",
    "\n",
    "\r\n",
    "\r",
    "\t",
    "\v",
    "\f",
    "\x1c",
    "\x1d",
    "\x1e",
    "\x1f",
    "\x85",
    "\u00a0",
    "\u1680",
    "\u2000",
    "\u2009",
    "\u200b",
    "\u200d",
    "\u2028",
    "\u2029",
    "\u202f",
    "\u205f",
    "\u3000",
    "\ufeff",
    " \n",
    "\n\n\n",
    " \t \t",
)

ASTRAL_AND_MARKS = (
    "\U0001f600",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467",
    "\U0001f3f4\U000e0067\U000e0062\U000e007f",
    "\U00020000",
    "\U0001d518",
    "\U00010348",
    "\U0010fffd",
    "\U000f0000",
    "e\u0301",
    "\u0301",
    "\u0301\u0302\u0303\u0304",
    "a" + "\u0300" * 40,
    "\u1100\u1161\u11a8",
    "\u0e01\u0e34",
    "\u0915\u094d\u0937",
    "\u202e",
    "\x00",
    "\ufffd",
    "\uffff",
)


def _long_strings() -> tuple[str, ...]:
    n = MAX_RUN + 1
    return (
        " " * n,
        "x" * n,
        "\n" * n,
        "\u3000" * n,
        "\u5b57" * n,  # one CJK char
        "\U0001f600" * n,  # astral
        "e\u0301" * (n // 2 + 1),  # combining marks: one non-space run
        "x" * MAX_RUN,  # exactly at the limit
        " " * MAX_RUN + "y",
        "ab" * (MAX_RUN // 2) + " cd",
        "a" * (MAX_RUN - 5) + "<|reserved_token_163700|>",  # the run cut falls inside it
        "a" * (MAX_RUN - 3) + "<|im_end|>" + "b" * n,  # added token between two long runs
        " " * (2 * MAX_RUN + 7),
        "x" * (3 * MAX_RUN + 1) + " " + "z" * 17,
        ("word " * 5_001) + "q" * n,
    )


LONG_STRINGS = _long_strings()

ROLES = ("system", "user", "assistant")

unicode_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)

piece = st.one_of(
    unicode_text,
    st.sampled_from(SPECIAL_STRINGS),
    st.sampled_from(ODD_WHITESPACE),
    st.sampled_from(ASTRAL_AND_MARKS),
    st.lists(st.sampled_from(ODD_WHITESPACE), max_size=30).map("".join),
    st.text(st.sampled_from("ab <|>[]\n"), max_size=30),
)

short_content = st.one_of(st.just(""), st.lists(piece, max_size=8).map("".join))


@st.composite
def messages(draw, max_turns: int = MAX_TURNS, long_one_in: int = 6) -> list[dict]:
    """A conversation: 1..max_turns messages; about one conversation in ``long_one_in``
    (0: none) has one long string spliced into one of its contents."""
    roles = draw(st.lists(st.sampled_from(ROLES), min_size=1, max_size=max_turns))
    out = [{"role": role, "content": draw(short_content)} for role in roles]
    if long_one_in and draw(st.integers(1, long_one_in)) == long_one_in:
        message = out[draw(st.integers(0, len(out) - 1))]
        text = message["content"]
        at = draw(st.integers(0, len(text)))
        message["content"] = text[:at] + draw(st.sampled_from(LONG_STRINGS)) + text[at:]
    return out


TOOL_SPECS = (
    [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather.\nOf a city.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "unit": {"type": "string", "enum": ["c", "f"], "default": "c"},
                        "city": {"type": "string", "description": "<|im_end|> a name"},
                        "days": {"type": "integer", "minimum": 1},
                    },
                    "required": ["city"],
                },
            },
        },
        {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}},
    ],
    [{"type": "retrieval", "index": "docs", "ü": [3, None, {"b": 1, "a": 2}]}],  # no function: declared as JSON
)
names = st.sampled_from(["", "bob", " x ", "<|im_end|>", "функция"])


def _content(draw, absent: bool = False):
    """A content: a string, text parts, or (``absent``) none at all."""
    kind = draw(st.sampled_from(["text", "parts", "none"] if absent else ["text", "parts"]))
    if kind == "none":
        return None
    if kind == "parts":
        return [{"type": "text", "text": draw(short_content)} for _ in range(draw(st.integers(0, 3)))]
    return draw(short_content)


def _message(role: str, content, **keys) -> dict:
    message = {"role": role, **({} if content is None else {"content": content})}
    return {**message, **{key: value for key, value in keys.items() if value is not None}}


@st.composite
def agentic_conversations(draw, max_turns: int = 4) -> tuple[list[dict], list | None]:
    """``(messages, tools)``: an optional system message, then turns of a user message and
    assistant steps, each with reasoning or not (under either key), a name or not, and
    0..2 tool calls (string or object arguments) followed by their results; cut at any
    message, so that trajectories end on a tool call or a result too. Tools: none, a
    list of functions, or a list that is declared as JSON."""
    out: list[dict] = []
    if draw(st.booleans()):
        out.append(_message("system", _content(draw), name=draw(st.one_of(st.none(), names))))
    calls = 0
    for _ in range(draw(st.integers(1, max_turns))):
        out.append(_message("user", _content(draw), name=draw(st.one_of(st.none(), names))))
        for _ in range(draw(st.integers(1, 3))):
            reasoning = draw(st.one_of(st.none(), st.lists(piece, min_size=1, max_size=4).map("".join)))
            key = draw(st.sampled_from(["reasoning_content", "reasoning"]))
            tool_calls = []
            for _ in range(draw(st.sampled_from([1, 0, 2]))):
                arguments = draw(
                    st.one_of(short_content, st.fixed_dictionaries({"q": short_content, "n": st.integers(-5, 10**6)}))
                )
                name = draw(st.sampled_from(["get_weather", "now"]))
                tool_calls.append(
                    {
                        "id": f"functions.{name}:{calls}{draw(st.sampled_from(['', ' ', '<|tool_call_end|>']))}",
                        "type": "function",
                        "function": {"name": name, "arguments": arguments},
                    }
                )
                calls += 1
            out.append(
                _message(
                    "assistant",
                    _content(draw, absent=bool(tool_calls)),
                    name=draw(st.one_of(st.none(), names)),
                    tool_calls=tool_calls or None,
                    **{key: reasoning},
                )
            )
            for call in tool_calls:
                out.append(_message("tool", _content(draw), tool_call_id=call["id"]))
            if not tool_calls:
                break
    calling = [k for k, message in enumerate(out) if message.get("tool_calls")]
    cut = draw(st.sampled_from(["none", "anywhere", "after a call"]))
    if cut == "anywhere":
        out = out[: draw(st.integers(1, len(out)))]
    elif cut == "after a call" and calling:
        out = out[: draw(st.sampled_from(calling)) + 1]
    tools = draw(st.one_of(st.none(), st.sampled_from(TOOL_SPECS)))
    return out, tools


@st.composite
def packing_cases(draw, max_conversations: int = 8) -> tuple[list[list[dict]], int]:
    """``(conversations, row_tokens)`` for the packing property."""
    conversations = draw(st.lists(messages(max_turns=6, long_one_in=12), min_size=0, max_size=max_conversations))
    row_tokens = draw(st.one_of(st.integers(2, 40), st.integers(41, 5000), st.sampled_from([2, 3, 1024, 8192])))
    return conversations, row_tokens


@st.composite
def examples(draw) -> tuple[list[dict], list[list[dict]], int]:
    """One fuzz example: a conversation checked against the reference, and it plus
    up to 4 more conversations packed into rows of ``row_tokens``."""
    conversation = draw(messages())
    others, row_tokens = draw(packing_cases(max_conversations=4))
    position = draw(st.integers(0, len(others)))
    return conversation, others[:position] + [conversation] + others[position:], row_tokens


# ---------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------


def check_conversation(encoder, reference, conversation: list[dict]) -> None:
    """Fast path == reference (ids and mask); supervised tokens == assistant bodies."""
    ids, mask = encoder.encode(conversation)
    assert len(ids) == len(mask)
    assert set(mask) <= {0, 1}
    expected_ids = reference.chat_ids(conversation)
    assert ids == expected_ids, _first_difference(ids, expected_ids)
    expected_mask = reference.chat_mask(conversation)
    assert mask == expected_mask, _first_difference(mask, expected_mask)

    tok = encoder.tokenizer
    think, end_think, im_end = tok.added["<think>"], tok.added["</think>"], tok.added["<|im_end|>"]
    bodies = [
        t
        for message in conversation
        if message["role"] == "assistant"
        for t in [think, end_think, *tok.encode(message["content"]), im_end]
    ]
    supervised = [t for t, m in zip(ids, mask) if m]
    assert supervised == bodies, _first_difference(supervised, bodies)

    arrays_ids, arrays_mask = encoder.encode_arrays(conversation)
    assert arrays_ids.dtype == np.int32 and arrays_mask.dtype == np.uint8
    assert arrays_ids.tolist() == ids and arrays_mask.tolist() == mask


def check_packing(encoder, conversations: list[list[dict]], row_tokens: int) -> None:
    """Rows of exactly ``row_tokens`` that re-join to the ``[EOS]``-joined stream."""
    from fixed_sft.pack import Packer

    eos = encoder.tokenizer.eos_id
    packer = Packer(row_tokens, eos)
    units: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    rows = []
    for index, conversation in enumerate(conversations):
        ids, mask = encoder.encode_arrays(conversation)
        units[index] = (np.append(ids, eos).astype(np.int32), np.append(mask, 0).astype(np.uint8))
        rows += list(packer.add(index, f"c{index}", ids, mask))
    total = sum(len(u[0]) for u in units.values())
    assert len(rows) == total // row_tokens
    assert packer.filled == total % row_tokens
    for row in rows:
        assert row.ids.shape == row.mask.shape == (row_tokens,)
        assert row.ids.dtype == np.int32 and row.mask.dtype == np.uint8
        rebuilt = np.concatenate([units[s.index][0][s.start : s.end] for s in row.segments])
        assert np.array_equal(rebuilt, row.ids)
        assert all(s.id == f"c{s.index}" and 0 <= s.start < s.end for s in row.segments)
    if not units:
        assert rows == []
        return
    stream = np.concatenate([u[0] for u in units.values()])
    stream_mask = np.concatenate([u[1] for u in units.values()])
    if rows:
        joined = np.concatenate([r.ids for r in rows])
        joined_mask = np.concatenate([r.mask for r in rows])
        assert np.array_equal(joined, stream[: len(joined)])
        assert np.array_equal(joined_mask, stream_mask[: len(joined)])
        assert int(joined_mask[1:].sum()) >= sum(r.trainable for r in rows) >= int(joined_mask.sum()) - len(rows)


def check_example(encoder, reference, example) -> None:
    conversation, packed, row_tokens = example
    check_conversation(encoder, reference, conversation)
    check_packing(encoder, packed, row_tokens)


def _first_difference(got: list, expected: list) -> str:
    n = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    return (
        f"lengths {len(got)} vs {len(expected)}; first difference at {n}: "
        f"got {got[max(0, n - 3) : n + 5]}, expected {expected[max(0, n - 3) : n + 5]}"
    )


def check_agentic(encoder, reference, conversation: list[dict], tools: list | None) -> None:
    """Fast path == reference (ids, and the mask by generation spans); the encoder's own
    template check passes; the conversation schema keeps the conversation as it is."""
    from fixed_sft.conversation import conversation as checked

    ids, mask = encoder.encode(conversation, tools)
    expected_ids = reference.chat_ids(conversation, tools=tools)
    assert ids == expected_ids, _first_difference(ids, expected_ids)
    expected_mask = reference.generation_mask(conversation, tools)
    assert mask == expected_mask, _first_difference(mask, expected_mask)
    encoder.check(conversation, np.array(ids, np.int32), tools)
    from fixed_sft.chat import SCHEMA

    assert checked({"messages": conversation, "tools": tools}, SCHEMA) == (None, conversation, tools)


def describe(conversation: list[dict], limit: int = 200) -> str:
    """A short repr of a conversation (long contents abbreviated)."""
    parts = []
    for m in conversation:
        c = m["content"]
        shown = repr(c) if len(c) <= limit else f"{c[: limit // 2]!r} + ... ({len(c)} chars) ... + {c[-limit // 2 :]!r}"
        parts.append(f"{m['role']}: {shown}")
    return "[" + ", ".join(parts) + "]"

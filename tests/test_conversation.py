"""The conversation schema: records checked against what their encoder reads, every
message key it would drop refused by name, a null key counted as absent, and the Kimi
schema's values (tool calls, tool results, reasoning, names, content parts, tools)."""

from __future__ import annotations

import datetime
import decimal
import json

import pytest

from fixed_sft.chat import ROLES, SCHEMA
from fixed_sft.conversation import InvalidRow, conversation
from fixed_sft.encoding import MessageSchema

CALL = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
DECIMAL, DAY = decimal.Decimal("1.50"), datetime.date(2026, 1, 2)
PLAIN = MessageSchema(name="plain", keys=frozenset({"role", "content"}), roles=("system", "user", "assistant"))


def _refusal(record: dict, schema: MessageSchema = SCHEMA) -> InvalidRow:
    with pytest.raises(InvalidRow) as error:
        conversation(record, schema)
    return error.value


def test_a_message_of_a_role_and_a_content_is_kept_as_it_is():
    record = {"id": 7, "messages": [{"role": "user", "content": "q"}, {"content": "a", "role": "assistant"}]}
    assert conversation(record, SCHEMA) == (
        "7",
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
        None,
    )


def test_an_agentic_conversation_is_kept_with_its_tools():
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "s"}], "name": "policy"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "reasoning_content": "r", "tool_calls": CALL},
        {"role": "tool", "tool_call_id": "c1", "content": "out"},
        {"role": "assistant", "content": "a", "reasoning": "r2"},
    ]
    for tools in (TOOLS, json.dumps(TOOLS)):
        assert conversation({"id": "x", "messages": messages, "tools": tools}, SCHEMA) == ("x", messages, TOOLS)
    arguments = [{"id": "c1", "function": {"name": "f", "arguments": {"a": [1, None]}}}]
    kept = conversation({"messages": [{"role": "assistant", "tool_calls": arguments, "content": None}]}, SCHEMA)
    assert kept.messages == [{"role": "assistant", "tool_calls": arguments}]
    assert conversation({"messages": messages[1:2], "tools": []}, SCHEMA).tools == []  # (a list: a template may tell)


@pytest.mark.parametrize(
    "message, reason",
    [
        ({"role": "assistant", "content": "a", "thinking": "r"}, "has the key 'thinking', which the kimi_k25"),
        ({"role": "user", "content": "q", "reasoning_content": "r"}, "does not read on user messages"),
        ({"role": "user", "content": "q", "tool_calls": CALL}, "'tool_calls', which the kimi_k25 encoder does not"),
        ({"role": "assistant", "content": "a", "tool_call_id": "c1"}, "does not read on assistant messages"),
        ({"role": "tool", "content": "out"}, "is a tool message without 'tool_call_id'"),
        ({"role": "user", "content": None}, "has no content"),
        ({"role": "tool", "tool_call_id": "c1"}, "has no content"),
        ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, "part 0 is an image"),
        ({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "video"}]}, "part 1 is a video"),
        ({"role": "user", "content": [{"type": "text", "text": "a", "extra": 1}]}, "part 0 is not a"),
        ({"role": "user", "content": [{"type": "text", "text": 3}]}, "part 0 text is a int"),
        ({"role": "user", "content": {"type": "text", "text": "a"}}, "content is a dict, not a string"),
        ({"role": "user", "content": "q", "name": 3}, "'name' is a int, not a string"),
        ({"role": "assistant", "content": "a", "reasoning": "x", "reasoning_content": "y"}, "which differ"),
        ({"role": "assistant", "tool_calls": {"id": "c1"}}, "'tool_calls' is a dict, not a list"),
        ({"role": "assistant", "tool_calls": [{**CALL[0], "index": 0}]}, "tool call 0 is not"),
        ({"role": "assistant", "tool_calls": [{**CALL[0], "type": "code"}]}, "tool call 0 is not"),
        ({"role": "assistant", "tool_calls": [{**CALL[0], "id": 1}]}, "tool call 0 is not"),
        ({"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": 1}}]}, "call 0 is"),
        ({"role": "assistant", "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}, "tool call 0 is not"),
        ({"role": "tool", "tool_call_id": "c\ud800", "content": "out"}, "has a lone surrogate"),
        (  # (a Parquet decimal or date, as pyarrow gives it)
            {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {"x": DECIMAL}}}]},
            "holds a Decimal, which is not a JSON value",
        ),
        (
            {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {"d": [DAY]}}}]},
            "holds a date, which is not a JSON value",
        ),
    ],
)
def test_a_message_the_encoder_would_not_render_as_given_is_refused_naming_the_row(message, reason):
    error = _refusal({"id": "row", "messages": [{"role": "user", "content": "q"}, message]})
    assert error.reason.startswith("message 1 ") and reason in error.reason
    assert error.row_id == "row"


@pytest.mark.parametrize(
    "tools, reason",
    [
        ("[{", "'tools' is a string that is not JSON"),
        ('[{"a": 1, "a": 2}]', "'tools' repeats the key 'a'"),
        ({"type": "function"}, "'tools' is not a list of objects"),
        (["f"], "'tools' is not a list of objects"),
        ([{"name": "\udc00"}], "'tools' has a lone surrogate"),
        ([{"function": {"parameters": {"default": DECIMAL}}}], "'tools' holds a Decimal, which is not a JSON value"),
    ],
)
def test_tools_that_are_not_a_list_of_objects_are_refused_naming_the_row(tools, reason):
    error = _refusal({"id": 3, "messages": [{"role": "user", "content": "q"}], "tools": tools})
    assert reason in error.reason and error.row_id == "3"


def test_tools_are_refused_where_the_encoder_does_not_read_them():
    error = _refusal({"messages": [{"role": "user", "content": "q"}], "tools": TOOLS}, PLAIN)
    assert error.reason == "the row has 'tools', which the plain encoder does not read"
    assert conversation({"messages": [{"role": "user", "content": "q"}], "tools": None}, PLAIN).tools is None


@pytest.mark.parametrize(
    "key, value", [("tool_calls", CALL), ("reasoning_content", "r"), ("name", "bob"), ("tool_call_id", "c1")]
)
def test_a_message_key_the_encoder_does_not_read_is_refused_by_name(key, value):
    record = {
        "id": "row",
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", key: value}],
    }
    error = _refusal(record, PLAIN)
    assert error.reason == f"message 1 has the key {key!r}, which the plain encoder does not read"
    assert error.row_id == "row"


def test_an_empty_value_of_a_key_the_encoder_does_not_read_counts_as_absent():
    """As chat exports write ``tool_calls: []`` and ``reasoning_content: ""`` on every
    message: nothing is dropped. A key the role reads keeps its empty value."""
    user = {"role": "user", "content": "q", "tool_calls": [], "reasoning_content": "", "tool_call_id": ""}
    reply = {"role": "assistant", "content": "", "tool_calls": [], "reasoning_content": ""}
    kept = conversation({"messages": [user, reply]}, SCHEMA).messages
    assert kept == [{"role": "user", "content": "q"}, reply]
    assert _refusal({"messages": [{**user, "tool_calls": CALL}]}).reason == (
        "message 0 has the key 'tool_calls', which the kimi_k25 encoder does not read on user messages"
    )


def test_an_unknown_role_is_named_before_the_keys_of_its_message():
    record = {"messages": [{"role": "tool", "content": "out", "tool_call_id": "c1"}]}
    with pytest.raises(InvalidRow, match="message 0 has unknown role 'tool'"):
        conversation(record, PLAIN)
    with pytest.raises(InvalidRow, match="message 0 has unknown role 'function'"):
        conversation({"messages": [{"role": "function", "content": "out", "x": 1}]}, SCHEMA)


def test_a_null_key_counts_as_absent():
    """As a Parquet struct gives a row without the key: every key of the file's schema, null."""
    message = {"role": "assistant", "content": "a", "name": None, "tool_calls": None, "reasoning_content": None}
    assert conversation({"messages": [message]}, SCHEMA) == (None, [{"role": "assistant", "content": "a"}], None)
    with pytest.raises(InvalidRow, match="message 0 has no content"):
        conversation({"messages": [{"role": "user", "content": None, "name": None}]}, SCHEMA)
    call = {"id": "c1", "type": None, "function": {"name": "f", "arguments": "{}"}}
    part = {"type": "text", "text": "q", "image_url": None}
    kept = conversation(
        {"messages": [{"role": "user", "content": [part]}, {"role": "assistant", "tool_calls": [call]}]}, SCHEMA
    )
    assert kept.messages == [
        {"role": "user", "content": [{"type": "text", "text": "q"}]},
        {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}]},
    ]


def test_keys_another_encoder_reads_are_kept_and_its_name_is_the_one_given():
    schema = MessageSchema(name="other", keys=frozenset({"role", "content", "name"}), roles=ROLES)
    message = {"role": "user", "content": "q", "name": "bob", "reasoning_content": None}
    assert conversation({"messages": [message]}, schema) == (
        None,
        [{"role": "user", "content": "q", "name": "bob"}],
        None,
    )
    with pytest.raises(InvalidRow, match="message 0 has the key 'tool_calls', which the other encoder does not read"):
        conversation({"messages": [{**message, "tool_calls": CALL}]}, schema)


def test_the_record_checks_come_before_the_message_checks():
    with pytest.raises(InvalidRow, match="'id' is a float"):
        conversation({"id": 1.5, "messages": [{"role": "user", "content": "q", "name": "x"}]}, SCHEMA)
    with pytest.raises(InvalidRow, match="message 0 content has a lone surrogate"):
        conversation({"messages": [{"role": "user", "content": "\ud800", "name": None}]}, SCHEMA)

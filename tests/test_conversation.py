"""The conversation schema: records checked against what their encoder reads, every
message key it would drop refused by name, a null key counted as absent."""

from __future__ import annotations

import pytest

from fixed_sft.chat import ROLES, SCHEMA
from fixed_sft.conversation import InvalidRow, conversation
from fixed_sft.encoding import MessageSchema

CALL = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]


def test_a_message_of_a_role_and_a_content_is_kept_as_it_is():
    record = {"id": 7, "messages": [{"role": "user", "content": "q"}, {"content": "a", "role": "assistant"}]}
    assert conversation(record, SCHEMA) == (
        "7",
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
    )


@pytest.mark.parametrize(
    "key, value", [("tool_calls", CALL), ("reasoning_content", "r"), ("name", "bob"), ("tool_call_id", "c1")]
)
def test_a_message_key_the_encoder_does_not_read_is_refused_by_name(key, value):
    record = {
        "id": "row",
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", key: value}],
    }
    with pytest.raises(InvalidRow) as error:
        conversation(record, SCHEMA)
    assert error.value.reason == f"message 1 has the key {key!r}, which the kimi_k25 encoder does not read"
    assert error.value.row_id == "row"


def test_an_assistant_message_of_tool_calls_without_content_names_the_tool_calls():
    record = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": CALL}]}
    with pytest.raises(InvalidRow, match="message 1 has the key 'tool_calls', which the kimi_k25 encoder"):
        conversation(record, SCHEMA)


def test_an_unknown_role_is_named_before_the_keys_of_its_message():
    record = {"messages": [{"role": "tool", "content": "out", "tool_call_id": "c1"}]}
    with pytest.raises(InvalidRow, match="message 0 has unknown role 'tool'"):
        conversation(record, SCHEMA)


def test_a_null_key_counts_as_absent():
    """As a Parquet struct gives a row without the key: every key of the file's schema, null."""
    message = {"role": "assistant", "content": "a", "name": None, "tool_calls": None, "reasoning_content": None}
    assert conversation({"messages": [message]}, SCHEMA) == (None, [{"role": "assistant", "content": "a"}])
    with pytest.raises(InvalidRow, match="message 0 has no content"):
        conversation({"messages": [{"role": "user", "content": None, "name": None}]}, SCHEMA)


def test_keys_another_encoder_reads_are_kept_and_its_name_is_the_one_given():
    schema = MessageSchema(name="other", keys=frozenset({"role", "content", "name"}), roles=ROLES)
    message = {"role": "user", "content": "q", "name": "bob", "reasoning_content": None}
    assert conversation({"messages": [message]}, schema) == (None, [{"role": "user", "content": "q", "name": "bob"}])
    with pytest.raises(InvalidRow, match="message 0 has the key 'tool_calls', which the other encoder does not read"):
        conversation({"messages": [{**message, "tool_calls": CALL}]}, schema)


def test_the_record_checks_come_before_the_message_checks():
    with pytest.raises(InvalidRow, match="'id' is a float"):
        conversation({"id": 1.5, "messages": [{"role": "user", "content": "q", "name": "x"}]}, SCHEMA)
    with pytest.raises(InvalidRow, match="message 0 content has a lone surrogate"):
        conversation({"messages": [{"role": "user", "content": "\ud800", "name": None}]}, SCHEMA)

"""The conversation schema: a source record -> its id, messages and tools, checked against what its encoder reads.

A record is valid when its ``messages`` is a non-empty list of objects, each with a ``role``
the encoder encodes and a ``content`` of valid Unicode, and no other key the encoder does
not read for that role; its ``id``, where present and not null, is a string or an integer.
A key whose value is null counts as absent: a Parquet struct carries every key of its
file's schema, null where a row has none; so does an empty value (``""``, ``[]``, ``{}``)
of a key the encoder does not read for the message's role (``tool_calls: []`` on a user
message). Any other key the encoder would drop is refused, never silently left out of the ids.

Values, where the schema reads the key (OpenAI's chat schema):

* ``content``: a string; where the schema takes parts, a list of ``{"type": "text",
  "text": str}`` (an image or video part is refused: no encoder here renders media);
  absent only on the roles the schema lets go without.
* ``name``, ``reasoning_content``, ``reasoning``: strings; when both reasoning keys are
  given they must be equal (a template reads one of them).
* ``tool_calls``: a list of ``{"id": str, "type": "function", "function": {"name": str,
  "arguments": str or object}}`` (``type`` may be left out).
* ``tool_call_id``: a string, required on a ``tool`` message.
* the record's ``tools`` (read only where the schema says; elsewhere a record with tools
  is refused): a list of objects, or a JSON string of one; an empty list stays one (a
  template may tell it from none; Kimi's declares no tools for it).

Every string a message or the tools hold must be valid Unicode, and neither nests lists
and objects deeper than ``MAX_DEPTH`` levels (which rendering them would need a deeper
stack for than Python's). Keys of the record beside ``id``, ``messages`` and ``tools``
are not read. For a schema of any key (``keys=None``: an
encoder that passes every key to its chat template) a message needs only a ``role`` that
is a non-empty string; its other keys, ``content`` included, are the template's to read or
refuse (a string content must still be valid Unicode), as are the record's ``tools``.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, NamedTuple

from .encoding import Message, MessageSchema
from .fields import STRICT_JSON, DuplicateKey

MAX_DEPTH = 64


class InvalidRow(Exception):
    """A source row that is not a valid conversation."""

    def __init__(self, reason: str, row_id: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.row_id = row_id


class Conversation(NamedTuple):
    """A valid record's id's text (``None`` without one), its messages, each reduced to
    the keys its encoder reads that are present and not null, and its tools (``None``
    without any)."""

    id: str | None
    messages: list[Message]
    tools: list | None = None


def conversation(record: object, schema: MessageSchema) -> Conversation:
    """The ``Conversation`` of a source record (a dict, or the ``InvalidRow`` that
    ``fixed_sft.records.records`` made of it, raised here); ``InvalidRow`` naming the reason
    and, where it is known, the id when the record is not valid for ``schema`` (module
    docstring). The id's text is the string, or the integer in decimal."""
    if isinstance(record, InvalidRow):
        raise record
    if not isinstance(record, dict):
        raise InvalidRow(f"the row is a {type(record).__name__}, not an object")
    row_id = record.get("id")
    if isinstance(row_id, bool) or not isinstance(row_id, (str, int, type(None))):
        raise InvalidRow(f"'id' is a {type(row_id).__name__}, not a string or integer")
    row_id = None if row_id is None else str(row_id)
    if row_id is not None and not row_id.isascii() and not is_unicode(row_id):
        raise InvalidRow("'id' has a lone surrogate", row_id.encode("utf-8", "backslashreplace").decode())
    messages = record.get("messages")
    if messages is None:
        raise InvalidRow("'messages' is missing", row_id)
    if not isinstance(messages, list):
        raise InvalidRow(f"'messages' is a {type(messages).__name__}, not a list", row_id)
    if not messages:
        raise InvalidRow("'messages' is empty", row_id)
    roles = schema.roles
    clean = []
    for n, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRow(f"message {n} is a {type(message).__name__}, not an object", row_id)
        if schema.keys is None:
            clean.append(_any_keys(n, message, row_id))
            continue
        assert roles is not None  # (a schema of named keys names its roles)
        role, content = message.get("role"), message.get("content")
        # exactly a role and a content (a tool message needs its tool_call_id)
        if len(message) == 2 and role in roles and role != "tool" and isinstance(content, str):
            if not content.isascii() and not is_unicode(content):
                raise InvalidRow(f"message {n} content has a lone surrogate", row_id)
            clean.append({"role": role, "content": content})
        else:
            clean.append(_reduced(n, message, schema, row_id))
    return Conversation(row_id, clean, _tools(record.get("tools"), schema, row_id))


def _any_keys(n: int, message: Message, row_id: str | None) -> Message:
    """Message ``n`` without its null keys, or the ``InvalidRow`` it is: a role missing or not
    a non-empty string, an image or video content part (no build renders media), a string
    with a lone surrogate, or values nested deeper than ``MAX_DEPTH``."""
    role, content = message.get("role"), message.get("content")
    if not (isinstance(role, str) and role):
        why = "has no role" if role is None else f"has role {role!r}, not a name"
        raise InvalidRow(f"message {n} {why}", row_id)
    for k, part in enumerate(content if isinstance(content, list) else ()):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in MEDIA:
            raise InvalidRow(
                f"message {n} content part {k} is {_a(kind.split('_')[0])}, which no build renders", row_id
            )
    kept = {key: value for key, value in message.items() if value is not None}
    try:
        texts = strings(kept)
    except ValueError as error:
        raise InvalidRow(f"message {n} {error}", row_id) from None
    if not all(text.isascii() or is_unicode(text) for text in texts):
        raise InvalidRow(f"message {n} has a lone surrogate", row_id)
    return kept


MEDIA = ("image", "image_url", "video", "video_url")


def _a(word: str) -> str:
    """``word`` with its indefinite article."""
    return f"{'an' if word[:1] in 'aeiou' else 'a'} {word}"


def _empty_unread(schema: MessageSchema, role: str, key: str, value: Any) -> bool:
    """Whether ``value`` is empty (``""``, ``[]``, ``{}``) under a key ``schema`` does not read
    for ``role``: it holds nothing to drop, as exports write ``tool_calls: []`` on every
    message."""
    return isinstance(value, str | list | dict) and not value and not schema.reads(role, key)


def _reduced(n: int, message: Message, schema: MessageSchema, row_id: str | None) -> Message:
    """Message ``n`` without its null keys, or the ``InvalidRow`` it is: a role missing or
    not one of ``schema.roles``, a key with a value that ``schema`` does not read for the
    role, then a value not of its key's shape (module docstring), checked in that order."""
    role = message.get("role")
    assert schema.roles is not None  # (``_any_keys`` reduces the others)
    if role not in schema.roles:
        why = "has no role" if role is None else f"has unknown role {role!r}"
        raise InvalidRow(f"message {n} {why}", row_id)
    kept = {
        key: value
        for key, value in message.items()
        if value is not None and not _empty_unread(schema, role, key, value)
    }
    for key in kept:
        if not schema.reads(role, key):
            where = f" on {role} messages" if any(key in keys for keys in schema.role_keys.values()) else ""
            raise InvalidRow(
                f"message {n} has the key {key!r}, which the {schema.name} encoder does not read{where}", row_id
            )

    def invalid(why: str) -> InvalidRow:
        return InvalidRow(f"message {n} {why}", row_id)

    content = kept.get("content")
    if content is None:
        if role not in schema.optional_content:
            raise invalid("has no content")
    elif isinstance(content, list) and schema.parts:
        for k, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in MEDIA:
                raise invalid(
                    f"content part {k} is {_a(kind.split('_')[0])}, which the {schema.name} encoder does not take"
                )
            part = {key: value for key, value in part.items() if value is not None} if isinstance(part, dict) else part
            if not (isinstance(part, dict) and kind == "text" and set(part) == {"type", "text"}):
                raise invalid(f"content part {k} is not a {{'type': 'text', 'text': ...}} part")
            if not isinstance(part["text"], str):
                raise invalid(f"content part {k} text is a {type(part['text']).__name__}, not a string")
        kept["content"] = [{"type": "text", "text": part["text"]} for part in content]
    elif not isinstance(content, str):
        raise invalid(f"content is a {type(content).__name__}, not a string")
    elif not content.isascii() and not is_unicode(content):
        raise invalid("content has a lone surrogate")
    for key in ("name", "reasoning_content", "reasoning", "tool_call_id"):
        if key in kept and not isinstance(kept[key], str):
            raise invalid(f"{key!r} is a {type(kept[key]).__name__}, not a string")
    if "reasoning" in kept and "reasoning_content" in kept and kept["reasoning"] != kept["reasoning_content"]:
        raise invalid("has both 'reasoning' and 'reasoning_content', which differ")
    if role == "tool" and "tool_call_id" not in kept:
        raise invalid("is a tool message without 'tool_call_id'")
    if "tool_calls" in kept:
        kept["tool_calls"] = _tool_calls(kept["tool_calls"], invalid)
    try:
        texts = strings(kept, json_only=True)
    except ValueError as error:
        raise invalid(str(error)) from None
    if not all(text.isascii() or is_unicode(text) for text in texts):
        raise invalid("has a lone surrogate")
    return kept


def _tool_calls(calls: Any, invalid: Any) -> list:
    """``tool_calls`` without their null keys (module docstring: their shape)."""
    if not isinstance(calls, list):
        raise invalid(f"'tool_calls' is a {type(calls).__name__}, not a list")
    clean = []
    for k, call in enumerate(calls):
        call = {key: value for key, value in call.items() if value is not None} if isinstance(call, dict) else call
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            function = {key: value for key, value in function.items() if value is not None}
        if not (
            isinstance(call, dict)
            and set(call) <= {"id", "type", "function"}
            and call.get("type", "function") == "function"
            and isinstance(call.get("id"), str)
            and isinstance(function, dict)
            and set(function) == {"name", "arguments"}
            and isinstance(function["name"], str)
            and isinstance(function["arguments"], (str, dict))
        ):
            raise invalid(
                f"tool call {k} is not {{'id': str, 'type': 'function', 'function': {{'name': str, "
                "'arguments': str or object}}"
            )
        clean.append({**call, "function": function})
    return clean


def _tools(tools: Any, schema: MessageSchema, row_id: str | None) -> list | None:
    """The record's ``tools`` as a list (``None`` for none; an empty list stays one, as a
    template may tell it from none), or the ``InvalidRow`` they are."""
    if tools is None:
        return None
    if not schema.tools:
        raise InvalidRow(f"the row has 'tools', which the {schema.name} encoder does not read", row_id)
    if isinstance(tools, str):
        try:
            tools = STRICT_JSON.decode(tools)
        except DuplicateKey as error:
            raise InvalidRow(f"'tools' repeats the key {error.key!r} in an object", row_id) from None
        except (json.JSONDecodeError, ValueError, RecursionError):
            raise InvalidRow("'tools' is a string that is not JSON", row_id) from None
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise InvalidRow("'tools' is not a list of objects (or a JSON string of one)", row_id)
    try:
        texts = strings(tools, json_only=True)
    except ValueError as error:
        raise InvalidRow(f"'tools' {error}", row_id) from None
    if not all(text.isascii() or is_unicode(text) for text in texts):
        raise InvalidRow("'tools' has a lone surrogate", row_id)
    return tools


def strings(value: Any, json_only: bool = False) -> list[str]:
    """Every string in ``value`` (keys and values, through lists and objects); ``ValueError``
    for a value nested deeper than ``MAX_DEPTH`` (read without recursion), for a float that
    is NaN or infinite (JSON has neither: a template would write ``NaN``), and with
    ``json_only`` for one of no JSON kind (a Parquet decimal or date, say).

    >>> strings({"a": ["b", 1]}), strings({"x": 1.5}, json_only=True)
    (['a', 'b'], ['x'])
    >>> strings({"x": [float("nan")]})
    Traceback (most recent call last):
    ValueError: holds nan, which is not a JSON value
    >>> import decimal
    >>> strings({"x": decimal.Decimal("1.5")}, json_only=True)
    Traceback (most recent call last):
    ValueError: holds a Decimal, which is not a JSON value
    """
    found: list[str] = []
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"holds {item}, which is not a JSON value")
        elif json_only and not isinstance(item, (dict, list, int, float, type(None))):
            raise ValueError(f"holds a {type(item).__name__}, which is not a JSON value")
        elif isinstance(item, (dict, list)):
            if depth >= MAX_DEPTH:
                raise ValueError(f"nests deeper than {MAX_DEPTH} levels")
            if isinstance(item, dict):
                found += item
                stack += ((child, depth + 1) for child in item.values())
            else:
                stack += ((child, depth + 1) for child in item)
    return found


_SURROGATE = re.compile("[\ud800-\udfff]")


def is_unicode(text: str) -> bool:
    """Whether ``text`` is valid Unicode (has no lone surrogate, which UTF-8 cannot hold),
    found without encoding it (a copy as large as the text)."""
    return _SURROGATE.search(text) is None

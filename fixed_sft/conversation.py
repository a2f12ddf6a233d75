"""The conversation schema: a source record -> its id and messages, checked against what its encoder reads.

A record is valid when its ``messages`` is a non-empty list of objects, each with a ``role``
the encoder encodes and a string ``content`` of valid Unicode, and no other key the encoder
does not read; its ``id``, where present and not null, is a string or an integer. A key whose
value is null counts as absent: a Parquet struct carries every key of its file's schema, null
where a row has none. A key the encoder would drop is refused, never silently left out of the
ids. Keys of the record beside ``id`` and ``messages`` are not read. For a schema of any key
(``keys=None``: an encoder that passes every key to its chat template) a message needs only a
``role`` that is a non-empty string; its other keys, ``content`` included, are the template's
to read or refuse (a string content must still be valid Unicode).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from .encoding import Message, MessageSchema


class InvalidRow(Exception):
    """A source row that is not a valid conversation."""

    def __init__(self, reason: str, row_id: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.row_id = row_id


class Conversation(NamedTuple):
    """A valid record's id's text (``None`` without one) and its messages, each reduced to
    the keys its encoder reads that are present and not null."""

    id: str | None
    messages: list[Message]


def conversation(record: object, schema: MessageSchema) -> Conversation:
    """The ``Conversation`` of a source record (a dict, or the ``InvalidRow`` that
    ``fixed_sft.source.records`` made of it, raised here); ``InvalidRow`` naming the reason
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
        if len(message) == 2 and role in roles and isinstance(content, str):  # exactly a role and a content
            kept, text = {"role": role, "content": content}, content
        else:
            kept = _reduced(n, message, schema, row_id)
            text = kept["content"]
        if not text.isascii() and not is_unicode(text):
            raise InvalidRow(f"message {n} content has a lone surrogate", row_id)
        clean.append(kept)
    return Conversation(row_id, clean)


def _any_keys(n: int, message: Message, row_id: str | None) -> Message:
    """Message ``n`` without its null keys, or the ``InvalidRow`` it is: a role missing or not
    a non-empty string, or a string content with a lone surrogate."""
    role, content = message.get("role"), message.get("content")
    if not (isinstance(role, str) and role):
        why = "has no role" if role is None else f"has role {role!r}, not a name"
        raise InvalidRow(f"message {n} {why}", row_id)
    if isinstance(content, str) and not content.isascii() and not is_unicode(content):
        raise InvalidRow(f"message {n} content has a lone surrogate", row_id)
    return {key: value for key, value in message.items() if value is not None}


def _reduced(n: int, message: Message, schema: MessageSchema, row_id: str | None) -> Message:
    """Message ``n`` without its null keys, or the ``InvalidRow`` it is: a role missing or
    not one of ``schema.roles``, a key with a value that ``schema`` does not read, or a
    content that is missing or not a string (checked in that order)."""
    role, content = message.get("role"), message.get("content")
    assert schema.keys is not None and schema.roles is not None  # (``_any_keys`` reduces the others)
    if role not in schema.roles:
        why = "has no role" if role is None else f"has unknown role {role!r}"
        raise InvalidRow(f"message {n} {why}", row_id)
    for key, value in message.items():
        if value is not None and key not in schema.keys:
            raise InvalidRow(f"message {n} has the key {key!r}, which the {schema.name} encoder does not read", row_id)
    if not isinstance(content, str):
        why = "has no content" if content is None else f"content is a {type(content).__name__}, not a string"
        raise InvalidRow(f"message {n} {why}", row_id)
    return {key: value for key, value in message.items() if value is not None}


_SURROGATE = re.compile("[\ud800-\udfff]")


def is_unicode(text: str) -> bool:
    """Whether ``text`` is valid Unicode (has no lone surrogate, which UTF-8 cannot hold),
    found without encoding it (a copy as large as the text)."""
    return _SURROGATE.search(text) is None

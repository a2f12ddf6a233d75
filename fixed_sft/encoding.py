"""The encoding seam: what every encoder of conversations into token ids and loss masks provides.

An encoder turns one conversation's messages (and, where its schema reads them, the
conversation's ``tools``) into ``(ids, mask)`` arrays (int32 ids, uint8 mask, of one length)
and names, in its ``schema``, the message keys and roles it reads; the conversation schema
(``fixed_sft.conversation``) refuses a message with any other key, so that nothing in a row
is silently left out of its ids. ``check`` compares a conversation's
ids with the model's own rendering of it. The Kimi fast path (``fixed_sft.chat.ChatEncoder``)
is one implementation; the render-based path for any Hugging Face chat model
(``fixed_sft.hf_chat.HFChatEncoder``) is another, a ``BatchEncoder``: it encodes a chunk's
conversations at once, and a conversation its template refuses is an invalid row. The code
that encodes chunks (``fixed_sft.encode``) sees only these protocols.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

RENDERER_MODULE = "transformers.utils.chat_template_utils"  # transformers' chat template renderer
Message = dict[str, Any]  # a message's keys and values, as JSON or Parquet gives them
Arrays = tuple[np.ndarray, np.ndarray]  # a conversation's int32 ids and uint8 mask


@dataclass(frozen=True)
class MessageSchema:
    """What an encoder reads of a message: the keys (``role`` and ``content`` among them)
    and the roles it encodes; ``name`` names the encoder in the refusal of a row whose
    messages hold anything else. ``role_keys``: keys read on messages of one role only;
    ``parts``: whether a content may be a list of text parts; ``optional_content``: roles
    whose messages may have no content; ``tools``: whether the conversation's ``tools``
    (beside its ``messages``) are read. ``keys=None`` and ``roles=None``: an encoder that
    passes every key of a message, and any role, to its chat template (which then decides
    what a content may be)."""

    name: str
    keys: frozenset[str] | None
    roles: tuple[str, ...] | None
    role_keys: dict[str, frozenset[str]] = field(default_factory=dict, hash=False)
    parts: bool = False
    optional_content: frozenset[str] = frozenset()
    tools: bool = False

    def reads(self, role: str, key: str) -> bool:
        """Whether a message of ``role`` has ``key`` read."""
        return self.keys is None or key in self.keys or key in self.role_keys.get(role, ())


class TemplateMismatch(Exception):
    """An encoder's ids for a conversation differ from the model's own rendering of it."""


class Encoder(Protocol):
    """Conversations -> token ids and loss masks. ``encode_arrays`` is given messages that
    the conversation schema has checked against ``schema`` (each reduced to the keys it
    names, absent keys left out), and the conversation's ``tools`` (``None`` without any,
    always ``None`` where the schema does not read them)."""

    @property
    def schema(self) -> MessageSchema:
        """The message keys and roles this encoder reads."""
        ...

    def encode_arrays(self, messages: Sequence[Message], tools: list | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One conversation's int32 token ids and uint8 loss mask, of one length;
        ``fixed_sft.conversation.InvalidRow`` for one the schema lets through that the
        encoder still cannot encode."""
        ...

    def check(self, messages: Sequence[Message], ids: np.ndarray, tools: list | None = None) -> None:
        """Raise ``TemplateMismatch`` unless ``ids`` are the model's own ids of ``messages``."""
        ...


@runtime_checkable
class BatchEncoder(Encoder, Protocol):
    """An encoder that encodes a chunk's conversations at once."""

    def encode_batch(
        self, conversations: Sequence[Sequence[Message]], tools: Sequence[list | None] | None = None
    ) -> Sequence[Arrays | Exception]:
        """Each conversation's ids and mask (as ``encode_arrays``, with ``tools[k]`` its
        tools), or the ``InvalidRow`` it is, or the ``TemplateMismatch`` that stops the build
        when the build reaches it."""
        ...

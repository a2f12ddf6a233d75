"""The Kimi fast path: conversation -> (token ids, loss mask), equal to rendering the chat template.

Reference path (what the model's own tokenizer does): render ``chat_template.jinja``
with transformers' Jinja renderer, then encode the text (``KimiTokenizer.encode``).

Fast path: the template renders each message as ``prefix[role] + content +
suffix[role]``, and both affixes are bounded by added tokens, so BPE never runs
across a boundary. The affixes are read off the template once, by rendering a probe
message per role, and a conversation's ids are the concatenation of its messages'
``prefix ids + encode(content) + suffix ids``. ``check`` compares the two paths' ids;
the build runs it on a sample of its own conversations.

Loss mask ``kimi_k25``: for an assistant message, its role header (``<|im_assistant|>``,
the role name, ``<|im_middle|>``) is 0 and every later token the template emits for
that message, through its closing ``<|im_end|>`` (``<think></think>``, content), is 1.
Every token of system and user messages is 0.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from .encoding import Message, MessageSchema, TemplateMismatch
from .tokenizer import TEMPLATE_KWARGS, KimiTokenizer

MASK_TYPES = ("kimi_k25",)
ROLES = ("system", "user", "assistant")
# What the fast path reads of a message: every other key is refused (fixed_sft.conversation),
# since the fast path would leave it out of the ids.
SCHEMA = MessageSchema(name="kimi_k25", keys=frozenset({"role", "content"}), roles=ROLES)
_PROBE = "\x00fixed-sft-probe\x00"
# Conversations on which the fast path must equal the template before it is used: every
# pair of roles, and longer ones in which every role follows every role and each role
# ends one. Each is probed once per rotation of the contents, so that every content
# lands on every message: empty, starting or ending with whitespace (which BPE would
# merge across a message boundary), or holding ``</think>`` and special-token text.
PROBE_CONVERSATIONS = (
    *((first, second) for first in ROLES for second in ROLES),
    ("system", "user", "assistant"),
    ("user", "assistant", "user", "assistant", "user"),
    ("assistant", "assistant", "system", "system", "user", "user", "system", "assistant", "user", "system"),
)
_PROBE_CONTENTS = ("\n probe {}\n", "", " probe {} ", "a</think>probe {}\n\n", "<|im_end|>probe {}<think>")


class TemplateRefusal(TemplateMismatch):
    """The template refuses to render a conversation that the fast path encodes."""


@dataclass(frozen=True, eq=False)
class RoleLayout:
    """How the template renders a message of one role: ``prefix + content + suffix``.
    Its first ``header`` tokens have mask 0 and the rest have mask ``body_mask``."""

    prefix: np.ndarray  # uint32, as ``KimiTokenizer.encode_to_numpy`` gives
    suffix: np.ndarray
    header: int
    body_mask: int

    @property
    def size(self) -> int:
        """Tokens of the prefix and suffix together."""
        return len(self.prefix) + len(self.suffix)


RENDERER_MODULE = "transformers.utils.chat_template_utils"


class ChatEncoder:
    """Encodes conversations of ``{"role": system|user|assistant, "content": str}``: the
    Kimi fast path's ``fixed_sft.encoding.Encoder``."""

    schema = SCHEMA

    def __init__(self, tokenizer: KimiTokenizer, loss_mask_type: str = "kimi_k25", template_kwargs: dict | None = None):
        if loss_mask_type not in MASK_TYPES:
            raise ValueError(f"unknown loss mask type {loss_mask_type!r} (known: {', '.join(MASK_TYPES)})")
        self.tokenizer = tokenizer
        self.template_kwargs = TEMPLATE_KWARGS if template_kwargs is None else template_kwargs
        self._layouts = {role: self._read_layout(role) for role in ROLES}
        self._check_probes()

    def _read_layout(self, role: str) -> RoleLayout:
        try:
            text = self.render([{"role": role, "content": _PROBE}])
        except Exception as error:  # Jinja syntax, undefined names, template-raised errors
            raise TemplateMismatch(
                f"{self.tokenizer.directory / 'chat_template.jinja'}: cannot render a {role} "
                f"message ({type(error).__name__}: {error})"
            ) from None
        before, probe, after = text.partition(_PROBE)
        added = self.tokenizer.added
        if not probe or not any(before.endswith(t) for t in added) or not any(after.startswith(t) for t in added):
            raise TemplateMismatch(f"the chat template does not bound {role} content with added tokens")
        prefix, suffix = self.tokenizer.encode_to_numpy(before), self.tokenizer.encode_to_numpy(after)
        if role != "assistant":
            return RoleLayout(prefix, suffix, header=len(prefix), body_mask=0)
        header = prefix.tolist()
        if added.get("<|im_middle|>") not in header:
            raise TemplateMismatch(
                "the chat template's assistant header has no <|im_middle|>, which ends it for kimi_k25"
            )
        return RoleLayout(prefix, suffix, header=header.index(added["<|im_middle|>"]) + 1, body_mask=1)

    def _check_probes(self) -> None:
        """Raise ``TemplateMismatch`` unless the fast path equals the rendered template on
        ``PROBE_CONVERSATIONS``, so that a template that renders a message depending on the
        others (a default system prompt, only the last assistant's reasoning, text between
        messages that BPE joins) is refused before it is used. A probe the template refuses
        to render (one that checks the roles alternate) is passed over; a template that
        renders none is refused. The build's sampled check covers what probes cannot."""
        template = self.tokenizer.directory / "chat_template.jinja"
        rendered, refusal = 0, None
        for roles in PROBE_CONVERSATIONS:
            for shift in range(len(_PROBE_CONTENTS)):
                messages = [
                    {"role": role, "content": _PROBE_CONTENTS[(k + shift) % len(_PROBE_CONTENTS)].format(k)}
                    for k, role in enumerate(roles)
                ]
                try:
                    expected = self.reference_ids(messages)
                except TemplateRefusal as error:
                    refusal = refusal or error
                    continue
                if self.encode_arrays(messages)[0].tolist() != expected:
                    raise TemplateMismatch(
                        f"{template}: the chat template does not render each message as its role's prefix + "
                        f"content + suffix, whatever the messages around it (a {'/'.join(roles)} conversation "
                        "differs), so its ids cannot be built per message"
                    )
                rendered += 1
        if not rendered:
            raise TemplateMismatch(f"{template}: the chat template renders no probe conversation ({refusal})")

    def encode(self, messages: Sequence[Message]) -> tuple[list[int], list[int]]:
        """Token ids and loss mask of one conversation (fast path)."""
        ids, mask = self.encode_arrays(messages)
        return ids.tolist(), mask.tolist()

    def encode_arrays(self, messages: Sequence[Message]) -> tuple[np.ndarray, np.ndarray]:
        """``encode`` as int32 ids and uint8 mask arrays."""
        parts: list[np.ndarray] = []
        values: list[int] = []
        lengths: list[int] = []
        for message in messages:
            layout = self._layouts[message["role"]]
            body = list(self.tokenizer.encode_pieces(message["content"]))  # a long content's pieces: joined once
            parts += (layout.prefix, *body, layout.suffix)
            values += (0, layout.body_mask)
            lengths += (layout.header, layout.size - layout.header + sum(map(len, body)))
        ids = np.concatenate(parts).view(np.int32) if parts else np.zeros(0, np.int32)
        return ids, np.repeat(np.array(values, dtype=np.uint8), lengths)

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = False) -> str:
        """The chat template rendered as transformers renders it for ``apply_chat_template``:
        with this tokenizer's special tokens (``bos_token``, ...) and the template arguments."""
        renderer = importlib.import_module(RENDERER_MODULE)  # heavy: imported only where rendering
        variables = {**self.tokenizer.special_tokens, **self.template_kwargs}
        rendered, _ = renderer.render_jinja_template(
            conversations=[messages],
            chat_template=self.tokenizer.chat_template,
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
        return rendered[0]

    def reference_ids(self, messages: Sequence[Message]) -> list[int]:
        """Token ids by rendering the template and encoding the text; ``TemplateRefusal``
        when the template refuses to render the conversation (an error it raises, as for
        roles out of the order it allows)."""
        return np.concatenate([np.zeros(0, np.uint32), *self._reference_pieces(messages)]).tolist()

    def _reference_pieces(self, messages: Sequence[Message]) -> Iterator[np.ndarray]:
        """``reference_ids`` as the tokenizer's consecutive uint32 pieces (``encode_pieces``)."""
        try:
            text = self.render(messages)
        except Exception as error:  # whatever the template raises
            raise TemplateRefusal(
                f"the chat template refuses the conversation ({type(error).__name__}: {error})"
            ) from None
        return self.tokenizer.encode_pieces(text)

    def check(self, messages: Sequence[Message], ids: np.ndarray) -> None:
        """Raise ``TemplateMismatch`` unless ``ids`` equal the rendered template's ids
        (``TemplateRefusal`` when the template refuses to render the conversation). The
        rendered text is encoded a piece at a time and each piece compared with its slice
        of ``ids`` as arrays: a long conversation's ids never become Python integers, and
        its reference ids are never all held at once."""
        ids = np.asanyarray(ids)
        offset = 0
        for piece in self._reference_pieces(messages):
            end = offset + len(piece)
            if end > len(ids) or not np.array_equal(ids[offset:end], piece):
                break
            offset = end
        else:
            if offset == len(ids):
                return
        raise TemplateMismatch("fast-path ids differ from the rendered chat template")

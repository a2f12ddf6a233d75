"""The Kimi fast path: conversation -> (token ids, loss mask), equal to rendering the chat template.

Reference path (what the model's own tokenizer does): sort every object in ``tools`` by key,
convert them to the TypeScript-style declaration text (``tools_ts_str``; left out where the
conversion raises), render ``chat_template.jinja`` with transformers' Jinja renderer, then
encode the text (``KimiTokenizer.encode``).

Fast path: the template renders each message as ``prefix[role] + content +
suffix[role]``, and both affixes are bounded by added tokens, so BPE never runs
across a boundary. The affixes are read off the template once, by rendering a probe
message per role, and a plain conversation's ids are the concatenation of its messages'
``prefix ids + encode(content) + suffix ids``. ``check`` compares the two paths' ids;
the build runs it on a sample of its own conversations. The probes' outcome is kept in a
file (``probes``, in the token store's folder), so that a process that finds it there
encodes without importing the renderer (``read_probes``). The reference path always
encodes with tiktoken (``KimiTokenizer.reference``), so with gigatoken as the fast
path's BPE the probes and checks also compare the two BPEs; a difference that the BPE
alone makes is named as such (``BPEMismatch``), with the flag that turns gigatoken off.

A message with more than a role and a string content (a name, text parts, reasoning,
tool calls, a tool result) is written out as the template writes it, its header
(``<|im_assistant|>NAME<|im_middle|>``, ``<|im_user|>`` or ``<|im_system|>`` for the
other roles; NAME is the message's ``name``, else its role) and its body each encoded
as one text, both bounded by added tokens. The body: for an assistant, ``<think>`` +
reasoning + ``</think>`` + content + tool calls (``<|tool_calls_section_begin|>``, per
call ``<|tool_call_begin|>ID<|tool_call_argument_begin|>ARGUMENTS<|tool_call_end|>``,
``<|tool_calls_section_end|>``; arguments as given when a string, else as JSON); for a
tool message ``## Return of ID\n`` + content; then ``<|im_end|>``. Content parts are
joined. Reasoning (``reasoning``, else ``reasoning_content``) is rendered only after the
last assistant message without tool calls, unless ``preserve_thinking``, and never when
``thinking`` is false and ``preserve_thinking`` is not set. Tools open the conversation
as ``<|im_system|>tool_declare<|im_middle|>DECLARATIONS<|im_end|>``. Start-up probes
(``_check_probes``) refuse a template that renders any of these shapes otherwise.

Loss mask ``kimi_k25``: for an assistant message, its role header (``<|im_assistant|>``,
the role name, ``<|im_middle|>``) is 0 and every later token the template emits for
that message, through its closing ``<|im_end|>`` (``<think>``, reasoning, ``</think>``,
content, tool calls), is 1. Every token of the tool declarations and of system, user and
tool messages is 0.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import json
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .conversation import InvalidRow
from .encoding import RENDERER_MODULE, Message, MessageSchema, TemplateMismatch
from .hashes import read_checked_json, write_checked_json
from .tokenizer import FAST_BPE_OFF, TEMPLATE_KWARGS, KimiTokenizer
from .tool_declarations import ModelCheck, ToolDeclarationError, declare, sort_keys, typescript_declarations

MASK_TYPES = ("kimi_k25",)
PLAIN_ROLES = ("system", "user", "assistant")  # the roles read off the template as prefix + content + suffix
ROLES = (*PLAIN_ROLES, "tool")
# What the fast path reads of a message: every other key is refused (fixed_sft.conversation),
# since the fast path would leave it out of the ids. Content may be absent on an assistant
# message (one of tool calls), which the template renders as empty.
SCHEMA = MessageSchema(
    name="kimi_k25",
    keys=frozenset({"role", "content", "name"}),
    roles=ROLES,
    role_keys={
        "assistant": frozenset({"tool_calls", "reasoning_content", "reasoning"}),
        "tool": frozenset({"tool_call_id"}),
    },
    parts=True,
    optional_content=frozenset({"assistant"}),
    tools=True,
)
HEADERS = {"user": "<|im_user|>", "assistant": "<|im_assistant|>"}  # every other role: <|im_system|>
TOOL_DECLARATION = ("<|im_system|>tool_declare<|im_middle|>", "<|im_end|>")
_PROBE = "\x00fixed-sft-probe\x00"
# Conversations on which the fast path must equal the template before it is used: every
# pair of roles, and longer ones in which every role follows every role and each role
# ends one. Each is probed once per rotation of the contents, so that every content
# lands on every message: empty, starting or ending with whitespace (which BPE would
# merge across a message boundary), or holding ``</think>`` and special-token text.
PROBE_CONVERSATIONS = (
    *((first, second) for first in PLAIN_ROLES for second in PLAIN_ROLES),
    ("system", "user", "assistant"),
    ("user", "assistant", "user", "assistant", "user"),
    ("assistant", "assistant", "system", "system", "user", "user", "system", "assistant", "user", "system"),
)
_PROBE_CONTENTS = ("\n probe {}\n", "", " probe {} ", "a</think>probe {}\n\n", "<|im_end|>probe {}<think>")


def agentic_probes() -> list[tuple[str, list[Message], list | None]]:
    """``(what, messages, tools)`` probes of every message shape the fast path writes out:
    trajectories of tool calls (string and object arguments) and results that end on an
    answer, a result and a call, with reasoning on each assistant message, names on each
    role, content parts, no content; each once per rotation of ``_PROBE_CONTENTS`` over
    its texts, and with tools declared (a function spec beside one of another shape, and
    the other alone, which is declared as JSON)."""
    probes: list[tuple[str, list[Message], list | None]] = []
    for shift in range(len(_PROBE_CONTENTS)):
        texts = (_PROBE_CONTENTS[(k + shift) % len(_PROBE_CONTENTS)].format(k) for k in itertools.count())
        probes += _agentic_probes(functools.partial(next, texts))
    return probes


def _agentic_probes(text: Callable[[], str]) -> list[tuple[str, list[Message], list | None]]:
    """``agentic_probes`` of one rotation, its texts drawn from ``text``."""

    def call(arguments: object) -> Message:
        return {"id": text(), "type": "function", "function": {"name": "probe", "arguments": arguments}}

    def assistant(**keys: object) -> Message:
        return {"role": "assistant", "reasoning_content": text(), **keys}

    trajectory: list[Message] = [
        {"role": "system", "content": text(), "name": text()},
        {"role": "user", "content": [{"type": "text", "text": text()}, {"type": "text", "text": text()}]},
        assistant(content=text()),
        {"role": "user", "content": text()},
        assistant(tool_calls=[call(text()), call({"q": text(), "n": [1, 2.5, None, True], "ü": {"k": text()}})]),
        {"role": "tool", "tool_call_id": text(), "content": text()},
        {"role": "tool", "tool_call_id": text(), "content": [{"type": "text", "text": text()}]},
        assistant(content=text(), tool_calls=[call(text())]),
        {"role": "tool", "tool_call_id": text(), "content": text(), "name": text()},
        assistant(content=text(), name=text()),
    ]
    named: list[Message] = [
        {"role": "user", "content": text(), "name": text()},
        {"role": "assistant", "content": [], "reasoning": text(), "name": text()},
        {"role": "assistant", "content": text(), "reasoning": "r", "reasoning_content": "r"},
        {"role": "user", "content": []},
    ]
    probes: list[tuple[str, list[Message], list | None]] = [
        ("an agentic trajectory", trajectory, None),
        ("a trajectory that ends on a tool result", trajectory[:-1], None),
        ("a trajectory that ends on a tool call", trajectory[:-2], None),
        ("messages with names and content parts", named, None),
    ]
    function = {
        "type": "function",
        "function": {
            "name": "probe",
            "description": text(),
            "parameters": {
                "type": "object",
                "properties": {"b": {"type": "string", "description": text()}, "a": {"type": "integer"}},
                "required": ["b"],
            },
        },
    }
    other = {"z": text(), "a": [{"y": 1, "x": None}]}
    probes += [
        ("tool declarations", trajectory[:-2], [function, other]),
        ("tool declarations as JSON", named, [other]),
    ]
    return probes


class TemplateRefusal(TemplateMismatch):
    """The template refuses to render a conversation that the fast path encodes."""


class BPEMismatch(TemplateMismatch):
    """The fast BPE's ids of a rendered conversation differ from tiktoken's."""


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


class ChatEncoder:
    """Encodes conversations of the Kimi schema (``SCHEMA``; fixed_sft.conversation):
    the Kimi fast path's ``fixed_sft.encoding.Encoder``."""

    schema = SCHEMA

    def __init__(
        self,
        tokenizer: KimiTokenizer,
        loss_mask_type: str = "kimi_k25",
        template_kwargs: dict | None = None,
        model_check: ModelCheck | None = None,
        probes: Path | None = None,
    ):
        if loss_mask_type not in MASK_TYPES:
            raise ValueError(f"unknown loss mask type {loss_mask_type!r} (known: {', '.join(MASK_TYPES)})")
        self.tokenizer = tokenizer
        self.template_kwargs = TEMPLATE_KWARGS if template_kwargs is None else template_kwargs
        self.model_check = model_check
        # the template's rules for reasoning, on its variables as Jinja tests them
        self._preserve = self.template_kwargs.get("preserve_thinking", False)
        self._empty_think = self.template_kwargs.get("thinking", _UNSET) is False and self._preserve is False
        key = _probe_key(tokenizer, self.template_kwargs) if model_check is None else None
        probed = _probed.get(tokenizer, {}).get(key) if key is not None else None
        kept = read_probes(probes) if probes is not None else None  # (by an earlier process, for the same inputs)
        probed = probed or kept
        if probed is not None:  # the same tokenizer and variables, probed already
            self._layouts, self._cannot_write_out = probed
            if probes is not None and kept is None:
                write_probes(probes, *probed)
            return
        self._layouts = {role: self._read_layout(role) for role in PLAIN_ROLES}
        self._cannot_write_out = ""  # why messages cannot be written out, when the probes found that they cannot
        self._check_probes()
        if probes is not None:
            write_probes(probes, self._layouts, self._cannot_write_out)
        if key is not None:
            _probed.setdefault(tokenizer, {})[key] = (self._layouts, self._cannot_write_out)

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
        messages that BPE joins) is refused before it is used. A template that renders the
        ``agentic_probes`` (tools, tool calls and results, reasoning before and after the
        last assistant message without tool calls, names, content parts) otherwise than the
        module docstring says is used only for conversations of plain messages
        (``encode_arrays`` refuses the others). A probe the template refuses to render (one
        that checks the roles alternate) is passed over; a template that renders none is
        refused. The build's sampled check covers what probes cannot."""
        template = self.tokenizer.directory / "chat_template.jinja"
        rendered, written, refusal = 0, 0, None
        probes: list[tuple[str, list[Message], list | None]] = []
        for roles in PROBE_CONVERSATIONS:
            for shift in range(len(_PROBE_CONTENTS)):
                messages = [
                    {"role": role, "content": _PROBE_CONTENTS[(k + shift) % len(_PROBE_CONTENTS)].format(k)}
                    for k, role in enumerate(roles)
                ]
                probes.append(("/".join(roles), messages, None))
        plain = len(probes)
        probes += agentic_probes()
        for n, (what, messages, tools) in enumerate(probes):
            try:
                expected = self.reference_ids(messages, tools)
            except TemplateRefusal as error:
                refusal = refusal or error
                continue
            if n < plain and self.encode_arrays(messages, tools)[0].tolist() != expected:
                self._raise_if_bpe_differs(messages, tools)
                raise TemplateMismatch(
                    f"{template}: the chat template does not render each message as its role's prefix + "
                    f"content + suffix, whatever the messages around it (a {what} conversation "
                    "differs), so its ids cannot be built per message"
                )
            if n >= plain and not self._cannot_write_out and self._write_out(messages, tools)[0].tolist() != expected:
                self._raise_if_bpe_differs(messages, tools)
                self._cannot_write_out = (  # (without the folder: kept for any copy of these files)
                    f"the chat template does not render {what} as the kimi_k25 encoder writes them "
                    f"(template variables {json.dumps(self.template_kwargs)}); it encodes only conversations of "
                    "roles system, user and assistant with string contents and no other key"
                )
            rendered += 1
            written += n >= plain
        if not rendered:
            raise TemplateMismatch(f"{template}: the chat template renders no probe conversation ({refusal})")
        if not written:
            self._cannot_write_out = (
                f"the chat template renders no probe conversation of tool calls, reasoning or names "
                f"({refusal}); it encodes only conversations of roles system, user and assistant with string "
                "contents and no other key"
            )

    def encode(self, messages: Sequence[Message], tools: list | None = None) -> tuple[list[int], list[int]]:
        """Token ids and loss mask of one conversation (fast path)."""
        ids, mask = self.encode_arrays(messages, tools)
        return ids.tolist(), mask.tolist()

    def encode_arrays(self, messages: Sequence[Message], tools: list | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``encode`` as int32 ids and uint8 mask arrays. A message of a role and a string
        content takes its role's layout; any other is written out (``_texts``), unless the
        probes found that the template does not render such messages as they are written
        (then ``TemplateMismatch``)."""
        if tools:
            return self._written(messages, tools)
        parts: list[np.ndarray] = []
        values: list[int] = []
        lengths: list[int] = []
        for message in messages:
            layout = self._layouts.get(message["role"])
            content = message.get("content")
            if layout is None or len(message) != 2 or type(content) is not str:
                return self._written(messages, tools)
            body = list(self.tokenizer.encode_pieces(content))  # a long content's pieces: joined once
            parts += (layout.prefix, *body, layout.suffix)
            values += (0, layout.body_mask)
            lengths += (layout.header, layout.size - layout.header + sum(map(len, body)))
        ids = np.concatenate(parts).view(np.int32) if parts else np.zeros(0, np.int32)
        return ids, np.repeat(np.array(values, dtype=np.uint8), lengths)

    def _is_plain(self, message: Message) -> bool:
        """Whether ``message`` is a role with a layout and a string content, and nothing else."""
        return len(message) == 2 and message["role"] in self._layouts and type(message.get("content")) is str

    def _written(self, messages: Sequence[Message], tools: list | None) -> tuple[np.ndarray, np.ndarray]:
        """``_write_out``, unless the probes found that the template renders otherwise."""
        if self._cannot_write_out:
            raise TemplateMismatch(f"{self.tokenizer.directory / 'chat_template.jinja'}: {self._cannot_write_out}")
        return self._write_out(messages, tools)

    def _write_out(self, messages: Sequence[Message], tools: list | None) -> tuple[np.ndarray, np.ndarray]:
        """``encode_arrays`` of a conversation with tools or messages that are not plain:
        the plain messages by their layouts, the others written out."""
        parts: list[np.ndarray] = []
        values: list[int] = []
        lengths: list[int] = []
        if tools:
            declaration = self.tokenizer.encode_to_numpy(self.declaration(tools))
            parts.append(declaration)
            values.append(0)
            lengths.append(len(declaration))
        reasoned_from = self._reasoned_from(messages)
        for k, message in enumerate(messages):
            if self._is_plain(message):
                layout = self._layouts[message["role"]]
                body = list(self.tokenizer.encode_pieces(message["content"]))
                parts += (layout.prefix, *body, layout.suffix)
                values += (0, layout.body_mask)
                lengths += (layout.header, layout.size - layout.header + sum(map(len, body)))
                continue
            header_text, body_text = self._texts(message, reasoned=k >= reasoned_from)
            header = self.tokenizer.encode_to_numpy(header_text)
            body = list(self.tokenizer.encode_pieces(body_text))
            parts += (header, *body)
            values += (0, int(message["role"] == "assistant"))
            lengths += (len(header), sum(map(len, body)))
        ids = np.concatenate(parts).view(np.int32) if parts else np.zeros(0, np.int32)
        return ids, np.repeat(np.array(values, dtype=np.uint8), lengths)

    def _reasoned_from(self, messages: Sequence[Message]) -> int:
        """The first message whose reasoning the template renders: the one after the last
        assistant message without tool calls (0 with ``preserve_thinking``, or none such)."""
        if self._preserve:
            return 0
        for k in range(len(messages) - 1, -1, -1):
            if messages[k]["role"] == "assistant" and not messages[k].get("tool_calls"):
                return k + 1
        return 0

    def _texts(self, message: Message, reasoned: bool) -> tuple[str, str]:
        """A message's header and body text as the template writes them (module docstring);
        ``reasoned``: whether it comes where the template renders reasoning."""
        role = message["role"]
        header = f"{HEADERS.get(role, '<|im_system|>')}{message.get('name') or role}<|im_middle|>"
        content = message.get("content")
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        else:
            text = "".join(part["text"] for part in content)
        if role == "tool":
            return header, f"## Return of {message['tool_call_id']}\n{text}<|im_end|>"
        if role != "assistant":
            return header, text + "<|im_end|>"
        reasoning: str = ""
        if reasoned and not self._empty_think:
            reasoning = message.get("reasoning", message.get("reasoning_content")) or ""
        calls = ""
        if message.get("tool_calls"):
            calls = "".join(
                f"<|tool_call_begin|>{call['id']}<|tool_call_argument_begin|>{_arguments(call)}<|tool_call_end|>"
                for call in message["tool_calls"]
            )
            calls = f"<|tool_calls_section_begin|>{calls}<|tool_calls_section_end|>"
        return header, f"<think>{reasoning}</think>{text}{calls}<|im_end|>"

    def declaration(self, tools: list) -> str:
        """The tool declaration message's text: ``TOOL_DECLARATION`` around the tools'
        declarations (``fixed_sft.tool_declarations.declare``); ``InvalidRow`` for tools
        that cannot be declared with certainty (nested too deeply). With ``model_check``
        (the model's own encoder, pinned), each distinct tools list is compared with it
        first: ``TemplateMismatch`` where they differ."""
        try:
            declared = declare(tools)
        except ValueError as error:
            raise InvalidRow(f"'tools' cannot be declared ({error})") from None
        if self.model_check is not None and (problem := self.model_check.check(tools, declared)) is not None:
            raise TemplateMismatch(problem)
        return declared.text.join(TOOL_DECLARATION)

    def render(
        self, messages: Sequence[Message], add_generation_prompt: bool = False, tools: list | None = None
    ) -> str:
        """The chat template rendered as transformers renders it for ``apply_chat_template``:
        with this tokenizer's special tokens (``bos_token``, ...) and the template arguments,
        and for ``tools`` as the model's tokenizer passes them (sorted by key, with their
        TypeScript-style text as ``tools_ts_str`` where it converts them)."""
        renderer = importlib.import_module(RENDERER_MODULE)  # heavy: imported only where rendering
        variables = {**self.tokenizer.special_tokens, **self.template_kwargs}
        if tools:  # as the model's apply_chat_template passes them
            try:
                variables["tools_ts_str"] = typescript_declarations(tools)
            except ToolDeclarationError:  # (the template declares them as JSON)
                pass
            tools = sort_keys(tools)
        rendered, _ = renderer.render_jinja_template(
            conversations=[messages],
            tools=tools or None,
            chat_template=self.tokenizer.chat_template,
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
        return rendered[0]

    def reference_ids(self, messages: Sequence[Message], tools: list | None = None) -> list[int]:
        """Token ids by rendering the template and encoding the text with tiktoken; ``TemplateRefusal``
        when the template refuses to render the conversation (an error it raises, as for
        roles out of the order it allows)."""
        return np.concatenate([np.zeros(0, np.uint32), *self._reference_pieces(messages, tools)]).tolist()

    def _reference_pieces(self, messages: Sequence[Message], tools: list | None = None) -> Iterator[np.ndarray]:
        """``reference_ids`` as the tokenizer's consecutive uint32 pieces (``encode_pieces``)."""
        try:
            text = self.render(messages, tools=tools)
        except Exception as error:  # whatever the template raises
            raise TemplateRefusal(
                f"the chat template refuses the conversation ({type(error).__name__}: {error})"
            ) from None
        return self.tokenizer.reference.encode_pieces(text)

    def _raise_if_bpe_differs(self, messages: Sequence[Message], tools: list | None) -> None:
        """Raise ``BPEMismatch`` where the fast BPE's ids of the rendered conversation differ
        from tiktoken's (then the BPE, not the template, explains a difference)."""
        if self.tokenizer.differs_from_reference(self.render(messages, tools=tools)):
            raise BPEMismatch(
                f"{self.tokenizer.bpe}'s ids of the rendered chat template differ from tiktoken's; {FAST_BPE_OFF}"
            )

    def check(self, messages: Sequence[Message], ids: np.ndarray, tools: list | None = None) -> None:
        """Raise ``TemplateMismatch`` unless ``ids`` equal the rendered template's ids, encoded
        with tiktoken (``TemplateRefusal`` when the template refuses to render the
        conversation, ``BPEMismatch`` when the fast BPE's ids of that text differ). The
        rendered text is encoded a piece at a time and each piece compared with its slice
        of ``ids`` as arrays: a long conversation's ids never become Python integers, and
        its reference ids are never all held at once."""
        ids = np.asanyarray(ids)
        offset = 0
        for piece in self._reference_pieces(messages, tools):
            end = offset + len(piece)
            if end > len(ids) or not np.array_equal(ids[offset:end], piece):
                break
            offset = end
        else:
            if offset == len(ids):
                return
        self._raise_if_bpe_differs(messages, tools)
        raise TemplateMismatch("fast-path ids differ from the rendered chat template")


_UNSET = object()
# What the probes found per tokenizer (loaded once per process for its files: fixed_sft.tokenizer.load_kimi)
# and template variables, for encoders without a model check: each role's layout, and why messages
# cannot be written out.
_probed: weakref.WeakKeyDictionary[KimiTokenizer, dict[tuple, tuple[dict[str, RoleLayout], str]]] = (
    weakref.WeakKeyDictionary()
)


PROBES_VERSION = 1  # of the probes file's contents (``write_probes``)


def write_probes(path: Path, layouts: dict[str, RoleLayout], cannot_write_out: str) -> None:
    """Keep the probes' outcome at ``path`` (its name is the sha256 of every input the probes
    depend on: ``fixed_sft.store.probes_path``), checked by a sha256 (``write_checked_json``)."""
    body = {
        "version": PROBES_VERSION,
        "layouts": {
            role: {"prefix": a.prefix.tolist(), "suffix": a.suffix.tolist(), "header": a.header, "mask": a.body_mask}
            for role, a in layouts.items()
        },
        "cannot_write_out": cannot_write_out,
    }
    write_checked_json(path, body)


def read_probes(path: Path) -> tuple[dict[str, RoleLayout], str] | None:
    """The probes' outcome kept at ``path`` (``write_probes``); ``None`` where there is no
    such file, or it is damaged (its contents do not match their sha256) or of another version.

    >>> import tempfile
    >>> one = RoleLayout(np.array([1, 2], np.uint32), np.array([3], np.uint32), header=1, body_mask=1)
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = Path(folder) / "probes.json"
    ...     write_probes(path, {role: one for role in PLAIN_ROLES}, "")
    ...     layouts, _ = read_probes(path)
    ...     _ = path.write_text(path.read_text().replace('"header": 1', '"header": 2'))
    ...     layouts["assistant"].prefix.tolist(), read_probes(path)
    ([1, 2], None)
    """
    body = read_checked_json(path)
    try:
        if not isinstance(body, dict) or body["version"] != PROBES_VERSION:
            return None
        layouts = {role: _layout(kept) for role, kept in body["layouts"].items()}
        if sorted(layouts) != sorted(PLAIN_ROLES):
            return None
        return layouts, str(body["cannot_write_out"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _layout(kept: dict) -> RoleLayout:
    """A ``RoleLayout`` as ``write_probes`` keeps it."""
    prefix, suffix = (np.array(kept[name], np.uint32) for name in ("prefix", "suffix"))
    prefix.flags.writeable = suffix.flags.writeable = False
    return RoleLayout(prefix, suffix, header=int(kept["header"]), body_mask=int(kept["mask"]))


def _probe_key(tokenizer: KimiTokenizer, template_kwargs: dict) -> tuple | None:
    """What the probes' outcome depends on beyond the tokenizer's files: the template variables
    (``None`` where they are not JSON) and which fast BPE is loaded now (a renewed one is probed again)."""
    try:
        variables = json.dumps(template_kwargs, sort_keys=True)
    except (TypeError, ValueError):
        return None
    return variables, tokenizer.fast_loads


def _arguments(call: Message) -> str:
    """A tool call's arguments as the template writes them: a string as it is, else as
    transformers' ``tojson`` writes it (``json.dumps``, non-ASCII kept)."""
    arguments = call["function"]["arguments"]
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)

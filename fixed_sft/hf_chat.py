"""The any-model path: conversation -> (token ids, loss mask) by rendering a Hugging Face chat template.

The tokenizer is a folder of Hugging Face tokenizer files (``tokenizer.json`` and
``tokenizer_config.json``; the chat template inside the config or in ``chat_template.jinja``),
loaded with transformers' ``AutoTokenizer``. A conversation's ids are
``tokenizer.apply_chat_template(messages, tokenize=True, **template_kwargs)["input_ids"]``:
the template is rendered as transformers renders it (its compiled template, the tokenizer's
special tokens and the template variables), and the text tokenized without added special
tokens. The build renders each conversation once and tokenizes a chunk's texts in one
batched call of the fast tokenizer; ``check`` compares with ``apply_chat_template`` itself.

Loss mask ``assistant``:

- A template with ``{% generation %}`` blocks: transformers' ``assistant_masks``
  (``return_assistant_tokens_mask=True``): every token that overlaps a block's characters is 1.
  Blocks are found in the parsed template (not in a comment; in any spelling). A block
  inside a macro, a ``{% set %}``, ``{% filter %}`` or ``{% call %}`` block or a recursive
  loop stops the build: transformers places its characters wrongly there.
- Any other template: assistant message ``k``'s characters are those that the rendering of
  ``messages[:k + 1]`` adds to the rendering of ``messages[:k]`` with the generation prompt;
  each token that overlaps them is 1, as transformers maps generation blocks to tokens.
  Both renderings must begin the conversation's rendering; where the generation prompt adds
  no text, the span must begin with the message's content, shown by rendering it with a
  marker before its content (else it would take in the assistant's header); and each
  message's span must begin where the one before it ended or later; and the text after a
  span must not go on with an added token (the tokenizer's special and control tokens)
  unless the span ends with it, or, where it is not the ``eos_token``, the span ends with
  the ``eos_token`` or with an added token the template also writes after the content of
  the nearest user message before the reply that has some (else after it; where none has,
  the conversation is refused), shown by rendering it with a marker after its content; a
  token that ends the reply's content, with nothing of the template's after it, is the
  content's. Else the template writes a reply's end only when another message follows, or
  a reply only the next turn's header ends (``end_follows``). A span that holds the
  ``eos_token`` ends with it or with such a turn's end (nothing after the end is the
  model's to write); what the template writes after the last reply's content but not
  where another message follows (an end-of-conversation token, a header written after
  the loop) is not the reply's (``_not_the_last_replys``). Where the generation prompt is
  only part of a reply's header, the rest is the reply's: the model writes it after the
  prompt, as at inference.
  Otherwise the conversation is an invalid row, never a guessed mask.

Refused: a conversation the template does not render (an error it raises, a type error) is an
invalid row; a template that reads the clock (``strftime_now``) stops the build, naming the
variable to pin in the template variables (``date_string`` for Llama 3 templates), so that a
rebuild renders the same text.
"""

from __future__ import annotations

import importlib
import json
import os
import threading
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from .conversation import InvalidRow, is_unicode
from .encoding import RENDERER_MODULE, Arrays, Message, MessageSchema, TemplateMismatch
from .fields import read_json_object
from .tokenizer import TokenizerError

MASK_TYPES = ("assistant",)
REQUIRED_FILES = ("tokenizer.json", "tokenizer_config.json")
# What AutoTokenizer reads of a fast tokenizer's folder besides REQUIRED_FILES, where present
# (config.json: the model type, which picks the tokenizer class where tokenizer_config.json names none).
OPTIONAL_FILES = (
    "chat_template.jinja",
    "chat_template.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "config.json",
)
ADDITIONAL_TEMPLATES = "additional_chat_templates"  # AutoTokenizer's folder of named templates (NAME.jinja)
# Every key of a message goes to the template, every role is the template's to accept: nothing is dropped.
SCHEMA = MessageSchema(name="hf", keys=None, roles=None, tools=True)
# apply_chat_template's own arguments: a template variable of one of these names would not reach the
# template as a variable (``tools`` and ``documents`` do, as apply_chat_template passes them).
RESERVED = frozenset(
    {
        "conversation",
        "messages",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "sanitize_control_tokens",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
        "strftime_now",
    }
)
# Names transformers' renderer takes for its own (``_render_with_assistant_indices``): a template
# variable of one of these names cannot reach the template through it.
RENDERER_RESERVED = frozenset({"compiled_template"})
# What apply_chat_template renders with (transformers 5), called here one step at a time:
RENDERER_FUNCTIONS = (
    "_compile_jinja_template",
    "_normalize_chat_messages",
    "_plain_template_data",
    "_alias_reasoning_fields",
    "_render_with_assistant_indices",
)
MARK = "\ue000\ue001"  # (private-use characters, which no template writes: where a content starts or ends)
MARK_JSON = json.dumps(MARK)[1:-1]  # (as ``tojson`` writes it)
PROBE = {"role": "user", "content": "next"}  # a message put after a conversation's last reply, to find its end
_PROBE = [{"role": "system", "content": "probe"}, {"role": "user", "content": "probe"}]
_PROBE_REPLY = {"role": "assistant", "content": "probe"}


def tokenizer_files(directory: Path, trust_remote_code: bool = False) -> list[str]:
    """The names of the files of ``directory`` that loading its tokenizer reads: ``REQUIRED_FILES``,
    those of ``OPTIONAL_FILES`` present, its named templates (``ADDITIONAL_TEMPLATES``: the
    ``tool_use`` one renders rows with tools) and, with ``trust_remote_code``, its ``*.py`` files."""
    names = [*REQUIRED_FILES, *(name for name in OPTIONAL_FILES if (directory / name).is_file())]
    named = (directory / ADDITIONAL_TEMPLATES).glob("*.jinja")
    names += sorted(f"{ADDITIONAL_TEMPLATES}/{path.name}" for path in named if path.is_file())
    if trust_remote_code:
        names += sorted(path.name for path in directory.glob("*.py"))
    return names


def remote_code_files(config_path: Path) -> list[str]:
    """The module files that ``tokenizer_config.json``'s ``auto_map`` names for the tokenizer
    (``tokenization_x.Class`` -> ``tokenization_x.py``), of this repo (not ``other/repo--...``)."""
    try:
        config = read_json_object(config_path, TokenizerError)
    except TokenizerError:
        return []
    references = config.get("auto_map", {}).get("AutoTokenizer") if isinstance(config.get("auto_map"), dict) else None
    references = references if isinstance(references, list) else [references]
    modules = {ref.rsplit(".", 1)[0] for ref in references if isinstance(ref, str) and "--" not in ref and "." in ref}
    return sorted(module.replace(".", "/") + ".py" for module in modules)


LOADED_CODE = ("AutoTokenizer", "AutoConfig")  # (config.json's AutoConfig: where the tokenizer's config names no class)


def foreign_code(directory: Path) -> tuple[str, str] | None:
    """The first ``auto_map`` reference to code in another repo (``other/repo--module.Class``)
    of the classes ``AutoTokenizer`` may load (``LOADED_CODE``: the model's own, such as
    ``AutoModelForCausalLM``, it never does), and the file naming it: transformers fetches
    such code from that repo's default branch, which no pin covers."""
    for name, classes in (("tokenizer_config.json", LOADED_CODE[:1]), ("config.json", LOADED_CODE)):
        if not (directory / name).is_file():
            continue
        try:
            config = read_json_object(directory / name, TokenizerError)
        except TokenizerError:
            continue  # (loading names what is wrong with it)
        auto_map = config.get("auto_map")
        if isinstance(auto_map, list):  # (the older form: the tokenizer's classes alone)
            auto_map = {"AutoTokenizer": auto_map}
        if not isinstance(auto_map, dict):
            continue
        for kind in classes:
            references = auto_map.get(kind)
            for reference in references if isinstance(references, list) else [references]:
                if isinstance(reference, str) and "--" in reference:
                    return name, reference
    return None


class ClockRead(TemplateMismatch):
    """The chat template reads the clock, so its text would differ from one day to the next:
    the build stops (when it reaches the conversation), as for a template check that fails."""


class _Clock(Exception):
    """Raised by the template's ``strftime_now`` while a conversation renders."""


def _no_clock(*args: object, **kwargs: object) -> str:
    raise _Clock


_loading = threading.Lock()
_loaded: dict[tuple, Any] = {}


def load_tokenizer(directory: Path, trust_remote_code: bool = False, key: tuple = ()) -> Any:
    """The fast tokenizer of ``directory`` (AutoTokenizer, ``trust_remote_code`` passed on),
    loaded once per process for each ``key`` (the files' hashes); ``TokenizerError`` for a
    folder it cannot load, a tokenizer that is not fast, or one without a chat template."""
    with _loading:
        found = _loaded.get((str(directory), trust_remote_code, key))
        if found is not None:
            return found
        from transformers import AutoTokenizer

        if trust_remote_code and (foreign := foreign_code(directory)) is not None:
            raise TokenizerError(
                f"{directory}: the auto_map of {foreign[0]} names code in another repo ({foreign[1]}), which "
                "transformers would fetch unpinned and unhashed; put that code in the folder"
            )
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(directory), trust_remote_code=trust_remote_code)
        except Exception as error:  # malformed files, remote code refused, an unknown tokenizer class
            raise TokenizerError(
                f"{directory}: transformers cannot load the tokenizer ({type(error).__name__}: {error})"
            ) from None
        if not getattr(tokenizer, "is_fast", False):
            raise TokenizerError(f"{directory}: {type(tokenizer).__name__} is not a fast tokenizer (tokenizer.json)")
        if not tokenizer.chat_template:
            raise TokenizerError(
                f"{directory}: the tokenizer has no chat template (tokenizer_config.json or chat_template.jinja)"
            )
        _loaded[(str(directory), trust_remote_code, key)] = tokenizer
        return tokenizer


def separator(tokenizer: Any, token: str | None) -> tuple[str, int]:
    """The token that follows each conversation and its id: ``token``, else the tokenizer's
    ``eos_token``; ``ValueError`` unless it is a single token of the vocabulary."""
    text = tokenizer.eos_token if token is None else token
    if text is None:
        raise ValueError("the tokenizer has no eos_token")
    vocabulary = tokenizer.get_vocab()
    if text not in vocabulary:
        raise ValueError(f"{text!r} is not a single token of the tokenizer's vocabulary")
    return text, int(vocabulary[text])


def clock_variables(template: Any, source: str) -> list[str]:
    """The variables that the template sets from ``strftime_now`` (``{% set X = strftime_now(...) %}``):
    pinning one in the template variables is how such a template avoids the clock."""
    from jinja2 import nodes

    names: list[str] = []
    for assign in template.environment.parse(source).find_all(nodes.Assign):
        calls = [node for node in (assign.node, *assign.node.find_all(nodes.Call)) if isinstance(node, nodes.Call)]
        if any(isinstance(call.node, nodes.Name) and call.node.name == "strftime_now" for call in calls):
            targets = [assign.target] if isinstance(assign.target, nodes.Name) else assign.target.find_all(nodes.Name)
            names += [target.name for target in targets]
    return sorted(set(names))


def token_mask(offsets: np.ndarray, spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """The uint8 mask of the tokens whose character offsets (``(start, end)`` rows) overlap the
    spans, by transformers' rule for ``assistant_masks``: going through the tokens once, pass
    the spans that end at or before a token's start; the token is 1 when it ends after the
    current span's start."""
    mask = np.zeros(len(offsets), np.uint8)
    if not spans or not len(offsets):
        return mask
    starts = np.array([a for a, _ in spans], np.int64)
    ends = np.array([b for _, b in spans], np.int64)
    token_starts, token_ends = offsets[:, 0], offsets[:, 1]
    if np.all(ends[1:] >= ends[:-1]) and np.all(token_starts[1:] >= token_starts[:-1]):
        first = np.searchsorted(ends, token_starts, side="right")  # the first span ending after the start
        inside = first < len(spans)
        mask[inside] = token_ends[inside] > starts[first[inside]]
        return mask
    current = 0  # spans or offsets out of order: the rule itself, token by token
    for n, (start, end) in enumerate(offsets.tolist()):
        while current < len(spans) and start >= spans[current][1]:
            current += 1
        if current == len(spans):
            break
        mask[n] = end > spans[current][0]
    return mask


class Marks:
    """A tokenizer's added tokens (its special tokens, its chat format's control tokens):
    which one a text begins or ends with (a set lookup per length).

    >>> marks = Marks(["</s>", "<|user|>", "<|u"])
    >>> marks.starting("<|user|>hi"), marks.starting("hi</s>"), marks.ending("hi</s>"), marks.ending("</s>hi")
    ('<|user|>', None, '</s>', None)
    """

    def __init__(self, tokens: Sequence[str]):
        self.tokens = frozenset(token for token in tokens if token)
        self.lengths = sorted({len(token) for token in self.tokens}, reverse=True)

    def starting(self, text: str) -> str | None:
        """The longest token ``text`` begins with, or ``None``."""
        return next((text[:n] for n in self.lengths if text[:n] in self.tokens), None)

    def ending(self, text: str) -> str | None:
        """The longest token ``text`` ends with, or ``None``."""
        return next((text[-n:] for n in self.lengths if text[-n:] in self.tokens), None)


def end_follows(
    text: str,
    through: str,
    marks: Marks,
    eos: str | None,
    bare: Callable[[str], bool] = lambda token: False,
    after: Callable[[str], bool] = lambda token: False,
    start: int = 0,
) -> str | None:
    """The token the template ends a reply with only when another message follows it, or
    ``None``: the added token ``text`` goes on with after the reply's ``through`` (the
    rendering up to the reply; white space aside; the reply's span begins at ``start``:
    an added token before it, such as its header's, is no end of the reply), unless ``through`` ends with that token,
    or the token is not the ``eos_token`` and ``through`` ends with the ``eos_token`` or with
    an added token the template writes after another turn's content too (``after``: a
    turn's end, as a tool call's closing token is not). Where the reply's content ends with
    its last token and the template writes nothing after it (``bare``), that token is the
    content's. The prefix rule
    would leave such an end 0 in every reply but the last (``{% if not loop.last %}{{
    eos_token }}{% endif %}``, a ``<|im_end|>`` written before the next message, or a next
    turn's ``<|user|>`` where turns have no end): the model would not learn to stop.

    >>> marks = Marks(["</s>", "<|user|>", "<|assistant|>", "<tool>", "<|end|>"])
    >>> end_follows("U: hi A: yo</s>U: ok", "U: hi A: yo", marks, "</s>")
    '</s>'
    >>> end_follows("U: hi A: yo</s>U: ok", "U: hi A: yo</s>", marks, "</s>")
    >>> end_follows("<|assistant|>yo<|user|>ok", "<|assistant|>yo", marks, "</s>")
    '<|user|>'
    >>> turns = lambda token: token == "<|end|>"  # (the template ends each turn with <|end|>)
    >>> end_follows("<|assistant|>yo<|end|><|user|>ok", "<|assistant|>yo<|end|>", marks, "</s>", after=turns)
    >>> end_follows("<|assistant|>yo<|end|></s><|user|>ok", "<|assistant|>yo<|end|>", marks, "</s>", after=turns)
    '</s>'
    >>> end_follows("A: <tool><|end|>U: ok", "A: <tool>", marks, "</s>", after=turns)
    '<|end|>'
    >>> end_follows("A: yo</s></s>U: ok", "A: yo</s>", marks, "</s>", bare=lambda token: True)
    '</s>'
    >>> end_follows("A: yo U: ok", "A: yo", marks, "</s>")
    >>> end_follows("<|assistant|><tool>U: ok", "<|assistant|>", marks, "</s>", start=13)  # (an empty reply)
    '<tool>'
    """
    token = marks.starting(text[len(through) :].lstrip())
    written = through.rstrip()
    last = marks.ending(written[start:])
    if token is None:
        return None
    if last is None or bare(last):
        return token  # (the template writes no end of its own)
    if written.endswith(token):
        return None
    if token == eos:
        return token
    return None if last == eos or after(last) else token


def _generation_blocks(template: Any, text: str) -> tuple[bool, str | None]:
    """Whether the template ``text`` has ``{% generation %}`` blocks (read from its parsed
    form: not from a comment, and in any of Jinja's spellings), and where one renders into
    a buffer rather than the output: ``line 3, inside a macro`` (or a ``{% set %}``,
    ``{% filter %}`` or ``{% call %}`` block, or a recursive loop); ``None`` where none
    does. transformers places a block's characters by the output written so far, which
    there does not hold the buffer's text."""
    import jinja2.nodes as nodes

    buffers = {
        nodes.Macro: "a macro",
        nodes.CallBlock: "a call block",
        nodes.AssignBlock: "a set block",
        nodes.FilterBlock: "a filter block",
    }
    found: list[str | None] = []  # (each block: where it is buffered, or None)

    def is_generation(node: Any) -> bool:
        call = getattr(node, "call", None)
        named = getattr(call, "node", None)
        return (
            isinstance(node, nodes.CallBlock)
            and isinstance(named, nodes.ExtensionAttribute)
            and named.name == "_generation_support"
        )

    def find(node: Any, inside: str | None) -> None:
        for child in node.iter_child_nodes():
            if is_generation(child):
                found.append(f"line {child.lineno}, inside {inside}" if inside else None)
                find(child, None)  # (a block inside it lies inside its span: no harm)
            elif isinstance(child, nodes.For) and child.recursive:
                find(child, inside or "a recursive loop")
            else:
                find(child, buffers.get(type(child), inside))

    find(template.environment.parse(text), None)
    return bool(found), next((where for where in found if where), None)


def _text_of(part: object) -> str | None:
    """A content part's text (``{"type": "text", "text": ...}``), or ``None``."""
    return part["text"] if isinstance(part, dict) and isinstance(part.get("text"), str) else None


class HFChatEncoder:
    """Encodes conversations through a Hugging Face chat template (module docstring): the
    any-model ``fixed_sft.encoding.Encoder``, which also encodes a chunk at once (``encode_batch``)."""

    schema = SCHEMA

    def __init__(self, tokenizer: Any, template_kwargs: dict | None = None, loss_mask_type: str = "assistant"):
        if loss_mask_type not in MASK_TYPES:
            raise ValueError(f"unknown loss mask type {loss_mask_type!r} (known: {', '.join(MASK_TYPES)})")
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        reserved = sorted(RESERVED & set(self.template_kwargs))
        if reserved:
            raise TokenizerError(f"template variable {reserved[0]!r} is an argument of apply_chat_template, not one")
        taken = sorted(RENDERER_RESERVED & set(self.template_kwargs))
        if taken:
            raise TokenizerError(f"template variable {taken[0]!r} is a name transformers' renderer takes for its own")
        renderer = importlib.import_module(RENDERER_MODULE)
        lacking = [name for name in RENDERER_FUNCTIONS if not hasattr(renderer, name)]
        if lacking:
            raise TokenizerError(f"this transformers' {RENDERER_MODULE} lacks {', '.join(lacking)}, which renders")
        self._renderer = renderer
        added = [token.content for token in tokenizer.added_tokens_decoder.values()]
        self._marks = Marks([*added, *tokenizer.all_special_tokens])
        tools, documents = self.template_kwargs.get("tools"), self.template_kwargs.get("documents")
        self._compiled: dict[str, tuple[Any, bool, list[str]]] = {}
        self._use(tools)
        variables = {key: value for key, value in self.template_kwargs.items() if key not in ("tools", "documents")}
        self._tools = renderer._plain_template_data(tools)
        self._documents = renderer._plain_template_data(documents)
        self._variables = renderer._plain_template_data({**tokenizer.special_tokens_map, **variables})
        try:
            self._render(self._chat([*_PROBE, _PROBE_REPLY]))
        except ClockRead:
            raise
        except Exception:  # a template that refuses the probe may render the build's conversations
            pass

    def _use(self, tools: Any) -> None:
        """Render with the template ``apply_chat_template`` picks for ``tools`` (a tokenizer
        with named templates has a ``tool_use`` one for calls with tools): compiled once per
        template, with whether it has generation blocks and the clock variables it reads."""
        try:
            text = self.tokenizer.get_chat_template(None, tools)
            if text not in self._compiled:
                template = self._renderer._compile_jinja_template(text)
                generation, buffered = _generation_blocks(template, text)
                if buffered:
                    raise TokenizerError(
                        f"the chat template cannot be used: its {{% generation %}} block at {buffered}, where "
                        "transformers counts the block's characters from the wrong place, so its masks would be wrong"
                    )
                self._compiled[text] = (template, generation, clock_variables(template, text))
        except TokenizerError:
            raise
        except Exception as error:  # several templates and none the default, Jinja syntax
            line = getattr(error, "lineno", None)  # (a Jinja syntax error's)
            where = f" at line {line}" if isinstance(line, int) else ""
            raise TokenizerError(
                f"the chat template{self._name(tools)} cannot be used ({type(error).__name__}{where}: {error})"
            ) from None
        self.chat_template = text
        self._template, self.generation, self._clock_names = self._compiled[text]

    def _name(self, tools: Any) -> str:
        """The named template ``apply_chat_template`` picks for ``tools``, as an error names it:
        `` 'tool_use' (for conversations with tools)``, `` 'default'``, or nothing (one template)."""
        named = self.tokenizer.chat_template
        if not isinstance(named, dict):
            return ""
        if tools is not None and "tool_use" in named:
            return " 'tool_use' (for conversations with tools)"
        return " 'default'" if "default" in named else ""

    def _chat(self, messages: Sequence[Message]) -> list[dict]:
        """The messages as the template sees them (transformers' plain copy, reasoning aliased)."""
        renderer = self._renderer
        return renderer._alias_reasoning_fields(
            renderer._plain_template_data(renderer._normalize_chat_messages(list(messages)))
        )

    def _clock(self) -> ClockRead:
        if self._clock_names:
            names = " or ".join(self._clock_names)
            return ClockRead(
                f"the chat template reads the clock (strftime_now) unless {names} is set: pin {names} in the "
                "template variables, so that a rebuild renders the same text"
            )
        return ClockRead("the chat template reads the clock (strftime_now), which no template variable can pin")

    def _render(
        self, chat: list[dict], add_generation_prompt: bool = False, track: bool = False, tools: Any = None
    ) -> tuple[str, list[tuple[int, int]]]:
        """The template's text of ``chat`` (``_chat``'s form) and, with ``track``, its
        generation blocks' character spans; ``ClockRead`` if it reads the clock. ``tools``:
        the conversation's, in the template's form (``None``: the template variables')."""
        arguments = {
            "tools": self._tools if tools is None else tools,
            "documents": self._documents,
            "add_generation_prompt": add_generation_prompt,
            **self._variables,
            "strftime_now": _no_clock,
        }
        try:
            if track:
                text, spans = self._renderer._render_with_assistant_indices(
                    compiled_template=self._template, messages=chat, **arguments
                )
                return text, [tuple(span) for span in spans]
            return self._template.render(messages=chat, **arguments), []
        except _Clock:
            raise self._clock() from None

    def _text_and_spans(
        self, messages: Sequence[Message], tools: list | None = None
    ) -> tuple[str, list[tuple[int, int]]]:
        """The conversation's text and the character spans of its mask (module docstring);
        ``InvalidRow`` naming why when there are none to be found unambiguously. ``tools``:
        the conversation's own (its ``tools`` column), passed to the template as
        ``apply_chat_template(tools=...)`` passes them."""
        chat = self._chat(messages)
        own = None if tools is None else self._renderer._plain_template_data(tools)
        self._use(self.template_kwargs.get("tools") if tools is None else tools)
        try:
            text, spans = self._render(chat, track=self.generation, tools=own)
        except ClockRead:
            raise
        except Exception as error:  # whatever the template raises
            raise InvalidRow(f"the chat template refuses the conversation ({type(error).__name__}: {error})") from None
        if not text.isascii() and not is_unicode(text):
            raise InvalidRow("the conversation's text has a lone surrogate")
        if self.generation:
            return text, spans
        end = 0
        for k, message in enumerate(chat):
            if message.get("role") != "assistant":
                continue
            before = self._before(chat, k, k, own, prompt=True)
            through = text if k == len(chat) - 1 else self._before(chat, k, k + 1, own)
            if not (text.startswith(through) and through.startswith(before)):
                raise InvalidRow(
                    f"assistant message {k}: the chat template's rendering of the messages up to it does not "
                    "begin the conversation's rendering, so its span is ambiguous"
                )
            plain = self._before(chat, k, k, own)
            if len(before) <= len(plain) and not self._content_first(chat, k, before, own):
                raise InvalidRow(
                    f"assistant message {k}: the chat template adds no generation prompt before it and its text "
                    "does not begin with its content, so its span would take in its header"
                )
            if len(before) < end:
                raise InvalidRow(f"assistant message {k}: its span would begin inside the one before it")
            if len(through) == len(before) and self._unwritten(chat, k, own, text):
                continue  # (a reply the template writes nothing of: no token to train, no end to find)
            bare = partial(self._bare, chat, k, own)
            prompt = before[len(plain) :] if before.startswith(plain) else ""
            after = partial(self._after_content, chat, k, own, prompt)
            eos = self.tokenizer.eos_token
            ending = end_follows(text, through, self._marks, eos, bare, after, len(before))
            if ending is not None:
                raise InvalidRow(
                    f"assistant message {k}: the chat template writes its end ({ending}) only when another "
                    "message follows, so the mask would leave it 0; mark replies with {% generation %} blocks"
                )
            if k == len(chat) - 1:
                through = text[: len(text) - self._not_the_last_replys(chat, k, own, text)]
                if len(through) < len(before):
                    raise InvalidRow(
                        f"assistant message {k}: the chat template writes other text after the last reply than "
                        "where another message follows it, so its span is ambiguous"
                    )
            written = through[len(before) :].rstrip()
            if eos and eos in written and not written.endswith(eos):
                last = self._marks.ending(written)
                if last is None or not after(last):
                    raise InvalidRow(
                        f"assistant message {k}: its span goes on after the eos_token ({eos}) with "
                        f"{written[written.rfind(eos) + len(eos) :]!r}, which the model would never write"
                    )
            if len(through) > len(before):  # (an empty span overlaps no token)
                spans.append((len(before), len(through)))
            end = len(through)
        return text, spans

    def _marked(self, chat: list[dict], j: int, k: int, own: Any, then: Sequence[dict] = ()) -> tuple[str, int] | None:
        """The rendering of ``chat[:j + 1]`` (and the messages ``then``) with ``MARK`` after
        message ``j``'s content (after its last text part, or as a part of its own after
        images), and where the mark ends in it (as written, or as JSON writes it);
        ``None`` where the content is neither text nor parts (none, an object), or the
        rendering drops the mark or refuses it."""
        content = chat[j].get("content")
        if isinstance(content, str):
            marked: object = content + MARK
        elif isinstance(content, list) and (texts := [n for n, p in enumerate(content) if _text_of(p) is not None]):
            last = texts[-1]
            marked = [*content[:last], {**content[last], "text": content[last]["text"] + MARK}, *content[last + 1 :]]
        elif isinstance(content, list):  # (images alone: a text part of the mark after them)
            marked = [*content, {"type": "text", "text": MARK}]
        else:
            return None
        try:
            rendered = self._before([*chat[:j], {**chat[j], "content": marked}, *then], k, j + 1 + len(then), own)
        except InvalidRow:
            return None
        for form in (MARK, MARK_JSON):
            if (at := rendered.rfind(form)) >= 0:
                return rendered, at + len(form)
        return None

    def _bare(self, chat: list[dict], k: int, own: Any, token: str) -> bool:
        """Whether reply ``k``'s content ends with ``token`` and the template writes nothing
        but white space after it."""
        content = chat[k].get("content")
        parts = [_text_of(part) for part in content] if isinstance(content, list) else [content]
        texts = [text for text in parts if isinstance(text, str)]
        if not texts or not texts[-1].rstrip().endswith(token):
            return False
        found = self._marked(chat, k, k, own)
        return found is not None and not found[0][found[1] :].strip()

    def _after_content(self, chat: list[dict], k: int, own: Any, prompt: str, token: str) -> bool:
        """Whether the template writes ``token`` after the content of the nearest user message
        before reply ``k`` that has content to mark (after the one before the reply, then the
        generation prompt, ``prompt``), else of the nearest after it: a turn's end, which every
        turn has. A user's turn alone, and ``False`` where none has content to mark: a system
        prompt's tool instructions or an assistant's tool call write a tool call's closing
        token after their content too."""
        nearest = [*range(k - 1, -1, -1), *range(k + 1, len(chat))]
        for j in (j for j in nearest if chat[j].get("role") == "user"):
            if (found := self._marked(chat, j, k, own)) is not None:
                rendered, at = found
                return token in rendered[at:] + (prompt if j == k - 1 else "")
        return False

    def _not_the_last_replys(self, chat: list[dict], k: int, own: Any, text: str) -> int:
        """How many characters at the end of ``text`` are not the last reply ``k``'s: what
        the template writes after the reply's content there, but not where another message
        (``PROBE``) follows it (an end-of-conversation token, a header written whatever
        comes next), from the first added token of it on; what the two have in common, up
        to an added token and the white space after it, is the reply's end. ``InvalidRow``
        where they have no added token in common. The content is found by ``MARK``; where
        it has none to mark, the renderings themselves must begin one another (else
        ``InvalidRow``: reasoning a template keeps for the last reply alone would part them
        inside the reply). With a mark, an earlier part rendered otherwise once the reply is
        not last (such reasoning) is not compared."""
        marked = self._marked(chat, k, k, own)
        probed = self._marked(chat, k, k, own, then=[PROBE]) if marked is not None else None
        if marked is None or probed is None:  # (no content to mark: where the two part, the reply may too)
            if self._before([*chat, PROBE], k, len(chat) + 1, own).startswith(text):
                return 0
            raise InvalidRow(
                f"assistant message {k}: the chat template renders the last reply, which has no content to mark, "
                "otherwise where another message follows it, so its span is ambiguous"
            )
        written, following = marked[0][marked[1] :], probed[0][probed[1] :]
        if following.startswith(written):
            return 0
        common = os.path.commonprefix([written, following])
        kept = next((n for n in range(len(common), 0, -1) if self._marks.ending(common[:n])), 0)
        kept += len(common[kept:]) - len(common[kept:].lstrip()) if kept else 0
        if not kept or not text.endswith(written):
            raise InvalidRow(
                f"assistant message {k}: the chat template writes other text after the last reply than where "
                "another message follows it, so its span is ambiguous; mark replies with {% generation %} blocks"
            )
        return len(written) - kept

    def _content_first(self, chat: list[dict], k: int, before: str, own: Any) -> bool:
        """Whether the text of assistant message ``k`` after ``before`` begins with its
        content (white space aside), shown by rendering it with ``MARK`` before its content:
        where the template adds no generation prompt, anything else first would be the
        reply's header (``<|im_start|>assistant``), which the mask must not take in, and a
        content that only looks like the header's start (``A`` before ``Assistant:``) does not
        pass for it."""
        content = chat[k].get("content")
        if not isinstance(content, str):
            return False
        marked = self._before([*chat[:k], {**chat[k], "content": MARK + content}], k, k + 1, own)
        return marked.startswith(before) and marked[len(before) :].lstrip().startswith(MARK)

    def _unwritten(self, chat: list[dict], k: int, own: Any, text: str) -> bool:
        """Whether the conversation renders as ``text`` without message ``k`` too: the
        template writes nothing of that reply, nor anything after it for it (an end)."""
        try:
            return self._render([*chat[:k], *chat[k + 1 :]], tools=own)[0] == text
        except ClockRead:
            raise
        except Exception:  # (a template that needs the reply there: it writes something of it)
            return False

    def _before(self, chat: list[dict], k: int, count: int, own: Any, prompt: bool = False) -> str:
        """The text of ``chat[:count]`` (with the generation prompt: ``prompt``), to find
        assistant message ``k``'s span; ``InvalidRow`` where the template refuses it."""
        try:
            return self._render(chat[:count], add_generation_prompt=prompt, tools=own)[0]
        except ClockRead:
            raise
        except Exception as error:
            raise InvalidRow(
                f"assistant message {k}: the chat template refuses the messages up to it, so its span "
                f"cannot be found ({type(error).__name__}: {error})"
            ) from None

    def encode_batch(
        self, conversations: Sequence[Sequence[Message]], tools: Sequence[list | None] | None = None
    ) -> list[Arrays | InvalidRow | ClockRead]:
        """Each conversation's int32 ids and uint8 mask, or the ``InvalidRow`` it is, or the
        ``ClockRead`` that stops the build there: the texts rendered one at a time, tokenized
        in one batched call. ``tools``: each conversation's tools (``None``: none)."""
        found: list[tuple[str, list[tuple[int, int]]] | InvalidRow | ClockRead] = []
        for k, messages in enumerate(conversations):
            try:
                found.append(self._text_and_spans(messages, None if tools is None else tools[k]))
            except (InvalidRow, ClockRead) as error:
                found.append(error)
        texts = [item[0] for item in found if isinstance(item, tuple)]
        encodings = iter(self._encodings(texts))
        results: list[Arrays | InvalidRow | ClockRead] = []
        for item in found:
            if not isinstance(item, tuple):
                results.append(item)
                continue
            encoding = next(encodings)
            ids = np.array(encoding.ids, dtype=np.int32)
            if item[1]:
                offsets = np.array(encoding.offsets, dtype=np.int64).reshape(-1, 2)
                results.append((ids, token_mask(offsets, item[1])))
            else:
                results.append((ids, np.zeros(len(ids), np.uint8)))
        return results

    def _encodings(self, texts: list[str]) -> list:
        """The fast tokenizer's encodings of ``texts``, as ``apply_chat_template`` tokenizes
        its text (no special tokens added), in one batched call."""
        if not texts:
            return []
        # (verbose=False: no warning that a conversation is longer than the model's context; rows cut it)
        out = self.tokenizer(texts, add_special_tokens=False, return_attention_mask=False, verbose=False)
        return out.encodings

    def encode_arrays(self, messages: Sequence[Message], tools: list | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One conversation's int32 ids and uint8 mask; ``InvalidRow`` when it is refused."""
        result = self.encode_batch([messages], [tools])[0]
        if not isinstance(result, tuple):
            raise result
        return result

    def encode(self, messages: Sequence[Message]) -> tuple[list[int], list[int]]:
        """``encode_arrays`` as lists."""
        ids, mask = self.encode_arrays(messages)
        return ids.tolist(), mask.tolist()

    def reference_ids(self, messages: Sequence[Message], tools: list | None = None) -> list[int]:
        """``apply_chat_template(messages, tools=tools, tokenize=True, **template_kwargs)``'s ids
        (the conversation's tools, where it has any, else the template variables')."""
        kwargs = dict(self.template_kwargs)
        if tools is not None:
            kwargs["tools"] = tools
        out = self.tokenizer.apply_chat_template(list(messages), tokenize=True, **kwargs)
        return list(out["input_ids"])

    def check(self, messages: Sequence[Message], ids: np.ndarray, tools: list | None = None) -> None:
        """Raise ``TemplateMismatch`` unless ``ids`` are ``apply_chat_template``'s ids."""
        try:
            expected = self.reference_ids(messages, tools)
        except Exception as error:
            raise TemplateMismatch(
                f"apply_chat_template refuses a conversation this encoder encoded ({type(error).__name__}: {error})"
            ) from None
        if not np.array_equal(np.asarray(ids), np.array(expected, dtype=np.int64)):
            raise TemplateMismatch("the ids differ from apply_chat_template's")

"""Plain, independent reference for the Kimi-K2.6 tokenizer's chat path.

Used only by tests, to check a fast implementation. It is deliberately slow and
simple: every step goes through transformers' own slow-tokenizer machinery
(``PythonBackend``: chat-template rendering, added-token Trie split, token->id
lookup) plus a literal per-character transcription of Kimi's long-run rule.

The real path is ``AutoTokenizer.from_pretrained(kimi_dir, trust_remote_code=True)
.apply_chat_template(messages, tools=tools, tokenize=True, add_generation_prompt=...)["input_ids"]``,
whose rules are:

0. The model's ``apply_chat_template`` sorts every dict in ``tools`` by key, at any
   depth, and, where ``tools`` is not empty, passes their TypeScript-style text as
   ``tools_ts_str`` (none where the conversion raises) beside the sorted ``tools``.
1. ``chat_template.jinja`` is rendered by transformers' renderer with the template
   kwargs (by default ``thinking=True, preserve_thinking=False``).
2. The text is split on the 23 added tokens of ``tokenizer_config.json``'s
   ``added_tokens_decoder`` (transformers' Trie split); each becomes its id.
3. Every other piece is cut into 400,000-char windows; each window is cut just
   before any character that would make a run of consecutive whitespace, or of
   consecutive non-whitespace, characters (``str.isspace``) longer than 25,000
   (the run restarts at 1 after a cut; a window's first char starts a run of 1);
   each part is encoded by tiktoken with ``allowed_special="all"``.
4. The tiktoken Encoding: ranks from ``tiktoken.model`` (163,584), special ids
   163584..163839 named from ``added_tokens_decoder`` or else
   ``<|reserved_token_{id}|>``, and ``PAT_STR`` below.

Token strings (what ``_tokenize`` returns) are the GPT-2 ``bytes_to_unicode``
image of each rank's bytes, and the special name for special ids; the
constructor checks that this is a bijection that collides with no added token.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from transformers import AddedToken
from transformers.tokenization_python import PythonBackend
from transformers.utils.chat_template_utils import render_jinja_template

PAT_STR: str = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
NUM_RANKS: int = 163_584
NUM_SPECIAL: int = 256
WINDOW_CHARS: int = 400_000
MAX_RUN: int = 25_000
TEMPLATE_KWARGS: dict[str, Any] = {"thinking": True, "preserve_thinking": False}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode char map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def split_long_runs(text: str) -> list[str]:
    """Rule 3, literally: 400,000-char windows, then cut before a char that would
    make a whitespace / non-whitespace run longer than 25,000."""
    parts: list[str] = []
    for w in range(0, len(text), WINDOW_CHARS):
        window = text[w : w + WINDOW_CHARS]
        start = 0
        run = 0
        run_is_space = False
        for i, ch in enumerate(window):
            is_space = ch.isspace()
            if i == 0 or is_space != run_is_space:
                run = 1
                run_is_space = is_space
            else:
                run += 1
                if run > MAX_RUN:
                    parts.append(window[start:i])
                    start = i
                    run = 1
        parts.append(window[start:])
    return parts


class KimiSlowTokenizer(PythonBackend):
    """Minimal transformers slow tokenizer: ``_tokenize`` = rules 3-4; the base
    class does the added-token Trie split (rule 2) and the chat template (rule 1)."""

    def __init__(self, tokenizer_dir: str | Path, **kwargs: Any) -> None:
        d = Path(tokenizer_dir)
        config = json.loads((d / "tokenizer_config.json").read_text())
        ranks = load_tiktoken_bpe(str(d / "tiktoken.model"))
        assert len(ranks) == NUM_RANKS and sorted(ranks.values()) == list(range(NUM_RANKS))
        added = {int(i): v for i, v in config["added_tokens_decoder"].items()}
        special = {
            (added[i]["content"] if i in added else f"<|reserved_token_{i}|>"): i
            for i in range(NUM_RANKS, NUM_RANKS + NUM_SPECIAL)
        }
        self.enc = tiktoken.Encoding(
            name="kimi-k2.6-reference", pat_str=PAT_STR, mergeable_ranks=ranks, special_tokens=special
        )
        b2u = bytes_to_unicode()
        self.id_to_tok: dict[int, str] = {i: "".join(b2u[b] for b in bs) for bs, i in ranks.items()}
        self.id_to_tok.update({i: s for s, i in special.items()})
        self.tok_to_id: dict[str, int] = {s: i for i, s in self.id_to_tok.items()}
        # Bijection, and no rank string equals a special name (so no added token
        # can be confused with an ordinary piece by the base class' lookup).
        assert len(self.tok_to_id) == len(self.id_to_tok) == NUM_RANKS + NUM_SPECIAL
        assert all(self.tok_to_id[s] == i for s, i in special.items())

        added_tokens_decoder = {
            i: AddedToken(
                v["content"],
                lstrip=v["lstrip"],
                rstrip=v["rstrip"],
                single_word=v["single_word"],
                normalized=v["normalized"],
                special=v["special"],
            )
            for i, v in added.items()
        }
        super().__init__(
            added_tokens_decoder=added_tokens_decoder,
            bos_token=config["bos_token"],
            eos_token=config["eos_token"],
            unk_token=config["unk_token"],
            pad_token=config["pad_token"],
            additional_special_tokens=config["additional_special_tokens"],  # 5.x: -> extra_special_tokens
            chat_template=(d / "chat_template.jinja").read_text(),
            clean_up_tokenization_spaces=False,
            model_max_length=10**30,
            **kwargs,
        )

    @property
    def vocab_size(self) -> int:
        return NUM_RANKS + NUM_SPECIAL

    def get_vocab(self) -> dict[str, int]:
        return dict(self.tok_to_id)

    def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
        ids: list[int] = []
        for part in split_long_runs(text):
            ids.extend(self.enc.encode(part, allowed_special="all"))
        return [self.id_to_tok[i] for i in ids]

    def _convert_token_to_id(self, token: str) -> int:
        return self.tok_to_id[token]

    def _convert_id_to_token(self, index: int) -> str:
        return self.id_to_tok[index]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return self.enc.decode([self.tok_to_id[t] for t in tokens])


def deep_sorted(value: Any) -> Any:
    """Rule 0's sort: every dict's items by key, through dicts and lists."""
    if isinstance(value, dict):
        return {key: deep_sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [deep_sorted(item) for item in value]
    return value


def typescript(tools: list[dict[str, Any]]) -> str:
    """Rule 0's conversion (the declaration converter, fixed_sft.tool_declarations, which
    has its own tests against the model's)."""
    from fixed_sft.tool_declarations import typescript_declarations

    return typescript_declarations(tools)


class ReferenceKimi:
    """Reference ids / text / assistant mask for Kimi-K2.6 chats."""

    def __init__(self, tokenizer_dir: str | Path, template_kwargs: dict[str, Any] | None = None) -> None:
        self.tok = KimiSlowTokenizer(tokenizer_dir)
        self.template_kwargs = TEMPLATE_KWARGS if template_kwargs is None else template_kwargs
        trie_tokens = set(self.tok.tokens_trie._tokens)
        assert len(trie_tokens) == 23 and trie_tokens == set(self.tok.get_added_vocab()), trie_tokens

    def encode(self, text: str) -> list[int]:
        """Rules 2-4 (no template, no BOS/EOS)."""
        return list(self.tok.encode(text, add_special_tokens=False))

    def _arguments(self, tools: list[dict[str, Any]] | None) -> dict[str, Any]:
        """Rule 0: what the model's ``apply_chat_template`` adds for ``tools``, with the template kwargs."""
        arguments: dict[str, Any] = dict(self.template_kwargs)
        if tools is not None:
            arguments["tools"] = deep_sorted(tools)
            if tools:
                try:
                    arguments["tools_ts_str"] = typescript(arguments["tools"])
                except Exception:  # the model's tokenizer falls back to JSON on any error
                    pass
        return arguments

    def render(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = False, tools: list | None = None
    ) -> str:
        """Rules 0-1: the rendered template text."""
        out = self.tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **self._arguments(tools)
        )
        assert isinstance(out, str)
        return out

    def chat_ids(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = False, tools: list | None = None
    ) -> list[int]:
        """Rules 0-4, through ``apply_chat_template(tokenize=True)`` (5.x returns a
        BatchEncoding by default; we read ``input_ids``)."""
        out = self.tok.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=add_generation_prompt, **self._arguments(tools)
        )
        return list(out if isinstance(out, list) else out["input_ids"])

    def generation_mask(self, messages: list[dict[str, Any]], tools: list | None = None) -> list[int]:
        """``kimi_k25`` mask by transformers' ``{% generation %}`` spans, for any
        conversation (the split of history from the last turns makes prefixes render
        otherwise than the whole): the template with each assistant message's part after
        its header, through its ``<|im_end|>``, wrapped in generation blocks (checked to
        render the same text), rendered with ``return_assistant_tokens_mask``; a token is 1
        when its bytes lie in a span."""
        template = self.tok.chat_template
        edits = [
            (
                "{%- if message['role'] == 'assistant' -%}\n    <think></think>",
                "{%- if message['role'] == 'assistant' -%}{% generation -%}\n    <think></think>",
                1,
            ),
            (
                "{%- if message['role'] == 'assistant' -%}\n    {%- if thinking",
                "{%- if message['role'] == 'assistant' -%}{% generation -%}\n    {%- if thinking",
                1,
            ),
            (
                "  {%- elif message['role'] == 'tool' -%}",
                "  {% endgeneration %}{%- elif message['role'] == 'tool' -%}",
                2,
            ),
            (
                "  <|im_end|>\n{%- endfor -%}",
                "  {%- if message['role'] == 'assistant' -%}{% generation %}<|im_end|>{% endgeneration %}"
                "{%- else -%}<|im_end|>{%- endif -%}\n{%- endfor -%}",
                2,
            ),
        ]
        for old, new, count in edits:
            assert template.count(old) == count, old
            template = template.replace(old, new)
        arguments = self._arguments(tools)
        tools_given = arguments.pop("tools", None)
        rendered, spans = render_jinja_template(
            conversations=[messages],
            tools=tools_given,
            chat_template=template,
            return_assistant_tokens_mask=True,
            **{**self.tok.special_tokens_map, **arguments},
        )
        text = rendered[0]
        assert text == self.render(messages, tools=tools), "the generation blocks change the rendered text"
        ids = self.encode(text)
        ends = list(itertools.accumulate(len(self.tok.enc.decode_single_token_bytes(i)) for i in ids))
        assert ends[-1:] == [len(text.encode())], "the tokens do not cover the text"
        byte_spans = [(len(text[:a].encode()), len(text[:b].encode())) for a, b in spans[0]]
        return [
            int(any(a <= end - size and end <= b for a, b in byte_spans))
            for end, size in zip(ends, (len(self.tok.enc.decode_single_token_bytes(i)) for i in ids))
        ]

    def _gen_prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """``chat_ids(messages, add_generation_prompt=True)``; for an empty prefix
        (which ``apply_chat_template`` refuses) the template is rendered directly
        with transformers' renderer and encoded."""
        if messages:
            return self.chat_ids(messages, add_generation_prompt=True)
        text, _ = render_jinja_template(
            conversations=[[]],
            chat_template=self.tok.chat_template,
            add_generation_prompt=True,
            **{**self.tok.special_tokens_map, **self.template_kwargs},
        )
        return self.encode(text[0])

    def chat_mask(self, messages: list[dict[str, Any]], tools: list | None = None) -> list[int]:
        """``kimi_k25`` assistant-only loss mask by prefix rendering (``generation_mask``
        for a conversation with tools or with a message of more than a role and a string
        content, whose prefixes may render otherwise than the whole).

        Rule: for each assistant message its role header (``<|im_assistant|>``,
        the name tokens, ``<|im_middle|>``) is 0; every token the template emits for
        it after the header through its closing ``<|im_end|>`` is 1; all else 0.

        Computed as: for assistant message k, positions
        ``[header_end, len(chat_ids(messages[:k+1])))`` are 1, where
        ``header_end = len(chat_ids(messages[:k], add_generation_prompt=True)) - 1``
        (the generation prompt is header + ``<think>``, or ``<think></think>`` when
        ``thinking`` is false). If the message carries a
        ``name`` other than "assistant", the header is ``<|im_assistant|>`` +
        encode(name) + ``<|im_middle|>`` instead (checked against the tokens).
        Asserts prefix stability: chat_ids(messages[:k]) is a prefix of
        chat_ids(messages[:k+1]), which is a prefix of chat_ids(messages).
        """
        if tools or not all(len(m) == 2 and isinstance(m.get("content"), str) for m in messages):
            return self.generation_mask(messages, tools)
        full = self.chat_ids(messages)
        mask = [0] * len(full)
        im_assistant, im_middle, think, end_think = self.tok.convert_tokens_to_ids(
            ["<|im_assistant|>", "<|im_middle|>", "<think>", "</think>"]
        )
        for k, msg in enumerate(messages):
            if msg["role"] != "assistant":
                continue
            upto = self.chat_ids(messages[: k + 1])
            assert full[: len(upto)] == upto, f"prefix instability: messages[:{k + 1}] vs full"
            before = self.chat_ids(messages[:k]) if k > 0 else []
            assert upto[: len(before)] == before, f"prefix instability: messages[:{k}] vs messages[:{k + 1}]"
            prompt = self._gen_prompt_ids(messages[:k])
            opened = [think] if prompt[-1] == think else [think, end_think]  # (``thinking`` false: closed)
            assert prompt[: len(before)] == before and prompt[-len(opened) :] == opened
            header_end = len(prompt) - len(opened)
            name = msg.get("name") or "assistant"
            if name != "assistant":
                header_end = len(before) + 2 + len(self.encode(name))
            header = [im_assistant] + self.encode(name) + [im_middle]
            assert upto[len(before) : header_end] == header, f"unexpected header for message {k}"
            for i in range(header_end, len(upto)):
                mask[i] = 1
        return mask

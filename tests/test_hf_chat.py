"""The any-model path: ids and masks equal transformers' own apply_chat_template on the same files.

The tokenizer is ../shared/tokenizers/deepseek-v4 (a real fast tokenizer without a chat
template) in a folder beside a template written here. Oracles: ``apply_chat_template(...,
tokenize=True)`` for ids, and ``return_assistant_tokens_mask=True`` for masks: a template
without ``{% generation %}`` is compared with the same template whose assistant text is
wrapped in a generation block, which renders the same text.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import messages as conversations

from fixed_sft.conversation import InvalidRow, conversation
from fixed_sft.hf_chat import SCHEMA, ClockRead, HFChatEncoder, load_tokenizer, separator, token_mask
from fixed_sft.tokenizer import TokenizerError

# ChatML, the assistant's text (its content and <|im_end|>\n) in a generation block, or not
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}[[{{ message['content'] + '<|im_end|>\\n' }}]]"
    "{% else %}{{ message['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# DeepSeek style: tools in the system part, tool calls, tool outputs, <｜end▁of▁sentence｜> after each reply
DEEPSEEK = (
    "{{ bos_token }}{% if tools %}{{ 'Tools: ' + (tools | tojson) + '\\n' }}{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}"
    "{% elif message['role'] == 'user' %}{{ '<｜User｜>' + message['content'] }}"
    "{% elif message['role'] == 'assistant' %}{{ '<｜Assistant｜>' }}[["
    "{% if message['content'] %}{{ message['content'] }}{% endif %}"
    "{% if message.get('tool_calls') %}{{ '<｜tool▁calls▁begin｜>' }}{% for call in message['tool_calls'] %}"
    "{{ '<｜tool▁call▁begin｜>' + call['type'] + '<｜tool▁sep｜>' + call['function']['name'] + '\\n```json\\n'"
    " + call['function']['arguments'] + '\\n```<｜tool▁call▁end｜>' }}{% endfor %}{{ '<｜tool▁calls▁end｜>' }}"
    "{% endif %}{{ '<｜end▁of▁sentence｜>' }}]]"
    "{% elif message['role'] == 'tool' %}{{ '<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>' }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}"
)
# Llama 3 style: the date from the clock unless date_string is set
LLAMA3 = (
    "{{- bos_token }}"
    "{%- if not date_string is defined %}{%- if strftime_now is defined %}"
    '{%- set date_string = strftime_now("%d %b %Y") %}{%- else %}{%- set date_string = "26 Jul 2024" %}'
    "{%- endif %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\nToday Date: ' + date_string + '\\n\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] | trim }}"
    "{%- set messages = messages[1:] %}{%- endif %}{{- '<|eot_id|>' }}"
    "{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{%- if message['role'] == 'assistant' %}[[{{- message['content'] | trim + '<|eot_id|>' }}]]"
    "{%- else %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
# ChatML joined sloppily: a newline before each message but the first, none before the generation prompt
SLOPPY = (
    "{% for message in messages %}{% if not loop.first %}{{ '\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
ALTERNATING = (
    "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}"
    "{{ message['role'] + ': ' + message['content'] + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)


def _plain(template: str) -> str:
    return template.replace("[[", "").replace("]]", "")


def _generation(template: str) -> str:
    return template.replace("[[", "{% generation %}").replace("]]", "{% endgeneration %}")


@pytest.fixture(scope="session")
def folder_of(deepseek_dir, tmp_path_factory):
    """``folder_of(template, in_config=False)``: a tokenizer folder of the DeepSeek-V4 files and
    ``template`` (in chat_template.jinja, or inside tokenizer_config.json)."""
    made: dict[tuple[str, bool], Path] = {}

    def make(template: str, in_config: bool = False) -> Path:
        if (template, in_config) not in made:
            folder = tmp_path_factory.mktemp("hf")
            (folder / "tokenizer.json").symlink_to(deepseek_dir / "tokenizer.json")
            config = json.loads((deepseek_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
            if in_config:
                config["chat_template"] = template
            else:
                (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
            (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
            made[template, in_config] = folder
        return made[template, in_config]

    return make


@pytest.fixture(scope="session")
def oracle_of(folder_of):
    """transformers' own tokenizer of a folder (loaded apart from the encoder's)."""
    from transformers import AutoTokenizer

    loaded: dict[Path, object] = {}

    def load(template: str, in_config: bool = False):
        folder = folder_of(template, in_config)
        if folder not in loaded:
            loaded[folder] = AutoTokenizer.from_pretrained(str(folder))
        return loaded[folder]

    return load


@pytest.fixture(scope="session")
def encoder_of(folder_of):
    def make(template: str, template_kwargs: dict | None = None, in_config: bool = False) -> HFChatEncoder:
        return HFChatEncoder(load_tokenizer(folder_of(template, in_config)), template_kwargs)

    return make


def _oracle(oracle, messages, **kwargs) -> tuple[list[int], list[int]]:
    out = oracle.apply_chat_template(messages, tokenize=True, return_assistant_tokens_mask=True, **kwargs)
    return list(out["input_ids"]), list(out["assistant_masks"])


def _ids(oracle, messages, **kwargs) -> list[int]:
    return list(oracle.apply_chat_template(messages, tokenize=True, **kwargs)["input_ids"])


CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": " and <|im_end|> 3+3?\n"},
    {"role": "assistant", "content": "  6 \n"},
]


@pytest.mark.parametrize("in_config", [False, True])
def test_chatml_with_generation_blocks_is_transformers_assistant_masks(encoder_of, oracle_of, in_config):
    encoder = encoder_of(_generation(CHATML), in_config=in_config)
    assert encoder.generation
    ids, mask = encoder.encode(CHAT)
    assert (ids, mask) == _oracle(oracle_of(_generation(CHATML), in_config), CHAT)
    assert 0 < sum(mask) < len(mask)


def test_chatml_without_generation_blocks_masks_what_each_reply_adds(encoder_of, oracle_of):
    encoder = encoder_of(_plain(CHATML))
    assert not encoder.generation
    ids, mask = encoder.encode(CHAT)
    assert ids == _ids(oracle_of(_plain(CHATML)), CHAT)
    assert (ids, mask) == _oracle(oracle_of(_generation(CHATML)), CHAT)  # the same text, blocks where replies are


@settings(max_examples=60, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(max_turns=8, long_one_in=10))
def test_chatml_parity_on_generated_conversations(encoder_of, oracle_of, messages):
    expected = _oracle(oracle_of(_generation(CHATML)), messages)
    for template in (_generation(CHATML), _plain(CHATML)):
        assert encoder_of(template).encode(messages) == expected


TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
CALL = [{"type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]
TOOL_CHAT = [
    {"role": "system", "content": "You add."},
    {"role": "user", "content": "1+2?"},
    {"role": "assistant", "content": "", "tool_calls": CALL},
    {"role": "tool", "content": "3"},
    {"role": "assistant", "content": "It is 3."},
    {"role": "user", "content": "thanks"},
    {"role": "assistant", "tool_calls": CALL},
]


def test_deepseek_tool_calls_every_key_reaches_the_template(encoder_of, oracle_of):
    valid = conversation({"messages": TOOL_CHAT}, SCHEMA).messages
    assert valid == TOOL_CHAT  # no key dropped
    for template in (_generation(DEEPSEEK), _plain(DEEPSEEK)):
        encoder = encoder_of(template, {"tools": TOOLS})
        ids, mask = encoder.encode(valid)
        assert ids == _ids(oracle_of(template), valid, tools=TOOLS)
        assert (ids, mask) == _oracle(oracle_of(_generation(DEEPSEEK)), valid, tools=TOOLS)
        assert oracle_of(template).convert_tokens_to_ids("<｜tool▁calls▁begin｜>") in [
            t for t, m in zip(ids, mask) if m
        ]


def test_a_conversations_own_tools_reach_the_template(encoder_of, oracle_of):
    """The row's ``tools`` column (a list, or a JSON string of one) is each conversation's
    own ``apply_chat_template(tools=...)``: two rows with other tools render other ids."""
    other = [{"type": "function", "function": {"name": "mul", "parameters": {"type": "object"}}}]
    for template in (_generation(DEEPSEEK), _plain(DEEPSEEK)):
        encoder = encoder_of(template)
        rows = [{"messages": TOOL_CHAT, "tools": TOOLS}, {"messages": TOOL_CHAT, "tools": json.dumps(other)}]
        parsed = [conversation(row, encoder.schema) for row in rows]
        assert [c.tools for c in parsed] == [TOOLS, other]
        results = encoder.encode_batch([c.messages for c in parsed], [c.tools for c in parsed])
        for (ids, mask), tools in zip(results, (TOOLS, other)):
            assert (ids.tolist(), mask.tolist()) == _oracle(oracle_of(_generation(DEEPSEEK)), TOOL_CHAT, tools=tools)
            encoder.check(TOOL_CHAT, ids, tools)
        assert results[0][0].tolist() != results[1][0].tolist()


def test_a_conversation_with_tools_uses_the_tool_use_template(deepseek_dir, oracle_of, tmp_path):
    """Named templates: ``apply_chat_template`` renders with ``tool_use`` when it is given
    tools, and so does the encoder, per conversation."""
    from transformers import AutoTokenizer

    config = json.loads((deepseek_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = [
        {"name": "default", "template": _plain(CHATML)},
        {"name": "tool_use", "template": "TOOLS {{ tools | tojson }}\n" + _generation(CHATML)},
    ]
    (tmp_path / "tokenizer.json").symlink_to(deepseek_dir / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    encoder, oracle = HFChatEncoder(load_tokenizer(tmp_path)), AutoTokenizer.from_pretrained(str(tmp_path))
    with_tools, without, again = encoder.encode_batch([CHAT, CHAT, CHAT], [TOOLS, None, TOOLS])
    assert (with_tools[0].tolist(), with_tools[1].tolist()) == _oracle(oracle, CHAT, tools=TOOLS)
    assert (again[0].tolist(), again[1].tolist()) == _oracle(oracle, CHAT, tools=TOOLS)
    assert without[0].tolist() == _ids(oracle, CHAT) != with_tools[0].tolist()
    assert without[1].tolist() == _oracle(oracle_of(_generation(CHATML)), CHAT)[1]


def test_a_broken_tool_use_template_is_named_when_a_conversation_needs_it(deepseek_dir, tmp_path):
    """Rows without tools render with the default template; the first with tools stops the
    build, naming the ``tool_use`` template and the line of its error."""
    config = json.loads((deepseek_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = [
        {"name": "default", "template": _plain(CHATML)},
        {"name": "tool_use", "template": "{% for m in messages %}\n{{ m.content + }}\n{% endfor %}"},
    ]
    (tmp_path / "tokenizer.json").symlink_to(deepseek_dir / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    encoder = HFChatEncoder(load_tokenizer(tmp_path))
    assert encoder.encode(CHAT)[0]
    says = r"the chat template 'tool_use' \(for conversations with tools\) cannot be used "
    says += r"\(TemplateSyntaxError at line 2:"
    with pytest.raises(TokenizerError, match=says):
        encoder.encode_batch([CHAT], [TOOLS])


@settings(max_examples=25, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(max_turns=6, long_one_in=0))
def test_deepseek_parity_on_generated_conversations(encoder_of, oracle_of, messages):
    expected = _oracle(oracle_of(_generation(DEEPSEEK)), messages)
    assert encoder_of(_plain(DEEPSEEK)).encode(messages) == expected


def test_a_template_that_reads_the_clock_is_refused_naming_the_variable(encoder_of):
    with pytest.raises(ClockRead, match="unless date_string is set: pin date_string in the template variables"):
        encoder_of(_plain(LLAMA3))


def test_a_pinned_date_renders_as_transformers_does(encoder_of, oracle_of):
    pinned = {"date_string": "01 Dec 2026"}
    encoder = encoder_of(_plain(LLAMA3), pinned)
    ids, mask = encoder.encode(CHAT)
    assert (ids, mask) == _oracle(oracle_of(_generation(LLAMA3)), CHAT, **pinned)
    assert ids == _ids(oracle_of(_plain(LLAMA3)), CHAT, **pinned)


def test_the_clock_read_only_by_some_conversations_stops_their_encoding(encoder_of):
    template = "{% if messages[0]['role'] != 'system' %}{{ strftime_now('%Y') }}{% endif %}" + _plain(CHATML)
    encoder = encoder_of(template)  # the probe has a system message
    assert encoder.encode(CHAT)[0]
    first, second = encoder.encode_batch([CHAT, CHAT[1:]])
    assert isinstance(first, tuple)
    assert isinstance(second, ClockRead) and "which no template variable can pin" in str(second)


def test_a_sloppy_template_gives_a_named_refusal_not_a_wrong_mask(encoder_of):
    encoder = encoder_of(SLOPPY)
    with pytest.raises(InvalidRow, match="assistant message 2: .* does not begin the conversation's rendering"):
        encoder.encode(CHAT)
    with pytest.raises(InvalidRow, match="assistant message 2"):
        encoder.encode(CHAT[:3])
    ids, mask = encoder.encode(CHAT[:2])  # no reply: nothing to find
    assert ids and not any(mask)


# ChatML with no generation prompt: a reply's span would take in its header
NO_PROMPT = CHATML.replace("{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}", "")


def test_a_template_without_a_generation_prompt_is_refused_not_masked_with_its_header(encoder_of, oracle_of):
    assert "add_generation_prompt" not in NO_PROMPT
    encoder = encoder_of(_plain(NO_PROMPT))
    with pytest.raises(InvalidRow, match="assistant message 2: the chat template adds no generation prompt"):
        encoder.encode(CHAT)
    ids, mask = encoder.encode(CHAT[:2])  # no reply: nothing to mask, nothing to refuse
    assert ids == _ids(oracle_of(_plain(NO_PROMPT)), CHAT[:2]) and not any(mask)
    # with generation blocks the template marks the replies itself: transformers' masks
    assert encoder_of(_generation(NO_PROMPT)).encode(CHAT) == _oracle(oracle_of(_generation(NO_PROMPT)), CHAT)


# Mistral style: no assistant header and no generation prompt; a reply is its content and </s>
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "[[{{ message['content'] + eos_token }}]]{% endif %}{% endfor %}"
)


def test_a_template_without_headers_needs_no_generation_prompt(encoder_of, oracle_of):
    chat = [m for m in CHAT if m["role"] != "system"]
    assert encoder_of(_plain(MISTRAL)).encode(chat) == _oracle(oracle_of(_generation(MISTRAL)), chat)
    empty = [*chat[:1], {"role": "assistant", "content": ""}]  # (its text is its end of sequence alone)
    assert encoder_of(_plain(MISTRAL)).encode(empty) == _oracle(oracle_of(_generation(MISTRAL)), empty)


# A reply's end written only when another message follows it
LAST_OPEN = (
    "{% for m in messages %}{% if m.role == 'user' %}{{ 'User: ' + m.content + '\\n' }}"
    "{% elif m.role == 'assistant' %}{{ 'Assistant: ' }}"
    "[[{{ m.content }}{% if not loop.last %}{{ eos_token }}{% endif %}]]{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant: ' }}{% endif %}"
)


# A header written after the loop whatever comes next: the last reply's span would take it in
HEADER_AFTER = (
    "{% for m in messages %}{% if m.role == 'user' %}{{ '<｜User｜>' + m.content }}"
    "{% elif m.role == 'assistant' %}{{ '<｜Assistant｜>' }}[[{{ m.content + eos_token }}]]{% endif %}{% endfor %}"
    "{{ '<｜Assistant｜>' }}"
)
# The next turn's header written after a reply's end, as part of the reply
HEADER_IN_REPLY = (
    "{% for m in messages %}{% if loop.first %}{{ '<｜User｜>' }}{% endif %}{% if m.role == 'user' %}"
    "{{ m.content + '<｜Assistant｜>' }}{% elif m.role == 'assistant' %}[[{{ m.content + eos_token }}]]"
    "{{ '<｜User｜>' }}{% endif %}{% endfor %}"
)
# Reasoning kept for the last reply alone (as Qwen3's and DeepSeek-R1's templates keep it)
LAST_REASONING = (
    "{% for m in messages %}{% if m.role == 'user' %}{{ '<｜User｜>' + m.content }}"
    "{% elif m.role == 'assistant' %}{{ '<｜Assistant｜>' }}[[{% if loop.last and m.reasoning_content %}"
    "{{ '<think>' + m.reasoning_content + '</think>' }}{% endif %}{{ m.content + eos_token }}]]{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}"
)


# An end of conversation written after the last reply alone (as Phi-3's template writes its eos_token)
END_OF_CHAT = (
    "{% for m in messages %}{% if m.role == 'user' %}{{ '<｜User｜>' + m.content }}"
    "{% elif m.role == 'assistant' %}{{ '<｜Assistant｜>' }}[[{{ m.content + '<|EOT|>' + '\\n' }}]]{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% else %}{{ eos_token }}{% endif %}"
)


@pytest.mark.parametrize("template", [HEADER_AFTER, END_OF_CHAT])
def test_what_a_template_writes_after_the_last_reply_alone_is_not_the_replys(encoder_of, oracle_of, template):
    """A header written after the loop whatever follows, or an end of conversation: text
    the template writes after the last reply but not where another message follows is not
    the reply's (its end, up to an added token they share, is): the mask of the template
    marked with generation blocks."""
    one = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    ids, mask = encoder_of(_plain(template)).encode(one)
    assert (ids, mask) == _oracle(oracle_of(_generation(template)), one)
    assert mask[-1] == 0


def test_a_last_reply_without_content_whose_rendering_changes_is_refused(encoder_of, oracle_of):
    """A reply of reasoning and tool calls alone (content null) has no content to mark: where
    another message after it changes its own rendering (reasoning kept for the last reply
    alone), its end cannot be told from its text, and the row is refused, never cut short."""
    template = LAST_REASONING.replace("m.content + eos_token", "(m.content or '') + eos_token")
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "reasoning_content": "think"}]
    with pytest.raises(InvalidRow, match="has no content to mark, otherwise where another message follows"):
        encoder_of(_plain(template)).encode(chat)
    marked = [chat[0], {**chat[1], "content": "ok"}]  # (with content to mark: encoded as transformers masks it)
    assert encoder_of(_plain(template)).encode(marked) == _oracle(oracle_of(_generation(template)), marked)


def test_the_next_turns_header_written_after_a_replys_end_is_refused(encoder_of, oracle_of):
    """As part of a reply, after its eos_token: the prefix rule would train what the model
    never writes. Marked with generation blocks, the template is encoded as transformers
    masks it."""
    one = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    says = "its span goes on after the eos_token (<｜end▁of▁sentence｜>) with '<｜User｜>'"
    for chat in (one, [*one, {"role": "user", "content": "again"}, {"role": "assistant", "content": "ok"}]):
        with pytest.raises(InvalidRow, match=re.escape(says)):
            encoder_of(_plain(HEADER_IN_REPLY)).encode(chat)
        assert encoder_of(_generation(HEADER_IN_REPLY)).encode(chat) == _oracle(
            oracle_of(_generation(HEADER_IN_REPLY)), chat
        )


def test_reasoning_kept_for_the_last_reply_alone_is_in_its_span(encoder_of, oracle_of):
    """The last reply's end is compared with what the template writes where another message
    follows after its content only: reasoning rendered for the last reply alone is its own."""
    chat = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "ok", "reasoning_content": "think it over"},
    ]
    for messages in (chat[:2], chat):
        got = encoder_of(_plain(LAST_REASONING)).encode(messages)
        assert got == _oracle(oracle_of(_generation(LAST_REASONING)), messages)
    assert sum(encoder_of(_plain(LAST_REASONING)).encode(chat)[1]) > sum(
        encoder_of(_plain(LAST_REASONING)).encode(chat[:2])[1]
    )


def test_a_reply_whose_end_comes_only_before_another_message_is_refused(encoder_of, oracle_of):
    """The prefix rule would leave that end 0 in every reply but the last: refused, naming
    the reply; a template that marks the reply and its end with a generation block is not."""
    says = r"assistant message 2: the chat template writes its end \(<｜end▁of▁sentence｜>\) only when another"
    with pytest.raises(InvalidRow, match=says):
        encoder_of(_plain(LAST_OPEN)).encode(CHAT)
    ids, mask = encoder_of(_generation(LAST_OPEN)).encode(CHAT)
    assert (ids, mask) == _oracle(oracle_of(_generation(LAST_OPEN)), CHAT)
    eos = oracle_of(_generation(LAST_OPEN)).eos_token_id
    assert [m for i, m in zip(ids, mask, strict=True) if i == eos] == [1]  # the first reply's end is trained
    one = [m for m in CHAT[:3] if m["role"] != "system"]  # the last reply: no end written, nothing to leave 0
    assert encoder_of(_plain(LAST_OPEN)).encode(one) == _oracle(oracle_of(_generation(LAST_OPEN)), one)


# Turns that end with <|EOT|> (an added token, not the eos_token) only before another message
EOT_OPEN = (
    "{% for m in messages %}{% if m.role == 'user' %}{{ '<｜User｜>' + m.content }}"
    "{% elif m.role == 'assistant' %}{{ '<｜Assistant｜>' }}[[{{ m.content }}"
    "{% if not loop.last %}{{ '<|EOT|>' }}{% endif %}]]{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}"
)
# No end at all: a reply runs until the next turn's <｜User｜>, which the model would never learn to write
NO_END = "{% for m in messages %}{{ '<｜' + m.role | capitalize + '｜>' + m.content }}{% endfor %}" + (
    "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}"
)


# Each turn opened with the eos_token (as where bos_token is eos_token): from the text alone,
# the same as an eos_token written only before another message
EOS_OPENS = (
    "{% for m in messages %}{{ eos_token + '<｜' + m.role | capitalize + '｜>' + m.content + '<|EOT|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ eos_token + '<｜Assistant｜>' }}{% endif %}"
)


@pytest.mark.parametrize(
    "template, end",
    [
        (_plain(EOT_OPEN), "<|EOT|>"),
        (NO_END, "<｜User｜>"),
        ("{{ eos_token }}" + _plain(LAST_OPEN), "<｜end▁of▁sentence｜>"),  # (as where bos_token is eos_token)
        (EOS_OPENS, "<｜end▁of▁sentence｜>"),
    ],
    ids=["added token", "next turn", "text opening with eos", "eos opening each turn"],
)
def test_any_end_written_only_before_another_message_is_refused(encoder_of, oracle_of, template, end):
    """Whatever token a template writes after a reply only when another message follows
    (its eos_token or another added token, or the next turn's own, where no reply ends with
    one), the reply is refused, naming it; with generation blocks the end is trained."""
    chat = [m for m in CHAT if m["role"] != "system"]
    with pytest.raises(InvalidRow, match=f"assistant message 1: the chat template writes its end \\({end}\\)"):
        encoder_of(template).encode(chat)
    ids, mask = encoder_of(_generation(EOT_OPEN)).encode(chat)
    assert (ids, mask) == _oracle(oracle_of(_generation(EOT_OPEN)), chat)
    eot = oracle_of(_generation(EOT_OPEN)).convert_tokens_to_ids("<|EOT|>")
    assert [m for i, m in zip(ids, mask, strict=True) if i == eot] == [1]


# A header that ends with white space, and each reply trimmed: an empty reply's rendering ends with its header
HEADER_EOT_OPEN = (
    "{% for m in messages %}{% if m.role == 'user' %}{{ '<｜User｜>\\n\\n' + m.content | trim + '<|EOT|>' }}"
    "{% elif m.role == 'assistant' %}{{ '<｜Assistant｜>\\n\\n' }}[[{{ m.content | trim }}"
    "{% if not loop.last %}{{ '<|EOT|>' }}{% endif %}]]{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜>\\n\\n' }}{% endif %}"
)


@pytest.mark.parametrize("reply", ["", " ", "\n\n"])
def test_an_empty_reply_whose_end_comes_only_before_another_message_is_refused(encoder_of, oracle_of, reply):
    """The added token the reply's rendering ends with is its header's, not an end of the
    reply: the ``<|EOT|>`` written after it only when another message follows is refused as
    for any reply, where a generation block trains it."""
    chat = [CHAT[1], {"role": "assistant", "content": reply}, *CHAT[3:]]
    with pytest.raises(InvalidRow, match=r"assistant message 1: the chat template writes its end \(<\|EOT\|>\)"):
        encoder_of(_plain(HEADER_EOT_OPEN)).encode(chat)
    ids, mask = encoder_of(_generation(HEADER_EOT_OPEN)).encode(chat)
    assert (ids, mask) == _oracle(oracle_of(_generation(HEADER_EOT_OPEN)), chat)
    eot = oracle_of(_generation(HEADER_EOT_OPEN)).convert_tokens_to_ids("<|EOT|>")
    assert [m for i, m in zip(ids, mask, strict=True) if i == eot] == [0, 1, 0]  # (the empty reply's end is trained)
    plain = [CHAT[1], {"role": "assistant", "content": "4"}, *CHAT[3:]]
    with pytest.raises(InvalidRow, match=r"assistant message 1: the chat template writes its end"):
        encoder_of(_plain(HEADER_EOT_OPEN)).encode(plain)


# A reply with no content renders nothing at all
SILENT_EMPTY = (
    "{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}"
    "{% elif m.content %}{{ m.content + eos_token }}{% endif %}{% endfor %}"
)


# The same, each user turn opened with an added token
SILENT_EMPTY_HEADED = SILENT_EMPTY.replace("{{ m.content }}", "{{ '<｜User｜>' + m.content }}", 1)


@pytest.mark.parametrize(
    ("template", "first", "then", "text"),
    [
        (SILENT_EMPTY, "hello wor", "ld", "hello worldok"),
        (SILENT_EMPTY_HEADED, "hi", "again", "<｜User｜>hi<｜User｜>againok"),
    ],
    ids=["a token across its place", "the next turn's added token"],
)
def test_a_reply_that_renders_nothing_trains_nothing_and_needs_no_end(encoder_of, template, first, then, text):
    """The conversation renders the same without it: an empty span overlaps no token (the
    user's token that straddles where the reply would be stays 0), and the next turn's
    added token is that turn's, not an end written for the reply."""
    chat = [
        {"role": "user", "content": first},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": then},
        {"role": "assistant", "content": "ok"},
    ]
    encoder = encoder_of(template)
    ids, mask = encoder.encode(chat)
    tokenizer = encoder.tokenizer
    assert tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m]) == "ok" + tokenizer.eos_token
    assert tokenizer.decode(ids) == text + tokenizer.eos_token


def test_an_end_token_in_a_reply_s_content_is_not_taken_for_the_template_s(encoder_of):
    """A reply whose content ends with the token the template writes only before another
    message still lacks the template's end: refused, as without it."""
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo<|EOT|>"}]
    chat += [{"role": "user", "content": "ok"}, {"role": "assistant", "content": "fine"}]
    with pytest.raises(InvalidRow, match=r"assistant message 1: the chat template writes its end \(<\|EOT\|>\)"):
        encoder_of(_plain(EOT_OPEN)).encode(chat)


# Replies that end with a token of the template's own, whatever comes after
OWN_ENDS = {
    # Zephyr's form: the eos_token, then the next turn's header
    "eos, then a header": (
        "{% for m in messages %}{{ '<｜' + m.role | capitalize + '｜>' }}{% if m.role == 'assistant' %}"
        "[[{{ m.content + eos_token + '\\n' }}]]{% else %}{{ m.content + eos_token + '\\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}"
    ),
    # Phi-3's form: every turn ends with <|EOT|>, a user turn then with the assistant's header
    "a turn's end, the header in the user's turn": (
        "{% for m in messages %}{% if m.role == 'user' %}{{ '<｜User｜>' + m.content + '<|EOT|><｜Assistant｜>' }}"
        "{% elif m.role == 'assistant' %}[[{{ m.content + '<|EOT|>' }}]]{% endif %}{% endfor %}"
    ),
}


@pytest.mark.parametrize("form", OWN_ENDS)
def test_a_reply_that_ends_with_the_template_s_end_is_not_refused(encoder_of, oracle_of, form):
    """A reply that ends with the eos_token, or with the token the template writes after
    the other turns' content, keeps its end, whatever token the next turn opens with."""
    chat = [m for m in CHAT if m["role"] != "system"]
    template = OWN_ENDS[form]
    assert encoder_of(_plain(template)).encode(chat) == _oracle(oracle_of(_generation(template)), chat)


# Turns ending with <|EOT|> (not the eos_token); a user's content in text parts (an image as an
# added token), a tool's as JSON, system messages dropped
PARTS_AND_TOOLS = (
    "{% for m in messages %}{% if m.role != 'system' %}{{ '<｜' + m.role | capitalize + '｜>' }}{% endif %}"
    "{% if m.role == 'assistant' %}"
    "[[{{ m.content + '<|EOT|>' }}]]{% elif m.role == 'tool' %}{{ m.content | tojson + '<|EOT|>' }}"
    "{% elif m.role == 'system' %}{% elif m.content is string %}{{ m.content + '<|EOT|>' }}"
    "{% else %}{% for part in m.content %}{{ part.text if part.type == 'text' else '<｜place▁holder▁no▁0｜>' }}"
    "{% endfor %}{{ '<|EOT|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}"
)


AROUND = {
    "text parts": {"role": "user", "content": [{"type": "text", "text": "2+2"}, {"type": "text", "text": "?"}]},
    "tool results": {"role": "tool", "content": "4"},
    "content inside the end's text": {"role": "user", "content": "EOT"},
    "a message the template drops": {"role": "system", "content": "be brief"},
    "images alone": {"role": "user", "content": [{"type": "image"}]},
    "text, then an image": {"role": "user", "content": [{"type": "text", "text": "2+2?"}, {"type": "image"}]},
}


@pytest.mark.parametrize("turns", AROUND)
def test_a_turn_s_end_is_found_whatever_the_content_around_the_reply(encoder_of, oracle_of, turns):
    """The end a reply shares with a user's turn is found after that turn's content, whether
    it is text parts, images alone, text then an image's token, or text the end holds,
    whatever comes between (a tool's JSON, a message the template drops): the reply is
    encoded, its end trained. A reply that is the end's last character is no end of its own."""
    around = AROUND[turns]
    chat = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": ">"}, around]
    chat += [{"role": "assistant", "content": "4"}, around, {"role": "assistant", "content": "so 4"}]
    if turns == "a message the template drops":
        chat.insert(4, {"role": "user", "content": "so?"})
    ids, mask = encoder_of(_plain(PARTS_AND_TOOLS)).encode(chat)
    assert (ids, mask) == _oracle(oracle_of(_generation(PARTS_AND_TOOLS)), chat)
    eot = oracle_of(_generation(PARTS_AND_TOOLS)).convert_tokens_to_ids("<|EOT|>")
    assert [m for i, m in zip(ids, mask, strict=True) if i == eot] == [r == "assistant" for r in _roles(chat)]


def _roles(chat: list[dict]) -> list[str]:
    """The roles of the messages the template writes (it drops system messages)."""
    return [m["role"] for m in chat if m["role"] != "system"]


# A tool call's closing token written after other content than a reply's: in a preamble, in
# a system prompt's tool instructions, after an assistant's content
CALLS = (
    "{{ 'Call tools as <｜tool▁calls▁begin｜>name<｜tool▁calls▁end｜>.' }}"
    "{% for m in messages %}{% if m.role == 'user' %}{{ '<｜User｜>' + m.content }}"
    "{% elif m.role == 'system' %}{{ m.content + ' Call tools as <｜tool▁calls▁begin｜>name<｜tool▁calls▁end｜>.' }}"
    "{% elif m.role == 'tool' %}{{ '<｜Tool｜>' + m.content }}"
    "{% elif m.role == 'assistant' %}{{ '<｜Assistant｜>' + m.content }}"
    "{% if m.tool_calls %}{{ '<｜tool▁calls▁begin｜>' + m.tool_calls[0].function.name + '<｜tool▁calls▁end｜>' }}"
    "{% endif %}{% if not loop.last %}{{ '<|EOT|>' }}{% endif %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}"
)
CALL = {"type": "function", "function": {"name": "add", "arguments": {}}}
BEFORE_THE_CALL = {
    "a user": [{"role": "user", "content": "2+2?"}],
    "a system prompt": [{"role": "system", "content": "be brief."}],
    "an assistant's call": [{"role": "assistant", "content": "so", "tool_calls": [CALL]}],
}
AFTER_THE_CALL = {
    "a user": [{"role": "user", "content": "so?"}, {"role": "assistant", "content": "4"}],
    "no user": [{"role": "tool", "content": "4"}, {"role": "assistant", "content": "4"}],
}


@pytest.mark.parametrize("after", AFTER_THE_CALL)
@pytest.mark.parametrize("before", BEFORE_THE_CALL)
def test_a_reply_ending_with_an_added_token_of_its_own_still_needs_the_end(encoder_of, before, after):
    """A tool call's closing token ends the reply's text, not its turn: a template that
    writes the turn's end only before another message is refused there too, whatever the
    message before the reply writes after its content, with a user message or none."""
    chat = [*BEFORE_THE_CALL[before], {"role": "assistant", "content": "", "tool_calls": [CALL]}]
    chat += AFTER_THE_CALL[after]
    k = len(chat) - 3 if before != "an assistant's call" else 0
    says = rf"assistant message {k}: the chat template writes its end \(<\|EOT\|>\)"
    with pytest.raises(InvalidRow, match=says):
        encoder_of(CALLS).encode(chat)


# No generation prompt, and a header a reply's content can look like the start of
HEADED = (
    "{% for m in messages %}{% if m.role == 'user' %}{{ 'User: ' + m.content + '\\n' }}"
    "{% elif m.role == 'assistant' %}{{ 'Assistant: ' + m.content + eos_token + '\\n' }}{% endif %}{% endfor %}"
)


@pytest.mark.parametrize(
    "template, reply", [(HEADED, "A"), (HEADED, "Assist"), (HEADED, "B"), (NO_PROMPT, "<"), (NO_PROMPT, "<|im_start|>")]
)
def test_a_reply_that_looks_like_its_header_is_refused_not_masked_with_it(encoder_of, template, reply):
    """A span that opens with the header is refused, whether or not the reply's content
    happens to begin as the header does."""
    with pytest.raises(InvalidRow, match="assistant message 1: the chat template adds no generation prompt"):
        encoder_of(template).encode([{"role": "user", "content": "A or B?"}, {"role": "assistant", "content": reply}])


@pytest.mark.parametrize(
    "template",
    [
        "{% macro turn(m) %}{{ '<|im_start|>' + m.role + '\\n' }}{% if m.role == 'assistant' %}{% generation %}"
        "{{ m.content + '<|im_end|>\\n' }}{% endgeneration %}{% else %}{{ m.content + '<|im_end|>\\n' }}{% endif %}"
        "{% endmacro %}{% for message in messages %}{{ turn(message) }}{% endfor %}",
        "{% for m in messages %}{% set turn %}{{ '<|im_start|>' + m.role + '\\n' }}{% generation %}{{ m.content }}"
        "{% endgeneration %}{% endset %}{{ turn }}{% endfor %}",
        "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}{% filter trim %}{% generation %}{{ m.content }}"
        "{% endgeneration %}{% endfilter %}{% endfor %}",
        "{% for m in messages recursive %}{{ '<|im_start|>' + m.role + '\\n' }}{% generation %}{{ m.content }}"
        "{% endgeneration %}{% endfor %}",
    ],
    ids=["macro", "set", "filter", "recursive loop"],
)
def test_a_generation_block_rendered_into_a_buffer_is_refused(encoder_of, template):
    """transformers places a block's characters by the output written so far, which inside
    a macro, a set or filter block or a recursive loop does not hold the text before it:
    its masks are wrong."""
    inside = r"inside a (macro|set block|filter block|recursive loop)"
    with pytest.raises(TokenizerError, match=r"its \{% generation %\} block at line 1, " + inside):
        encoder_of(template)


@pytest.mark.parametrize(
    "spelling", ["{%+ generation %}", "{%- generation -%}", "{%generation%}"], ids=["plus", "minus", "tight"]
)
def test_generation_blocks_are_found_however_jinja_spells_them(encoder_of, oracle_of, spelling):
    """Blocks are read from the parsed template: each spelling Jinja accepts gives
    transformers' own masks; a block named only in a comment is no block."""
    spelt = _generation(CHATML).replace("{% generation %}", spelling)
    assert encoder_of(spelt).generation
    assert encoder_of(spelt).encode(CHAT) == _oracle(oracle_of(spelt), CHAT)
    commented = "{# replies could be marked with {% generation %} blocks #}" + _plain(CHATML)
    assert not encoder_of(commented).generation
    assert encoder_of(commented).encode(CHAT) == _oracle(oracle_of(_generation(CHATML)), CHAT)


def test_a_reply_first_in_a_template_whose_prompt_comes_with_a_message_is_refused(encoder_of):
    """Tulu's template adds its generation prompt after the last message only: the
    rendering of no messages has none, so a reply that comes first has no span."""
    tulu = (
        "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + '\\n' }}"
        "{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}{% endfor %}"
    )
    encoder = encoder_of(tulu)
    with pytest.raises(InvalidRow, match="assistant message 0: the chat template adds no generation prompt"):
        encoder.encode([{"role": "assistant", "content": "Hello"}, {"role": "user", "content": "hi"}])
    ids, mask = encoder.encode(CHAT[1:3])  # a reply after a user message: its content and newline
    text = encoder.tokenizer.decode([i for i, m in zip(ids, mask) if m])
    assert text == CHAT[2]["content"] + "\n"


def test_an_empty_tools_list_reaches_the_template_as_one(deepseek_dir, tmp_path):
    """``tools: []`` is not ``None``: a template (and apply_chat_template's choice of a named
    one) may tell them apart."""
    from transformers import AutoTokenizer

    template = "{% if tools is not none %}{{ 'Tools: ' + (tools | tojson) + '\\n' }}{% endif %}" + _plain(CHATML)
    config = json.loads((deepseek_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = template
    (tmp_path / "tokenizer.json").symlink_to(deepseek_dir / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    encoder, oracle = HFChatEncoder(load_tokenizer(tmp_path)), AutoTokenizer.from_pretrained(str(tmp_path))
    for tools in ([], "[]"):
        record = conversation({"messages": CHAT, "tools": tools}, SCHEMA)
        assert record.tools == []
        ids = encoder.encode_arrays(record.messages, record.tools)[0].tolist()
        assert ids == _ids(oracle, CHAT, tools=[]) != _ids(oracle, CHAT)
    assert conversation({"messages": CHAT}, SCHEMA).tools is None


def test_a_conversation_the_template_refuses_is_an_invalid_row(encoder_of):
    encoder = encoder_of(ALTERNATING)
    results = encoder.encode_batch([CHAT[1:3], CHAT[1:2] + CHAT[1:2], [{"role": "user", "content": ["a"]}]])
    assert isinstance(results[0], tuple)
    assert isinstance(results[1], InvalidRow)
    refusal = "the chat template refuses the conversation (TemplateError: roles must alternate user/assistant)"
    assert results[1].reason == refusal
    assert isinstance(results[2], InvalidRow) and "TypeError" in results[2].reason


def test_the_message_schema_keeps_every_key_and_any_role():
    record = {"messages": [{"role": "ipython", "content": {"x": 1}, "name": "n", "extra": None}]}
    assert conversation(record, SCHEMA).messages == [{"role": "ipython", "content": {"x": 1}, "name": "n"}]
    with pytest.raises(InvalidRow, match="message 0 has no role"):
        conversation({"messages": [{"content": "a"}]}, SCHEMA)
    with pytest.raises(InvalidRow, match="message 0 has role 3, not a name"):
        conversation({"messages": [{"role": 3, "content": "a"}]}, SCHEMA)
    with pytest.raises(InvalidRow, match="lone surrogate"):
        conversation({"messages": [{"role": "user", "content": "\ud800"}]}, SCHEMA)
    with pytest.raises(InvalidRow, match="message 0 has a lone surrogate"):
        conversation({"messages": [{"role": "user", "content": "a", "extra": {"k": ["\udc00"]}}]}, SCHEMA)
    deep: object = "x"
    for _ in range(500):  # a JSON reader takes it; rendering it would exhaust the stack
        deep = [deep]
    with pytest.raises(InvalidRow, match="message 0 nests deeper than 64 levels"):
        conversation({"messages": [{"role": "user", "content": "a", "x": deep}]}, SCHEMA)
    with pytest.raises(InvalidRow, match="message 0 content part 1 is a video, which no build renders"):
        parts = [{"type": "text", "text": "a"}, {"type": "video_url", "video_url": {"url": "v"}}]
        conversation({"messages": [{"role": "user", "content": parts}]}, SCHEMA)


def test_the_separator_is_eos_or_a_single_vocabulary_token(folder_of):
    tokenizer = load_tokenizer(folder_of(_plain(CHATML)))
    assert separator(tokenizer, None) == ("<｜end▁of▁sentence｜>", 1)
    assert separator(tokenizer, "<｜User｜>") == ("<｜User｜>", 128803)
    with pytest.raises(ValueError, match="'two words' is not a single token"):
        separator(tokenizer, "two words")


def test_a_template_variable_that_is_an_argument_is_refused(encoder_of):
    with pytest.raises(TokenizerError, match="'add_generation_prompt' is an argument of apply_chat_template"):
        encoder_of(_plain(CHATML), {"add_generation_prompt": True})
    with pytest.raises(TokenizerError, match="'compiled_template' is a name transformers' renderer takes"):
        encoder_of(_generation(CHATML), {"compiled_template": 1})


def test_check_compares_with_apply_chat_template(encoder_of):
    from fixed_sft.encoding import TemplateMismatch

    encoder = encoder_of(_plain(CHATML))
    ids, _ = encoder.encode_arrays(CHAT)
    encoder.check(CHAT, ids)
    with pytest.raises(TemplateMismatch, match="differ from apply_chat_template"):
        encoder.check(CHAT, ids[:-1])
    changed = ids.copy()
    changed[3] += 1  # (as long as the template's)
    with pytest.raises(TemplateMismatch, match="differ from apply_chat_template"):
        encoder.check(CHAT, changed)


@st.composite
def _offsets_and_spans(draw):
    lengths = draw(st.lists(st.integers(0, 4), max_size=30))
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    offsets = np.stack([starts[:-1], starts[1:]], axis=1).reshape(-1, 2)
    cuts = sorted(draw(st.lists(st.integers(0, int(starts[-1]) + 2), max_size=8)))
    spans = list(zip(cuts[::2], cuts[1::2]))
    return offsets, spans


def _transformers_rule(offsets: list, spans: list) -> list[int]:
    """apply_chat_template's loop for ``assistant_masks``, restated."""
    mask, current = [0] * len(offsets), 0
    for n, (start, end) in enumerate(offsets):
        while current < len(spans) and start >= spans[current][1]:
            current += 1
        if current == len(spans):
            break
        mask[n] = int(end > spans[current][0])
    return mask


@settings(derandomize=True)
@given(_offsets_and_spans())
def test_token_mask_is_transformers_rule(case):
    offsets, spans = case
    assert token_mask(offsets, spans).tolist() == _transformers_rule(offsets.tolist(), spans)
    backwards = offsets[::-1].copy()  # offsets out of order: the token-by-token branch
    assert token_mask(backwards, spans).tolist() == _transformers_rule(backwards.tolist(), spans)


ROWS = [
    {"id": "a", "messages": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]},
    {"id": "b", "messages": [{"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "7"}]},
    {"id": "c", "messages": CHAT},
    {"id": "d", "messages": [{"role": "user", "content": "q", "name": "bob"}, {"role": "assistant", "content": ""}]},
    {"id": "e", "messages": [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}]},
]


def _source(tmp_path: Path, rows: list[dict]) -> Path:
    """The rows as a JSONL file in ``tmp_path``, named relative to it (a rebuild reads a
    recorded source inside the current folder only)."""
    (tmp_path / "chats.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return Path("chats.jsonl")


def _build(source: Path, folder: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--source", str(source), "--rows", "all", "--row-tokens", "16", "--tokenizer", str(folder),
        "--allow-unpinned-tokenizer", "--loss-mask-type", "assistant", "--out", str(out), "--quiet", *extra,
    ]  # fmt: skip


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_build_through_the_cli_is_transformers_ids_and_masks_and_rebuilds(
    folder_of, oracle_of, tmp_path, capsys, monkeypatch, workers
):
    import pyarrow.parquet as pq

    from fixed_sft.cli import main

    monkeypatch.chdir(tmp_path)
    folder, out = folder_of(_plain(CHATML)), tmp_path / "out"
    assert main(_build(_source(tmp_path, ROWS), folder, out, "--workers", workers, "--check-every", "1")) == 0
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["params"]["separator"] == "<｜end▁of▁sentence｜>"
    assert manifest["params"]["loss_mask_type"] == "assistant" and manifest["loss_mask"]["template_kwargs"] == {}
    assert set(manifest["tokenizer"]["files"]) == {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}
    assert manifest["template_check"]["checked"] == manifest["stats"]["conversations"] > 0
    rows = [row["metadata"] for row in pq.read_table(out / "train.parquet").to_pylist()]
    assert rows
    for row in rows:  # each segment is its conversation's slice of transformers' ids + [separator]
        at = 0
        for segment in row["segments"]:
            ids, mask = _oracle(oracle_of(_generation(CHATML)), ROWS[segment["source_index"]]["messages"])
            span = slice(segment["start"], segment["end"])
            size = segment["end"] - segment["start"]
            assert row["input_ids"][at : at + size] == [*ids, 1][span]
            assert row["loss_mask"][at : at + size] == [*mask, 0][span]
            at += size
        assert at == 16
    capsys.readouterr()
    assert main(["verify", str(out), "--rebuild", "--tokenizer", str(folder), "--quiet", "--workers", "1"]) == 0
    assert "gives the same rows and manifest" in capsys.readouterr().out


def test_named_templates_are_recorded_and_key_the_store(deepseek_dir, tmp_path, capsys, monkeypatch):
    """``additional_chat_templates/tool_use.jinja`` renders the rows with tools: it is a file
    the build records and keys its token store by, so a changed one is never served stale."""
    from fixed_sft.cli import main

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "tok"
    (folder / "additional_chat_templates").mkdir(parents=True)
    (folder / "tokenizer.json").symlink_to(deepseek_dir / "tokenizer.json")
    (folder / "tokenizer_config.json").write_bytes((deepseek_dir / "tokenizer_config.json").read_bytes())
    (folder / "chat_template.jinja").write_text(_plain(CHATML), encoding="utf-8")
    named = folder / "additional_chat_templates" / "tool_use.jinja"
    rows = [{"id": f"t{k}", "messages": CHAT, "tools": TOOLS} for k in range(4)]
    source, cache = _source(tmp_path, rows), ["--cache-dir", str(tmp_path / "cache"), "--workers", "1"]
    digests = {}
    for version in ("V1", "V2"):
        named.write_text(f"TOOLS {version} " + "{{ tools | tojson }}\n" + _plain(CHATML), encoding="utf-8")
        for store in ("cached", "plain"):
            out = tmp_path / f"{version}-{store}"
            extra = cache if store == "cached" else ["--no-cache", "--workers", "1"]
            assert main(_build(source, folder, out, *extra)) == 0
            manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
            assert "additional_chat_templates/tool_use.jinja" in manifest["tokenizer"]["files"]
            digests[version, store] = manifest["rows_sha256"]
    capsys.readouterr()
    assert digests["V1", "cached"] == digests["V1", "plain"] != digests["V2", "plain"] == digests["V2", "cached"]


def test_a_named_separator_is_recorded_and_rebuilt(folder_of, tmp_path, capsys, monkeypatch):
    from fixed_sft.cli import main

    monkeypatch.chdir(tmp_path)
    folder, out = folder_of(_plain(CHATML)), tmp_path / "out"
    assert main(_build(_source(tmp_path, ROWS), folder, out, "--separator", "<｜User｜>", "--workers", "1")) == 0
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["params"]["separator"] == "<｜User｜>"
    import pyarrow.parquet as pq

    stream = [t for row in pq.read_table(out / "train.parquet").to_pylist() for t in row["metadata"]["input_ids"]]
    assert 128803 in stream and 1 not in stream  # (ChatML writes neither: only the separator is one)
    assert main(["verify", str(out), "--rebuild", "--tokenizer", str(folder), "--quiet", "--workers", "1"]) == 0


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--separator", "two words"], "error: --separator 'two words' is not a single token of the vocabulary\n"),
        (["--loss-mask-type", "kimi_k25"], "error: loss mask kimi_k25 is not one for a Hugging Face tokenizer"),
    ],
)
def test_bad_separator_or_mask_is_a_usage_error(folder_of, tmp_path, capsys, monkeypatch, extra, says):
    from fixed_sft.cli import main

    monkeypatch.chdir(tmp_path)
    assert main([*_build(_source(tmp_path, ROWS), folder_of(_plain(CHATML)), tmp_path / "o"), *extra]) == 2
    assert capsys.readouterr().err.startswith(says)
    assert not (tmp_path / "o").exists()


def test_refused_conversations_are_skipped_and_recorded(folder_of, tmp_path, monkeypatch):
    from fixed_sft.cli import main

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    source = _source(tmp_path, ROWS)
    assert main(_build(source, folder_of(SLOPPY), out, "--workers", "1")) == 1  # without --skip-invalid: stops
    assert main(_build(source, folder_of(ALTERNATING), out, "--workers", "1", "--skip-invalid")) == 0
    skipped = json.loads((out / "manifest.json").read_text(encoding="utf-8"))["skipped_invalid"]
    assert [row["id"] for row in skipped] == ["c", "e"]
    assert all("roles must alternate" in row["reason"] for row in skipped)


def test_a_clock_reading_template_stops_the_build_naming_the_variable(folder_of, tmp_path, capsys, monkeypatch):
    from fixed_sft.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(_build(_source(tmp_path, ROWS), folder_of(_plain(LLAMA3)), tmp_path / "o", "--workers", "1")) == 1
    assert "pin date_string in the template variables" in capsys.readouterr().err


@pytest.fixture
def spec_folder(tmp_path, monkeypatch):
    """Tokenizer specs read from (and pinned into) a folder of the test's own."""
    from fixed_sft import specs

    folder = tmp_path / "specs"
    folder.mkdir()
    for path in specs.TOKENIZERS.glob("*.json"):
        (folder / path.name).write_bytes(path.read_bytes())
    monkeypatch.setattr(specs, "TOKENIZERS", folder)
    return folder


REVISION = "0123456789abcdef0123456789abcdef01234567"


def test_pin_tokenizer_writes_a_spec_that_builds_check_files_against(folder_of, spec_folder, tmp_path, capsys):
    from fixed_sft.cli import main
    from fixed_sft.specs import SpecError, resolve_tokenizer

    folder = folder_of(_plain(CHATML))
    assert main(["pin-tokenizer", str(folder), "--repo", "someone/Chat-Model", "--revision", "main"]) == 2
    says = "error: --revision main: a folder's files are pinned at a commit (40 hex digits)\n"
    assert capsys.readouterr().err == says and not list(spec_folder.glob("chat-model*"))
    assert main(["pin-tokenizer", str(folder), "--repo", "someone/Chat-Model", "--revision", REVISION]) == 0
    assert "pinned someone/Chat-Model@" + REVISION in capsys.readouterr().out
    spec = json.loads((spec_folder / "chat-model.json").read_text(encoding="utf-8"))
    assert (spec["family"], spec["repo"], spec["revision"]) == ("hf", "someone/Chat-Model", REVISION)
    assert (spec["template_kwargs"], spec["loss_mask_type"]) == ({}, "assistant")
    files = {name: (folder / name).read_bytes() for name in ("tokenizer.json", "tokenizer_config.json")}
    files["chat_template.jinja"] = _plain(CHATML).encode()
    assert spec["files"] == {
        name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in files.items()
    }
    resolved = resolve_tokenizer(str(folder))
    assert (resolved.name, resolved.pinned, resolved.family) == ("chat-model", True, "hf")
    changed = tmp_path / "changed"
    changed.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (changed / name).symlink_to(folder / name)
    (changed / "chat_template.jinja").write_text(_plain(CHATML) + " ", encoding="utf-8")
    with pytest.raises(SpecError, match="differ from the pinned spec chat-model: chat_template.jinja: expected sha256"):
        resolve_tokenizer(str(changed), expected="chat-model")
    assert main(["pin-tokenizer", str(folder), "--repo", "someone/Chat-Model", "--revision", REVISION]) == 2
    assert "chat-model.json exists" in capsys.readouterr().err
    absent = ["pin-tokenizer", str(folder), "--repo", "o/n", "--revision", REVISION, "--out", str(tmp_path / "no")]
    assert main(absent) == 2
    assert f"--out {tmp_path / 'no'}: no such folder" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--name", "a\nb", "spec name 'a\\nb' is not a name"),
        ("--name", " ", "spec name ' ' is not a name"),
        ("--name", "x.json", "spec name 'x.json' is not a name"),
        ("--name", "esc\x1b[31mred", "spec name 'esc\\x1b[31mred' is not a name"),
        ("--name", "a\x00b", "spec name 'a\\x00b' is not a name"),
        ("--name", "Upper", "spec name 'Upper' is not a name"),
        ("--repo", "not a repo!!", "--repo 'not a repo!!' is not a Hub repo id"),
        ("--repo", "x", "--repo 'x' is not a Hub repo id (OWNER/NAME)"),
    ],
)
def test_pin_tokenizer_refuses_a_name_or_repo_that_is_not_one(folder_of, spec_folder, capsys, flag, value, says):
    """A spec's name is its file's: lowercase letters, digits, '.', '-', '_'; nothing is written otherwise."""
    from fixed_sft.cli import main

    folder = folder_of(_plain(CHATML))
    args = ["pin-tokenizer", str(folder), "--repo", "someone/chat", "--revision", REVISION]
    before = sorted(spec_folder.iterdir())
    assert main([*args, flag, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {says}") and err.count("\n") == 1, err
    assert sorted(spec_folder.iterdir()) == before


def test_pin_tokenizer_refuses_files_damaged_in_the_hub_cache(folder_of, spec_folder, tmp_path, capsys):
    """A pin is what later builds trust: bytes the Hub does not hold (a cached blob changed
    since it was downloaded) are refused, naming the blob to delete, not pinned."""
    from conftest import cache_link

    from fixed_sft.cli import main

    folder = folder_of(_plain(CHATML))
    snapshot = tmp_path / "hub" / "models--someone--Chat-Model" / "snapshots" / REVISION
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        cache_link(snapshot, name, (folder / name).read_bytes())
    template = (snapshot / "chat_template.jinja").resolve()
    template.write_bytes(template.read_bytes() + b" ")
    assert main(["pin-tokenizer", str(snapshot)]) == 1
    err = capsys.readouterr().err
    assert (
        f"{snapshot / 'chat_template.jinja'} is damaged in the Hugging Face cache" in err
        and f"delete {template}" in err
    )
    assert not (spec_folder / "chat-model.json").exists()


def test_a_spec_name_downloads_its_files_at_the_pinned_revision(folder_of, spec_folder, monkeypatch):
    from fixed_sft.specs import pin_tokenizer, resolve_tokenizer, write_tokenizer_spec

    folder = folder_of(_plain(CHATML))
    write_tokenizer_spec(pin_tokenizer(str(folder), REVISION, "someone/chat", "chat"))
    calls = []

    def hf_hub_download(repo_id, filename, revision=None, **kwargs):
        calls.append((repo_id, filename, revision))
        return str(folder / filename)

    monkeypatch.setattr("huggingface_hub.hf_hub_download", hf_hub_download)
    monkeypatch.setattr("huggingface_hub.model_info", lambda *args, **kwargs: SimpleNamespace(siblings=[]))
    resolved = resolve_tokenizer("chat")
    assert sorted(calls) == sorted(("someone/chat", name, REVISION) for name in resolved.files)
    assert resolved.pinned and resolved.family == "hf"
    calls.clear()
    repo = pin_tokenizer("other/repo", revision="main")  # an unpinned repo: its files, whichever family
    assert (repo["name"], repo["family"], repo["revision"]) == ("repo", "hf", "main")
    assert set(repo["files"]) == {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}
    assert {(r, rev) for r, _, rev in calls} == {("other/repo", "main")}


@pytest.mark.parametrize("listing", ["listed", "offline", "unreachable", "no folder"])
def test_an_unpinned_repo_brings_its_named_templates(folder_of, spec_folder, tmp_path, monkeypatch, capsys, listing):
    """The Hub lists the repo's files, and those of ``additional_chat_templates/*.jinja``
    come down with the tokenizer (they render rows with tools). Where the Hub cannot list
    them, the cache's copies are the ones read, with a warning."""
    import shutil

    import httpx2
    from huggingface_hub.errors import OfflineModeIsEnabled, RemoteEntryNotFoundError

    from fixed_sft.specs import pin_tokenizer

    remote = tmp_path / "remote"
    shutil.copytree(folder_of(_plain(CHATML)), remote, symlinks=True)
    (remote / "additional_chat_templates").mkdir()
    (remote / "additional_chat_templates" / "tool_use.jinja").write_text(_plain(CHATML), encoding="utf-8")
    (remote / "additional_chat_templates" / "notes.txt").write_text("not a template", encoding="utf-8")
    if listing == "no folder":
        shutil.rmtree(remote / "additional_chat_templates")
    snapshot = tmp_path / "snapshot"  # what was downloaded, alone
    cached = snapshot / "additional_chat_templates" / "cached.jinja"  # (an earlier download's)
    cached.parent.mkdir(parents=True)
    cached.write_text(_plain(CHATML), encoding="utf-8")
    request = httpx2.Request("GET", "https://huggingface.co")

    def hf_hub_download(repo_id, filename, revision=None, **kwargs):
        if not (remote / filename).is_file():
            raise RemoteEntryNotFoundError(filename, response=httpx2.Response(404, request=request))
        (snapshot / filename).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(remote / filename, snapshot / filename)
        return str(snapshot / filename)

    def model_info(repo_id, revision=None, expand=None, **kwargs):
        assert expand == ["siblings"]
        if listing == "offline":
            raise OfflineModeIsEnabled("offline")
        if listing == "unreachable":
            raise httpx2.ConnectError("refused", request=request)
        files = [str(path.relative_to(remote)) for path in remote.rglob("*") if path.is_file()]
        return SimpleNamespace(siblings=[SimpleNamespace(rfilename=name) for name in files])

    monkeypatch.setattr("huggingface_hub.hf_hub_download", hf_hub_download)
    monkeypatch.setattr("huggingface_hub.model_info", model_info)
    spec = pin_tokenizer("other/repo", revision="main")
    named = {"additional_chat_templates/cached.jinja"}
    if listing == "listed":
        named.add("additional_chat_templates/tool_use.jinja")
    assert set(spec["files"]) == {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", *named}
    assert not (snapshot / "additional_chat_templates" / "notes.txt").exists()
    warned = "warning: cannot list the chat templates of other/repo@main" in capsys.readouterr().err
    assert warned == (listing in ("offline", "unreachable"))


def test_a_hub_cache_folder_names_its_repo_and_revision(folder_of, tmp_path):
    from conftest import cache_link

    from fixed_sft.specs import pin_tokenizer

    source = folder_of(_plain(CHATML))
    snapshot = tmp_path / "hub" / "models--someone--Chat" / "snapshots" / REVISION
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        cache_link(snapshot, name, (source / name).read_bytes())
    spec = pin_tokenizer(str(snapshot))
    assert (spec["name"], spec["repo"], spec["revision"]) == ("chat", "someone/Chat", REVISION)


def test_pinning_a_clock_reading_template_needs_its_variable(folder_of, spec_folder, tmp_path, capsys, monkeypatch):
    """The spec records the template variables; a build from it uses them, and so does its rebuild."""
    from fixed_sft.cli import main

    folder = folder_of(_plain(LLAMA3))
    pin = ["pin-tokenizer", str(folder), "--repo", "meta/Llama", "--revision", REVISION]
    assert main(pin) == 1
    assert "pin date_string in the template variables" in capsys.readouterr().err
    assert main([*pin, "--template-kwargs", '{"date_string": "01 Dec 2026"}']) == 0
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    build = _build(_source(tmp_path, ROWS), folder, out, "--workers", "1")
    build.remove("--allow-unpinned-tokenizer")
    assert main(build) == 0
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["loss_mask"]["template_kwargs"] == {"date_string": "01 Dec 2026"}
    assert (manifest["tokenizer"]["name"], manifest["tokenizer"]["pinned"]) == ("llama", True)
    assert main(["verify", str(out), "--rebuild", "--tokenizer", str(folder), "--quiet", "--workers", "1"]) == 0


def test_the_kimi_separator_is_its_eos_or_a_named_token(kimi_dir):
    from fixed_sft.encode import EncoderConfig
    from fixed_sft.errors import UsageError

    config = EncoderConfig(kimi_dir, {}, "kimi_k25", {})
    assert config.separator(None) == ("[EOS]", 163585)
    assert config.separator("<|im_end|>")[1] == 163586
    with pytest.raises(UsageError, match="--separator 'two words' is not a single token"):
        config.separator("two words")


def test_a_kimi_manifest_from_before_the_separator_still_rebuilds(kimi_dir, tmp_path, capsys, monkeypatch):
    """A manifest without params.separator had the eos token: its rebuild is the same."""
    from fixed_sft.cli import main

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    build = ["--source", str(_source(tmp_path, ROWS[:3])), "--rows", "all", "--row-tokens", "16"]
    assert main([*build, "--tokenizer", str(kimi_dir), "--out", str(out), "--quiet", "--workers", "1"]) == 0
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["params"]["separator"] == "[EOS]"
    del manifest["params"]["separator"]
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["verify", str(out), "--rebuild", "--tokenizer", str(kimi_dir), "--quiet", "--workers", "1"]) == 0
    assert "gives the same rows and manifest" in capsys.readouterr().out


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_conversation_that_reads_the_clock_stops_the_build_naming_its_row(
    folder_of, tmp_path, capsys, monkeypatch, workers
):
    from fixed_sft.cli import main

    monkeypatch.chdir(tmp_path)
    template = "{% if messages[0]['role'] != 'system' %}{{ strftime_now('%Y') }}{% endif %}" + _plain(CHATML)
    build = _build(_source(tmp_path, ROWS), folder_of(template), tmp_path / "o", "--workers", workers)
    assert main(build) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: source row ") and "the chat template reads the clock (strftime_now)" in err
    assert not (tmp_path / "o").exists()


def test_remote_code_in_another_repo_is_refused(deepseek_dir, tmp_path):
    """transformers fetches ``other/repo--module.Class`` from that repo's default branch:
    code no pin covers, refused before any is fetched; the folder's own module is named
    among its files."""
    from fixed_sft.hf_chat import foreign_code, remote_code_files

    config = json.loads((deepseek_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    (tmp_path / "tokenizer.json").symlink_to(deepseek_dir / "tokenizer.json")
    config["auto_map"] = {"AutoTokenizer": [None, "someone/code--tokenization_x.XTokenizerFast"]}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    assert foreign_code(tmp_path) == ("tokenizer_config.json", "someone/code--tokenization_x.XTokenizerFast")
    with pytest.raises(TokenizerError, match=r"names code in another repo \(someone/code--tokenization_x"):
        load_tokenizer(tmp_path, trust_remote_code=True)
    config["auto_map"] = {"AutoTokenizer": [None, "tokenization_x.XTokenizerFast"]}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    assert foreign_code(tmp_path) is None
    assert remote_code_files(tmp_path / "tokenizer_config.json") == ["tokenization_x.py"]
    model = {"auto_map": {"AutoModelForCausalLM": "base/model--modeling_x.XForCausalLM"}}  # (never loaded here)
    (tmp_path / "config.json").write_text(json.dumps(model), encoding="utf-8")
    assert foreign_code(tmp_path) is None
    model["auto_map"]["AutoConfig"] = "base/model--configuration_x.XConfig"
    (tmp_path / "config.json").write_text(json.dumps(model), encoding="utf-8")
    assert foreign_code(tmp_path) == ("config.json", "base/model--configuration_x.XConfig")
    (tmp_path / "config.json").unlink()
    config["auto_map"] = [None, "someone/code--tokenization_x.XTokenizerFast"]  # (the older form)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    assert foreign_code(tmp_path) == ("tokenizer_config.json", "someone/code--tokenization_x.XTokenizerFast")

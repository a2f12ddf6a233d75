"""The fast path equals the rendered template and the independent reference."""

from __future__ import annotations

import time

import numpy as np
import pytest
import synthetic

from fixed_sft.chat import ChatEncoder, TemplateMismatch, TemplateRefusal

SPECIALS = [
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_middle|>",
    "[EOS]",
    "[BOS]",
    "<think>",
    "</think>",
    "<|reserved_token_163700|>",
    "<|im_",
    "<|tool_calls_section_begin|>",
    "[PAD]",
]


def _edge_conversations() -> list[list[dict]]:
    cases = [
        [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}],
        [{"role": "assistant", "content": "first"}],
        [{"role": "system", "content": "s"}],
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "q2"}],
        [
            {"role": "system", "content": " \n "},
            {"role": "user", "content": "\r\n\t"},
            {"role": "assistant", "content": "  "},
        ],
    ]
    for special in SPECIALS:
        cases.append(
            [{"role": "user", "content": f"a{special}b"}, {"role": "assistant", "content": f"{special} x {special}"}]
        )
    return cases


def test_edge_cases_match_reference(encoder, reference):
    for messages in _edge_conversations():
        ids, mask = encoder.encode(messages)
        assert ids == reference.chat_ids(messages), messages
        assert mask == reference.chat_mask(messages), messages


def test_generated_corpus_matches_reference(encoder, reference):
    for row in synthetic.conversations(150, seed=7):
        ids, mask = encoder.encode(row["messages"])
        assert ids == reference.chat_ids(row["messages"]), row["id"]
        assert mask == reference.chat_mask(row["messages"]), row["id"]


def test_hard_conversations_match_template(encoder, reference):
    for row in synthetic.hard_conversations(0):
        ids, mask = encoder.encode(row["messages"])
        assert ids == reference.chat_ids(row["messages"]), row["id"]
        assert mask == reference.chat_mask(row["messages"]), row["id"]


def test_fast_path_equals_own_render_path(encoder):
    for row in synthetic.conversations(400, seed=11):
        ids, _ = encoder.encode(row["messages"])
        encoder.check(row["messages"], ids)


def test_mask_marks_assistant_bodies_only(encoder):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    ids, mask = encoder.encode(messages)
    supervised = [t for t, m in zip(ids, mask) if m]
    assert supervised == [163606, 163607, *encoder.tokenizer.encode("yo"), 163586]


def test_check_catches_a_difference(encoder):
    messages = [{"role": "user", "content": "hi"}]
    ids, _ = encoder.encode(messages)
    with pytest.raises(TemplateMismatch):
        encoder.check(messages, ids[:-1])


def test_check_catches_one_token_changed(encoder):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    ids, _ = encoder.encode(messages)
    encoder.check(messages, ids)
    for k in (0, len(ids) // 2, len(ids) - 1):
        wrong = list(ids)
        wrong[k] = 163600 if wrong[k] != 163600 else 163601
        with pytest.raises(TemplateMismatch):
            encoder.check(messages, wrong)


def test_unknown_mask_type_is_refused(tokenizer):
    with pytest.raises(ValueError, match="unknown loss mask type"):
        ChatEncoder(tokenizer, "llama3")


def _edited_tokenizer(kimi_dir, folder, old: str, new: str):
    from fixed_sft.tokenizer import KimiTokenizer

    folder.mkdir()
    for name in ("tiktoken.model", "tokenizer_config.json"):
        (folder / name).symlink_to(kimi_dir / name)
    template = (kimi_dir / "chat_template.jinja").read_text()
    assert template.count(old) == 1
    (folder / "chat_template.jinja").write_text(template.replace(old, new))
    return KimiTokenizer(folder)


HISTORY_ASSISTANT = (
    "<think></think>{{render_content(message)}}\n    {%- if message.get('tool_calls') -%}\n      {{render"
)


@pytest.mark.parametrize(
    "old, new",
    [
        # a default system prompt when the conversation has none
        (
            "{%- for message in hist_msgs -%}",
            "{%- if messages[0]['role'] != 'system' -%}<|im_system|>system<|im_middle|>"
            "Be brief.<|im_end|>{%- endif -%}{%- for message in hist_msgs -%}",
        ),
        # an empty reasoning block on the last message only
        (
            HISTORY_ASSISTANT,
            HISTORY_ASSISTANT.replace("<think></think>", "{% if loop.last %}<think></think>{% endif %}"),
        ),
        # a newline between messages, which BPE joins with a newline that ends the next content
        (
            "  <|im_end|>\n{%- endfor -%}\n\n{%- for message in suffix_msgs",
            "  <|im_end|>\n\n{% endfor -%}\n\n{%- for message in suffix_msgs",
        ),
        # a token before the first message
        ("{%- for message in hist_msgs -%}", "{{ bos_token }}{%- for message in hist_msgs -%}"),
        # a header for two-message conversations only
        (
            "{%- for message in hist_msgs -%}",
            "{%- if messages|length == 2 -%}<|im_system|>two<|im_middle|><|im_end|>"
            "{%- endif -%}{%- for message in hist_msgs -%}",
        ),
        # a token after a final system message that follows others
        (
            "{%- if add_generation_prompt -%}",
            "{%- if messages|length > 1 and messages[-1]['role'] == 'system' -%}"
            "<|im_end|>{%- endif -%}{%- if add_generation_prompt -%}",
        ),
        # reasoning cut at </think>
        (
            HISTORY_ASSISTANT,
            HISTORY_ASSISTANT.replace(
                "{{render_content(message)}}", "{{render_content(message).split('</think>')[-1]}}"
            ),
        ),
        # conversations of the lengths of the longer probes: three, five and ten messages
        (
            "{%- for message in hist_msgs -%}",
            "{%- if messages|length == 3 -%}<|im_system|>three<|im_middle|><|im_end|>"
            "{%- endif -%}{%- for message in hist_msgs -%}",
        ),
        (
            "{%- for message in hist_msgs -%}",
            "{%- if messages|length == 5 -%}<|im_system|>five<|im_middle|><|im_end|>"
            "{%- endif -%}{%- for message in hist_msgs -%}",
        ),
        (
            "{%- for message in hist_msgs -%}",
            "{%- if messages|length > 5 -%}<|im_system|>long<|im_middle|><|im_end|>"
            "{%- endif -%}{%- for message in hist_msgs -%}",
        ),
        # messages with empty content left out
        ("{%- for message in hist_msgs -%}", "{%- for message in hist_msgs if message['content'] -%}"),
        # assistant content with its leading newlines, or leading spaces, or <|im_end|> text removed
        (
            HISTORY_ASSISTANT,
            HISTORY_ASSISTANT.replace("{{render_content(message)}}", "{{render_content(message).lstrip('\\n')}}"),
        ),
        (
            HISTORY_ASSISTANT,
            HISTORY_ASSISTANT.replace("{{render_content(message)}}", "{{render_content(message).lstrip(' ')}}"),
        ),
        (
            HISTORY_ASSISTANT,
            HISTORY_ASSISTANT.replace(
                "{{render_content(message)}}", "{{render_content(message).replace('<|im_end|>', '')}}"
            ),
        ),
        # the same, on assistant messages before the last one only
        (
            HISTORY_ASSISTANT,
            HISTORY_ASSISTANT.replace(
                "{{render_content(message)}}",
                "{%- if loop.index0 < ns.last_non_tool_call_assistant_msg -%}"
                "{{ message['content'].split('</think>')[-1] }}{%- else -%}{{render_content(message)}}{%- endif -%}",
            ),
        ),
    ],
)
def test_a_template_that_renders_messages_by_context_is_refused(kimi_dir, tmp_path, old, new):
    """Per-message ids are only used when they equal the template on conversations of
    every role order: a template that breaks this is refused when it loads."""
    tokenizer = _edited_tokenizer(kimi_dir, tmp_path / "tok", old, new)
    with pytest.raises(TemplateMismatch, match="does not render each message as its role's prefix"):
        ChatEncoder(tokenizer)


def test_special_tokens_reach_the_template(kimi_dir, tmp_path, reference):
    """The template sees ``eos_token`` and the other special tokens, as the model's
    ``apply_chat_template`` passes them."""
    from reference_kimi import ReferenceKimi

    folder = tmp_path / "tok"
    tokenizer = _edited_tokenizer(
        kimi_dir,
        folder,
        HISTORY_ASSISTANT,
        HISTORY_ASSISTANT.replace("{{render_content(message)}}", "{{render_content(message)}}{{ eos_token }}"),
    )
    encoder = ChatEncoder(tokenizer)
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "b"},
    ]
    ids, mask = encoder.encode(messages)
    assert ids.count(tokenizer.eos_id) == 2  # after each assistant message
    assert ids == ReferenceKimi(folder).chat_ids(messages)
    assert mask == ReferenceKimi(folder).chat_mask(messages)


def test_a_template_that_refuses_some_role_orders_is_used_for_the_others(kimi_dir, tmp_path, reference):
    """Probes the template itself refuses (here: roles must alternate) say nothing against it."""
    check = (
        "{%- for m in messages -%}{%- if not loop.first and m['role'] == messages[loop.index0 - 1]['role'] -%}"
        "{{ raise_exception('roles must alternate') }}{%- endif -%}{%- endfor -%}"
    )
    tokenizer = _edited_tokenizer(
        kimi_dir, tmp_path / "tok", "{%- for message in hist_msgs -%}", check + "{%- for message in hist_msgs -%}"
    )
    encoder = ChatEncoder(tokenizer)
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
    ]
    assert encoder.encode(messages)[0] == reference.chat_ids(messages)
    refused = messages[1:2] * 2
    with pytest.raises(TemplateRefusal, match="refuses the conversation .* roles must alternate"):
        encoder.check(refused, encoder.encode_arrays(refused)[0])


def test_a_template_that_refuses_empty_content_is_used_for_other_conversations(kimi_dir, tmp_path, reference):
    guard = (
        "{%- for m in messages -%}{%- if not m['content'] -%}{{ raise_exception('empty') }}{%- endif -%}{%- endfor -%}"
    )
    tokenizer = _edited_tokenizer(
        kimi_dir, tmp_path / "tok", "{%- for message in hist_msgs -%}", guard + "{%- for message in hist_msgs -%}"
    )
    encoder = ChatEncoder(tokenizer)
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert encoder.encode(messages)[0] == reference.chat_ids(messages)


def test_a_template_that_renders_no_probe_conversation_is_refused(kimi_dir, tmp_path):
    """A template that renders single messages but refuses every probe conversation
    leaves the per-message ids unchecked: it is refused when it loads."""
    guard = "{%- if messages|length > 1 -%}{{ raise_exception('one message at a time') }}{%- endif -%}"
    tokenizer = _edited_tokenizer(
        kimi_dir, tmp_path / "tok", "{%- for message in hist_msgs -%}", guard + "{%- for message in hist_msgs -%}"
    )
    with pytest.raises(TemplateMismatch, match=r"renders no probe conversation .*one message at a time"):
        ChatEncoder(tokenizer)


@pytest.mark.parametrize("new", ["字{{ c }}", "{{ c }}字"])
def test_content_not_bounded_by_added_tokens_on_either_side_is_refused(kimi_dir, tmp_path, new):
    """Text that BPE may join with the content (here a Han character, which joins a
    content that starts or ends with one, as no probe content does) is refused on
    either side of the content."""
    tokenizer = _edited_tokenizer(kimi_dir, tmp_path / "tok", "{{ c }}", new)
    with pytest.raises(TemplateMismatch, match="does not bound system content with added tokens"):
        ChatEncoder(tokenizer)


def test_template_kwargs_reach_the_template(kimi_dir, tmp_path):
    """The template variables given (a tokenizer spec's ``template_kwargs``) are what
    the template renders with, in the builder's process and in a worker's."""
    from fixed_sft.encode import EncoderConfig
    from fixed_sft.tokenizer import TEMPLATE_KWARGS

    folder = tmp_path / "tok"
    _edited_tokenizer(
        kimi_dir,
        folder,
        "<|im_user|>{{role_name}}<|im_middle|>",
        "<|im_user|>{{role_name}}{{ marker | default('') }}<|im_middle|>",
    )
    kwargs = {**TEMPLATE_KWARGS, "marker": "!"}
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    encoder = EncoderConfig(folder, tokenizer_sha256={}, loss_mask_type="kimi_k25", template_kwargs=kwargs).load()
    ids, _ = encoder.encode(messages)
    assert encoder.template_kwargs == kwargs
    added = encoder.tokenizer.added
    assert ids[:4] == [added["<|im_user|>"], *encoder.tokenizer.encode("user!"), added["<|im_middle|>"]]
    assert ids == encoder.tokenizer.encode(encoder.render(messages))


class _NoList(np.ndarray):
    """Ids that refuse to become a Python list."""

    def tolist(self):
        raise AssertionError("the ids were turned into a Python list")


def test_check_compares_ids_as_arrays_never_as_lists(encoder, monkeypatch):
    """The template check of a long conversation (its rendered text encoded in many
    pieces) turns neither the ids nor the reference's ids into Python lists, and still
    finds a token changed, one missing and one more, anywhere."""
    content = ("long answer, " * 9_000 + "<|im_end|> ") * 4  # past a window, several runs and added tokens
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": content}]
    ids = np.array(encoder.encode_arrays(messages)[0])
    monkeypatch.setattr(type(encoder.tokenizer), "encode", lambda self, text: pytest.fail("list encode used"))
    encoder.check(messages, ids.view(_NoList))
    for k in (0, len(ids) // 3, len(ids) - 1):
        wrong = ids.copy()
        wrong[k] = 163600 if wrong[k] != 163600 else 163601
        with pytest.raises(TemplateMismatch):
            encoder.check(messages, wrong.view(_NoList))
    for wrong in (ids[:-1], np.append(ids, ids[-1])):
        with pytest.raises(TemplateMismatch):
            encoder.check(messages, wrong.view(_NoList))


def test_the_probes_run_once_per_tokenizer_and_template_variables(kimi_dir, monkeypatch):
    """Encoders of one loaded tokenizer and the same template variables share what the
    probes found; other variables, another tokenizer or a renewed fast BPE are probed again."""
    import fixed_sft.chat as chat
    from fixed_sft.tokenizer import KimiTokenizer

    probed = []
    check = chat.ChatEncoder._check_probes
    monkeypatch.setattr(chat.ChatEncoder, "_check_probes", lambda self: (probed.append(1), check(self))[1])
    tokenizer = KimiTokenizer(kimi_dir, "tiktoken")
    first, second = ChatEncoder(tokenizer), ChatEncoder(tokenizer, template_kwargs=dict(chat.TEMPLATE_KWARGS))
    assert len(probed) == 1 and second._layouts is first._layouts
    ChatEncoder(tokenizer, template_kwargs={"thinking": False})
    ChatEncoder(KimiTokenizer(kimi_dir, "tiktoken"))
    assert len(probed) == 3
    tokenizer.fast_loads += 1  # (as a renewal of its fast BPE counts)
    ChatEncoder(tokenizer)
    assert len(probed) == 4


def test_a_kept_probes_outcome_is_used_without_rendering(tokenizer, tmp_path, monkeypatch):
    """The probes' outcome kept in a file (``write_probes``) gives an encoder that renders
    nothing and encodes as one that probed; a file whose contents do not match their sha256
    is not used: the encoder probes again, and keeps its outcome anew."""
    import fixed_sft.chat as chat

    path = tmp_path / "probes" / "kept.json"
    probed = ChatEncoder(tokenizer, probes=path)
    assert chat.read_probes(path) is not None
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    renders: list[int] = []
    real_render = ChatEncoder.render

    def counted_render(self, *args, **kwargs):
        renders.append(1)
        return real_render(self, *args, **kwargs)

    monkeypatch.setattr(ChatEncoder, "render", counted_render)
    monkeypatch.setattr(chat, "_probed", chat.weakref.WeakKeyDictionary())  # (as a new process starts)
    kept = ChatEncoder(tokenizer, probes=path)
    assert renders == []
    ids, mask = kept.encode_arrays(conversation)
    expected_ids, expected_mask = probed.encode_arrays(conversation)
    assert ids.tolist() == expected_ids.tolist() and mask.tolist() == expected_mask.tolist()
    path.write_text(path.read_text().replace('"header": ', '"header": 1'))
    assert chat.read_probes(path) is None
    monkeypatch.setattr(chat, "_probed", chat.weakref.WeakKeyDictionary())
    ChatEncoder(tokenizer, probes=path)
    assert renders and chat.read_probes(path) is not None


def test_a_probes_file_that_cannot_be_written_is_left_out(tokenizer, tmp_path, monkeypatch):
    """Where the probes' file cannot be written (a full disk), the encoder probes as usual and
    leaves no temporary file behind."""
    import fixed_sft.chat as chat
    import fixed_sft.hashes as hashes

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hashes.os, "replace", full)
    monkeypatch.setattr(chat, "_probed", chat.weakref.WeakKeyDictionary())
    folder = tmp_path / "probes"
    ChatEncoder(tokenizer, probes=folder / "kept.json")
    assert list(folder.iterdir()) == []


def test_a_killed_writer_s_probes_draft_is_removed_a_day_later(tokenizer, tmp_path, monkeypatch):
    """A temporary file a killed build left beside the probes' file is removed by the next
    writer once it is a day old; a newer one (another build's, still writing) is kept."""
    import os

    import fixed_sft.chat as chat
    from fixed_sft.hashes import STALE_SECONDS

    folder = tmp_path / "probes"
    folder.mkdir()
    old, new = folder / ".tmp-killed", folder / ".tmp-writing"
    for draft in (old, new):
        draft.write_text("{")
    os.utime(old, (time.time() - STALE_SECONDS - 60,) * 2)
    monkeypatch.setattr(chat, "_probed", chat.weakref.WeakKeyDictionary())
    ChatEncoder(tokenizer, probes=folder / "kept.json")
    assert sorted(p.name for p in folder.iterdir()) == [".tmp-writing", "kept.json"]

"""Agentic conversations (tools, tool calls and results, reasoning, names, content parts)
through the Kimi fast path: pinned goldens from the independent reference, parity with it
on generated trajectories under each template-variable setting, the refusals, and
templates that render these shapes otherwise."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import strategies as S
from hypothesis import HealthCheck, given, settings

from fixed_sft.chat import ChatEncoder, TemplateMismatch
from fixed_sft.conversation import InvalidRow

WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
                "required": ["city"],
            },
        },
    }
]
CALL = {"id": "functions.get_weather:0", "type": "function"}
TOOL_CALLS = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "reasoning_content": "Call the tool.",
        "tool_calls": [{**CALL, "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}],
    },
    {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "18 C, sunny"},
    {"role": "assistant", "reasoning_content": "Report it.", "content": "18 C and sunny."},
]
REASONING = [
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "reasoning_content": "Simple sum.", "content": "4"},
    {"role": "user", "content": [{"type": "text", "text": "And "}, {"type": "text", "text": "3*3?"}]},
    {
        "role": "assistant",
        "reasoning": "Use the calculator.",
        "name": "calc",
        "tool_calls": [
            {"id": "functions.mul:1", "type": "function", "function": {"name": "mul", "arguments": {"a": 3, "b": 3}}}
        ],
    },
    {"role": "tool", "tool_call_id": "functions.mul:1", "content": "9"},
]
# ReferenceKimi (tests/reference_kimi.py: transformers' renderer and slow tokenizer), pinned.
TOOL_CALLS_HEAD = [
    163594, 20960, 35556, 677, 163601, 2, 30391, 382, 798, 8271, 198, 6370, 8271, 440, 408, 15545, 10666, 318, 261,
    5243, 341, 2217, 922, 21055, 2800, 327, 9600, 25, 440, 220, 5243, 25, 2204, 422, 220, 7404, 8042, 414, 66, 1, 950,
    414, 69, 1057, 9483, 1318, 1178, 303, 896, 163586, 163594, 14062, 163601, 3900, 554, 93330, 13, 163586, 163587,
    2482, 163601, 65512, 306, 17374, 30, 163586, 163588, 69702, 163601, 163606,
]  # fmt: skip
TOOL_CALL_AND_RESULT = [
    163595, 163597, 41937, 1150, 21055, 2800, 25, 15, 163598, 8264, 37666, 1289, 414, 113476, 16934, 163599, 163596,
    163586, 163594, 20960, 163601, 798, 6014, 318, 8271, 1150, 21055, 2800, 25, 15, 198, 1428, 396, 11, 41149, 163586,
    163588, 69702, 163601, 163606,
]  # fmt: skip
GOLDEN = {
    ("tool calls", False): (
        [*TOOL_CALLS_HEAD, 163607, *TOOL_CALL_AND_RESULT, 163607, 1428, 396, 316, 41149, 13, 163586],
        [(69, 89), (110, 118)],
    ),
    ("tool calls", True): (
        [*TOOL_CALLS_HEAD, 4612, 276, 4453, 13, 163607, *TOOL_CALL_AND_RESULT, 14311, 483, 13, 163607, 1428, 396, 316,
         41149, 13, 163586],
        [(69, 93), (114, 125)],
    ),
    ("reasoning", False): (
        [163587, 2482, 163601, 17, 10, 17, 30, 163586, 163588, 69702, 163601, 163606, 163607, 19, 163586, 163587, 2482,
         163601, 3951, 220, 18, 9, 18, 30, 163586, 163588, 48556, 163601, 163606, 8962, 276, 53133, 13, 163607, 163595,
         163597, 41937, 35387, 25, 16, 163598, 8264, 64, 1289, 220, 18, 11, 414, 65, 1289, 220, 18, 92, 163599, 163596,
         163586, 163594, 20960, 163601, 798, 6014, 318, 8271, 35387, 25, 16, 198, 24, 163586],
        [(11, 15), (28, 56)],
    ),
    ("reasoning", True): (
        [163587, 2482, 163601, 17, 10, 17, 30, 163586, 163588, 69702, 163601, 163606, 17499, 5547, 13, 163607, 19,
         163586, 163587, 2482, 163601, 3951, 220, 18, 9, 18, 30, 163586, 163588, 48556, 163601, 163606, 8962, 276,
         53133, 13, 163607, 163595, 163597, 41937, 35387, 25, 16, 163598, 8264, 64, 1289, 220, 18, 11, 414, 65, 1289,
         220, 18, 92, 163599, 163596, 163586, 163594, 20960, 163601, 798, 6014, 318, 8271, 35387, 25, 16, 198, 24,
         163586],
        [(11, 18), (31, 59)],
    ),
}  # fmt: skip
SETTINGS = {
    "default": {"thinking": True, "preserve_thinking": False},
    "preserve": {"thinking": True, "preserve_thinking": True},
    "no thinking": {"thinking": False, "preserve_thinking": False},
    "no thinking, preserve": {"thinking": False, "preserve_thinking": True},
}


@pytest.fixture(scope="module", params=list(SETTINGS))
def pair(request, tokenizer, kimi_dir):
    """The encoder and the reference under one setting of the template variables."""
    from reference_kimi import ReferenceKimi

    kwargs = SETTINGS[request.param]
    return ChatEncoder(tokenizer, template_kwargs=kwargs), ReferenceKimi(kimi_dir, kwargs)


def _mask(length: int, runs: list[tuple[int, int]]) -> list[int]:
    mask = [0] * length
    for start, end in runs:
        mask[start:end] = [1] * (end - start)
    return mask


@pytest.mark.parametrize("preserve", [False, True])
@pytest.mark.parametrize("name", ["tool calls", "reasoning"])
def test_goldens(tokenizer, name, preserve):
    """Pinned ids and masks: the history's reasoning is dropped unless preserve_thinking
    (the tool-call conversation ends on an answer, so all of it is history; the reasoning
    one ends on a tool result, so its last assistant message keeps its reasoning)."""
    encoder = ChatEncoder(tokenizer, template_kwargs={"thinking": True, "preserve_thinking": preserve})
    messages, tools = (TOOL_CALLS, WEATHER) if name == "tool calls" else (REASONING, None)
    ids, runs = GOLDEN[name, preserve]
    assert encoder.encode(messages, tools) == (ids, _mask(len(ids), runs))


def test_goldens_are_the_references(kimi_dir):
    from reference_kimi import ReferenceKimi

    for preserve in (False, True):
        reference = ReferenceKimi(kimi_dir, {"thinking": True, "preserve_thinking": preserve})
        for name, messages, tools in (("tool calls", TOOL_CALLS, WEATHER), ("reasoning", REASONING, None)):
            ids, runs = GOLDEN[name, preserve]
            assert reference.chat_ids(messages, tools=tools) == ids
            assert reference.chat_mask(messages, tools) == _mask(len(ids), runs)


@settings(derandomize=True, max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(example=S.agentic_conversations())
def test_agentic_conversations_match_reference(pair, example):
    encoder, reference = pair
    S.check_agentic(encoder, reference, *example)


def test_the_template_variables_decide_the_think_blocks(tokenizer):
    messages = REASONING[:2] + [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    trailing = REASONING[3:]
    think, end = tokenizer.added["<think>"], tokenizer.added["</think>"]
    for kwargs, reasoned in [
        ({"thinking": True, "preserve_thinking": False}, 1),  # only after the last answer
        ({"thinking": True, "preserve_thinking": True}, 2),
        ({"thinking": False, "preserve_thinking": False}, 0),
        ({"thinking": False, "preserve_thinking": True}, 2),
    ]:
        ids, _ = ChatEncoder(tokenizer, template_kwargs=kwargs).encode(messages + trailing)
        empty = sum(1 for a, b in zip(ids, ids[1:]) if (a, b) == (think, end))
        assert ids.count(think) == 3 and empty == 3 - reasoned, kwargs


def test_plain_conversations_stay_on_the_per_message_path(encoder, monkeypatch):
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
    ]
    expected = encoder.encode(messages)
    monkeypatch.setattr(ChatEncoder, "_write_out", lambda *args: pytest.fail("written out"))
    assert encoder.encode(messages) == expected


def _edited(kimi_dir, folder, old: str, new: str):
    from fixed_sft.tokenizer import KimiTokenizer

    folder.mkdir()
    for name in ("tiktoken.model", "tokenizer_config.json"):
        (folder / name).symlink_to(kimi_dir / name)
    template = (kimi_dir / "chat_template.jinja").read_text()
    assert old in template
    (folder / "chat_template.jinja").write_text(template.replace(old, new))
    return KimiTokenizer(folder)


@pytest.mark.parametrize(
    "old, new",
    [
        ("## Return of {{ tool_call_id }}", "## Result of {{ tool_call_id }}"),  # tool results worded otherwise
        ("<|tool_call_begin|>{{ formatted_id }}", "<|tool_call_begin|>{{ tool_call['function']['name'] }}"),
        ("{%- set role_name =  message.get('name') or  message['role'] -%}", "{%- set role_name = message['role'] -%}"),
        ("<think></think>{{render_content(message)}}\n    {%- if message.get('tool_calls') -%}\n      {{render",
         "<think>{{ message.get('reasoning_content', '') }}</think>{{render_content(message)}}\n"
         "    {%- if message.get('tool_calls') -%}\n      {{render"),  # reasoning kept in the history
        ("{{ tools_ts_str }}", "{{ tools | tojson }}"),
        ("{{ content['text'] }}", "{{ content['text'] }}{{ ' ' }}"),  # parts joined with spaces
    ],
)  # fmt: skip
def test_a_template_that_renders_agentic_shapes_otherwise_encodes_only_plain_conversations(
    kimi_dir, tmp_path, old, new
):
    encoder = ChatEncoder(_edited(kimi_dir, tmp_path / "tok", old, new))
    plain = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert encoder.encode(plain)[0] == encoder.reference_ids(plain)
    with pytest.raises(TemplateMismatch, match="does not render .* as the kimi_k25 encoder writes them"):
        encoder.encode(TOOL_CALLS, WEATHER)
    from fixed_sft.encode import Chunk, encode_rows

    rows = [{"id": "plain", "messages": plain}, {"id": "agentic", "messages": TOOL_CALLS}]
    with pytest.raises(TemplateMismatch, match=r"^source row 1 \(id agentic\): .* does not render"):
        list(encode_rows(encoder, Chunk(_chunk(rows), 0)))


def test_the_sampled_check_covers_tools(encoder):
    ids = encoder.encode_arrays(TOOL_CALLS, WEATHER)[0]
    encoder.check(TOOL_CALLS, ids, WEATHER)
    with pytest.raises(TemplateMismatch):
        encoder.check(TOOL_CALLS, ids)  # the declaration is part of the ids
    with pytest.raises(TemplateMismatch):
        encoder.check(TOOL_CALLS, np.delete(ids, 80), WEATHER)


def test_an_empty_tools_list_is_no_tools_to_kimi(encoder):
    """Kimi's template declares tools only where there are some: ``[]`` encodes as none."""
    none = encoder.encode_arrays(TOOL_CALLS, None)
    empty = encoder.encode_arrays(TOOL_CALLS, [])
    assert all(np.array_equal(x, y) for x, y in zip(none, empty))
    assert encoder.reference_ids(TOOL_CALLS, []) == none[0].tolist()
    encoder.check(TOOL_CALLS, empty[0], [])


def _chunk(lines: list[dict]):
    """A chunk of JSONL rows, as ``fixed_sft.bands`` reads them."""
    import pyarrow as pa

    raw = pa.array([json.dumps(line).encode() for line in lines], pa.large_binary())
    n = len(lines)
    return pa.table(
        {"line": raw, "bytes": [len(v.as_py()) for v in raw], "dropped": [False] * n, "index": list(range(n))}
    )


def test_rows_the_encoder_cannot_take_are_invalid_rows_named_by_id(encoder):
    from fixed_sft.encode import Chunk, encode_rows

    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    lines = [
        {"id": "img", "messages": [image]},
        {"id": "key", "messages": [{"role": "assistant", "content": "a", "thinking": "r"}]},
        {"id": "tool", "messages": [{"role": "tool", "content": "out"}]},
        {"id": "good", "messages": TOOL_CALLS, "tools": WEATHER},
    ]
    got = list(encode_rows(encoder, Chunk(_chunk(lines), 1)))
    assert [(item.id, item.invalid) for item in got[:3]] == [
        ("img", "message 0 content part 0 is an image, which the kimi_k25 encoder does not take"),
        ("key", "message 0 has the key 'thinking', which the kimi_k25 encoder does not read"),
        ("tool", "message 0 is a tool message without 'tool_call_id'"),
    ]
    assert got[3].invalid is None and got[3].checked
    assert got[3].ids.tolist() == encoder.encode(TOOL_CALLS, WEATHER)[0]
    with pytest.raises(InvalidRow, match="'tools' nests deeper than 64 levels"):
        from fixed_sft.conversation import conversation

        deep: list = ["x"]
        for _ in range(70):
            deep = [deep]
        conversation({"id": "deep", "messages": TOOL_CALLS, "tools": [{"a": deep}]}, encoder.schema)


def _trajectories(n: int) -> list[dict]:
    """Agentic rows that Parquet can hold too (string contents and arguments; tools as a
    JSON string), each its own texts."""
    rows = []
    for k in range(n):
        call = {**CALL, "id": f"functions.get_weather:{k}"}
        city = ["Paris", "Oslo", " Lima\n", "東京"][k % 4]
        messages = [
            {**m, "content": m["content"].replace("Paris", city)} if isinstance(m.get("content"), str) else dict(m)
            for m in TOOL_CALLS
        ]
        messages[2]["tool_calls"] = [{**call, "function": {"name": "get_weather", "arguments": f'{{"city": "{k}"}}'}}]
        messages[3]["tool_call_id"] = call["id"]
        rows.append({"id": f"t{k}", "messages": messages[: 5 - k % 3], "tools": json.dumps(WEATHER) if k % 2 else None})
    rows.append({"id": "plain", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})
    return rows


def _build_here(source, kimi_dir, out, *extra) -> int:
    from fixed_sft.cli import main

    args = ["build", "--source", os.path.relpath(source), "--tokenizer", str(kimi_dir), "--rows", "all"]
    args += ["--row-tokens", "64", "--out", str(out), "--workers", "1", "--check-every", "1", "--quiet", *extra]
    return main(args)


def test_an_agentic_build_records_its_template_variables_and_rebuilds(kimi_dir, tmp_path, monkeypatch, capsys):
    """A JSONL build of agentic rows (REASONING among them: content parts, object
    arguments) with the template variables given: the manifest records them, every row is
    checked against the template, ``verify --rebuild`` proves it, and a manifest that
    misstates them is caught; a Parquet file of the same rows gives the same rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fixed_sft.cli import main

    monkeypatch.chdir(tmp_path)
    rows = _trajectories(12)
    (tmp_path / "rows.jsonl").write_text(
        "".join(json.dumps(row) + "\n" for row in [*rows, {"id": "r", "messages": REASONING}])
    )
    preserve = {"thinking": True, "preserve_thinking": True}
    assert (
        _build_here(tmp_path / "rows.jsonl", kimi_dir, tmp_path / "o", "--template-kwargs", json.dumps(preserve)) == 0
    )
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["loss_mask"]["template_kwargs"] == preserve
    assert manifest["template_check"]["checked"] == len(rows) + 1 and manifest["stats"]["invalid_rows_skipped"] == 0
    capsys.readouterr()
    assert main(["verify", "o", "--rebuild", "--quiet", "--tokenizer", str(kimi_dir), "--workers", "1"]) == 0
    assert "gives the same rows and manifest" in capsys.readouterr().out

    assert _build_here(tmp_path / "rows.jsonl", kimi_dir, tmp_path / "default") == 0
    default = json.loads((tmp_path / "default" / "manifest.json").read_text())
    assert default["loss_mask"]["template_kwargs"] == {"thinking": True, "preserve_thinking": False}
    assert default["rows_sha256"] != manifest["rows_sha256"]  # the history's reasoning is left out
    edited = {
        **manifest,
        "loss_mask": {**manifest["loss_mask"], "template_kwargs": default["loss_mask"]["template_kwargs"]},
    }
    (tmp_path / "o" / "manifest.json").write_text(json.dumps(edited))
    capsys.readouterr()
    assert main(["verify", "o", "--rebuild", "--quiet", "--tokenizer", str(kimi_dir), "--workers", "1"]) == 1
    assert "rows_sha256: differs" in capsys.readouterr().out

    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rows.parquet")
    assert (
        _build_here(tmp_path / "rows.jsonl", kimi_dir, tmp_path / "j", "--template-kwargs", json.dumps(preserve)) == 0
    )
    assert (
        _build_here(tmp_path / "rows.parquet", kimi_dir, tmp_path / "p", "--template-kwargs", json.dumps(preserve)) == 0
    )
    read = [json.loads((tmp_path / name / "manifest.json").read_text()) for name in ("j", "p")]
    assert read[0]["rows_sha256"] == read[1]["rows_sha256"] and read[0]["stats"]["invalid_rows_skipped"] == 0


@pytest.mark.parametrize("value", ["[1]", "true", "{x", '"thinking"', "[1"])
def test_template_variables_that_are_not_a_json_object_are_a_usage_error(value, capsys):
    from fixed_sft.cli import main

    if value.startswith(("{", "[")) and value[-1] not in "}]":  # (not JSON: the parser's error)
        with pytest.raises(SystemExit, match="2"):
            main(["build", "--source", "none.jsonl", "--template-kwargs", value])
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "argument --template-kwargs: not JSON (" in err
        return
    assert main(["build", "--source", "none.jsonl", "--template-kwargs", value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--template-kwargs must be a JSON object" in err


@pytest.mark.parametrize("name", ["tools", "messages", "add_generation_prompt", "chat_template", "tools_ts_str"])
def test_template_variables_the_renderer_sets_are_a_usage_error(name, tmp_path, capsys):
    """A variable the renderer passes itself (or takes as its own argument) would clash as
    it renders: refused by name before anything is read, for a build and for a pin."""
    from fixed_sft.cli import main

    value = json.dumps({name: [1]})
    assert main(["build", "--source", "none.jsonl", "--template-kwargs", value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--template-kwargs may not set {name!r}: the renderer sets it" in err
    pin = ["pin-tokenizer", "org/model", "--revision", "a" * 40, "--out", str(tmp_path / "spec.json")]
    assert main([*pin, "--template-kwargs", value]) == 2
    assert f"--template-kwargs may not set {name!r}" in capsys.readouterr().err


def test_a_named_build_pins_its_template_variables(tmp_path, monkeypatch):
    """A spec's ``template_kwargs`` are the build's unless the flag overrides them; a spec
    whose value is not an object is named."""
    from fixed_sft import specs
    from fixed_sft.cli import _config, parser
    from fixed_sft.specs import SpecError, build_spec

    monkeypatch.setattr(specs, "BUILDS", tmp_path)
    pinned = {"thinking": True, "preserve_thinking": True}
    (tmp_path / "agentic.json").write_text(json.dumps({"source": "x.jsonl", "template_kwargs": pinned}))
    config, _, _ = _config(parser().parse_args(["build", "agentic"]))
    assert config.template_kwargs == pinned
    config, _, _ = _config(parser().parse_args(["build", "agentic", "--template-kwargs", '{"thinking": false}']))
    assert config.template_kwargs == {"thinking": False}
    config, _, _ = _config(parser().parse_args(["build", "--source", "x.jsonl"]))
    assert config.template_kwargs is None  # the tokenizer spec's
    (tmp_path / "bad.json").write_text(json.dumps({"source": "x.jsonl", "template_kwargs": [1]}))
    with pytest.raises(SpecError, match="bad.json: template_kwargs is \\[1\\], not an object or null"):
        build_spec("bad")


def test_a_parquet_value_of_no_json_kind_is_an_invalid_row(kimi_dir, tmp_path):
    """A decimal in a tool call's arguments (a Parquet struct) is named as an invalid row,
    and skipped with --skip-invalid: no internal error."""
    import decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": decimal.Decimal("1.50")}}}
    odd = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    odd.append({"role": "tool", "content": "r", "tool_call_id": "c1"})
    plain = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a " * 40}]
    rows = [{"id": "odd", "messages": odd}, *({"id": f"r{i}", "messages": plain} for i in range(6))]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rows.parquet")
    assert _build_here(tmp_path / "rows.parquet", kimi_dir, tmp_path / "stop") == 1
    assert _build_here(tmp_path / "rows.parquet", kimi_dir, tmp_path / "o", "--skip-invalid") == 0
    [skipped] = json.loads((tmp_path / "o" / "manifest.json").read_text())["skipped_invalid"]
    assert skipped["id"] == "odd" and skipped["reason"] == "message 1 holds a Decimal, which is not a JSON value"


def test_values_of_arrows_json_type_are_read_as_the_json_they_hold(kimi_dir, tmp_path):
    """``datasets`` writes a field whose type varies by row (content a string here and parts
    there, arguments of other keys) as Arrow's JSON type: text holding the value. The rows
    are those of the same conversations as JSONL, not of the JSON text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def call(k: int, arguments: dict) -> dict:
        function = {"name": "tool", "arguments": arguments}
        return {"id": f"functions.tool:{k}", "type": "function", "function": function}

    rows = [
        {
            "id": "a",
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [call(0, {"city": "Paris"})]},
                {"role": "tool", "content": "sunny", "tool_call_id": "functions.tool:0"},
                {"role": "assistant", "content": "It is sunny."},
            ],
        },
        {
            "id": "b",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                *[{"role": "assistant", "content": "Hello " * 30}],
            ],
        },
        {
            "id": "c",
            "messages": [
                {"role": "user", "content": "Add"},
                *[
                    {"role": "assistant", "content": "", "tool_calls": [call(1, {"a": 1, "b": [2, None]})]},
                    {"role": "tool", "content": "3", "tool_call_id": "functions.tool:1"},
                    {"role": "assistant", "content": "3, as asked " * 9},
                ],
            ],
        },
    ]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))

    def texts(message: dict) -> dict:  # (as datasets stores it: JSON text, a null where a key is absent)
        calls = message.get("tool_calls")
        return {
            "role": message["role"],
            "content": json.dumps(message["content"]),
            "tool_calls": None
            if calls is None
            else [
                {**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}} for c in calls
            ],
            "tool_call_id": message.get("tool_call_id"),
        }

    function = pa.struct([("name", pa.string()), ("arguments", pa.string())])
    calls = pa.list_(pa.struct([("id", pa.string()), ("type", pa.string()), ("function", function)]))
    stored = [("role", pa.string()), ("content", pa.string()), ("tool_calls", calls), ("tool_call_id", pa.string())]
    json_calls = pa.list_(
        pa.struct(
            [
                ("id", pa.string()),
                ("type", pa.string()),
                ("function", pa.struct([("name", pa.string()), ("arguments", pa.json_())])),
            ]
        )
    )
    typed = [("role", pa.string()), ("content", pa.json_()), ("tool_calls", json_calls), ("tool_call_id", pa.string())]
    messages = pa.array([[texts(m) for m in row["messages"]] for row in rows], pa.list_(pa.struct(stored)))
    table = pa.table({"id": [row["id"] for row in rows], "messages": messages.cast(pa.list_(pa.struct(typed)))})
    pq.write_table(table, tmp_path / "rows.parquet")
    assert _build_here(tmp_path / "rows.jsonl", kimi_dir, tmp_path / "jsonl") == 0
    assert _build_here(tmp_path / "rows.parquet", kimi_dir, tmp_path / "parquet") == 0
    hashes = [
        json.loads((tmp_path / name / "manifest.json").read_text())["rows_sha256"] for name in ("jsonl", "parquet")
    ]
    assert hashes[0] == hashes[1]

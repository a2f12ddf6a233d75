"""fixed_sft.tool_declarations against golden declarations from the model's own encoder.

Every ``EXPECTED`` text was printed by Kimi K2.5's ``tool_declaration_ts.py``
(``encode_tools_to_typescript_style``, the encoder Kimi-K2.6's tokenizer calls) on
``sort_keys(tools)`` for the ``CASES`` below, and pinned here. ``REFUSED`` are tools on
which that encoder raises; ``EMPTY`` are tools for which it gives ``""``. In both, the
model's template declares the tools as JSON instead.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from fixed_sft.tool_declarations import Declaration, ToolDeclarationError, declare, sort_keys, typescript_declarations


def fn(name: str, parameters: Any = None, description: Any = None) -> dict[str, Any]:
    """An OpenAI-style function tool."""
    function: dict[str, Any] = {"name": name}
    if description is not None:
        function["description"] = description
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


CASES = {
    "weather": [
        fn(
            "get_weather",
            {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"], "default": "c"}},
                "required": ["city"],
            },
            "Gets the weather.",
        )
    ],
    "scalars": [
        fn(
            "scalars",
            {
                "type": "object",
                "properties": {
                    "s": {"type": "string"},
                    "n": {"type": "number"},
                    "i": {"type": "integer"},
                    "b": {"type": "boolean"},
                    "z": {"type": "null"},
                    "anything": {},
                    "yes": True,
                    "no": False,
                },
                "required": ["s", "n", "i", "b", "z"],
            },
        )
    ],
    "enums": [
        fn(
            "enums",
            {
                "type": "object",
                "properties": {
                    "color": {"type": "string", "enum": ["red", "green", "dark blue"], "description": "A color."},
                    "level": {"type": "integer", "enum": [1, 2, 3]},
                    "mixed": {"enum": ["a", 1, 2.5, True, None]},
                    "maybe": {"type": ["string", "null"], "enum": ["x", None]},
                    "quoted": {"enum": ['say "hi"', ""]},
                    "empty": {"enum": []},
                },
                "required": ["color"],
            },
        )
    ],
    "arrays": [
        fn(
            "arrays",
            {
                "type": "object",
                "properties": {
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "anything": {"type": "array"},
                    "bounded": {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 3},
                    "points": {
                        "type": "array",
                        "description": "Points to visit.",
                        "items": {
                            "type": "object",
                            "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                            "required": ["x", "y"],
                        },
                    },
                    "described": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "description": "A point.",
                            "properties": {"x": {"type": "number", "description": "Across."}},
                        },
                    },
                    "limited_items": {"type": "array", "items": {"type": "string", "maxLength": 8}},
                    "grid": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
                },
                "required": ["tags"],
            },
        )
    ],
    "nested": [
        fn(
            "nested",
            {
                "type": "object",
                "properties": {
                    "user": {
                        "type": "object",
                        "description": "The user.",
                        "properties": {
                            "name": {"type": "string", "description": "Full name."},
                            "address": {
                                "type": "object",
                                "properties": {
                                    "street": {"type": "string"},
                                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                                },
                                "required": ["street"],
                            },
                        },
                        "required": ["name"],
                    },
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "open": {"type": "object", "properties": {"k": {"type": "string"}}, "additionalProperties": True},
                    "closed": {
                        "type": "object",
                        "properties": {"k": {"type": "string"}},
                        "additionalProperties": False,
                    },
                    "bare": {"type": "object"},
                },
                "required": ["user"],
            },
        )
    ],
    "defs": [
        fn(
            "defs",
            {
                "type": "object",
                "$defs": {
                    "Unit": {"type": "string", "enum": ["c", "f"], "description": "A unit.\nCelsius or Fahrenheit."},
                    "Place": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}, "unit": {"$ref": "#/$defs/Unit"}},
                        "required": ["city"],
                    },
                },
                "properties": {
                    "place": {"$ref": "#/$defs/Place", "description": "Where."},
                    "places": {"type": "array", "items": {"$ref": "#/$defs/Place"}},
                },
                "required": ["place"],
            },
        )
    ],
    "self_ref": [
        fn(
            "tree",
            {
                "type": "object",
                "properties": {"value": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}},
                "required": ["value"],
                "additionalProperties": False,
            },
            "A tree.",
        )
    ],
    "defaults": [
        fn(
            "defaults",
            {
                "type": "object",
                "properties": {
                    "s": {"type": "string", "default": 'naïve "x"'},
                    "i": {"type": "integer", "default": 3},
                    "f": {"type": "number", "default": 0.5},
                    "big": {"type": "number", "default": 1e20},
                    "b": {"type": "boolean", "default": False},
                    "l": {"type": "array", "default": [1, "a"]},
                    "d": {"type": "object", "default": {"k": "v", "a": 1}},
                    "n": {"type": "string", "default": None},
                },
            },
        )
    ],
    "constraints": [
        fn(
            "constraints",
            {
                "type": "object",
                "properties": {
                    "name": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": 40,
                        "pattern": "^[a-z]+$",
                        "format": "hostname",
                    },
                    "ratio": {"type": "number", "minimum": 0, "maximum": 1.5, "exclusiveMaximum": 2, "multipleOf": 0.5},
                    "count": {"type": "integer", "minimum": 1, "description": "How many."},
                },
                "required": ["name", "ratio", "count"],
            },
        )
    ],
    "descriptions": [
        fn(
            "describe",
            {
                "type": "object",
                "description": "Not written.",
                "properties": {
                    "text": {
                        "type": "string",
                        "description": "First line.\n\nThird line, after a blank one.\n  indented",
                    }
                },
            },
            "Does a thing.\nSecond line.\n\nFourth line.",
        )
    ],
    "ordering": [
        fn(
            "ordering",
            {
                "type": "object",
                "properties": {
                    "zeta": {"type": "string"},
                    "beta": {"type": "string"},
                    "alpha": {"type": "string"},
                    "gamma": {"type": "string"},
                },
                "required": ["zeta", "beta"],
            },
        )
    ],
    "several": [
        fn("first", {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}, "The first."),
        {"type": "_plugin", "_plugin": {"name": "skipped"}},
        fn("second", description="No parameters."),
        fn("third", {}),
    ],
    "unions": [
        fn(
            "unions",
            {
                "type": "object",
                "properties": {
                    "id": {"anyOf": [{"type": "string"}, {"type": "integer"}], "description": "An id."},
                    "opt": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
                    "listed": {"type": ["string", "number", "null"]},
                    "wide": {"type": ["object", "array", "integer", "boolean"]},
                },
                "required": ["id"],
            },
        )
    ],
    "required_string": [
        fn(
            "required_string",
            {
                "type": "object",
                "properties": {"a": {"type": "string"}, "b": {"type": "string"}, "ab": {"type": "string"}},
                "required": "ab",
            },
        )
    ],
    "root_ref_in_defs_only": [
        fn(
            "f",
            {
                "type": "object",
                "$defs": {"Node": {"type": "object", "properties": {"up": {"$ref": "#"}}}},
                "properties": {"node": {"$ref": "#/$defs/Node"}},
            },
        )
    ],
    "odd_type": [
        fn(
            "odd_type",
            {
                "type": "object",
                "properties": {"a": {"type": 5}, "b": {"type": "any"}, "c": {"type": "array", "items": {"type": None}}},
            },
        )
    ],
}

REFUSED = {
    "enum_type_mismatch": [fn("f", {"type": "object", "properties": {"a": {"type": "integer", "enum": [1, "two"]}}})],
    "enum_type_list": [fn("f", {"type": "object", "properties": {"a": {"type": ["string", "number"], "enum": ["a"]}}})],
    "unknown_ref": [fn("f", {"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}})],
    "definitions_ref": [
        fn(
            "f",
            {
                "type": "object",
                "definitions": {"A": {"type": "string"}},
                "properties": {"a": {"$ref": "#/definitions/A"}},
            },
        )
    ],
    "one_of": [fn("f", {"type": "object", "properties": {"a": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}})],
    "description_only": [fn("f", {"type": "object", "properties": {"a": {"description": "No type."}}})],
    "unknown_type_in_list": [fn("f", {"type": "object", "properties": {"a": {"type": ["string", "date"]}}})],
    "additional_properties_number": [fn("f", {"type": "object", "properties": {}, "additionalProperties": 1})],
    "description_not_string": [
        fn("f", {"type": "object", "properties": {"a": {"type": "string", "description": ["x"]}}})
    ],
    "function_description_not_string": [fn("f", {}, description={"text": "x"})],
    "odd_type_in_any_of": [fn("f", {"type": "object", "properties": {"a": {"anyOf": [{"type": 5}]}}})],
    "boolean_definition": [fn("f", {"type": "object", "$defs": {"A": True}, "properties": {}})],
    "parameters_not_object": [fn("f", ["a"])],
    "function_not_object": [{"type": "function", "function": "f"}],
    "tool_not_object": ["f"],
    "required_not_list": [fn("f", {"type": "object", "properties": {"a": {"type": "string"}}, "required": 1})],
}

EMPTY = {
    "no_function": [{"type": "_plugin", "_plugin": {}}],
    "empty_function": [{"type": "function", "function": {}}, {"type": "function"}],
}

EXPECTED = {
    "weather": """\
# Tools

## functions
namespace functions {
// Gets the weather.
type get_weather = (_: {
  city: string,
  // Default: "c"
  unit?: "c" | "f"
}) => any;
}
""",
    "scalars": """\
# Tools

## functions
namespace functions {
type scalars = (_: {
  b: boolean,
  i: number,
  n: number,
  s: string,
  z: null,
  anything?: any,
  no?: null,
  yes?: any
}) => any;
}
""",
    "enums": """\
# Tools

## functions
namespace functions {
type enums = (_: {
  // A color.
  color: "red" | "green" | "dark blue",
  empty?: ,
  level?: 1 | 2 | 3,
  maybe?: "x" | None,
  mixed?: "a" | 1 | 2.5 | True | None,
  quoted?: "say "hi"" | ""
}) => any;
}
""",
    "arrays": """\
# Tools

## functions
namespace functions {
type arrays = (_: {
  tags: Array<string>,
  anything?: Array<any>,
  // maxItems: 3, minItems: 1
  bounded?: Array<number>,
  described?: Array<
    // A point.
    {
      // Across.
      x?: number
    }
  >,
  grid?: Array<Array<number>>,
  limited_items?: Array<
    // maxLength: 8
    string
  >,
  // Points to visit.
  points?: Array<{
    x: number,
    y: number
  }>
}) => any;
}
""",
    "nested": """\
# Tools

## functions
namespace functions {
type nested = (_: {
  // The user.
  user: {
    // Full name.
    name: string,
    address?: {
      street: string,
      // pattern: ^[0-9]{5}$
      zip?: string
    }
  },
  bare?: {},
  closed?: {
    k?: string,
    [k: string]: never
  },
  labels?: {
    [k: string]: string
  },
  open?: {
    k?: string,
    [k: string]: any
  }
}) => any;
}
""",
    "defs": """\
# Tools

## functions
namespace functions {
interface Place {
  city: string,
  unit?: Unit
}
// A unit.
// Celsius or Fahrenheit.
interface Unit "c" | "f"
type defs = (_: {
  // Where.
  place: Place,
  places?: Array<Place>
}) => any;
}
""",
    "self_ref": """\
# Tools

## functions
namespace functions {
interface parameters {
  children?: Array<parameters>,
  value: string
}
// A tree.
type tree = (_: parameters) => any;
}
""",
    "defaults": """\
# Tools

## functions
namespace functions {
type defaults = (_: {
  // Default: False
  b?: boolean,
  // Default: 1e+20
  big?: number,
  // Default: {"a": 1, "k": "v"}
  d?: {},
  // Default: 0.5
  f?: number,
  // Default: 3
  i?: number,
  // Default: [1, "a"]
  l?: Array<any>,
  n?: string,
  // Default: "naïve \\"x\\""
  s?: string
}) => any;
}
""",
    "constraints": """\
# Tools

## functions
namespace functions {
type constraints = (_: {
  // How many.
  // minimum: 1
  count: number,
  // maxLength: 40, minLength: 1, pattern: ^[a-z]+$
  name: string,
  // maximum: 1.5, minimum: 0
  ratio: number
}) => any;
}
""",
    "descriptions": """\
# Tools

## functions
namespace functions {
// Does a thing.
// Second line.

// Fourth line.
type describe = (_: {
  // First line.

  // Third line, after a blank one.
  //   indented
  text?: string
}) => any;
}
""",
    "ordering": """\
# Tools

## functions
namespace functions {
type ordering = (_: {
  beta: string,
  zeta: string,
  alpha?: string,
  gamma?: string
}) => any;
}
""",
    "several": """\
# Tools

## functions
namespace functions {
// The first.
type first = (_: {
  q: string
}) => any;
// No parameters.
type second = (_: {}) => any;
type third = (_: {}) => any;
}
""",
    "unions": """\
# Tools

## functions
namespace functions {
type unions = (_: {
  // An id.
  id: string | number,
  listed?: string | number | null,
  opt?: Array<string> | null,
  wide?: {} | Array<any> | number | boolean
}) => any;
}
""",
    "required_string": """\
# Tools

## functions
namespace functions {
type required_string = (_: {
  a: string,
  b: string,
  ab?: string
}) => any;
}
""",
    "root_ref_in_defs_only": """\
# Tools

## functions
namespace functions {
interface Node {
  up?: parameters
}
type f = (_: {
  node?: Node
}) => any;
}
""",
    "odd_type": """\
# Tools

## functions
namespace functions {
type odd_type = (_: {
  a?: 5,
  b?: any,
  c?: Array<None>
}) => any;
}
""",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_declarations_equal_the_models(name):
    assert typescript_declarations(CASES[name]) == EXPECTED[name]
    assert declare(CASES[name]) == Declaration(EXPECTED[name], typescript=True)


def reversed_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: reversed_keys(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [reversed_keys(item) for item in value]
    return value


@pytest.mark.parametrize("name", ["defs", "self_ref", "defaults", "enums"])
def test_keys_are_sorted_first(name):
    """The model sorts before declaring: the order of keys in the input does not matter
    (these cases write $defs, root fields, a default object and an enum in key order)."""
    tools = reversed_keys(CASES[name])
    assert json.dumps(tools) != json.dumps(sort_keys(tools))
    assert typescript_declarations(tools) == EXPECTED[name]


def test_sort_keys_sorts_every_object_and_keeps_lists():
    value = {"b": [{"z": 1, "a": {"y": None, "x": [3, 1]}}, "s"], "a": True}
    result = sort_keys(value)
    assert json.dumps(result) == '{"a": true, "b": [{"a": {"x": [3, 1], "y": null}, "z": 1}, "s"]}'
    assert list(value) == ["b", "a"]  # the input is left as it was


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_where_the_model_refuses(name):
    with pytest.raises(ToolDeclarationError) as raised:
        typescript_declarations(REFUSED[name])
    assert isinstance(raised.value, ValueError) and "\n" not in str(raised.value)


@pytest.mark.parametrize("name", sorted(EMPTY))
def test_no_function_gives_no_declarations(name):
    assert typescript_declarations(EMPTY[name]) == ""


def test_no_tools_give_no_declarations():
    assert typescript_declarations([]) == ""


@pytest.mark.parametrize("name", sorted(set(REFUSED) - {"tool_not_object"}) + sorted(EMPTY))
def test_declare_falls_back_to_the_sorted_tools_as_json(name):
    tools = {**REFUSED, **EMPTY}[name]
    expected = json.dumps(sort_keys(tools), ensure_ascii=False, separators=(",", ":"))
    assert declare(tools) == Declaration(expected, typescript=False)


def test_declare_refuses_what_the_template_cannot_take():
    for tools in ([], None, {"type": "function"}):
        with pytest.raises(ValueError, match="non-empty list"):
            declare(tools)
    with pytest.raises(ValueError, match="tool 1 is not an object"):
        declare([fn("f"), "f"])


def render_declaration(kimi_dir, tools, **kwargs) -> str:
    """The tool declaration transformers renders from the model's chat template."""
    from transformers.utils.chat_template_utils import render_jinja_template

    template = (kimi_dir / "chat_template.jinja").read_text(encoding="utf-8")
    rendered, _ = render_jinja_template(
        conversations=[[{"role": "user", "content": "hi"}]], tools=tools, chat_template=template, **kwargs
    )
    head, tail = "<|im_system|>tool_declare<|im_middle|>", "<|im_end|>"
    assert rendered[0].startswith(head)
    return rendered[0][len(head) : rendered[0].index(tail)]


@pytest.mark.parametrize("name", ["weather", "defaults", "unions"])
def test_the_template_writes_the_declarations_as_given(kimi_dir, name):
    tools = sort_keys(CASES[name])
    assert render_declaration(kimi_dir, tools, tools_ts_str=declare(tools).text) == EXPECTED[name]


@pytest.mark.parametrize("name", ["one_of", "function_description_not_string", "no_function"])
def test_the_fallback_is_the_templates_json(kimi_dir, name):
    """What the model renders where its encoder raises (no ``tools_ts_str``) or gives
    ``""`` (the template then writes ``tools | tojson``, of the sorted tools)."""
    tools = {**REFUSED, **EMPTY}[name]
    kwargs = {"tools_ts_str": ""} if name in EMPTY else {}
    unicode = [*tools, {"type": "_plugin", "_plugin": {"name": "naïve ☂", "z": 1, "a": [2, "x"]}}]
    for case in (tools, unicode):
        declaration = declare(case)
        assert not declaration.typescript
        assert declaration.text == render_declaration(kimi_dir, sort_keys(case), **kwargs)


def test_tools_nested_too_deeply_are_not_declared():
    """Near Python's recursion limit, where the model's encoder stops is unknown: neither
    text is given (a ``ValueError`` that is not a ``ToolDeclarationError``)."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(5000):
        schema = {"type": "array", "items": schema}
    tools = [fn("deep", {"type": "object", "properties": {"a": schema}})]
    for declared in (typescript_declarations, declare):
        with pytest.raises(ValueError, match="too deeply") as raised:
            declared(tools)
        assert not isinstance(raised.value, ToolDeclarationError)


# ---------------------------------------------------------------------------
# The check against the model's own encoder, where a spec pins it
# ---------------------------------------------------------------------------

WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def _model_file(folder, body):
    import hashlib

    path = folder / "tool_declaration_ts.py"
    path.write_text(body)
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


AGREES = "from fixed_sft.tool_declarations import typescript_declarations as encode_tools_to_typescript_style\n"
DIFFERS = "def encode_tools_to_typescript_style(tools):\n    return 'namespace functions {}'\n"


def test_the_models_encoder_runs_only_at_its_pinned_sha256(tmp_path):
    from fixed_sft.tool_declarations import model_declarer

    path, digest = _model_file(tmp_path, AGREES)
    assert model_declarer(path, digest)(sort_keys(WEATHER)) == typescript_declarations(WEATHER)
    with pytest.raises(ValueError, match="its sha256 is not the pinned"):
        model_declarer(path, "0" * 64)
    path, digest = _model_file(tmp_path, "x = 1\n")
    with pytest.raises(ValueError, match="holds no encode_tools_to_typescript_style"):
        model_declarer(path, digest)


def test_a_declaration_is_compared_once_with_the_models():
    from fixed_sft.tool_declarations import ModelCheck

    calls = []
    check = ModelCheck(lambda tools: calls.append(1) or typescript_declarations(tools))
    assert check.check(WEATHER, declare(WEATHER)) is None and check.check(WEATHER, declare(WEATHER)) is None
    assert len(calls) == 1  # (each distinct tools list once)
    assert "differ from the model's own" in ModelCheck(lambda tools: "other").check(WEATHER, declare(WEATHER))

    def refuses(tools):
        raise KeyError("type")

    assert "differ" in ModelCheck(refuses).check(WEATHER, declare(WEATHER))  # the model would declare JSON


def test_a_build_stops_where_its_declarations_differ_from_the_models(kimi_dir, tmp_path, monkeypatch):
    import json

    import fixed_sft.specs as specs
    from fixed_sft.build import BuildConfig, build
    from fixed_sft.encoding import TemplateMismatch

    folder = tmp_path / "tok"
    folder.mkdir()
    for name in ("tiktoken.model", "tokenizer_config.json", "chat_template.jinja"):
        (folder / name).symlink_to(kimi_dir / name)
    call = {"id": "functions.get_weather:0", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    row = {
        "id": "agent-1",
        "tools": WEATHER,
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "sunny"},
            {"role": "assistant", "content": "It is sunny."},
        ],
    }
    source = tmp_path / "rows.jsonl"
    source.write_text(json.dumps(row) + "\n")
    config = BuildConfig(name="t", source=str(source), tokenizer=str(folder), rows=None, row_tokens=16, workers=1)
    for body, agrees in ((AGREES, True), (DIFFERS, False)):
        _, digest = _model_file(folder, body)
        monkeypatch.setattr(specs, "_declarations_pin", lambda spec, digest=digest: digest)
        out = tmp_path / f"out-{agrees}"
        if agrees:
            assert build(config, out)["stats"]["conversations"] == 1
        else:
            with pytest.raises(TemplateMismatch, match="the tool declarations differ from the model's own"):
                build(config, out)  # (at start-up: the encoder's probes declare tools too)
            assert not out.exists()

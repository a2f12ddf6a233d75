"""Fuzz fixed_sft.tool_declarations against the model's own tool_declaration_ts.py.

    python benchmarks/fuzz_tool_declarations.py PATH/tool_declaration_ts.py [--cases 5000] [--seed 0]

PATH is a copy of the model repository's ``tool_declaration_ts.py`` (Kimi K2.5 / K2.6),
kept outside this repository. Each case is a random list of tools: mostly plausible
JSON-schema function specs (every type, enums, arrays, nested objects, ``$defs`` and
``$ref``, defaults, constraints, multi-line descriptions), with values of the wrong kind
mixed in, so that both the text and the refusals are compared. Each case is compared
twice: ``typescript_declarations(tools)`` against the reference on ``sort_keys(tools)``
(what the model runs), and the unsorted tools against the reference as given.

A case agrees when both give the same text, or when the reference raises (any exception,
as the model's tokenizer catches any) and ours raises ``ToolDeclarationError``. Prints
the first differences, then ``compared N cases: A same text, R both refused, D differ``.
Exits 1 on a difference.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fixed_sft import tool_declarations as ours  # noqa: E402

NAMES = ["a", "b", "city", "unit", "Z", "x_1", "é", "$x", ""]
DEF_NAMES = ["Item", "Node", "Unit", "a"]
WORDS = ["the", "city", "name", "// odd", "Δ", '"q"', "<|im_end|>", "  spaced  "]


class Generator:
    """Random tools from one seeded ``random.Random``."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.messy = False  # drawn per tool list: only a messy one holds values of the wrong kind

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def wrong(self, p: float) -> bool:
        """Whether to put a value of the wrong kind here (never in a tidy tool list)."""
        return self.messy and self.chance(p)

    def either(self, tidy: list[Any], messy: list[Any]) -> Any:
        return self.pick(tidy + messy if self.messy else tidy)

    def pick(self, items: list[Any]) -> Any:
        return items[self.rng.randrange(len(items))]

    def text(self) -> str:
        lines = [" ".join(self.rng.choices(WORDS, k=self.rng.randint(1, 3))) for _ in range(self.rng.randint(1, 3))]
        if self.chance(0.3):
            lines.insert(self.rng.randint(0, len(lines)), "")
        return "\n".join(lines)

    def scalar(self) -> Any:
        return self.pick(
            [None, True, False, 0, 1, -7, 2**40, 1.5, 0.1, 1e20, float("inf"), "", "s", "a b", 'q"t', "Ω", "\n"]
        )

    def value(self, depth: int = 0) -> Any:
        """Any JSON value."""
        roll = self.rng.random()
        if depth > 2 or roll < 0.6:
            return self.scalar()
        if roll < 0.8:
            return [self.value(depth + 1) for _ in range(self.rng.randint(0, 3))]
        return {self.pick(NAMES): self.value(depth + 1) for _ in range(self.rng.randint(0, 3))}

    def odd(self) -> Any:
        """A value of a kind that is usually wrong where it is put."""
        return self.pick([None, 0, 3, True, False, "x", "", [], ["x"], {}, {"a": 1}, 1.5])

    def description(self) -> Any:
        return self.odd() if self.wrong(0.1) else self.text()

    def annotate(self, schema: dict[str, Any], kind: Any) -> dict[str, Any]:
        if self.chance(0.4):
            schema["description"] = self.description()
        if self.chance(0.25):
            schema["default"] = self.value()
        keys = {
            "string": ["minLength", "maxLength", "pattern", "format"],
            "number": ["minimum", "maximum", "exclusiveMinimum", "multipleOf"],
            "integer": ["minimum", "maximum"],
            "array": ["minItems", "maxItems", "uniqueItems"],
        }.get(kind if isinstance(kind, str) else "", ["minimum", "pattern"])
        for key in keys:
            if self.chance(0.2):
                schema[key] = self.pick([0, 3, 2.5, "^[a-z]+$", None, [1], "date"])
        return schema

    def schema(self, depth: int, defs: list[str]) -> Any:
        roll = self.rng.random()
        if depth > 3:
            roll = min(roll, 0.49)
        if self.wrong(0.02):
            return self.odd()
        if roll < 0.04:
            return self.pick([True, False, {}])
        if roll < 0.38:
            kind = self.either(["string", "number", "integer", "boolean", "null", "any"], ["str", 5, None])
            return self.annotate({"type": kind}, kind)
        if roll < 0.5:
            return self.enum()
        if roll < 0.62:
            return self.array(depth, defs)
        if roll < 0.75:
            return self.object(depth, defs)
        if roll < 0.83:
            return self.union(depth, defs)
        if roll < 0.92:
            return self.ref(defs)
        if roll < 0.97 or not self.messy:
            return self.annotate({"type": self.type_list()}, "")
        return self.pick([{"oneOf": [{"type": "string"}]}, {"description": "only"}, {"allOf": []}, {"default": 1}])

    def enum(self) -> dict[str, Any]:
        values = [self.scalar() for _ in range(self.rng.randint(0, 4))]
        if self.chance(0.5):
            values = [self.pick(["a", "b", "c d", 'x"y', ""]) for _ in range(self.rng.randint(1, 4))]
        schema: dict[str, Any] = {"enum": self.odd() if self.wrong(0.05) else values}
        if self.chance(0.6):
            if self.messy or all(isinstance(value, str) for value in values):
                tidy: list[Any] = ["string", ["string", "null"], ["null", "string"], ["string"], "other"]
            else:
                tidy = ["null", "other"]
            schema["type"] = self.either(
                tidy, ["number", "integer", "boolean", ["string", "number"], [], ["a", "b", "c"]]
            )
        return self.annotate(schema, "")

    def type_list(self) -> Any:
        names = ["string", "number", "integer", "boolean", "null", "object", "array"]
        chosen = self.rng.sample(names, self.rng.randint(0, 3))
        if self.wrong(0.2):
            chosen.append(self.pick(["any", "str", 1, None]))
        return chosen

    def array(self, depth: int, defs: list[str]) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "array"}
        roll = self.rng.random()
        if roll < 0.75:
            schema["items"] = self.schema(depth + 1, defs)
        elif roll < 0.85:
            schema["items"] = self.either([{}, [], False, True, None], [[{"type": "string"}], "string"])
        return self.annotate(schema, "array")

    def union(self, depth: int, defs: list[str]) -> dict[str, Any]:
        members: Any = [self.schema(depth + 1, defs) for _ in range(self.rng.randint(0, 3))]
        if self.wrong(0.1):
            members = self.pick(["", "ab", {}, {"a": 1}, 3, None])
        schema: dict[str, Any] = {"anyOf": members}
        if self.chance(0.2):
            schema["type"] = "object"
        return self.annotate(schema, "")

    def ref(self, defs: list[str]) -> dict[str, Any]:
        roll = self.rng.random()
        if roll < 0.7 and defs:
            ref: Any = "#/$defs/" + self.pick(defs)
        elif roll < 0.8 or not self.messy:
            ref = "#"
        else:
            ref = self.pick(["#/$defs/Missing", "#/definitions/Item", "Item", 3, None, "#/$defs/a/Item", "#/$defs/"])
        schema: dict[str, Any] = {"$ref": ref}
        if self.chance(0.2):
            schema["type"] = "string"
        return self.annotate(schema, "")

    def object(self, depth: int, defs: list[str], root: bool = False) -> Any:
        schema: dict[str, Any] = {"type": "object"} if not root or self.chance(0.9) else {}
        if self.chance(0.25 if root else 0.08):
            names = self.rng.sample(DEF_NAMES, self.rng.randint(1, 3))
            defs = defs + names
            definitions: Any = {}
            for name in names:
                definitions[name] = self.schema(depth + 1, defs)
                if self.wrong(0.05):
                    definitions[name] = {"$self_ref": True, "type": "object"}
            if self.wrong(0.05):
                definitions = self.odd()
            schema["$defs"] = definitions
        if self.chance(0.9):
            properties: Any = {}
            for _ in range(self.rng.randint(0, 4)):
                properties[self.pick(NAMES)] = self.schema(depth + 1, defs)
            if self.wrong(0.04):
                properties = self.odd()
            schema["properties"] = properties
            if self.chance(0.7):
                names = list(properties) if isinstance(properties, dict) else []
                required: Any = [name for name in names if self.chance(0.5)]
                if self.wrong(0.1):
                    required = self.pick(["ab", "", ["a", ["b"]], 1, None, {"a": 1}, [None, 1]])
                schema["required"] = required
        if self.chance(0.2):
            schema["additionalProperties"] = (
                self.schema(depth + 1, defs) if self.chance(0.5) else self.either([True, False, None], [0, 1, "x", []])
            )
        if not root:
            return self.annotate(schema, "object")
        if self.chance(0.2):
            schema["description"] = self.description()
        return schema

    def function(self) -> Any:
        if self.wrong(0.03):
            return self.odd()
        function: dict[str, Any] = {}
        if self.chance(0.95):
            function["name"] = self.either(["get_weather", "search", "f"], ["x-y", 3, None])
        if self.chance(0.7):
            function["description"] = self.description()
        roll = self.rng.random()
        if roll < 0.9:
            function["parameters"] = self.object(0, [], root=True)
        elif roll < 0.95:
            function["parameters"] = self.either([None, {}, {"type": "string"}], [[], "x", [1]])
        return function

    def tools(self) -> Any:
        self.messy = self.chance(0.5)
        tools: list[Any] = []
        for _ in range(self.rng.randint(1, 3)):
            roll = self.rng.random()
            if roll < 0.9:
                tools.append({"type": "function", "function": self.function()})
            elif roll < 0.95:
                tools.append({"type": self.pick(["_plugin", None, "Function"]), "function": self.function()})
            else:
                tools.append(self.either([{"type": "function"}, {"type": "function", "function": {}}], ["x", None, []]))
        return tools


def load_reference(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("tool_declaration_ts_reference", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.encode_tools_to_typescript_style


def outcome(function: Any, tools: Any, refusal: type[BaseException]) -> tuple[str, str]:
    """("text", TEXT) or ("refused", MESSAGE). An exception other than ``refusal`` is
    returned as ("crash", ...), which never agrees."""
    try:
        return "text", function(tools)
    except refusal as error:
        return "refused", f"{type(error).__name__}: {error}"
    except Exception as error:  # noqa: BLE001 - a crash is a difference, reported
        return "crash", f"{type(error).__name__}: {error}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reference", type=Path, help="a copy of the model's tool_declaration_ts.py")
    parser.add_argument("--cases", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=3, help="differences printed in full")
    args = parser.parse_args(argv)
    reference = load_reference(args.reference)
    logging.disable(logging.WARNING)  # the reference logs a warning for a `false` schema
    generator = Generator(random.Random(args.seed))
    same = refused = differ = 0
    for case in range(args.cases):
        tools = generator.tools()
        pairs = [
            (
                outcome(reference, ours.sort_keys(tools), Exception),
                outcome(ours.typescript_declarations, tools, ours.ToolDeclarationError),
            ),
            (outcome(reference, tools, Exception), outcome(ours._declarations, tools, ours.ToolDeclarationError)),
        ]
        for order, (theirs, mine) in zip(("sorted", "as given"), pairs):
            if theirs[0] == "text" and theirs == mine:
                same += 1
            elif theirs[0] == "refused" and mine[0] == "refused":
                refused += 1
            else:
                differ += 1
                if differ <= args.show:
                    print(f"case {case} ({order}): {json.dumps(tools, ensure_ascii=False)}")
                    print(f"  reference: {theirs[0]}: {theirs[1]!r}")
                    print(f"  ours:      {mine[0]}: {mine[1]!r}")
    print(
        f"compared {2 * args.cases} cases ({args.cases} tool lists, sorted and as given): "
        f"{same} same text, {refused} both refused, {differ} differ"
    )
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())

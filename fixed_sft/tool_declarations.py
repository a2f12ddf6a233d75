"""Kimi's tool declarations: a conversation's ``tools`` -> the text its chat template declares.

Kimi's tokenizer sorts every object in ``tools`` by key (``sort_keys``) and turns the
OpenAI-style function specs (``{"type": "function", "function": {"name", "description",
"parameters"}}``) into TypeScript-like declarations (``typescript_declarations``). The
template writes them as ``<|im_system|>tool_declare<|im_middle|>TEXT<|im_end|>``. Where
that conversion fails, or gives no text, it writes the sorted ``tools`` as compact JSON
instead. ``declare`` gives the TEXT either way.

The declarations, for tools that hold functions::

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

Rules (docs/tool-declarations.md states them all):

- A tool whose ``type`` is not ``"function"``, or whose ``function`` is empty, is left out.
- A function is ``type NAME = (_: PARAMETERS) => any;``, after its description as ``//``
  comment lines and after an ``interface`` per ``$defs`` entry.
- An object's fields are the required ones by name, then the optional ones (``name?``) by
  name. Each comes after ``//`` lines: its description, its constraints, its default.
- Types: ``string``, ``number`` (also for ``integer``), ``boolean``, ``null``, ``any``,
  ``Array<T>``, ``{...}``, an enum's values joined by `` | ``, ``anyOf`` joined by `` | ``,
  a ``$ref``'s definition name.

The text is byte-identical to the model's own ``encode_tools_to_typescript_style``, quirks
included, on every JSON input it accepts, and ``ToolDeclarationError`` is raised exactly
where it raises (the model then falls back to JSON). A quirk is kept, not fixed: it
changes what the model was trained to read.
"""

from __future__ import annotations

import hashlib
import json
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

_INDENT = "  "
_HEADER = "# Tools\n\n## functions\nnamespace functions {\n"
_FOOTER = "\n}\n"
# How each name of a list-valued ``type`` is written.
_TYPE_LIST_NAMES = {
    "string": "string",
    "number": "number",
    "integer": "number",
    "boolean": "boolean",
    "null": "null",
    "object": "{}",
    "array": "Array<any>",
}
# The constraints written above a field, by the schema's ``type``.
_CONSTRAINTS = {
    "string": ("maxLength", "minLength", "pattern"),
    "number": ("maximum", "minimum"),
    "integer": ("maximum", "minimum"),
    "array": ("maxItems", "minItems"),
}
# The model writes ``$ref: "#"`` (the parameters themselves) as this interface, and marks
# the schema it resolves such a reference to with this key.
_ROOT_INTERFACE = "parameters"
_ROOT_MARK = "$self_ref"


class ToolDeclarationError(ValueError):
    """The model's encoder refuses these tools: the template declares them as JSON instead."""


class Declaration(NamedTuple):
    """What the template writes between ``tool_declare<|im_middle|>`` and ``<|im_end|>``."""

    text: str
    typescript: bool  # False: ``text`` is the JSON fallback


def sort_keys(value: Any) -> Any:
    """``value`` with every object's keys in sorted order, at every depth; lists keep their
    order. This is what the model's tokenizer does to ``tools`` before anything else."""
    if isinstance(value, dict):
        return {key: sort_keys(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [sort_keys(item) for item in value]
    return value


def typescript_declarations(tools: list[dict[str, Any]]) -> str:
    """The ``tools_ts_str`` the model's tokenizer gives its template for ``tools``: the
    declarations of the sorted tools (``tools`` may be sorted already; sorting is done
    here either way). ``""`` where no tool is a non-empty function. Raises
    ``ToolDeclarationError`` where the model's encoder raises."""
    try:
        tools = sort_keys(tools)
    except RecursionError:
        raise ValueError("the tools nest too deeply to declare") from None
    return _checked(tools)


def declare(tools: list[dict[str, Any]]) -> Declaration:
    """The declaration the template writes for a non-empty list of tool objects: the
    TypeScript declarations, or, where they fail or are empty, the sorted tools as JSON,
    as the template's ``tools | tojson(separators=(',', ':'))`` writes them (transformers'
    filter: ``json.dumps`` with ``ensure_ascii=False``). The template sees the sorted tools.

    An empty list declares nothing (the template leaves the block out), a tool that is
    not an object makes the model's ``apply_chat_template`` fail, and tools nested too
    deeply for Python's stack cannot be declared with certainty: all raise ``ValueError``
    (the conversation is to be refused, not declared another way).
    """
    if not isinstance(tools, list) or not tools:
        raise ValueError("tools must be a non-empty list")
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise ValueError(f"tool {index} is not an object")
    try:
        text = typescript_declarations(tools)
    except ToolDeclarationError:
        text = ""
    tools = sort_keys(tools)
    if text:
        return Declaration(text, True)
    return Declaration(json.dumps(tools, ensure_ascii=False, separators=(",", ":")), False)


def _checked(tools: Any) -> str:
    """``_declarations``. Schemas nested too deeply for Python's stack raise a plain
    ``ValueError``, not a ``ToolDeclarationError``: how deep the model's encoder gets
    before it fails is not known, so no text is given for them, JSON or TypeScript."""
    try:
        return _declarations(tools)
    except RecursionError:
        raise ValueError("the tools nest too deeply to declare") from None


def _declarations(tools: Any) -> str:
    """The declarations of ``tools`` as given (keys in their own order)."""
    if not tools:
        return ""
    if not isinstance(tools, list):
        raise ToolDeclarationError("tools is not a list")
    functions = []
    for tool in tools:
        if not isinstance(tool, dict):
            raise ToolDeclarationError("a tool is not an object")
        if tool.get("type") == "function":
            function = tool.get("function", {})
            if function:
                functions.append(_function(function))
    if not functions:
        return ""
    return _HEADER + "\n".join(functions) + _FOOTER


# Parsed schemas. A schema is read into one of these before anything is written, because
# a ``$ref`` must name a ``$defs`` entry read before it (in reading order), while fields
# are written in another order. ``doc`` is the schema's ``description`` (written when
# truthy), ``limits`` its constraints.


@dataclass
class _Type:
    doc: Any = ""
    limits: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Named(_Type):
    """A type written as its JSON-schema ``type`` (``integer`` as ``number``)."""

    name: Any = "any"


@dataclass
class _Field:
    name: str
    type: _Type
    optional: bool
    default: Any


@dataclass
class _Object(_Type):
    fields: list[_Field] = field(default_factory=list)
    # None (not written), True, False, a _Type, or anything else (refused when written).
    extra: Any = None


@dataclass
class _Array(_Type):
    item: _Type = field(default_factory=_Named)


@dataclass
class _Enum(_Type):
    values: Any = ()


@dataclass
class _AnyOf(_Type):
    members: list[_Type] = field(default_factory=list)


@dataclass
class _TypeList(_Type):
    names: list[str] = field(default_factory=list)


@dataclass
class _Ref(_Type):
    name: str = ""


def _items(value: Any, what: str) -> list[Any]:
    """``value`` iterated as the model's Python code iterates it: a list's items, a
    string's characters, an object's keys. Anything else is refused."""
    if isinstance(value, list | str | dict):
        return list(value)
    raise ToolDeclarationError(f"{what} is not a list")


class _Reader:
    """Reads one function's parameter schemas. ``$defs`` found anywhere in an object
    schema join one table for the whole function; a later entry of the same name
    replaces the earlier one's schema."""

    def __init__(self) -> None:
        self.definitions: dict[str, Any] = {}
        self.refers_to_root = False

    def schema(self, schema: Any) -> _Type:
        """A schema, by the first of these keys it has: ``$ref``, ``anyOf``, ``enum``,
        ``type``. ``true`` and ``{}`` are ``any``; ``false`` is ``null``. Any other schema
        is refused (``oneOf``, ``allOf`` and ``not`` are not read)."""
        if schema is True or schema is False:
            return _Named(name="any" if schema else "null")
        if not isinstance(schema, dict):
            raise ToolDeclarationError("a schema is not an object")
        doc = schema.get("description", "")
        if "$ref" in schema:
            return _Ref(doc, name=self.ref(schema["$ref"]))
        if "anyOf" in schema:
            return _AnyOf(doc, members=[self.schema(member) for member in _items(schema["anyOf"], "anyOf")])
        if "enum" in schema:
            return self.enum(schema, doc)
        if "type" in schema:
            kind = schema["type"]
            if isinstance(kind, list):
                for name in kind:
                    if not isinstance(name, str) or name not in _TYPE_LIST_NAMES:
                        raise ToolDeclarationError("a type list holds an unknown type")
                return _TypeList(doc, names=[_TYPE_LIST_NAMES[name] for name in kind])
            if kind == "object":
                return self.object(schema)
            limits = _limits(schema, kind)
            if kind == "array":
                items = schema.get("items")
                # Missing or falsy ``items`` (``{}``, ``[]``, ``false``) is ``any``.
                return _Array(doc, limits, item=self.schema(items) if items else _Named())
            # Any other ``type`` is written as it is: ``"any"``, ``"null"``, even ``5``.
            return _Named(doc, limits, name=kind)
        if not schema:
            return _Named()
        raise ToolDeclarationError("a schema has no $ref, anyOf, enum or type")

    def object(self, schema: dict[str, Any]) -> _Object:
        """An object schema's fields: ``properties`` in their order, optional unless named
        in ``required``. ``additionalProperties`` is read before them and ``$defs`` before
        both. Its ``type``, ``anyOf`` and the like are not looked at: the function's
        ``parameters`` are read as an object whatever they say."""
        node = _Object(schema.get("description", ""))
        if not schema:
            return node
        if "$defs" in schema:
            definitions = schema["$defs"]
            if definitions:
                if not isinstance(definitions, dict):
                    raise ToolDeclarationError("$defs is not an object")
                self.definitions.update(definitions)
        extra = schema.get("additionalProperties")
        node.extra = self.schema(extra) if isinstance(extra, dict) else extra
        if "properties" not in schema:
            return node
        properties = schema["properties"]
        if not isinstance(properties, dict):
            raise ToolDeclarationError("properties is not an object")
        required = _items(schema.get("required", []), "required")
        if any(isinstance(name, list | dict) for name in required):
            raise ToolDeclarationError("required holds a list or an object")
        for name, value in properties.items():
            default = value.get("default") if isinstance(value, dict) else None
            node.fields.append(_Field(name, self.schema(value), name not in required, default))
        return node

    def enum(self, schema: dict[str, Any], doc: Any) -> _Enum:
        """An enum. With a ``type`` (or a list of one type, or of a type and ``"null"``),
        each value other than null must be of that type; bools count as numbers."""
        values = schema["enum"]
        if "type" in schema:
            kind = schema["type"]
            if isinstance(kind, list):
                if len(kind) == 1:
                    kind = kind[0]
                elif len(kind) == 2 and "null" in kind:
                    kind = kind[1] if kind[0] == "null" else kind[0]
                else:
                    raise ToolDeclarationError("an enum's type list is not one type, or one type and null")
            wanted = {"string": str, "number": int | float, "integer": int, "boolean": bool}
            for value in _items(values, "enum"):
                if value is not None and isinstance(kind, str) and kind in wanted:
                    if not isinstance(value, wanted[kind]):
                        raise ToolDeclarationError(f"an enum value is not of type {kind}")
        return _Enum(doc, values=values)

    def ref(self, ref: Any) -> str:
        """The name a ``$ref`` is written as: ``parameters`` for ``"#"``, else the last part of
        ``"#/$defs/NAME"``, which must name a ``$defs`` entry read already. Other
        references are refused."""
        if ref == "#":
            self.refers_to_root = True
            return _ROOT_INTERFACE
        if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
            raise ToolDeclarationError("a $ref is not '#' or '#/$defs/NAME'")
        name = ref.split("/")[-1]
        if name not in self.definitions:
            raise ToolDeclarationError(f"$ref {name!r} is not in $defs")
        target = self.definitions[name]
        if not isinstance(target, dict):
            raise ToolDeclarationError(f"$defs entry {name!r} is not an object")
        # The model resolves "#" to a schema holding a truthy "$self_ref": a definition
        # that holds one is written as the root interface's name too.
        return _ROOT_INTERFACE if target.get(_ROOT_MARK, False) else name


def _limits(schema: dict[str, Any], kind: Any) -> dict[str, Any]:
    """The constraints written for a schema of type ``kind``: those in ``_CONSTRAINTS``."""
    keys = _CONSTRAINTS.get(kind, ()) if isinstance(kind, str) else ()
    return {key: value for key, value in schema.items() if key in keys}


def _function(function: Any) -> str:
    """One function: the ``interface`` lines, its description, its ``type`` line.

    A ``$ref: "#"`` in the parameters (outside ``$defs``) makes them ``interface
    parameters``, whose fields stay in their own order and leave out
    ``additionalProperties``. Each ``$defs`` entry read while reading the parameters
    becomes ``interface NAME TYPE``, in the order first read, after its description.
    """
    if not isinstance(function, dict):
        raise ToolDeclarationError("a tool's function is not an object")
    parameters = function.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise ToolDeclarationError("a function's parameters are not an object")
    reader = _Reader()
    root = reader.object(parameters)
    # Taken now: a "#" met while reading $defs below names the interface, but does not make it.
    root_interface = reader.refers_to_root

    interfaces = []
    if root_interface:
        fields = ",\n".join(_field(item, _INDENT) for item in root.fields)
        interfaces.append(f"interface {_ROOT_INTERFACE} {{" + (f"\n{fields}\n" if fields else "") + "}")
    for name, schema in list(reader.definitions.items()):
        text = _text(reader.schema(schema), "")
        if not isinstance(schema, dict):
            raise ToolDeclarationError(f"$defs entry {name!r} is not an object")
        doc = schema.get("description", "")
        interfaces.append((_comment(doc, "") + "\n" if doc else "") + f"interface {name} {text}")

    signature = _ROOT_INTERFACE if root_interface else _text(root, "")
    description = function.get("description")
    parts = [
        "\n".join(interfaces),
        _comment(description, "") if description else "",
        f"type {function.get('name', 'function')} = (_: {signature}) => any;",
    ]
    return "\n".join(part for part in parts if part)


def _comment(text: Any, indent: str) -> str:
    """``text`` as ``//`` lines; an empty line stays empty (no ``//``, no indent)."""
    if not isinstance(text, str):
        raise ToolDeclarationError("a description is not a string")
    return "\n".join(f"{indent}// {line}" if line else "" for line in text.split("\n"))


def _notes(node: _Type, indent: str) -> str:
    """The ``//`` lines above a field or a multi-line array's item: the description,
    then the constraints on one line, sorted by name and written with Python's ``str``
    (``minimum: 1.5``, ``pattern: ^a+$``)."""
    lines = []
    if node.doc:
        lines.append(_comment(node.doc, indent) + "\n")
    if node.limits:
        lines.append(f"{indent}// {', '.join(f'{key}: {node.limits[key]}' for key in sorted(node.limits))}\n")
    return "".join(lines)


def _field(item: _Field, indent: str) -> str:
    """A field: its notes, its default (numbers and bools with Python's ``repr``, the
    rest as JSON), then ``name: TYPE`` or ``name?: TYPE``."""
    notes = _notes(item.type, indent)
    if item.default is not None:
        if isinstance(item.default, int | float):
            default = repr(item.default)
        else:
            try:
                default = json.dumps(item.default, ensure_ascii=False)
            except (TypeError, ValueError) as error:
                raise ToolDeclarationError(f"a default is not JSON: {error}") from None
        notes += f"{indent}// Default: {default}\n"
    return f"{notes}{indent}{item.name}{'?' if item.optional else ''}: {_text(item.type, indent)}"


def _joined(node: _Type, indent: str) -> str:
    """A type's text where the model joins it to other text rather than formatting it:
    in an ``anyOf``, or a multi-line ``Array<``. A non-string ``type`` fails there."""
    if isinstance(node, _Named) and not isinstance(node.name, str):
        raise ToolDeclarationError("a type is not a string")
    return _text(node, indent)


def _text(node: _Type, indent: str) -> str:
    """A type's text. ``indent`` is that of the line the type starts on."""
    if isinstance(node, _Named):
        return "number" if node.name == "integer" else str(node.name)
    if isinstance(node, _Object):
        return _object(node, indent)
    if isinstance(node, _Array):
        # An item with notes goes on its own line, one level in; otherwise it stays on the
        # line, at this indent (an object item's fields are then only one level in).
        notes = _notes(node.item, indent + _INDENT)
        if notes:
            return f"Array<\n{notes}{indent}{_INDENT}{_joined(node.item, indent + _INDENT)}\n{indent}>"
        return f"Array<{_text(node.item, indent)}>"
    if isinstance(node, _Enum):
        # Strings in double quotes as they are (no escaping), the rest with Python's str.
        return " | ".join(
            f'"{value}"' if isinstance(value, str) else str(value) for value in _items(node.values, "enum")
        )
    if isinstance(node, _AnyOf):
        return " | ".join(_joined(member, indent) for member in node.members)
    if isinstance(node, _TypeList):
        return " | ".join(node.names)
    assert isinstance(node, _Ref)
    return node.name


def _object(node: _Object, indent: str) -> str:
    """``{}``, or ``{`` then a line per field (required ones first, each group by name)
    and an ``[k: string]: T`` line for ``additionalProperties`` (``any`` for true,
    ``never`` for false), joined by ``,``, then ``}``."""
    inner = indent + _INDENT
    fields = sorted((item for item in node.fields if not item.optional), key=lambda item: item.name)
    fields += sorted((item for item in node.fields if item.optional), key=lambda item: item.name)
    lines = [_field(item, inner) for item in fields]
    if node.extra is not None:
        if node.extra is True:
            extra = "any"
        elif node.extra is False:
            extra = "never"
        elif isinstance(node.extra, _Type):
            extra = _text(node.extra, inner)
        else:
            raise ToolDeclarationError("additionalProperties is not a boolean or a schema")
        lines.append(f"{inner}[k: string]: {extra}")
    if not lines:
        return "{}"
    return "{\n" + ",\n".join(lines) + f"\n{indent}}}"


MODEL_FILE = "tool_declaration_ts.py"  # the model repo's own encoder of this format


def model_declarer(path: Path, sha256: str) -> Callable[[list[dict[str, Any]]], str]:
    """The model repo's own ``encode_tools_to_typescript_style``, from ``path``, once the
    file's sha256 is ``sha256`` (its tokenizer spec's pin): code is run only when pinned.
    ``ValueError`` naming the file when it is not, or holds no such function."""
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ValueError(f"{path}: its sha256 is not the pinned {sha256}; it is not run")
    module = types.ModuleType("fixed_sft_model_tool_declarations")
    exec(compile(data, str(path), "exec"), module.__dict__)  # noqa: S102 (pinned model code)
    encoder = getattr(module, "encode_tools_to_typescript_style", None)
    if not callable(encoder):
        raise ValueError(f"{path}: holds no encode_tools_to_typescript_style")
    return encoder


class ModelCheck:
    """Each distinct tools list declared, compared once with the model's own encoder:
    where the model's raises or gives nothing, the declaration must be the JSON fallback;
    else the same text. ``check`` returns the problem, or ``None``."""

    def __init__(self, model: Callable[[list[dict[str, Any]]], str]):
        self.model = model
        self._seen: set[str] = set()

    def check(self, tools: list[dict[str, Any]], declared: Declaration) -> str | None:
        key = json.dumps(tools, sort_keys=True, ensure_ascii=False)
        if key in self._seen:
            return None
        try:
            theirs: str | None = self.model(sort_keys(tools)) or None
        except Exception:  # the model's tokenizer falls back to JSON on any error
            theirs = None
        ours = declared.text if declared.typescript else None
        if theirs != ours:
            return f"the tool declarations differ from the model's own {MODEL_FILE}"
        self._seen.add(key)
        return None

"""Strict JSON: documents read into dataclasses by their type hints, a wrong field named.

``decode(kind, value)`` reads a JSON value as ``kind``: a dataclass (an object holding
each field without a default, and no other key), ``list[X]``, ``tuple[X, ...]`` (an
array), ``dict[str, X]``, ``str``, ``int``, ``float``, ``bool``, ``None``, ``Any``, a
``Literal`` constant, a union of these, or ``Annotated[X, rule]`` (a ``Rule`` that a
value of ``X`` must also meet). Nothing is coerced: a boolean is not an integer, an
integer not a decimal number, nor a decimal number an integer. ``encode`` writes a
dataclass back as JSON, its keys in field order. ``loads`` reads JSON text, refusing an
object that repeats a key.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints


class _Missing:
    def __repr__(self) -> str:
        return "missing"


MISSING = _Missing()  # the value of a key a document lacks (``value_at``)


class DuplicateKey(ValueError):
    """A JSON object that repeats a key: readers that keep the first value and readers
    that keep the last would read two documents."""

    def __init__(self, key: str):
        super().__init__(f"duplicate key {key!r}")
        self.key = key


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object's ``(key, value)`` pairs as a dict (an ``object_pairs_hook``);
    ``DuplicateKey`` naming the first key that comes twice."""
    document = dict(pairs)
    if len(document) < len(pairs):  # (rare: then find which key)
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return document


STRICT_JSON = json.JSONDecoder(object_pairs_hook=unique_keys)  # (source rows: NaN as Python writes it, is read)


def _not_json(constant: str) -> object:
    raise ValueError(f"{constant} is not JSON")


def _finite(text: str) -> float:
    """A JSON number with a fraction or exponent, refused where it is out of a float's range
    (``1e999``: it would be written back as ``Infinity``, which is not JSON)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text if len(text) <= 24 else text[:20] + '...'} is out of the range of a float")
    return value


STANDARD_JSON = json.JSONDecoder(object_pairs_hook=unique_keys, parse_constant=_not_json, parse_float=_finite)


def loads(text: str) -> object:
    """The JSON document ``text``; a ``ValueError`` for an object that repeats a key
    (``DuplicateKey``) or a number JSON does not have (``NaN``, ``Infinity``), or a float
    cannot hold.

    >>> loads('{"a": NaN}')
    Traceback (most recent call last):
    ...
    ValueError: NaN is not JSON
    >>> loads('{"a": 1e999}')
    Traceback (most recent call last):
    ...
    ValueError: 1e999 is out of the range of a float
    >>> loads("[1" + "0" * 5000 + "e999]")  # (its text cut: an error is one short line)
    Traceback (most recent call last):
    ...
    ValueError: 10000000000000000000... is out of the range of a float
    """
    return STANDARD_JSON.decode(text)


def read_json_object(path: Path, error: type[Exception]) -> dict:
    """The JSON object in file ``path`` (read by ``loads``); ``error`` naming the file
    when it holds none."""
    try:
        value = loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as reason:
        raise error(f"{path}: cannot read it ({reason})") from None
    if not isinstance(value, dict):
        raise error(f"{path}: not a JSON object")
    return value


def value_at(document: object, keys: tuple[str, ...]) -> object:
    """The value at ``keys``, or ``MISSING`` where a key is absent or its parent is not an object."""
    for key in keys:
        document = document.get(key, MISSING) if isinstance(document, dict) else MISSING
    return document


def show(value: object) -> str:
    """A value as JSON, cut to 80 characters; ``missing`` for ``MISSING``."""
    return "missing" if value is MISSING else json.dumps(value)[:80]


def same(a: object, b: object) -> bool:
    """Equal as JSON (so ``true``, ``1`` and ``1.0`` differ; ``MISSING`` only to itself)."""
    if a is MISSING or b is MISSING:
        return a is b
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


class FieldError(ValueError):
    """A JSON document that is not of its kind: the message names the first wrong field."""


T = TypeVar("T")
OMIT = "fixed_sft.omit"  # a dataclass field's metadata key: its value, when equal to the default, is not written


def omitted(default: Any = None) -> Any:
    """A dataclass field that a document may lack and that ``encode`` leaves out while it
    holds ``default`` (``[]`` gives a new empty list each time)."""
    if isinstance(default, list):
        return dataclasses.field(default_factory=list, metadata={OMIT: True})
    return dataclasses.field(default=default, metadata={OMIT: True})


class Rule:
    """What a value must also be, beyond its type (``Annotated[X, rule]``); ``name`` says
    what it must be ("a non-empty array of non-empty strings"), ``outside`` how a value of
    the right type that breaks it is named (by default: not ``expected``, its field's kinds)."""

    name: str = ""

    def holds(self, value: Any) -> bool:
        raise NotImplementedError

    def outside(self, shown: str, expected: str) -> str:
        return f"{shown}, not {expected}"


class NonEmptyStrings(Rule):
    """A non-empty array of non-empty strings."""

    name = "a non-empty array of non-empty strings"

    def holds(self, value: Any) -> bool:
        return bool(value) and all(value)


@dataclasses.dataclass(frozen=True)
class Within(Rule):
    """An integer in ``low .. high`` (``text``: how to write that range, if not so)."""

    low: int
    high: int
    text: str = ""

    def holds(self, value: Any) -> bool:
        return self.low <= value <= self.high

    def outside(self, shown: str, expected: str) -> str:
        return f"{shown}, outside {self.text or f'{self.low} .. {self.high}'}"


_NAMES: dict[Any, str] = {
    str: "a string",
    int: "an integer",
    float: "a decimal number",
    bool: "true or false",
    type(None): "null",
    list: "an array",
    tuple: "an array",
    dict: "an object",
}


@functools.cache
def hints(kind: type) -> dict[str, Any]:
    """A dataclass's fields' type hints (``Annotated`` kept), in field order."""
    every = get_type_hints(kind, include_extras=True)
    return {f.name: every[f.name] for f in dataclasses.fields(kind)}


def _members(kind: Any) -> tuple[Any, ...]:
    if get_origin(kind) in (Union, types.UnionType):
        return get_args(kind)
    if get_origin(kind) is Literal and len(get_args(kind)) > 1:
        return tuple(Literal[value] for value in get_args(kind))
    return (kind,)


def _base(kind: Any) -> Any:
    """The JSON type a member stands for (``Annotated`` and generics taken off)."""
    while get_origin(kind) is typing.Annotated:
        kind = get_args(kind)[0]
    if dataclasses.is_dataclass(kind):
        return dict
    return get_origin(kind) or kind


def kind_name(kind: Any) -> str:
    """How ``kind`` is named in a message: "an integer or \"all\" or null"."""
    names = []
    for member in _members(kind):
        if get_origin(member) is typing.Annotated and (rule := _rule(member)) is not None and rule.name:
            names.append(rule.name)
        elif get_origin(member) is Literal:
            names.append(json.dumps(get_args(member)[0]))
        else:
            names.append(_NAMES.get(_base(member), "a value"))
    return " or ".join(names)


def _rule(kind: Any) -> Rule | None:
    return next((extra for extra in kind.__metadata__ if isinstance(extra, Rule)), None)


def _of_type(value: Any, base: Any) -> bool:
    """Whether a JSON value is of the JSON type ``base`` (a boolean is not a number, an integer not a decimal)."""
    if base is Any:
        return True
    if base is Literal:
        return False  # (matched by ``_matches``)
    if base is type(None):
        return value is None
    if base is tuple:
        base = list
    return type(value) is base or (isinstance(value, base) and base not in (int, float))


def _matches(value: Any, member: Any) -> bool:
    if get_origin(member) is Literal:
        constant = get_args(member)[0]
        return type(value) is type(constant) and value == constant
    return _of_type(value, _base(member))


def decode(kind: type[T] | Any, value: Any, path: str = "") -> T:
    """``value`` (a JSON value, as ``loads`` gives) read as ``kind``; ``FieldError`` naming the
    first field, by its key path (``params.rows``), that is missing, unknown or of another kind."""
    members = _members(kind)
    member = next((m for m in members if _matches(value, m)), None)
    where = path or "the document"
    if member is None:
        raise FieldError(f"{where} is {show(value)}, not {kind_name(kind)}")
    if get_origin(member) is not typing.Annotated or (rule := _rule(member)) is None:
        return _decode_member(member, value, path)
    try:  # (a value that breaks a rule is named as a whole: "[3], not a non-empty array of non-empty strings")
        result = _decode_member(get_args(member)[0], value, path)
    except FieldError:
        raise FieldError(f"{where} is {show(value)}, not {kind_name(kind)}") from None
    if not rule.holds(result):
        raise FieldError(f"{where} is {rule.outside(show(value), kind_name(kind))}")
    return result


def _decode_member(member: Any, value: Any, path: str) -> Any:
    if dataclasses.is_dataclass(member):
        return _decode_object(member, value, path)  # type: ignore[arg-type]
    origin, args = get_origin(member), get_args(member)
    if origin in (list, tuple):
        item = args[0]
        if item is str and all(type(v) is str for v in value):  # (a fast path for long lists of hashes)
            return value if origin is list else tuple(value)
        items = [decode(item, v, f"{path}[{n}]") for n, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        return {key: decode(args[1], v, f"{path}.{key}" if path else key) for key, v in value.items()}
    return value


def _decode_object(kind: type, value: dict, path: str) -> Any:
    fields = hints(kind)
    unknown = [key for key in value if key not in fields]
    if unknown:
        raise FieldError(f"{path + ': ' if path else ''}unknown key {unknown[0]!r} (known: {', '.join(fields)})")
    given = {}
    for field in dataclasses.fields(kind):
        key = f"{path}.{field.name}" if path else field.name
        if field.name in value:
            given[field.name] = decode(fields[field.name], value[field.name], key)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise FieldError(f"{key} is missing")
    return kind(**given)


def encode(value: Any) -> Any:
    """A dataclass (or list, tuple, dict of them) as JSON values: an object's keys in field
    order, a field marked ``omitted`` left out while it holds its default."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        document = {}
        for field in dataclasses.fields(value):
            item = getattr(value, field.name)
            if field.metadata.get(OMIT):
                default = [] if field.default_factory is list else field.default
                if type(item) is type(default) and item == default:
                    continue
            document[field.name] = encode(item)
        return document
    if isinstance(value, (list, tuple)):
        return [encode(item) for item in value]
    if isinstance(value, dict):
        return {key: encode(item) for key, item in value.items()}
    return value

"""The fields a reader takes from a JSON document (a spec, a manifest), checked by kind.

A field is a key path, such as ``("params", "rows")``. The kinds a field may take are
JSON types (``str``, ``int``, ``float`` (a number written with a point or exponent),
``bool``, ``list``, ``dict``; a boolean is never an integer), ``None`` for null,
``GLOBS`` for a non-empty array of non-empty strings, ``MISSING`` for a key the
document may lack, or a constant such as ``"all"``.
"""

from __future__ import annotations

import json
from pathlib import Path


class _Kind:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


MISSING = _Kind("missing")  # also the value of a key the document lacks
GLOBS = _Kind("a non-empty array of non-empty strings")
NAMES = {str: "a string", int: "an integer", float: "a decimal number", bool: "true or false", list: "an array",
         dict: "an object", None: "null"}


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


STRICT_JSON = json.JSONDecoder(object_pairs_hook=unique_keys)  # its ``decode`` reads as ``loads`` does


def loads(text: str) -> object:
    """The JSON document ``text``; ``DuplicateKey`` (a ``ValueError``) for an object that
    repeats a key."""
    return STRICT_JSON.decode(text)


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


def _is(value: object, kind: object) -> bool:
    if kind is GLOBS:
        return isinstance(value, list) and bool(value) and all(isinstance(item, str) and item for item in value)
    if isinstance(kind, type):
        return isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    return value is kind if kind is None or kind is MISSING else value == kind and type(value) is type(kind)


def problem(document: object, keys: tuple[str, ...], kinds: tuple) -> str | None:
    """What is wrong with the field at ``keys`` ("a.b is missing", "a.b is 3, not a
    string or null", "a is [], not an object"), or ``None`` when it is one of ``kinds``."""
    value = document
    for depth, key in enumerate(keys):
        if not isinstance(value, dict):
            parent = ".".join(keys[:depth]) or "the document"
            return f"{parent} is missing" if value is MISSING else f"{parent} is {show(value)}, not an object"
        value = value.get(key, MISSING)
    if any(_is(value, kind) for kind in kinds):
        return None
    field = ".".join(keys)
    if value is MISSING:
        return f"{field} is missing"
    names = [NAMES[kind] if kind is None or isinstance(kind, type) else kind.name if isinstance(kind, _Kind)
             else json.dumps(kind) for kind in kinds if kind is not MISSING]
    return f"{field} is {show(value)}, not {' or '.join(names)}"


def first_problem(document: object, fields: dict[tuple[str, ...], tuple]) -> str | None:
    """The first of ``fields`` (key path -> kinds) that ``problem`` finds wrong, or ``None``."""
    return next(filter(None, (problem(document, keys, kinds) for keys, kinds in fields.items())), None)

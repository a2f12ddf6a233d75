"""Typed fields of JSON documents: the kinds a field may take and how a wrong one is named."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import pytest

from fixed_sft.fields import GLOBS, MISSING, FieldError, NonEmptyStrings, decode, encode, first_problem, omitted, problem


@pytest.mark.parametrize(("document", "kinds", "says"), [
    ({"a": {"b": 3}}, (int,), None),
    ({"a": {"b": True}}, (int,), "a.b is true, not an integer"),
    ({"a": {"b": 1}}, (bool,), "a.b is 1, not true or false"),
    ({"a": {"b": "all"}}, (int, "all"), None),
    ({"a": {"b": "some"}}, (int, "all"), 'a.b is "some", not an integer or "all"'),
    ({"a": {"b": None}}, (str, None), None),
    ({"a": {}}, (str, None), "a.b is missing"),
    ({"a": {}}, (str, None, MISSING), None),
    ({"a": {"b": ["x*", "y"]}}, (GLOBS,), None),
    ({"a": {"b": ["x*", ""]}}, (GLOBS,), 'a.b is ["x*", ""], not a non-empty array of non-empty strings'),
    ({"a": {"b": []}}, (None, GLOBS), "a.b is [], not null or a non-empty array of non-empty strings"),
    ({"a": [1]}, (int,), "a is [1], not an object"),
    ({}, (int,), "a is missing"),
    ([], (int,), "the document is [], not an object"),
    ({"a": {"b": "x" * 100}}, (int,), f'a.b is "{"x" * 79}, not an integer'),
])
def test_a_field_is_one_of_its_kinds_or_named(document, kinds, says):
    assert problem(document, ("a", "b"), kinds) == says


def test_the_first_wrong_field_is_named_in_order():
    fields = {("a",): (int,), ("b",): (str,), ("c",): (str,)}
    assert first_problem({"a": 1, "b": 2, "c": 3}, fields) == "b is 2, not a string"
    assert first_problem({"a": 1, "b": "x", "c": "y"}, fields) is None


@dataclass
class _Inner:
    count: int
    ratio: float
    flag: bool


@dataclass
class _Outer:
    inner: _Inner
    rows: int | Literal["all"]
    globs: None | Annotated[list[str], NonEmptyStrings()] = None
    note: str | None = omitted()


@pytest.mark.parametrize(("document", "says"), [
    ({"inner": {"count": True, "ratio": 0.5, "flag": True}, "rows": 1}, "inner.count is true, not an integer"),
    ({"inner": {"count": 1, "ratio": 1, "flag": True}, "rows": 1}, "inner.ratio is 1, not a decimal number"),
    ({"inner": {"count": 1.0, "ratio": 0.5, "flag": True}, "rows": 1}, "inner.count is 1.0, not an integer"),
    ({"inner": {"count": 1, "ratio": 0.5, "flag": 1}, "rows": 1}, "inner.flag is 1, not true or false"),
    ({"inner": {"count": 1, "ratio": 0.5}, "rows": 1}, "inner.flag is missing"),
    ({"inner": {"count": 1, "ratio": 0.5, "flag": True, "x": 1}, "rows": 1},
     "inner: unknown key 'x' (known: count, ratio, flag)"),
    ({"inner": [], "rows": 1}, "inner is [], not an object"),
    ({"inner": {"count": 1, "ratio": 0.5, "flag": True}, "rows": "some"}, 'rows is "some", not an integer or "all"'),
    ({"inner": {"count": 1, "ratio": 0.5, "flag": True}, "rows": 1, "globs": []},
     "globs is [], not null or a non-empty array of non-empty strings"),
    ({"inner": {"count": 1, "ratio": 0.5, "flag": True}, "rows": 1, "globs": ["a", 2]},
     "globs[1] is 2, not a string"),
])
def test_decode_coerces_nothing_and_names_the_first_wrong_key(document, says):
    with pytest.raises(FieldError) as error:
        decode(_Outer, document)
    assert str(error.value) == says


def test_decode_and_encode_round_trip_in_field_order():
    document = {"inner": {"count": 1, "ratio": 0.5, "flag": False}, "rows": "all", "globs": None}
    value = decode(_Outer, document)
    assert value == _Outer(_Inner(1, 0.5, False), "all") and list(encode(value)) == ["inner", "rows", "globs"]
    assert encode(decode(_Outer, {**document, "note": "n"}))["note"] == "n"  # an omitted key is written when set

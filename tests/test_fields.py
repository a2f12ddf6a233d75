"""Strict JSON: documents read into dataclasses by their type hints, and how a wrong field is named."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import pytest

from fixed_sft.fields import FieldError, NonEmptyStrings, decode, encode, omitted


@dataclass
class _Top:
    a: int


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


def test_a_long_value_is_cut_in_the_message():
    with pytest.raises(FieldError, match=f'^a is "{"x" * 79}, not an integer$'):
        decode(_Top, {"a": "x" * 100})


def test_the_document_itself_is_named_when_it_is_not_an_object():
    with pytest.raises(FieldError, match=r"^the document is \[\], not an object$"):
        decode(_Top, [])


@pytest.mark.parametrize(
    ("document", "says"),
    [
        ({"inner": {"count": True, "ratio": 0.5, "flag": True}, "rows": 1}, "inner.count is true, not an integer"),
        ({"inner": {"count": 1, "ratio": 1, "flag": True}, "rows": 1}, "inner.ratio is 1, not a decimal number"),
        ({"inner": {"count": 1.0, "ratio": 0.5, "flag": True}, "rows": 1}, "inner.count is 1.0, not an integer"),
        ({"inner": {"count": 1, "ratio": 0.5, "flag": 1}, "rows": 1}, "inner.flag is 1, not true or false"),
        ({"inner": {"count": 1, "ratio": 0.5}, "rows": 1}, "inner.flag is missing"),
        (
            {"inner": {"count": 1, "ratio": 0.5, "flag": True, "x": 1}, "rows": 1},
            "inner: unknown key 'x' (known: count, ratio, flag)",
        ),
        ({"inner": [], "rows": 1}, "inner is [], not an object"),
        (
            {"inner": {"count": 1, "ratio": 0.5, "flag": True}, "rows": "some"},
            'rows is "some", not an integer or "all"',
        ),
        (
            {"inner": {"count": 1, "ratio": 0.5, "flag": True}, "rows": 1, "globs": []},
            "globs is [], not null or a non-empty array of non-empty strings",
        ),
        (
            {"inner": {"count": 1, "ratio": 0.5, "flag": True}, "rows": 1, "globs": ["a", 2]},
            'globs is ["a", 2], not null or a non-empty array of non-empty strings',
        ),
    ],
)
def test_decode_coerces_nothing_and_names_the_first_wrong_key(document, says):
    with pytest.raises(FieldError) as error:
        decode(_Outer, document)
    assert str(error.value) == says


def test_decode_and_encode_round_trip_in_field_order():
    document = {"inner": {"count": 1, "ratio": 0.5, "flag": False}, "rows": "all", "globs": None}
    value = decode(_Outer, document)
    assert value == _Outer(_Inner(1, 0.5, False), "all") and list(encode(value)) == ["inner", "rows", "globs"]
    assert encode(decode(_Outer, {**document, "note": "n"}))["note"] == "n"  # an omitted key is written when set

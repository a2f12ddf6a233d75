"""Typed fields of JSON documents: the kinds a field may take and how a wrong one is named."""

from __future__ import annotations

import pytest

from fixed_sft.fields import GLOBS, MISSING, first_problem, problem


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

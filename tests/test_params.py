"""The one definition of a build's parameters, and what derives from it."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from fixed_sft.cli import parser
from fixed_sft.fields import hints
from fixed_sft.manifest import Manifest
from fixed_sft.params import FLAGS, RECORDED, SPEC_KEYS, BuildConfig, BuildSpec, UsageError, flag, manifest_label


def test_each_flag_of_build_is_a_parameter_or_says_how_the_build_runs():
    commands = next(action for action in parser()._actions if isinstance(action, argparse._SubParsersAction))
    build = commands.choices["build"]
    flags = {option for action in build._actions for option in action.option_strings if option.startswith("--")}
    assert flags - {"--help"} == {flag(name) for name in FLAGS} | {"--out", "--trust-remote-code", "--quiet"}


def test_a_spec_holds_the_parameters_marked_for_it_and_what_it_publishes():
    assert [f.name for f in dataclasses.fields(BuildSpec)] == [*SPEC_KEYS, "published", "name", "description"]


def test_every_recorded_parameter_has_its_manifest_key():
    for name, path in RECORDED.items():
        kind = Manifest
        *parents, key = path.split(".")
        for parent in parents:
            kind = hints(kind)[parent]
        assert key in hints(kind), name


@pytest.mark.parametrize(
    ("values", "flag_says", "manifest_says"),
    [
        (
            {"row_tokens": 1},
            "--row-tokens must be between 2 and 1048576, got 1",
            "params.row_tokens must be between 2 and 1048576, got 1",
        ),
        ({"rows": 0}, "--rows must be a positive number or 'all', got 0", "params.rows must be a positive number"),
        ({"seed": 2**64}, "--seed must be between 0 and 2**64 - 1", "params.seed must be between 0 and 2**64 - 1"),
        (
            {"check_every": -1},
            "--check-every must be non-negative, got -1",
            "template_check.every must be non-negative",
        ),
        ({"source_files": ("",)}, "--source-files must not be empty", "source.file_patterns must not be empty"),
        (  # (a manifest records a count up to 2**63 - 1: a build of more could not be verified)
            {"check_every": 2**63},
            f"--check-every must be at most 2**63 - 1, got {2**63}",
            "template_check.every must be at most 2**63 - 1",
        ),
        ({"rows": 2**63}, "--rows must be at most 2**63 - 1", "params.rows must be at most 2**63 - 1"),
    ],
)
def test_a_range_rule_names_the_parameter_as_each_place_spells_it(values, flag_says, manifest_says):
    config = BuildConfig(name="x", source="x", **values)
    with pytest.raises(UsageError, match="^" + flag_says.replace("*", r"\*")):
        config.validate()
    with pytest.raises(UsageError, match="^" + manifest_says.replace("*", r"\*")):
        config.validate(label=manifest_label)

"""The pages a newcomer reads stay within their limits, every module names its job, its doctests hold."""

from __future__ import annotations

import ast
import doctest
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import fixed_sft

ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_is_a_newcomers_page():
    """At most 200 lines and 1,600 words, install within the first 40 lines, and no
    sentence of prose over 70 words (code blocks aside)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= 200 and len(text.split()) <= 1600
    assert any("pip install" in line for line in lines[:40])
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    sentences = re.split(r"(?<=[.!?])\s+|\n\s*\n|\n(?=\s*[-|#*\d])", prose)
    longest = max(sentences, key=lambda s: len(s.split()))
    assert len(longest.split()) <= 70, longest


def test_every_module_says_its_one_job():
    """Each module's docstring opens with a line of its own (the module's one job)."""
    for path in sorted((ROOT / "fixed_sft").glob("*.py")) + [ROOT / "pretokenized_sft_rollout.py"]:
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        assert doc and doc.splitlines()[0].strip(), path.name


@pytest.mark.parametrize("name", sorted(module.name for module in pkgutil.iter_modules(fixed_sft.__path__)))
def test_every_modules_doctests_hold(name):
    """The rules stated as doctests where they are applied (every module's, the ones without any too)."""
    result = doctest.testmod(importlib.import_module(f"fixed_sft.{name}"))
    assert result.failed == 0


def _documented_flags() -> dict[str, dict[str, str | None]]:
    """docs/cli.md's flag tables: each command's flags, each with the value it names (None for a switch)."""
    flags: dict[str, dict[str, str | None]] = {}
    command = None
    for line in (ROOT / "docs" / "cli.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            command = line[3:].strip()
        elif command and (cell := re.match(r"\| `(--[\w-]+)(?: ([^`]+))?` \|", line.replace("\\|", "|"))):
            flags.setdefault(command, {})[cell[1]] = cell[2]
    return flags


def _value_name(action) -> str | None:
    """The value an option names in its help, as docs/cli.md writes it."""
    if action.nargs == 0:
        return None
    if action.choices:
        return "|".join(action.choices)
    return action.metavar or action.dest.upper()


def test_every_flag_is_in_docs_cli_naming_the_value_help_names():
    """Each command's flags are the ones docs/cli.md's table lists for it, each naming its
    value as ``--help`` does (``--rows N|all``)."""
    import argparse

    from fixed_sft.cli import parser

    documented = _documented_flags()
    [commands] = [action for action in parser()._actions if isinstance(action, argparse._SubParsersAction)]
    for name, command in commands.choices.items():
        options = [action for action in command._actions if action.option_strings and action.dest != "help"]
        found = {action.option_strings[-1]: _value_name(action) for action in options}
        assert found == documented.get(name), name

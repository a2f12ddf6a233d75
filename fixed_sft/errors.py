"""The errors a build or rebuild stops with: bad parameters (exit 2), or a build that cannot finish (exit 1)."""

from __future__ import annotations


class UsageError(Exception):
    """Bad parameters (exit code 2)."""


class BuildError(Exception):
    """The build cannot finish (exit code 1)."""

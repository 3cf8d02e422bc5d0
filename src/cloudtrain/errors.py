"""One error hierarchy for the whole package.

`UserError` and its subclasses are mistakes the user can fix (bad input, an unknown
name, a malformed data file): the CLI prints their one-line message and exits 2.
Any other `CloudtrainError` is a failure of the tool or its environment: exit 1.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from pathlib import Path


def first_line(error: BaseException) -> str:
    """'TypeName: first line of the message', for errors of code that is not ours."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


class CloudtrainError(Exception):
    """Base of every error cloudtrain raises on purpose."""


class UserError(CloudtrainError):
    """Something the user gave us is wrong; the message says what and how to fix it."""


class DataError(UserError):
    """A data file (CSV, TOML, trace) is malformed at a known place."""

    def __init__(
        self,
        path: str | Path,
        problem: str,
        *,
        line: int | None = None,
        column: str | None = None,
    ) -> None:
        self.path = str(path)
        self.line = line
        self.column = column
        self.problem = problem
        where = self.path if line is None else f"{self.path}:{line}"
        if column is not None:
            where += f": column '{column}'"
        super().__init__(f"{where}: {problem}")


class UnknownNameError(UserError):
    """A name (GPU, provider, preset, ...) that is not among the valid choices."""

    def __init__(
        self,
        kind: str,
        name: str,
        choices: Iterable[str],
        *,
        aliases: Mapping[str, str] | None = None,
    ) -> None:
        self.kind = kind
        self.name = name
        self.choices = sorted(set(choices))
        hint = did_you_mean(name, self.choices, aliases=aliases)
        super().__init__(f"unknown {kind} '{name}'{hint}")


class StoreVersionError(UserError):
    """The run store was written by a newer cloudtrain than this one (fix: upgrade)."""


def did_you_mean(
    name: str,
    choices: Iterable[str],
    *,
    max_listed: int = 12,
    aliases: Mapping[str, str] | None = None,
) -> str:
    """A suffix for error messages: '; did you mean X?' or the list of valid choices.

    `aliases` maps other spellings to a choice: they are matched too, and the choice
    they stand for is what gets suggested.
    """
    options = sorted(set(choices))
    by_lower = {c.lower(): c for c in options}
    for alias, choice in (aliases or {}).items():
        by_lower.setdefault(alias.lower(), choice)
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=6, cutoff=0.5)
    suggested = list(dict.fromkeys(by_lower[c] for c in close))[:3]
    if suggested:
        return "; did you mean " + " or ".join(suggested) + "?"
    if not options:
        return ""
    listed = ", ".join(options[:max_listed])
    more = f", ... ({len(options)} in all)" if len(options) > max_listed else ""
    return f"; valid choices: {listed}{more}"

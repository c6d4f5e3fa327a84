"""Problems and the exceptions that carry them to the CLI.

Every user-facing failure is a `Problem`: one line naming the file, the field,
what is wrong and how to fix it. The CLI prints them and turns the exception
class into the exit code (1: a check found a problem, 2: usage/environment).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning"]

EXIT_OK = 0
EXIT_FINDING = 1
EXIT_USAGE = 2


@dataclass(frozen=True)
class Problem:
    """One finding about one field of one file."""

    file: str
    field: str
    message: str
    fix: str = ""
    severity: Severity = "error"
    rule: str = ""

    def line(self) -> str:
        where = ": ".join(part for part in (self.file, self.field) if part)
        tag = "warning: " if self.severity == "warning" else ""
        text = f"{where}: {tag}{self.message}" if where else f"{tag}{self.message}"
        if self.fix:
            text += f" (fix: {self.fix})"
        if self.rule:
            text += f" [{self.rule}]"
        return text

    def to_json(self) -> dict[str, str]:
        return {
            "file": self.file,
            "field": self.field,
            "message": self.message,
            "fix": self.fix,
            "severity": self.severity,
            "rule": self.rule,
        }


class SparkImagesError(Exception):
    """Base: carries one or more problem lines and an exit code."""

    exit_code = EXIT_USAGE

    def __init__(self, *lines: str | Problem) -> None:
        self.problems: list[Problem] = [
            p if isinstance(p, Problem) else Problem(file="", field="", message=p) for p in lines
        ]
        super().__init__("; ".join(p.line() for p in self.problems))

    def lines(self) -> list[str]:
        return [p.line() for p in self.problems]

    @property
    def message(self) -> str:
        """The first problem's message alone (no file or fix): what a caller
        quotes as the reason a stage was skipped (HttpProblem has the same)."""
        return self.problems[0].message if self.problems else str(self)


class UsageError(SparkImagesError):
    """Bad arguments or a target that cannot be opened as asked (exit 2)."""

    exit_code = EXIT_USAGE


class EnvironmentProblem(SparkImagesError):
    """Something outside the input is missing: engine, network, tool (exit 2)."""

    exit_code = EXIT_USAGE


class Finding(SparkImagesError):
    """The check ran and found a problem in the input (exit 1)."""

    exit_code = EXIT_FINDING

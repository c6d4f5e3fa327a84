"""The first problem's message, as callers quote it in a skip reason."""

from __future__ import annotations

from spark_images.core.errors import EnvironmentProblem, Problem, UsageError


def test_the_message_is_the_first_problems_without_its_file_or_fix() -> None:
    exc = EnvironmentProblem(Problem(file="pypi.org", field="", message="timed out", fix="try again"), "second")
    assert exc.message == "timed out"
    assert exc.lines() == ["pypi.org: timed out (fix: try again)", "second"]  # the full lines keep both


def test_an_error_with_no_problem_lines_still_has_a_message() -> None:
    assert UsageError().message == ""
    assert UsageError("one line").message == "one line"

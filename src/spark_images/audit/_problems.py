"""One-line problems of the audit: `WHERE: message` text -> Problem(file=WHERE)."""

from __future__ import annotations

from spark_images.errors import Problem


def problem(text: str, fix: str = "") -> Problem:
    """Split the leading `WHERE: ` (a path, URL or target) into the problem's file."""
    where, sep, message = text.partition(": ")
    if not sep or not where or " " in where.strip():
        return Problem(file="audit", field="", message=text, fix=fix)
    return Problem(file=where, field="", message=message, fix=fix)

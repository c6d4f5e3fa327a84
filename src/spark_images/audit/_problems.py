"""One-line problems of the audit: `WHERE: message` text -> Problem(file=WHERE).

Both parts are clipped: a target, ref or URL comes from the user or a server
and must never make a message unbounded."""

from __future__ import annotations

from spark_images.core.errors import Problem
from spark_images.core.inputs import short

_WHERE_MAX = 200
_MESSAGE_MAX = 600


def problem(text: str, fix: str = "") -> Problem:
    """Split the leading `WHERE: ` (a path, URL or target) into the problem's file."""
    where, sep, message = text.partition(": ")
    if not sep or not where or " " in where.strip():
        return Problem(file="audit", field="", message=short(text, _MESSAGE_MAX), fix=fix)
    return Problem(file=short(where, _WHERE_MAX), field="", message=short(message, _MESSAGE_MAX), fix=fix)

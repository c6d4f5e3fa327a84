"""A small declarative schema for YAML documents (pure; no I/O).

Why not jsonschema: we need one line per problem that names the dotted field,
says what was expected, and offers "did you mean" for unknown keys; that is
forty lines here and clearer than post-processing a validator's messages.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from spark_images.errors import Problem

Check = Callable[[Any], str | None]  # returns a message when the value is wrong


@dataclass(frozen=True)
class Field:
    """One key of a mapping: its type, whether it is required, and how to check it."""

    kind: type | tuple[type, ...]
    required: bool = True
    doc: str = ""
    check: Check | None = None
    children: Mapping[str, Field] | None = None  # for mappings
    items: Field | None = None  # for lists
    nullable: bool = False


@dataclass
class Validator:
    file: str
    problems: list[Problem] = field(default_factory=list)

    def add(self, path: str, message: str, fix: str = "") -> None:
        self.problems.append(Problem(file=self.file, field=path, message=message, fix=fix))

    def mapping(self, value: Any, spec: Mapping[str, Field], path: str) -> None:
        if not isinstance(value, dict):
            self.add(path or "(top level)", f"expected a mapping, got {_kind(value)}")
            return
        for key in value:
            if key not in spec:
                where = f"{path}.{key}" if path else str(key)
                close = difflib.get_close_matches(str(key), list(spec), n=1, cutoff=0.6)
                hint = f"did you mean '{close[0]}'?" if close else f"allowed: {', '.join(spec)}"
                self.add(where, f"unknown key '{key}'", hint)
        for key, fspec in spec.items():
            where = f"{path}.{key}" if path else key
            if key not in value:
                if fspec.required:
                    self.add(where, "missing required field", f"add '{key}:' ({fspec.doc})" if fspec.doc else f"add '{key}:'")
                continue
            self.value(value[key], fspec, where)

    def value(self, value: Any, spec: Field, path: str) -> None:
        if value is None and spec.nullable:
            return
        # bool is an int in Python; a YAML `yes` must not pass as a number
        wrong_bool = isinstance(value, bool) and bool not in _as_tuple(spec.kind)
        if wrong_bool or not isinstance(value, spec.kind):
            expected = " or ".join(t.__name__ for t in _as_tuple(spec.kind))
            hint = 'quote it, e.g. "13.0"' if str in _as_tuple(spec.kind) and isinstance(value, int | float) else ""
            self.add(path, f"expected {_type_name(expected)}, got {_kind(value)}", hint)
            return
        if spec.children is not None:
            self.mapping(value, spec.children, path)
        if spec.items is not None and isinstance(value, list):
            for i, item in enumerate(value):
                self.value(item, spec.items, f"{path}[{i}]")
        if spec.check is not None:
            message = spec.check(value)
            if message:
                self.add(path, message, spec.doc)


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _type_name(name: str) -> str:
    return {"str": "a string", "int": "an integer", "dict": "a mapping", "list": "a list", "bool": "true/false"}.get(name, name)


def _kind(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"a boolean ({value})"
    return {
        str: f"a string ({value!r})",
        int: f"an integer ({value})",
        float: f"a number ({value})",
        dict: "a mapping",
        list: "a list",
    }.get(type(value), type(value).__name__)


def validate(doc: Any, spec: Mapping[str, Field], file: str) -> list[Problem]:
    v = Validator(file=file)
    v.mapping(doc, spec, "")
    return v.problems

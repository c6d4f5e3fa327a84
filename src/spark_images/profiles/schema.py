"""A small declarative schema for YAML documents (pure; no I/O).

Why not jsonschema: we need one line per problem that names the dotted field,
says what was expected, and offers "did you mean" for unknown keys; that is
forty lines here and clearer than post-processing a validator's messages.
The same `Field` tree is exported as a JSON Schema (`json_schema`) for
editors, so the two cannot drift apart.

Every value that reaches a message goes through `show`, which bounds it: a
hostile file cannot make a message (or the work of building it) unbounded.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from spark_images.core.errors import Problem

Check = Callable[[Any], str | None]  # returns a message when the value is wrong

SHOW_LIMIT = 80  # characters of a value quoted in a message
MAX_ITEMS = 256  # entries of a list or mapping; profiles hold a handful
MAX_LENGTH = 256  # characters of a string unless a field says otherwise


def show(value: Any, limit: int = SHOW_LIMIT) -> str:
    """repr() of a value, bounded: a long string is cut, a container is named, not printed."""
    if isinstance(value, str):
        return repr(value) if len(value) <= limit else repr(value[:limit]) + f"... ({len(value)} characters)"
    if isinstance(value, dict | list | tuple | set | frozenset):
        return f"a {type(value).__name__} of {len(value)}"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def name_of(key: Any) -> str:
    """A mapping key as a message shows it: itself when short and printable, else bounded."""
    text = str(key) if isinstance(key, str | int | float | bool) or key is None else show(key)
    return text if len(text) <= SHOW_LIMIT and text.isprintable() else show(str(key))


@dataclass(frozen=True)
class Field:
    """One key of a mapping: its type, whether it is required, and how to check it."""

    kind: type | tuple[type, ...]
    required: bool = True
    doc: str = ""
    check: Check | None = None
    children: Mapping[str, Field] | None = None  # for mappings with fixed keys
    items: Field | None = None  # for lists
    nullable: bool = False
    pattern: str | None = None  # full-match regex for strings (also the JSON Schema's)
    what: str = ""  # what the pattern means, for the message: "'x' is not {what}"
    max_length: int = MAX_LENGTH  # strings
    max_items: int = MAX_ITEMS  # lists and mappings
    min_items: int = 0  # lists: an empty one can mean "nothing to check", which no gate may pass
    keys: Field | None = None  # for free-form mappings: every key
    values: Field | None = None  # for free-form mappings: every value
    enum: tuple[str, ...] = ()
    default: Any = None  # documented in the JSON Schema; applied where the model is built


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
        if len(value) > MAX_ITEMS:  # one line, not one per unknown key
            self.add(path or "(top level)", f"has {len(value)} keys, more than the {MAX_ITEMS} allowed", f"allowed: {', '.join(spec)}")
            return
        for key in value:
            if key not in spec:
                name = name_of(key)
                where = f"{path}.{name}" if path else name
                close = difflib.get_close_matches(str(key)[:SHOW_LIMIT], list(spec), n=1, cutoff=0.6)
                hint = f"did you mean '{close[0]}'?" if close else f"allowed: {', '.join(spec)}"
                self.add(where, f"unknown key '{name}'", hint)
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
        if isinstance(value, list | dict) and len(value) > spec.max_items:
            self.add(path, f"has {len(value)} entries, more than the {spec.max_items} allowed", spec.doc)
            return
        if isinstance(value, list) and len(value) < spec.min_items:
            self.add(path, f"has {len(value)} entries, at least {spec.min_items} needed", spec.doc)
            return
        if isinstance(value, str) and not self.string(value, spec, path):
            return
        if spec.children is not None:
            self.mapping(value, spec.children, path)
        if isinstance(value, dict) and (spec.keys is not None or spec.values is not None):
            self.free_mapping(value, spec, path)
        if spec.items is not None and isinstance(value, list):
            for i, item in enumerate(value):
                self.value(item, spec.items, f"{path}[{i}]")
        if spec.check is not None:
            message = spec.check(value)
            if message:
                self.add(path, message, spec.doc)

    def string(self, value: str, spec: Field, path: str) -> bool:
        """Length, enum and full-match pattern of a string; False when one failed."""
        if len(value) > spec.max_length:
            self.add(path, f"{show(value)} is longer than {spec.max_length} characters", spec.doc)
            return False
        if spec.enum and value not in spec.enum:
            self.add(path, f"{show(value)} is not one of {', '.join(spec.enum)}", spec.doc)
            return False
        if spec.pattern is not None and re.fullmatch(spec.pattern, value) is None:
            # a field's own check may say more precisely why (e.g. "leaves the project")
            specific = spec.check(value) if spec.check is not None else None
            self.add(path, specific or f"{show(value)} is not {spec.what or 'of the expected form'}", spec.doc)
            return False
        return True

    def free_mapping(self, value: dict[Any, Any], spec: Field, path: str) -> None:
        for key, item in value.items():
            name = name_of(key)
            where = f"{path}.{name}"
            if spec.keys is not None:
                before = len(self.problems)
                self.value(key, spec.keys, where)
                if len(self.problems) > before:
                    continue
            if spec.values is not None:
                self.value(item, spec.values, where)


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _type_name(name: str) -> str:
    return {"str": "a string", "int": "an integer", "dict": "a mapping", "list": "a list", "bool": "true/false"}.get(name, name)


def _kind(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"a boolean ({value})"
    if isinstance(value, int):
        return f"an integer ({show(value)})"
    return {
        str: lambda: f"a string ({show(value)})",
        float: lambda: f"a number ({show(value)})",
        dict: lambda: "a mapping",
        list: lambda: "a list",
    }.get(type(value), lambda: type(value).__name__)()


def validate(doc: Any, spec: Mapping[str, Field], file: str) -> list[Problem]:
    v = Validator(file=file)
    v.mapping(doc, spec, "")
    return v.problems


# --- JSON Schema export ---------------------------------------------------------------

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array"}


def anchored(pattern: str) -> str:
    """A JSON Schema pattern (a search) that is a full match in every regex dialect:
    `$` would let a trailing newline through in Python's, so the end is "no character follows"."""
    return f"^(?:{pattern})(?![\\s\\S])"


def field_schema(spec: Field) -> dict[str, Any]:
    """The JSON Schema (2020-12) of one field; checks written as code are described only."""
    types = [_JSON_TYPES[t] for t in _as_tuple(spec.kind)] + (["null"] if spec.nullable else [])
    out: dict[str, Any] = {"type": types[0] if len(types) == 1 else types}
    if spec.doc:
        out["description"] = spec.doc
    if spec.default is not None:
        out["default"] = list(spec.default) if isinstance(spec.default, tuple) else spec.default
    if str in _as_tuple(spec.kind):
        out["maxLength"] = spec.max_length
        if spec.pattern is not None:
            out["pattern"] = anchored(spec.pattern)
        if spec.enum:
            out["enum"] = list(spec.enum) + ([None] if spec.nullable else [])
    if dict in _as_tuple(spec.kind):
        out["maxProperties"] = spec.max_items
        if spec.children is not None:
            out.update(object_schema(spec.children))
        else:
            if spec.keys is not None and spec.keys.pattern is not None:
                out["propertyNames"] = {"pattern": anchored(spec.keys.pattern)}
            if spec.values is not None:
                out["additionalProperties"] = field_schema(spec.values)
    if list in _as_tuple(spec.kind):
        out["maxItems"] = spec.max_items
        if spec.min_items:
            out["minItems"] = spec.min_items
        if spec.items is not None:
            out["items"] = field_schema(spec.items)
    if int in _as_tuple(spec.kind) and spec.check is not None and getattr(spec.check, "minimum", None) is not None:
        out["minimum"] = spec.check.minimum  # type: ignore[attr-defined]
        if getattr(spec.check, "maximum", None) is not None:
            out["maximum"] = spec.check.maximum  # type: ignore[attr-defined]
    return out


def object_schema(spec: Mapping[str, Field]) -> dict[str, Any]:
    return {
        "properties": {key: field_schema(f) for key, f in spec.items()},
        "required": [key for key, f in spec.items() if f.required],
        "additionalProperties": False,
    }


def json_schema(spec: Mapping[str, Field], *, title: str, schema_id: str = "") -> dict[str, Any]:
    doc: dict[str, Any] = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": title, "type": "object"}
    if schema_id:
        doc["$id"] = schema_id
    doc.update(object_schema(spec))
    return doc

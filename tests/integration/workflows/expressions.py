"""GitHub Actions `${{ ... }}` expressions, evaluated as a runner does (the subset the workflows use).

Literals ('str', numbers, true/false/null), context paths (`needs.build.outputs.digest`,
`inputs.profile`, `matrix.profile`, `steps.candidate.outputs.image`, ...), `==`, `!=`,
`&&`, `||`, `!`, parentheses, and the functions `success()`, `failure()`, `always()`,
`cancelled()`, `fromJSON()`, `toJSON()`, `format()`, `contains()`, `startsWith()`.
A missing property is null, `||`/`&&` return an operand (not a boolean), `==` compares
strings case-insensitively: GitHub's rules. Anything else raises, so a workflow that
starts using more fails its test instead of being half-understood.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

_TOKEN = re.compile(
    r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>\d+(?:\.\d+)?)|(?P<op>==|!=|&&|\|\||[!().,\[\]])"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z_*][A-Za-z0-9_-]*)*))"
)
EXPR = re.compile(r"\$\{\{(.*?)\}\}", re.S)


class ExpressionError(Exception):
    pass


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ExpressionError(f"cannot read {text[pos:]!r} in {text!r}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return out


def truthy(value: Any) -> bool:
    return value not in (None, False, 0, "", 0.0)


def _text(value: Any) -> str:
    """How a value is written into a string (a `run:` script, an env value)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return a.lower() == b.lower()
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a == b
    return a == b


class _Parser:
    def __init__(self, text: str, context: Mapping[str, Any], status: Mapping[str, Callable[[], bool]]) -> None:
        self.toks = _tokens(text)
        self.i = 0
        self.context = context
        self.status = status
        self.text = text

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if tok is None or (value is not None and tok[1] != value):
            raise ExpressionError(f"expected {value or 'more'} in {self.text!r}")
        self.i += 1
        return tok

    def parse(self) -> Any:
        value = self.or_()
        if self.peek() is not None:
            raise ExpressionError(f"unexpected {self.peek()} in {self.text!r}")
        return value

    def or_(self) -> Any:
        left = self.and_()
        while self.peek() == ("op", "||"):
            self.take()
            right = self.and_()
            left = left if truthy(left) else right
        return left

    def and_(self) -> Any:
        left = self.cmp()
        while self.peek() == ("op", "&&"):
            self.take()
            right = self.cmp()
            left = right if truthy(left) else left
        return left

    def cmp(self) -> Any:
        left = self.unary()
        while self.peek() in (("op", "=="), ("op", "!=")):
            op = self.take()[1]
            right = self.unary()
            left = _equal(left, right) if op == "==" else not _equal(left, right)
        return left

    def unary(self) -> Any:
        if self.peek() == ("op", "!"):
            self.take()
            return not truthy(self.unary())
        return self.primary()

    def primary(self) -> Any:
        kind, value = self.take()
        if kind == "str":
            return value[1:-1].replace("''", "'")
        if kind == "num":
            return float(value) if "." in value else int(value)
        if (kind, value) == ("op", "("):
            inner = self.or_()
            self.take(")")
            return inner
        if kind != "name":
            raise ExpressionError(f"unexpected {value!r} in {self.text!r}")
        if value in ("true", "false"):
            return value == "true"
        if value == "null":
            return None
        if self.peek() == ("op", "("):
            return self.call(value)
        return self.lookup(value)

    def lookup(self, path: str) -> Any:
        parts = path.split(".")
        if parts[0] not in self.context:
            raise ExpressionError(f"unknown context {parts[0]!r} in {self.text!r}")
        value: Any = self.context[parts[0]]
        for part in parts[1:]:
            value = value.get(part) if isinstance(value, Mapping) else None
        return value

    def call(self, name: str) -> Any:
        self.take("(")
        args: list[Any] = []
        while self.peek() != ("op", ")"):
            args.append(self.or_())
            if self.peek() == ("op", ","):
                self.take()
        self.take(")")
        lowered = name.lower()
        if lowered in self.status:
            return self.status[lowered]()
        if lowered == "fromjson":
            return json.loads(args[0])
        if lowered == "tojson":
            return json.dumps(args[0], indent=2)
        if lowered == "format":
            return re.sub(r"\{(\d+)\}", lambda m: _text(args[int(m.group(1)) + 1]), str(args[0]))
        if lowered == "contains":
            hay, needle = args
            if isinstance(hay, list):
                return any(_equal(h, needle) for h in hay)
            return str(needle).lower() in _text(hay).lower()
        if lowered == "startswith":
            return _text(args[0]).lower().startswith(_text(args[1]).lower())
        raise ExpressionError(f"function {name}() is not supported here ({self.text!r})")


def evaluate(text: str, context: Mapping[str, Any], status: Mapping[str, Callable[[], bool]] | None = None) -> Any:
    """The value of one expression (the part between `${{` and `}}`, or an `if:` without them)."""
    body = text.strip()
    m = EXPR.fullmatch(body)
    if m:
        body = m.group(1)
    return _Parser(body, context, status or {}).parse()


def substitute(value: Any, context: Mapping[str, Any], status: Mapping[str, Callable[[], bool]] | None = None) -> Any:
    """A YAML value with every `${{ ... }}` replaced; a string that is one expression keeps its type."""
    if isinstance(value, dict):
        return {k: substitute(v, context, status) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, context, status) for v in value]
    if not isinstance(value, str):
        return value
    whole = EXPR.fullmatch(value.strip())
    if whole:
        return evaluate(whole.group(1), context, status)
    return EXPR.sub(lambda m: _text(evaluate(m.group(1), context, status)), value)


def as_text(value: Any) -> str:
    return _text(value)

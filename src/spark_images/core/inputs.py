"""Bounded reads of the files a user names: profiles, locks, patches, records.

Every input is hostile until checked. A FIFO, a device (`/dev/zero`), a
directory, a file larger than the limit or bytes that are not UTF-8 are
refused with one line naming the file, before anything is parsed; JSON is
depth-limited and refuses NaN/Infinity; YAML is safe-loaded with limits on
size, depth, aliases and alias expansion, and refuses duplicate keys.
Nothing here decides what the content means.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from spark_images.core.errors import Finding, Problem, SparkImagesError, UsageError

MiB = 1024 * 1024
# the one digest pattern (fullmatch): a sha256 as 64 lower-case hex digits, bare and as
# an OCI digest; profiles, the lock, PyPI's hashes and image references all use these
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
DIGEST = re.compile(rf"sha256:{SHA256_HEX.pattern}")
DEFAULT_LIMIT = 16 * MiB  # far above any profile, lock or record we write
MAX_DEPTH = 64  # nesting of JSON/YAML documents; ours are at most ~6 deep


def _fail(error: type[SparkImagesError], file: str, message: str, fix: str) -> SparkImagesError:
    return error(Problem(file=file, field="", message=message, fix=fix))


def read_bytes(
    path: str | os.PathLike[str],
    *,
    what: str,
    limit: int = DEFAULT_LIMIT,
    error: type[SparkImagesError] = UsageError,
    example: str = "",
) -> bytes:
    """The bytes of a regular file of at most `limit` bytes, or `error` naming it
    (a missing file's fix names `example`, e.g. profiles/cu130.yaml, when given).

    Opened non-blocking and checked with fstat on the open descriptor, so a
    FIFO cannot hang the open and a file swapped after a stat cannot slip in.
    """
    file = display_path(path)  # for messages; the open uses the path as given
    try:
        fd = os.open(os.fsencode(path), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        fix = f"pass a path like {example}" if example else f"pass the path of a {what}"
        raise _fail(error, file, f"no such {what} file", fix) from None
    except IsADirectoryError:
        raise _fail(error, file, f"is a directory, not a {what} file", f"pass the path of a {what}") from None
    except OSError as exc:
        raise _fail(error, file, f"cannot open {what}: {exc.strerror}", "check the path and its permissions") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _fail(error, file, f"not a regular file (a {what} must be one)", f"pass the path of a {what}")
        if info.st_size > limit:
            raise _fail(error, file, f"{what} is {info.st_size} bytes, over the limit of {limit}", f"pass a real {what}")
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        total = 0
        while True:  # the size can grow between fstat and read: stop at the limit regardless
            chunk = os.read(fd, min(1 * MiB, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise _fail(error, file, f"{what} is over the limit of {limit} bytes", f"pass a real {what}")
        return b"".join(chunks)
    except OSError as exc:
        raise _fail(error, file, f"cannot read {what}: {exc.strerror}", "check the path and its permissions") from None
    finally:
        os.close(fd)


def decode_text(data: bytes, *, file: str, what: str, error: type[SparkImagesError] = UsageError) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(error, file, f"{what} is not UTF-8 text (byte {exc.start})", f"save the {what} as UTF-8") from None


def read_text(
    path: str | os.PathLike[str],
    *,
    what: str,
    limit: int = DEFAULT_LIMIT,
    error: type[SparkImagesError] = UsageError,
    example: str = "",
) -> str:
    data = read_bytes(path, what=what, limit=limit, error=error, example=example)
    return decode_text(data, file=display_path(path), what=what, error=error)


def json_depth_exceeds(text: str, max_depth: int = MAX_DEPTH) -> bool:
    """True when brackets nest deeper than max_depth (strings skipped); linear, no recursion."""
    depth = 0
    in_string = False
    escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def loads_json(
    text: str,
    *,
    file: str,
    what: str,
    max_depth: int = MAX_DEPTH,
    error: type[SparkImagesError] = UsageError,
) -> Any:
    """Strict JSON: no NaN/Infinity, nesting at most max_depth, one line on failure."""
    if json_depth_exceeds(text, max_depth):
        raise _fail(error, file, f"{what} nests deeper than {max_depth} levels", f"pass a real {what}")
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:  # JSONDecodeError is a ValueError; so is a refused constant
        raise _fail(error, file, f"{what} is not valid JSON: {short(str(exc))}", f"pass a {what} as spark-images writes it") from None
    except RecursionError:  # belt and braces: the depth scan should make this unreachable
        raise _fail(error, file, f"{what} nests too deeply", f"pass a real {what}") from None


def load_json(
    path: str | os.PathLike[str],
    *,
    what: str,
    limit: int = DEFAULT_LIMIT,
    max_depth: int = MAX_DEPTH,
    error: type[SparkImagesError] = UsageError,
) -> Any:
    file = display_path(path)
    return loads_json(read_text(path, what=what, limit=limit, error=error), file=file, what=what, max_depth=max_depth, error=error)


def short(text: str, limit: int = 200, *, middle: bool = False) -> str:
    """A value for a message, the one shortener: bounded to `limit` characters, control
    characters escaped (a newline in a value can never start a second line). `middle`
    cuts out the middle instead of the end (a path in a table keeps its file name)."""
    if not text.isprintable():
        text = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)
    if len(text) <= limit:
        return text
    keep = limit - 3
    if middle:
        return text[: keep // 2] + "..." + text[len(text) - (keep - keep // 2) :]
    return text[:keep] + "..."


def display_path(path: str | os.PathLike[str]) -> str:
    """A path for a message or JSON: undecodable bytes become escapes, never an error."""
    raw = os.fsencode(Path(path))
    return raw.decode("utf-8", errors="backslashreplace")



# --- YAML ---------------------------------------------------------------------------

YAML_LIMIT = 1 * MiB  # a profile is ~3 KB and fixes.yaml ~8 KB
MAX_YAML_NODES = 50_000  # nodes after expanding every alias; ours hold a few hundred
MAX_YAML_ALIASES = 100  # a profile needs none; a few anchors are fine
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _YamlLimit(yaml.YAMLError):
    """A document over one of our limits: named, with the line where it was met."""

    def __init__(self, problem: str, mark: Any) -> None:
        super().__init__(problem)
        self.problem = problem
        self.problem_mark = mark


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader (no arbitrary objects) with the limits a hostile file needs.

    The composer is recursive and aliases share nodes, so depth and alias
    counts are checked while composing, and the size of the document with
    every alias expanded is computed on the node graph before anything is
    constructed: a 4 KB billion-laughs file is refused without building it.
    Duplicate and unhashable keys are refused while constructing.
    """

    max_depth = MAX_DEPTH
    max_aliases = MAX_YAML_ALIASES

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > self.max_aliases:
                raise _YamlLimit(f"more than {self.max_aliases} aliases (*name)", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > self.max_depth:
                raise _YamlLimit(f"nests deeper than {self.max_depth} levels", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue  # `<<: *base` merges; an explicit key may override it
                key = self.construct_object(key_node, deep=deep)
                try:
                    hash(key)
                except TypeError:
                    raise _YamlLimit("a key is a list or mapping; keys must be plain names", key_node.start_mark) from None
                if key in seen:
                    raise _YamlLimit(f"duplicate key '{short(str(key), 80)}'", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


_BoundedLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    lambda loader, node: loader.construct_mapping(node),
)


def _expanded_size(root: Any, limit: int) -> tuple[int, Any]:
    """(nodes with every alias expanded, capped just past limit; the node where a cycle
    was found or None). Iterative: a shared node is sized once and reused."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            children = _children(node)
            sizes[key] = min(limit + 1, 1 + sum(sizes[id(c)] for c in children))
            continue
        if key in sizes:
            continue
        if key in on_path:
            return limit + 1, node
        on_path.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in on_path:
                return limit + 1, child
            if id(child) not in sizes:
                stack.append((child, False))
    return sizes.get(id(root), 0), None


def _children(node: Any) -> list[Any]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def loads_yaml(
    text: str,
    *,
    file: str,
    what: str,
    max_bytes: int = YAML_LIMIT,
    max_depth: int = MAX_DEPTH,
    max_nodes: int = MAX_YAML_NODES,
    max_aliases: int = MAX_YAML_ALIASES,
    error: type[SparkImagesError] = Finding,
) -> Any:
    """One YAML document, safely: no objects, bounded size, depth, aliases and
    expansion; duplicate or unhashable keys refused. On failure `error` with one
    Problem whose field is "line L, column C" and whose message starts
    "not valid YAML:" (the style validate has always printed)."""

    def fail(message: str, mark: Any = None, fix: str = "fix the YAML syntax") -> SparkImagesError:
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "(yaml)"
        return error(Problem(file=file, field=where, message=f"not valid YAML: {short(message)}", fix=fix))

    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise _fail(error, file, f"{what} is {size} bytes, over the limit of {max_bytes}", f"pass a real {what}")
    loader_class = type("_Loader", (_BoundedLoader,), {"max_depth": max_depth, "max_aliases": max_aliases})
    loader = None
    try:
        loader = loader_class(text)  # the reader refuses control characters here
        node = loader.get_single_node()
        if node is None:
            return None
        total, cycle = _expanded_size(node, max_nodes)
        if cycle is not None:
            raise fail("an alias refers to a node that contains it", cycle.start_mark, "drop the recursive alias")
        if total > max_nodes:
            raise fail(f"expands to more than {max_nodes} values (aliases of aliases)", node.start_mark,
                       f"write the {what} out without nested aliases")
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or (str(exc).splitlines() or ["unreadable"])[0]
        raise fail(str(problem), mark) from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise fail(f"a value cannot be read ({short(str(exc), 80)})") from None
    except RecursionError:  # belt and braces: the depth limit should make this unreachable
        raise fail(f"nests too deeply (limit {max_depth})") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_yaml(
    path: str | os.PathLike[str],
    *,
    what: str,
    limit: int = YAML_LIMIT,
    read_error: type[SparkImagesError] = UsageError,
    error: type[SparkImagesError] = Finding,
) -> Any:
    """Read a regular file of at most `limit` bytes (else `read_error`) and parse it
    with `loads_yaml` (its problems raise `error`)."""
    file = display_path(path)
    text = read_text(path, what=what, limit=limit, error=read_error)
    return loads_yaml(text, file=file, what=what, max_bytes=limit, error=error)

"""Hash-pinned requirements locks beside the profiles (pure: text in, findings out).

A lock is `pip install --require-hashes --no-deps -r` input: `name==version`
lines with `--hash=sha256:` continuations, or a direct reference to one wheel
file (`name @ https://HOST/name-VERSION-TAGS.whl`, its hash below it), whose
version is the one in the wheel's file name (PEP 427). A lock whose header carries the
INCOMPLETE marker was not generated (see its header) and must not be used.
"""

from __future__ import annotations

import fnmatch
import re
import urllib.parse
from collections.abc import Sequence

from spark_images.pypi import normalize  # PEP 503 names, as the index spells them

INCOMPLETE_MARKER = "spark-images: incomplete"

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")
_URL_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*@\s*([^\s;\\#]+\.whl)(?=[\s;\\#]|$)")


def _wheel_version(url: str, name: str) -> str | None:
    """VERSION of a wheel URL `.../NAME-VERSION-[BUILD-]PY-ABI-PLATFORM.whl` naming `name`, else None."""
    filename = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
    parts = filename[: -len(".whl")].split("-")
    if len(parts) not in (5, 6) or normalize(parts[0]) != normalize(name):
        return None
    return parts[1]


def pinned_versions(text: str) -> dict[str, str]:
    """Normalised package name -> pinned version."""
    pins: dict[str, str] = {}
    for line in text.splitlines():
        m = _PIN.match(line.strip())
        if m:
            pins[normalize(m.group(1))] = m.group(2)
        elif (m := _URL_PIN.match(line.strip())) and (version := _wheel_version(m.group(2), m.group(1))):
            pins[normalize(m.group(1))] = version
    return pins


def usability_problem(text: str) -> str:
    """Why the lock cannot be installed as it is, or ""."""
    if INCOMPLETE_MARKER in text:
        return "is marked incomplete (fix: regenerate it as its header says, or drop the key)"
    if not pinned_versions(text):
        return "pins no package (fix: regenerate it with --generate-hashes)"
    if "--hash=sha256:" not in text:
        return "carries no --hash=sha256: lines (fix: regenerate it with --generate-hashes)"
    return ""


def pin_mismatches(text: str, pins: dict[str, str]) -> list[tuple[str, str, str | None]]:
    """(name, profile version, locked version or None) for each pin the lock does not match."""
    locked = pinned_versions(text)
    found: list[tuple[str, str, str | None]] = []
    for name, version in sorted(pins.items()):
        have = locked.get(normalize(name))
        if have != version:
            found.append((name, version, have))
    return found


_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)")


def entries(text: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The lock's pip option lines, and its entries as (PEP 503 name, the entry's lines).

    An entry is a requirement line at column 0 with its continuations: the lines
    after a trailing backslash and the indented ones (`--hash=`, `# via`). Comments
    and blank lines between entries belong to none. A line that names no package
    (an option such as `--index-url`) applies to every entry.
    """
    options: list[str] = []
    found: list[tuple[str, list[str]]] = []
    continued = False
    for line in text.splitlines():
        if continued or (line[:1].isspace() and line.strip() and found):
            if found:
                found[-1][1].append(line)
            continued = line.rstrip().endswith("\\")
            continue
        continued = line.rstrip().endswith("\\")
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continued = False
            continue
        if stripped.startswith("-"):
            options.append(line)
            continue
        m = _NAME.match(stripped)
        found.append((normalize(m.group(1)) if m else "", [line]))
    return options, [(name, "\n".join(lines)) for name, lines in found]


def layer_of(name: str, layers: Sequence[tuple[str, Sequence[str]]], last: str) -> str:
    """The first layer with a glob matching the PEP 503 name, else `last`."""
    for layer, globs in layers:
        if any(fnmatch.fnmatchcase(name, glob) for glob in globs):
            return layer
    return last


def layered(text: str, layers: Sequence[tuple[str, Sequence[str]]], last: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(layer, the packages it installs, in lock order) for each layer that gets one, in layer order."""
    names: dict[str, list[str]] = {layer: [] for layer, _ in layers}
    names.setdefault(last, [])
    for name, _ in entries(text)[1]:
        names[layer_of(name, layers, last)].append(name)
    return tuple((layer, tuple(found)) for layer, found in names.items() if found)


def split(text: str, packages: Sequence[str], header: str) -> str:
    """The part of the lock that installs exactly `packages`: the header, every option
    line, then those entries as the lock writes them."""
    wanted = set(packages)
    options, found = entries(text)
    body = [block for name, block in found if name in wanted]
    return "\n".join([header, *options, *body]) + "\n"

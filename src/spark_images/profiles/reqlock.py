"""Hash-pinned requirements locks beside the profiles (pure: text in, findings out).

A lock is `pip install --require-hashes --no-deps -r` input: `name==version`
lines with `--hash=sha256:` continuations, or a direct reference to one wheel
file (`name @ https://HOST/name-VERSION-TAGS.whl`, its hash below it), whose
version is the one in the wheel's file name (PEP 427). A lock whose header carries the
INCOMPLETE marker was not generated (see its header) and must not be used.
"""

from __future__ import annotations

import re
import urllib.parse

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

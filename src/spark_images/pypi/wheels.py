"""Wheel rules, with no I/O: requirement strings, PEP 503 names, and which file of an index is the wheel.

Filenames and tags are parsed with `packaging`, so cp312 ranks above cp39 and a
newer manylinux above an older; a file record that is not well-formed (a hostile
or broken index) is skipped, never trusted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from spark_images.core.inputs import SHA256_HEX

_REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9.+!_-]+)\s*")


@dataclass(frozen=True)
class WheelFile:
    filename: str
    url: str
    size: int
    sha256: str


def parse_requirement(text: str) -> tuple[str, str] | None:
    """'vllm==0.33.0' -> ('vllm', '0.33.0'); None if it is not that shape."""
    match = _REQUIREMENT.fullmatch(text)
    return (match.group(1), match.group(2)) if match else None


def normalize(name: str) -> str:
    return canonicalize_name(name)


def _glibc(platform: str) -> tuple[int, int]:
    """manylinux_2_28_aarch64 -> (2, 28); manylinux2014 -> (2, 17); plain linux -> (0, 0)."""
    m = re.fullmatch(r"manylinux_(\d+)_(\d+)_\w+", platform)
    if m:
        return int(m.group(1)), int(m.group(2))
    legacy = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
    return legacy.get(platform.rsplit("_", 1)[0].split("_", 1)[0], (0, 0))


def _python(interpreter: str) -> tuple[int, int]:
    """cp312 -> (3, 12); py3 -> (3, 0); anything else ranks lowest."""
    m = re.fullmatch(r"(?:cp|py|pp)(\d)(\d*)", interpreter)
    return (int(m.group(1)), int(m.group(2) or 0)) if m else (0, 0)


def wheel_rank(filename: str, name: str, version: str, arch: str = "aarch64") -> tuple[object, ...] | None:
    """How good a wheel for linux `arch` this file is (higher is better), None if it is not one.

    Ranks by the newest Python it supports, then the newest glibc it needs
    (the most recent build of the same code), then its build tag.
    """
    try:
        dist, ver, build, tags = parse_wheel_filename(filename)
        wanted = Version(version)
    except (InvalidWheelFilename, InvalidVersion):
        return None
    if dist != canonicalize_name(name) or ver != wanted:
        return None
    linux = [t for t in tags if t.platform.endswith(f"_{arch}") and ("linux" in t.platform)]
    if not linux:
        return None
    best_py = max(_python(t.interpreter) for t in linux)
    best_glibc = max(_glibc(t.platform) for t in linux)
    return (best_py, best_glibc, build)


def pick_wheel(files: list[dict[str, Any]], name: str, version: str, arch: str = "aarch64") -> WheelFile | None:
    """The best linux `arch` wheel of exactly `version` among a simple-API file list (pure)."""
    found: list[tuple[tuple[object, ...], WheelFile]] = []
    for item in files:
        if not isinstance(item, dict):
            continue  # a hostile or broken index: skip what is not a file record
        filename = item.get("filename")
        if not isinstance(filename, str) or not filename.endswith(".whl") or item.get("yanked"):
            continue
        rank = wheel_rank(filename, name, version, arch)
        if rank is None:
            continue
        hashes = item.get("hashes")
        sha256 = hashes.get("sha256") if isinstance(hashes, dict) else None
        size, url = item.get("size"), item.get("url")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            continue
        if not isinstance(sha256, str) or SHA256_HEX.fullmatch(sha256) is None:
            continue
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            continue
        if "/" in filename or "\\" in filename or filename.startswith("."):
            continue  # the cache path is built from it
        found.append((rank, WheelFile(filename, url, size, sha256)))
    if not found:
        return None
    return max(found, key=lambda pair: pair[0])[1]  # type: ignore[arg-type, return-value]

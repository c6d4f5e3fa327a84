"""What an audit TARGET names (pure): a commit, a release, a profile, an
artifact (wheel, directory, image) or a `vllm==X` requirement."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from spark_images.audit.releases import parse_tag
from spark_images.registry.reference import ImageReference, names_registry

_HEX = re.compile(r"^g?([0-9a-f]{7,40})$")
_REQUIREMENT = re.compile(r"^vllm\s*==\s*(?P<version>[^\s;]+)$", re.IGNORECASE)
_LOCAL_SHA = re.compile(r"\+g([0-9a-f]{7,40})(?:$|[.+])")


@dataclass(frozen=True)
class TargetSpec:
    """`kind` is one of commit, release, profile, artifact, image, rev.

    `image` is a registry reference (HOST/REPO:TAG or @sha256:...): its layers
    are read through the registry (no daemon, no pull); `artifact` covers
    wheels, directories and `docker://` images.
    """

    kind: str
    value: str
    text: str


def classify(text: str, exists: bool | None = None) -> TargetSpec:
    """Decide what TARGET names; `exists` says whether it is a path on disk.

    Order matters: a profile or artifact path wins over everything, then
    images, then commits and releases; anything else is tried as a git rev.
    """
    raw = text.strip()
    if raw.startswith("docker://"):
        return TargetSpec("artifact", raw, text)
    if raw.endswith((".yaml", ".yml")):
        return TargetSpec("profile", raw, text)
    if raw.endswith(".whl") or exists:
        return TargetSpec("artifact", raw, text)
    req = _REQUIREMENT.match(raw)
    if req:
        version = req.group("version")
        local = _LOCAL_SHA.search(version)
        if local:
            return TargetSpec("commit", local.group(1), text)
        return TargetSpec("release", version.removeprefix("v"), text)
    hexm = _HEX.match(raw.lower())
    if hexm and not raw.isdigit():
        return TargetSpec("commit", hexm.group(1), text)
    if parse_tag(raw) is not None and "." in raw:
        return TargetSpec("release", raw.removeprefix("v"), text)
    if _is_image_reference(raw):
        return TargetSpec("image", raw, text)
    return TargetSpec("rev", raw, text)


def _is_image_reference(raw: str) -> bool:
    """The one reference grammar (registry.reference)."""
    return names_registry(raw) and ImageReference.parse_or_none(raw) is not None


def path_exists(text: str) -> bool:
    try:
        return Path(text).exists()
    except OSError:
        return False

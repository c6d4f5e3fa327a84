"""Inputs the audit reads but does not own: patch files given by path, and
what an installed vLLM (a wheel, a directory, an image, local or in a registry)
says about its commit. Reading images goes through `spark_images.readers.artifacts`,
which streams layers from a registry without a daemon or a pull.

A profile's patches are not read here: `audit PROFILE` takes them from the
build's own plan (`resolve.resolve_profile`), so it counts exactly the patches
the build applies.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from spark_images.audit._problems import problem
from spark_images.audit.releases import parse_version_file
from spark_images.core import inputs
from spark_images.core.errors import UsageError

if TYPE_CHECKING:
    from spark_images.profiles.patches import PatchRef

_DIST_INFO = re.compile(r"(?:^|/)vllm-[^/]+\.dist-info/(METADATA|direct_url\.json)$")
_LOCAL_SHA = re.compile(r"\+g([0-9a-f]{7,40})(?:$|[.+])")
_MEMBER_LIMIT = 4 * 1024 * 1024


def patch_texts(patches: Sequence[PatchRef | Path | str]) -> tuple[tuple[PatchRef, ...], tuple[tuple[str, bytes], ...]]:
    """The patches an audit counts, and the bytes of those read here. A plan's
    PatchRef is taken as it is (the build read that file; its text is read again
    where the content is proven, and must hash the same); a file given by path is
    read here and made into a PatchRef by the same function the plan uses, so one
    header parser decides."""
    from spark_images.profiles.patches import PATCH_LIMIT, PatchRef, patch_ref

    out: list[PatchRef] = []
    texts: list[tuple[str, bytes]] = []
    for patch in patches:
        if isinstance(patch, PatchRef):
            out.append(patch)
        else:
            text = inputs.read_text(patch, what="patch", limit=PATCH_LIMIT)
            out.append(patch_ref(str(patch), text))
            texts.append((str(patch), text.encode("utf-8")))
    return tuple(out), tuple(texts)



@dataclass(frozen=True)
class Installed:
    """What an installed vLLM says about itself; `how` says where the commit came from."""

    version: str | None
    commit: str | None
    how: str
    release: str | None = None  # a plain release version to resolve when no commit is recorded


def _want(path: str) -> bool:
    return path == "vllm/_version.py" or path.endswith("/vllm/_version.py") or bool(_DIST_INFO.search(path))


def read_installed(target: str) -> Installed:
    """vLLM's `_version.py` and dist-info (METADATA, direct_url.json) from `target`, in one pass."""
    # imported here: an audit of a commit or a checkout reads no artifact, and needs none of the readers' imports
    from spark_images.readers import artifacts

    found: dict[str, bytes] = {}
    for path, data in artifacts.iter_files(target, _want):
        key = "version_file" if path.endswith("vllm/_version.py") else path.rsplit("/", 1)[-1]
        if key not in found:
            found[key] = bytes(data[:_MEMBER_LIMIT])
    return decide_installed(target, found)


def decide_installed(target: str, found: dict[str, bytes]) -> Installed:
    """The commit of an installed vLLM from its files (pure); UsageError when there is none."""
    version_text = found.get("version_file", b"").decode("utf-8", "replace")
    version, commit = parse_version_file(version_text) if version_text else (None, None)
    meta = found.get("METADATA", b"").decode("utf-8", "replace")
    dist_version = next((ln.split(":", 1)[1].strip() for ln in meta.splitlines()[:50] if ln.startswith("Version:")), None)
    version = version or dist_version
    if commit is not None:
        return Installed(version, commit, f"commit g{commit} read from the installed vllm/_version.py "
                         "(setuptools-scm writes it when the wheel is built; no git metadata is needed)")
    direct = found.get("direct_url.json")
    if direct:
        try:
            doc = json.loads(direct.decode("utf-8", "replace"))
            vcs = doc.get("vcs_info") if isinstance(doc, dict) else None
            sha = vcs.get("commit_id") if isinstance(vcs, dict) else None
        except ValueError:
            sha = None
        if isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{7,40}", sha):
            return Installed(version, sha, f"commit {sha[:12]} read from the dist-info's direct_url.json (installed from git)")
    local = _LOCAL_SHA.search(version or "")
    if local:
        return Installed(version, local.group(1), f"commit g{local.group(1)} read from the local version {version} in the dist-info")
    if version and re.fullmatch(r"\d+(\.\d+)+(rc\d+|\.post\d+)?", version):
        return Installed(version, None, f"no commit recorded; the dist-info names release {version}, resolved as that release", release=version)
    if not found:
        raise UsageError(problem(f"{target}: no vllm/_version.py and no vllm dist-info inside (is vLLM installed there?)"))
    raise UsageError(problem(f"{target}: vllm/_version.py (version {version or '?'}) records no commit"))


def read_artifact_version(target: str) -> tuple[str | None, str]:
    """(version, commit prefix) of an installed vLLM (kept for callers of the old API)."""
    installed = read_installed(target)
    if installed.commit is None:
        raise UsageError(problem(f"{target}: vllm/_version.py (version {installed.version or '?'}) records no commit"))
    return installed.version, installed.commit

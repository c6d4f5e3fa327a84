"""The I/O edge of `proof.py`: patch-ids of commits (cached) and patches applied
to the pinned commit's tree with git.

A commit's patch-id never changes (the SHA names its content), so patch-ids are
cached for good under the user cache, one JSON file, read once per run and
written atomically (best effort: a cache that cannot be written costs a
recomputation next time). Only the few commits a verdict needs are computed,
all in one `git diff-tree --stdin | git patch-id --stable`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from spark_images.audit import git as gitmod
from spark_images.audit.knowledge import KnowledgeBase
from spark_images.audit.markers import check_fixes
from spark_images.audit.proof import PatchProof
from spark_images.core import atomic
from spark_images.core.errors import EnvironmentProblem, SparkImagesError
from spark_images.profiles import patches as patch_text

if TYPE_CHECKING:
    from spark_images.profiles.patches import PatchRef

_CACHE_LIMIT = 64 * 1024 * 1024


def _cache_path() -> Path:
    return gitmod.cache_root() / "patch-ids.json"


class PatchIds:
    """`git patch-id --stable` per commit, computed once and cached."""

    def __init__(self, repo: gitmod.Repo) -> None:
        self.repo = repo
        self._known: dict[str, str] | None = None

    def _load(self) -> dict[str, str]:
        if self._known is None:
            self._known = {}
            path = _cache_path()
            with contextlib.suppress(OSError, ValueError):
                if path.stat().st_size <= _CACHE_LIMIT:
                    doc = json.loads(path.read_text())
                    if isinstance(doc, dict):
                        self._known = {k: v for k, v in doc.items() if isinstance(k, str) and isinstance(v, str)}
        return self._known

    def of(self, shas: Sequence[str]) -> tuple[dict[str, str] | None, str]:
        """(sha -> patch-id, "") or (None, why) when git could not compute them here."""
        known = self._load()
        missing = [s for s in dict.fromkeys(shas) if s not in known]
        if missing:
            try:
                found = self.repo.patch_ids(missing)
            except EnvironmentProblem as exc:
                return None, exc.message
            known.update(found)
            with contextlib.suppress(OSError):
                atomic.write_text(_cache_path(), json.dumps(known, sort_keys=True))
        return {s: known.get(s, "") for s in shas}, ""


@dataclass(frozen=True)
class BuildPatches:
    """The patches a build lists, and whether that build applies them.

    `applies`: the build's Dockerfile runs `git apply` (the source strategy);
    `why_not`: the reason when it does not. `base_dir`: where the patch paths
    of a plan's PatchRefs are read (their bytes must still hash to the plan's)."""

    refs: tuple[PatchRef, ...] = ()
    applies: bool = False
    why_not: str = "no build applies them: only a profile of build.strategy source runs git apply"
    base_dir: Path | None = None
    texts: tuple[tuple[str, bytes], ...] = ()  # path -> bytes read already (patch files given by path)


def _text(patches: BuildPatches, ref: PatchRef) -> tuple[bytes | None, str]:
    given = dict(patches.texts)
    if ref.path in given:
        return given[ref.path], ""
    if patches.base_dir is None:
        return None, "its text is not at hand (no project directory to read it from)"
    try:
        data = (patches.base_dir / ref.path).read_bytes()
    except OSError as exc:
        return None, f"cannot read it: {exc.strerror or exc}"
    if hashlib.sha256(data).hexdigest() != ref.sha256:
        return None, "its bytes changed since the plan read them (sha256 differs)"
    return data, ""


def prove_patches(repo: gitmod.Repo, commit: str, patches: BuildPatches, kb: KnowledgeBase) -> list[PatchProof]:
    """One PatchProof per listed patch, in the build's order: applied by the build, with
    hunks, `git apply --check` passing on top of the patches before it, markers of
    every declared fix holding in the patched tree."""
    out: list[PatchProof] = []
    ready: list[tuple[PatchRef, bytes]] = []
    for ref in patches.refs:
        if not patches.applies:
            out.append(PatchProof(ref.path, ref.prs, False, patches.why_not))
            continue
        data, why = _text(patches, ref)
        if data is None:
            out.append(PatchProof(ref.path, ref.prs, False, why))
            continue
        hunks = patch_text.hunk_count(data.decode("utf-8", "replace"))
        if not hunks:
            out.append(PatchProof(ref.path, ref.prs, False, "it has no hunks: it changes nothing"))
            continue
        ready.append((ref, data))
    if not ready:
        return out
    try:
        tree, done, why = repo.apply_to(commit, [(r.path, d) for r, d in ready])
    except SparkImagesError as exc:
        reason = f"skipped: {exc.message}"
        return out + [PatchProof(r.path, r.prs, False, reason) for r, _ in ready]
    for i, (ref, _data) in enumerate(ready):
        if i < done:
            continue
        reason = why if i == done else "not checked: an earlier patch does not apply (the build stops there)"
        out.append(PatchProof(ref.path, ref.prs, False, reason))
    applied = [r for r, _ in ready[:done]]
    fixes = [f for r in applied for pr in r.prs if (f := kb.get(pr)) is not None and f.markers]
    markers = check_fixes(repo, tree, fixes) if fixes else {}
    for ref in applied:
        failed = [m for pr in ref.prs for m in markers.get(pr, ()) if m.outcome != "ok"]
        if failed:
            out.append(PatchProof(ref.path, ref.prs, False, "in the patched tree: " + "; ".join(m.line() for m in failed)))
            continue
        held = sum(len(markers.get(pr, ())) for pr in ref.prs)
        how = f"git apply --check passes at {commit[:12]}" + (f"; {held} marker(s) hold in the patched tree" if held else "")
        out.append(PatchProof(ref.path, ref.prs, True, how))
    order = {r.path: i for i, r in enumerate(patches.refs)}
    return sorted(out, key=lambda p: order.get(p.path, 0))

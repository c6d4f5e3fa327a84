"""TARGET -> the commit to audit, with what the target itself requires.

A commit or short SHA, a release (its tag, else the commit its PyPI sdist
records), a profile (through the build's own resolver, which the caller hands
in as `profile_resolver`, so the audit counts the patches the build applies and
the audit room never imports the build line), or an installed vLLM (wheel,
directory, image).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from spark_images.audit._problems import problem
from spark_images.audit.pypi_releases import sdist_commit
from spark_images.audit.releases import tag_candidates
from spark_images.audit.sources import read_installed
from spark_images.audit.targets import TargetSpec
from spark_images.core.errors import UsageError

if TYPE_CHECKING:
    from spark_images.audit import git as gitmod
    from spark_images.audit.clone import History
    from spark_images.profiles.patches import PatchRef


@dataclass(frozen=True)
class Resolved:
    commit: str
    required: tuple[int, ...] = ()
    patches: tuple[PatchRef, ...] = ()
    notes: tuple[str, ...] = ()
    strategy: str | None = None  # the profile's build strategy: whether the build applies the patches
    base_dir: Path | None = None  # where the profile's patch paths are read


@dataclass(frozen=True)
class ProfileFacts:
    """What the build's plan of a profile says the audit must count."""

    commit: str
    required: tuple[int, ...]
    patches: tuple[PatchRef, ...]
    strategy: str
    base_dir: Path


ProfileResolver = Callable[[Path], ProfileFacts]


class TargetResolver:
    """Resolving targets, for `Auditor` (which sets `history`, `repo` and, for
    profile targets, `profile_resolver`)."""

    history: History
    repo: gitmod.Repo
    profile_resolver: ProfileResolver | None = None

    def resolve_commit(self, rev: str, what: str) -> str:
        sha = self._resolve_once(rev, what)
        if sha is None and self.history.refresh():
            sha = self._resolve_once(rev, what)
        if sha is None:
            raise UsageError(problem(f"{what}: no such commit in {self.repo.path}"))
        return sha

    def _resolve_once(self, rev: str, what: str) -> str | None:
        if 4 <= len(rev) < 40 and all(c in "0123456789abcdef" for c in rev):
            found = self.repo.commits_with_prefix(rev)
            if len(found) > 1:
                listed = ", ".join(f[:12] for f in found[:5])
                raise UsageError(problem(f"{what}: short commit {rev} is ambiguous in {self.repo.path} ({listed}); give more digits"))
            if found:
                return found[0]
        return self.repo.resolve_commit(rev)

    def resolve_release(self, version: str) -> tuple[str, str]:
        for attempt in range(2):
            for tag in tag_candidates(version):
                sha = self.repo.resolve_commit(f"refs/tags/{tag}")
                if sha:
                    return sha, f"release {version}: tag {tag}"
            if attempt == 0 and not self.history.refresh():
                break
        prefix = sdist_commit(version)
        sha = self.resolve_commit(prefix, f"vLLM {version} (commit g{prefix} from its PyPI sdist)")
        return sha, f"release {version}: no tag here; commit {prefix} read from the PyPI sdist's vllm/_version.py"

    def resolve(self, spec: TargetSpec) -> Resolved:
        if spec.kind == "commit":
            return Resolved(self.resolve_commit(spec.value, spec.text))
        if spec.kind == "release":
            sha, note = self.resolve_release(spec.value)
            return Resolved(sha, notes=(note,))
        if spec.kind == "profile":
            return self._resolve_profile(Path(spec.value))
        if spec.kind in ("artifact", "image"):
            installed = read_installed(spec.value)
            via = ("vllm/_version.py and the vllm dist-info read from the image's layers through the registry "
                   "(no daemon, no pull)",) if spec.kind == "image" else ()
            if installed.commit is None and installed.release:
                sha, note = self.resolve_release(installed.release)
                return Resolved(sha, notes=(*via, installed.how, note))
            prefix = installed.commit or ""
            what = f"{spec.text} (version {installed.version or '?'}, commit g{prefix})"
            return Resolved(self.resolve_commit(prefix, what), notes=(*via, installed.how))
        return Resolved(self.resolve_commit(spec.value, spec.text))

    def _resolve_profile(self, path: Path) -> Resolved:
        """The build's own plan of the profile: its commit, required fixes and the
        patches the build applies, read and parsed once, by the build's resolver."""
        if self.profile_resolver is None:
            raise UsageError(problem(f"{path}: a profile target needs the build's resolver (run `spark-images audit PROFILE`)"))
        facts = self.profile_resolver(path)
        sha = self.resolve_commit(facts.commit, f"{path}: vllm.commit")
        return Resolved(sha, required=facts.required, patches=facts.patches, notes=(f"profile {path}",),
                        strategy=facts.strategy, base_dir=facts.base_dir)

"""The audit line: open history, resolve the target to a commit, gather what
git knows once, then let the pure modules decide each PR.

This is the thin edge of the audit room: it talks to git (through `git.py`),
PyPI (through `releases.py`), artifacts (through `spark_images.artifacts`) and
the file system (profiles, patches); `history.py` and `states.py` decide.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from spark_images.audit import git as gitmod
from spark_images.audit._problems import problem
from spark_images.audit.history import (
    HistoryIndex,
    Presence,
    View,
    build_index,
    make_view,
    presence,
    revert_of_subject,
    subject_pr,
    truncated_at,
)
from spark_images.audit.knowledge import KnowledgeBase, load_knowledge
from spark_images.audit.releases import (
    first_release_and_rc,
    parse_tag,
    parse_version_file,
    sdist_commit,
    tag_candidates,
)
from spark_images.audit.states import AuditReport, FixResult, MarkerResult, check_marker, decide
from spark_images.audit.targets import TargetSpec, classify, path_exists
from spark_images.errors import EnvironmentProblem, UsageError

CACHE_MAX_AGE_S = 3600.0
FETCH_TIMEOUT_S = 120.0  # an update is optional: do not hang on a dead network
_MIN_PR_SUBJECT_RATIO = 0.3
_SAMPLE = 200


@dataclass
class History:
    """A repository holding vLLM history, and whether it is our cache clone."""

    repo: gitmod.Repo
    is_cache: bool
    url: str = ""
    fetched: bool = False
    notes: list[str] = field(default_factory=list)

    def refresh(self) -> bool:
        """Fetch once per run (cache clone only); False when it cannot."""
        if not self.is_cache or self.fetched:
            return False
        self.fetched = True
        try:
            why = gitmod.fetch_cache(self.repo, self.url, timeout=FETCH_TIMEOUT_S)
        except EnvironmentProblem as exc:  # e.g. a network that swallows packets
            why = exc.problems[0].message
        if why is not None:
            self.notes.append(f"could not update the cached clone ({why}); using the history it already has")
            return False
        return True


def open_history(repo: Path | None = None) -> History:
    """`--repo` as given, or the cached treeless clone (cloned/fetched as needed)."""
    if repo is not None:
        return History(gitmod.Repo(Path(repo)), is_cache=False)
    url = gitmod.upstream_url()
    dest = gitmod.cache_root() / "vllm.git"
    clone, fresh = gitmod.open_cache(url, dest)
    history = History(clone, is_cache=True, url=url, fetched=fresh)
    if not fresh and gitmod.cache_age_s(clone) > CACHE_MAX_AGE_S:
        history.refresh()
    return history


@dataclass(frozen=True)
class Resolved:
    commit: str
    required: tuple[int, ...] = ()
    patches: tuple[Path, ...] = ()
    notes: tuple[str, ...] = ()


class Auditor:
    """Audits any number of targets against one history, gathering main once."""

    def __init__(self, history: History, kb: KnowledgeBase | None = None) -> None:
        self.history = history
        self.repo = history.repo
        self.kb = kb or load_knowledge()
        self._main: tuple[str | None, list] | None = None
        self._tips: set[str] = set()
        self._index: HistoryIndex | None = None
        self._views: dict[str, View] = {}
        self._tags: list[gitmod.TagRef] | None = None

    # -- resolving targets ---------------------------------------------------
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
        if spec.kind == "artifact":
            version, prefix = read_artifact_version(spec.value)
            what = f"{spec.text} (vllm/_version.py: version {version or '?'}, commit g{prefix})"
            return Resolved(self.resolve_commit(prefix, what), notes=(f"commit g{prefix} read from the installed vllm/_version.py",))
        return Resolved(self.resolve_commit(spec.value, spec.text))

    def _resolve_profile(self, path: Path) -> Resolved:
        commit, required, patches = read_profile(path)
        sha = self.resolve_commit(commit, f"{path}: vllm.commit")
        return Resolved(sha, required=required, patches=patches, notes=(f"profile {path}",))

    # -- gathering history -----------------------------------------------------
    def _main_data(self) -> tuple[str | None, list]:
        if self._main is None:
            ref = self.repo.main_ref()
            head = self.repo.resolve_commit(ref) if ref else None
            commits = self.repo.log([head], bodies=False) if head else []
            self._main = (head, commits)
        return self._main

    def tags(self) -> list[gitmod.TagRef]:
        if self._tags is None:
            self._tags = [t for t in self.repo.tags() if parse_tag(t.name) is not None]
        return self._tags

    def index(self, tips: Iterable[str] = ()) -> HistoryIndex:
        known = self._index.commits if self._index is not None else {}
        new = {t for t in tips if t not in self._tips and t not in known}
        if self._index is not None and not new:
            return self._index
        self._tips |= new
        head, main_commits = self._main_data()
        wanted = sorted(self._tips | {t.commit for t in self.tags()})
        in_main = {c.sha for c in main_commits}
        branch_tips = [t for t in wanted if t not in in_main]
        branch = self.repo.log([*branch_tips, f"^{head}"] if head else branch_tips, bodies=True) if branch_tips else []
        revert_bodies = {
            c.sha for c in main_commits if c.subject.startswith(('Revert "', 'Reapply "')) and revert_of_subject(c.subject) is None
        }
        bodies = {sha: body for sha, (_, body) in self.repo.messages(revert_bodies).items()} if revert_bodies else {}
        shallow = [*self.repo.shallow_commits(), *self.repo.grafts()]
        index = build_index(head, main_commits, branch, shallow=shallow, bodies=bodies)
        unknown_origins = {o for o in index.cherry_from.values() if o not in index.commits}
        if unknown_origins:
            extra = {sha: subject for sha, (subject, _) in self.repo.messages(unknown_origins).items()}
            index = build_index(head, main_commits, branch, shallow=shallow, bodies=bodies, extra_subjects=extra)
        self._index = index
        self._views = {}
        return index

    def view(self, sha: str) -> View:
        index = self.index([sha])
        if sha not in self._views:
            self._views[sha] = make_view(index, sha)
        return self._views[sha]

    # -- checks ----------------------------------------------------------------
    def check_is_vllm(self, commit: str) -> None:
        index = self.index([commit])
        sample: list[str] = []
        cur: str | None = commit
        while cur is not None and cur in index.commits and len(sample) < _SAMPLE:
            sample.append(cur)
            parents = index.commits[cur].parents
            cur = parents[0] if parents else None
        with_pr = sum(1 for s in sample if subject_pr(index.commits[s].subject) is not None)
        if sample and with_pr / len(sample) < _MIN_PR_SUBJECT_RATIO:
            raise UsageError(
                problem(
                    f"{self.repo.path}: does not look like vLLM history (only {with_pr} of the last {len(sample)} "
                    "first-parent commits end in a '(#N)' PR number)",
                    "point --repo at a clone of vllm-project/vllm",
                )
            )
        has_vllm = self.repo.has_path(commit, "vllm")
        if has_vllm is False:
            raise UsageError(problem(f"{self.repo.path}: commit {commit[:12]} has no vllm/ directory; this is not a vLLM repository"))

    def _markers(self, commit: str, prs: Sequence[int], present: set[int]) -> dict[int, list[MarkerResult]]:
        fixes = [f for pr in prs if pr in present and (f := self.kb.get(pr)) is not None and f.markers]
        paths = sorted({m.path for f in fixes for m in f.markers})
        if not paths:
            return {}
        # in a treeless clone a file is fetched on demand; offline it reads as missing
        why = "not in the tree, or not fetchable into the treeless clone" if self.repo.is_partial() else ""
        try:
            files = self.repo.read_paths(commit, paths)
        except EnvironmentProblem as exc:
            files, why = {}, f"file not readable here: {exc.problems[0].message}"
        return {f.pr: [check_marker(m, files.get(m.path), why) for m in f.markers] for f in fixes}

    def first_tags(self, pr: int, undone_by: Sequence[int]) -> tuple[str | None, str | None]:
        index = self.index()
        ordered = sorted((parse_tag(t.name), t) for t in self.tags())  # type: ignore[type-var]
        finals = [t for name, t in ordered if name and name.kind == "final"]
        rcs = [t for name, t in ordered if name and name.kind == "rc"]
        found: list[str] = []
        for group in (finals, rcs):
            for tag in group:
                view = self.view(tag.commit)
                here = presence(index, view, pr)
                if not here.effective:
                    continue
                if any(presence(index, view, n).effective for n in undone_by):
                    continue
                found.append(tag.name)
                break
        return first_release_and_rc(found)

    # -- the audit -------------------------------------------------------------
    def audit(
        self,
        commit: str,
        *,
        target: str,
        prs: Sequence[int] | None = None,
        required: Sequence[int] = (),
        asked: Sequence[int] = (),
        patches: Sequence[Path] = (),
        notes: Sequence[str] = (),
    ) -> AuditReport:
        declared = read_patches(patches)
        wanted = list(dict.fromkeys([*(prs if prs is not None else self.kb.prs()), *required, *asked]))
        undoers = {n for pr in wanted if (f := self.kb.get(pr)) for n in f.undone_by}
        index = self.index([commit])
        self.check_is_vllm(commit)
        view = self.view(commit)
        cut = truncated_at(index, view)
        here = {pr: presence(index, view, pr) for pr in [*wanted, *undoers]}
        markers = self._markers(commit, wanted, {pr for pr in wanted if here[pr].effective})
        results: list[FixResult] = []
        for pr in wanted:
            fix = self.kb.get(pr)
            undone = fix.undone_by if fix else ()
            state, evidence = decide(
                pr,
                index,
                here[pr],
                undone_by=[(n, here[n]) for n in undone],
                markers=markers.get(pr, ()),
                patches=[str(p) for p, prs_ in declared if pr in prs_],
                truncated=cut,
            )
            first, first_rc = self.first_tags(pr, undone)
            title = fix.title if fix else self._subject_of(here[pr])
            results.append(
                FixResult(
                    pr=pr,
                    state=state,
                    title=title,
                    symptom=fix.symptom if fix else "",
                    area=fix.area if fix else "",
                    severity=fix.severity if fix else "",
                    first_release=first,
                    first_rc=first_rc,
                    evidence=tuple(evidence),
                    required=pr in required,
                    asked=pr in asked,
                )
            )
        unknown = [r.pr for r in results if r.state == "unknown"]
        if unknown:
            where = ", ".join(s[:12] for s in cut[:3])
            raise EnvironmentProblem(
                problem(
                    f"{self.repo.path}: history of {commit[:12]} is cut at {where} (shallow or grafted clone), so "
                    f"{', '.join(f'#{n}' for n in unknown)} cannot be called absent",
                    f"git -C {self.repo.path} fetch --unshallow, or use a full clone",
                )
            )
        report_notes = [*notes, *self.history.notes]
        if index.main_head is None:
            report_notes.append("no main branch in this repository: commits with a (#N) subject count as included")
        return AuditReport(
            target=target,
            commit=commit,
            fixes=tuple(results),
            repository=str(self.repo.path),
            notes=tuple(report_notes),
            commit_time=info.time if (info := index.commits.get(commit)) and info.time else None,
        )

    def _subject_of(self, here: Presence) -> str:
        """A PR outside the knowledge base is titled by its commit's subject."""
        index = self.index()
        for sha in [*here.squash, *(s for s, _ in here.picks)]:
            info = index.commits.get(sha)
            if info:
                return info.subject
        return ""


# -- reading inputs the audit does not own ---------------------------------------
def read_patches(patches: Sequence[Path]) -> list[tuple[Path, list[int]]]:
    from spark_images.patches import declared_prs

    out: list[tuple[Path, list[int]]] = []
    for path in patches:
        try:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise UsageError(problem(f"{path}: cannot read the patch ({exc.strerror or exc})")) from None
        out.append((Path(path), declared_prs(text)))
    return out


def read_profile(path: Path) -> tuple[str, tuple[int, ...], tuple[Path, ...]]:
    """(vllm.commit, verify.required_fixes, patch paths) of a profile."""
    if not path.is_file():
        raise UsageError(problem(f"{path}: no such profile"))
    from spark_images.profiles import load_profile

    profile = load_profile(path)
    commit = profile.vllm.commit
    required = tuple(int(n) for n in profile.verify.required_fixes)
    patches = tuple(resolve_patch_path(path, p) for p in profile.patches)
    return commit, required, patches


def resolve_patch_path(profile: Path, patch: str) -> Path:
    """Patches are named relative to the project root (the profile's parent's parent)."""
    p = Path(patch)
    if p.is_absolute():
        return p
    root = profile.resolve().parent.parent
    for candidate in (root / p, profile.resolve().parent / p, Path.cwd() / p):
        if candidate.is_file():
            return candidate
    raise UsageError(problem(f"{profile}: patches: {patch} not found (looked under {root})"))


def read_artifact_version(target: str) -> tuple[str | None, str]:
    """(version, commit prefix) from the installed `vllm/_version.py` of a wheel or image."""
    try:
        from spark_images import artifacts  # type: ignore[attr-defined]
    except ImportError:
        raise EnvironmentProblem(problem(f"{target}: reading wheels and images needs spark_images.artifacts, which this build lacks")) from None
    data = artifacts.read_one(target, "vllm/_version.py")
    if isinstance(data, tuple):  # (path, bytes)
        data = data[-1]
    if data is None:
        raise UsageError(problem(f"{target}: no vllm/_version.py inside (is vLLM installed there?)"))
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
    version, commit = parse_version_file(text)
    if commit is None:
        raise UsageError(problem(f"{target}: vllm/_version.py (version {version or '?'}) records no commit"))
    return version, commit


# -- the two entry points ---------------------------------------------------------
def audit_target(
    target: str,
    *,
    fixes: Sequence[int] = (),
    repo: Path | None = None,
    kb: KnowledgeBase | None = None,
) -> AuditReport:
    """`spark-images audit TARGET`: the report for the KB (or only `fixes`)."""
    spec = classify(target, exists=path_exists(target) and not target.endswith((".yaml", ".yml")))
    history = open_history(repo)
    auditor = Auditor(history, kb)
    resolved = auditor.resolve(spec)
    prs = list(fixes) if fixes else None
    return auditor.audit(
        resolved.commit,
        target=target,
        prs=prs,
        required=resolved.required,
        asked=fixes,
        patches=resolved.patches,
        notes=resolved.notes,
    )


def check_required(
    commit: str,
    required: Sequence[int],
    patches: Sequence[Path] = (),
    repo: Path | None = None,
) -> AuditReport:
    """The audit a build gate needs: every KB fix plus `required`, with `patches`.

    `report.missing_required` lists the required fixes that are absent,
    reverted or effect-absent and not patched. Raises EnvironmentProblem when
    the history cannot be had (no network, shallow clone), so the caller can
    record the stage as skipped with that reason.
    """
    history = open_history(repo)
    auditor = Auditor(history)
    sha = auditor.resolve_commit(commit, f"vllm.commit {commit}")
    return auditor.audit(sha, target=commit, required=required, patches=patches)

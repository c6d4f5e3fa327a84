"""The audit line: open history, resolve the target to a commit, gather what
git knows once, then let the pure modules decide each PR.

This is the thin edge of the audit room: it talks to git (through `git.py`),
PyPI (through `releases.py`), artifacts and profiles (through `resolving.py`
and `sources.py`); `history.py` and `states.py` decide. Where the history
comes from is `clone.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from spark_images.audit._problems import problem
from spark_images.audit.clone import History, open_history
from spark_images.audit.content import BuildPatches, PatchIds, prove_patches
from spark_images.audit.discover import discover
from spark_images.audit.firsts import FirstShipped, Release, first_shipped, release_list
from spark_images.audit.history import (
    HistoryIndex,
    Presence,
    View,
    build_index,
    contains,
    make_view,
    presence,
    revert_of_subject,
    subject_pr,
    truncated_at,
    with_extra_subjects,
)
from spark_images.audit.knowledge import KnowledgeBase, load_knowledge
from spark_images.audit.main_cache import main_commits
from spark_images.audit.markers import check_fixes
from spark_images.audit.proof import ChangeProof, prove_change
from spark_images.audit.pypi_releases import Catalog, load_catalog
from spark_images.audit.releases import parse_tag
from spark_images.audit.resolving import ProfileResolver, TargetResolver
from spark_images.audit.sources import patch_texts
from spark_images.audit.states import AuditReport, FixResult, MarkerResult, decide
from spark_images.audit.targets import classify, path_exists
from spark_images.core.errors import EnvironmentProblem, UsageError

if TYPE_CHECKING:
    from spark_images.audit.git_parse import TagRef
    from spark_images.profiles.patches import PatchRef

_MIN_PR_SUBJECT_RATIO = 0.3
_SAMPLE = 200


class Auditor(TargetResolver):
    """Audits any number of targets against one history, gathering main once."""

    def __init__(self, history: History, kb: KnowledgeBase | None = None, catalog: Catalog | None = None) -> None:
        self.history = history
        self._catalog = catalog
        self._releases: list[Release] | None = None
        self._releases_after: int | None = None
        self.repo = history.repo
        self.kb = kb or load_knowledge()
        self._main: tuple[str | None, list] | None = None
        self._tips: set[str] = set()
        self._index: HistoryIndex | None = None
        self._views: dict[str, View] = {}
        self._tags: list[TagRef] | None = None
        self.patch_ids = PatchIds(self.repo)

    # -- gathering history -----------------------------------------------------
    def _main_data(self) -> tuple[str | None, list]:
        if self._main is None:
            ref = self.repo.main_ref()
            head = self.repo.resolve_commit(ref) if ref else None
            commits = main_commits(self.repo, head) if head else []
            self._main = (head, commits)
        return self._main

    def tags(self) -> list[TagRef]:
        if self._tags is None:
            self._tags = [t for t in self.repo.tags() if parse_tag(t.name) is not None]
        return self._tags

    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = load_catalog()
        return self._catalog

    def releases(self, after: int | None = None) -> list[Release]:
        """PyPI's releases (and vLLM's rc tags), oldest first, with their commits here.

        A tag gives a release's commit for free; a release the clone has no tag
        for is resolved through its sdist's `_version.py` (cached per version).
        `after`: the earliest merge among the fixes asked about. A release PyPI
        got before it cannot carry any of them (`first_shipped` counts it, never
        lists it), so its sdist is not read: the lookups a run may spend go to
        the releases that can change an answer.
        """
        if self._releases is not None and (self._releases_after is None or (after or 0) >= self._releases_after):
            return self._releases
        catalog = self.catalog()
        listed = release_list(catalog.versions, {t.name: t.commit for t in self.tags()})
        asked: dict[str, tuple[str | None, str]] = {}  # version -> (commit prefix from PyPI, why none)
        for name, _tag, commit in listed:
            uploaded = catalog.uploaded.get(name.version)
            if commit is None and not (after is not None and uploaded is not None and uploaded < after):
                asked[name.version] = catalog.commit(name.version)
        found = self.repo.commits_with_prefixes(p[:40] for p, _ in asked.values() if p)
        out: list[Release] = []
        for name, tag, commit in listed:
            why = ""
            if commit is None and name.version not in asked:
                why = f"no tag {tag} here; not looked up (on PyPI before the fixes asked about were merged)"
            elif commit is None:
                prefix, why = asked[name.version]
                if prefix and len(here := found.get(prefix[:40], [])) == 1:
                    commit, why = here[0], ""
                elif prefix:
                    why = f"no tag {tag} here, and its commit g{prefix} (from its PyPI sdist) is not in this history"
                else:
                    why = f"no tag {tag} here, and its commit is not known from PyPI ({why})"
            out.append(Release(name, tag, commit, why, catalog.uploaded.get(name.version)))
        catalog.save()
        self._releases, self._releases_after = out, after
        return out

    def index(self, tips: Iterable[str] = ()) -> HistoryIndex:
        known = self._index.commits if self._index is not None else {}
        new = {t for t in tips if t not in self._tips and t not in known}
        if self._index is not None and not new:
            return self._index
        self._tips |= new
        head, main_commits = self._main_data()
        wanted = sorted(self._tips | {r.commit for r in self._releases or () if r.commit} | {t.commit for t in self.tags()})
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
            index = with_extra_subjects(index, extra)
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
        return check_fixes(self.repo, commit, fixes) if fixes else {}

    def merged_at(self, pr: int, index: HistoryIndex) -> int | None:
        """When the fix's squash commit landed on main: its time here, else the knowledge base's."""
        fix = self.kb.get(pr)
        main = index.commits.get(fix.main_commit) if fix and fix.main_commit else None
        return main.time if main is not None and main.time else (fix.merged_epoch if fix else None)

    def lookups_from(self, prs: Sequence[int], index: HistoryIndex) -> int | None:
        """The earliest time a fix of `prs` landed (its main commit, else the knowledge base's
        merge time, else its earliest `(#N)` commit here); None: no bound, look every release up.

        It only chooses which sdists are read. A fix with no known merge time still
        lists a release that was not looked up as unchecked, so a wrong bound costs
        precision, never a wrong first release; a fix that is nowhere in this history
        bounds nothing (no release here can carry it)."""
        times: list[int] = []
        for pr in prs:
            when = self.merged_at(pr, index)
            if when is None:
                seen = [t for sha in index.by_pr.get(pr, ()) if (info := index.commits.get(sha)) and (t := info.time)]
                when = min(seen) if seen else None
            if when is not None:
                times.append(when)
        return min(times) if times else None

    def first_shipped(self, pr: int, undone_by: Sequence[int], *, after: int | None = None) -> FirstShipped:
        """`after`: as for `releases` (the earliest merge among the fixes of this audit)."""
        releases = self.releases(after)
        index = self.index([r.commit for r in releases if r.commit])
        merged = self.merged_at(pr, index)

        def carries(sha: str) -> bool:
            view = self.view(sha)
            here = presence(index, view, pr)
            if not here.effective or any(presence(index, view, n).effective for n in undone_by):
                return False
            return self._proofs(index, view, [pr], {pr: here})[pr].proven  # its change, not only its title

        return first_shipped(releases, carries, list_known=self.catalog().versions is not None, merged=merged)

    def release_notes(self, results: Sequence[FixResult]) -> list[str]:
        """Words for the terminal: why a first release is only an upper bound."""
        notes: list[str] = []
        catalog = self.catalog()
        if catalog.versions is None:
            notes.append(f"PyPI's release list could not be read ({catalog.why}); the clone's tags stood in, so no "
                         "first release is proven")
        unchecked = sorted({t for r in results for t in r.unchecked_releases}, key=lambda t: parse_tag(t).key)  # type: ignore[union-attr]
        if unchecked:
            why = {r.tag: r.why_unchecked for r in self._releases or ()}
            listed = "; ".join(f"{t}: {why.get(t) or 'not checked'}" for t in unchecked[:8])
            more = f" (and {len(unchecked) - 8} more)" if len(unchecked) > 8 else ""
            notes.append(f"releases PyPI lists that could not be checked here: {listed}{more}. A first release "
                         "reported as 'at most' may be one of these")
        return notes

    def discover(self, commit: str, since: str | None) -> tuple[list[dict[str, object]], str]:
        """Spark-relevant PRs in `since..commit` that the knowledge base lacks, and the range shown."""
        if since is None:
            view, index = self.view(commit), self.index()
            earlier = [r for r in self.releases() if r.commit and r.commit != commit and contains(index, view, r.commit)]
            if not earlier:
                raise UsageError(problem(f"{commit[:12]}: no earlier release in its history to start --discover from",
                                         "pass --since REF"))
            base, shown = earlier[-1].commit or "", earlier[-1].tag
        else:
            base, shown = self.resolve_commit(since, f"--since {since}"), since
        found = discover(self.repo, commit, base, self.kb.prs())
        return [f.to_json() for f in found], f"{shown}..{commit[:12]}"

    # -- the audit -------------------------------------------------------------
    def audit(
        self,
        commit: str,
        *,
        target: str,
        prs: Sequence[int] | None = None,
        required: Sequence[int] = (),
        asked: Sequence[int] = (),
        patches: Sequence[PatchRef | Path] = (),
        notes: Sequence[str] = (),
        releases: bool = True,
        strategy: str | None = None,
        base_dir: Path | None = None,
    ) -> AuditReport:
        """`patches`: a plan's PatchRefs (their text read under `base_dir`), or patch files
        (read through the same parser); `strategy`: the build's, which decides whether it
        applies them at all (only `source` runs git apply)."""
        build = _build_patches(patches, strategy, base_dir)
        declared = build.refs
        wanted = list(dict.fromkeys([*(prs if prs is not None else self.kb.prs()), *required, *asked]))
        undoers = {n for pr in wanted if (f := self.kb.get(pr)) for n in f.undone_by}
        index = self.index([commit])
        self.check_is_vllm(commit)
        view = self.view(commit)
        cut = truncated_at(index, view)
        here = {pr: presence(index, view, pr) for pr in [*wanted, *undoers]}
        markers = self._markers(commit, wanted, {pr for pr in wanted if here[pr].effective})
        proofs = self._proofs(index, view, wanted, here)
        patch_proofs = prove_patches(self.repo, commit, build, self.kb) if declared else []
        after = self.lookups_from(wanted, index)
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
                patches=[p for p in patch_proofs if pr in p.prs],
                truncated=cut,
                proof=proofs[pr],
            )
            first = self.first_shipped(pr, undone, after=after) if releases else FirstShipped()
            title = fix.title if fix else self._subject_of(here[pr])
            results.append(
                FixResult(
                    pr=pr,
                    state=state,
                    title=title,
                    symptom=fix.symptom if fix else "",
                    area=fix.area if fix else "",
                    severity=fix.severity if fix else "",
                    first_release=first.first_release,
                    first_rc=first.first_rc,
                    first_release_at_most=first.first_release_at_most,
                    first_rc_at_most=first.first_rc_at_most,
                    unchecked_releases=first.unchecked,
                    excluded_before_merge=first.excluded_before_merge,
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
        report_notes = [*notes, *self.history.notes, *(self.release_notes(results) if releases else ())]
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

    def _proofs(self, index: HistoryIndex, view: View, prs: Sequence[int], here: dict[int, Presence]) -> dict[int, ChangeProof]:
        """Whether each PR's knowledge-base change is in the history: its main commit
        reachable, else a carrier of the same patch-id (computed only for the few
        carriers that need it, all in one git run, and cached)."""
        carriers = {pr: [*here[pr].squash, *(sha for sha, _ in here[pr].picks)] for pr in prs}
        need: list[str] = []
        for pr in prs:
            fix = self.kb.get(pr)
            main = fix.main_commit if fix else ""
            if not main or not carriers[pr] or (main in index.commits and contains(index, view, main)):
                continue
            need += [c for c in carriers[pr] if c != main]
            if fix and not fix.patch_id and main in index.commits:
                need.append(main)  # the change's patch-id from this history
        ids, why = self.patch_ids.of(need) if need else ({}, "")
        out: dict[int, ChangeProof] = {}
        for pr in prs:
            fix = self.kb.get(pr)
            main = fix.main_commit if fix else ""
            pid = (fix.patch_id if fix else "") or ((ids or {}).get(main, "") if main else "")
            out[pr] = prove_change(index, view, pr, carriers[pr], main_commit=main, patch_id=pid, ids=ids, why_no_ids=why)
        return out

    def _subject_of(self, here: Presence) -> str:
        """A PR outside the knowledge base is titled by its commit's subject."""
        index = self.index()
        for sha in [*here.squash, *(s for s, _ in here.picks)]:
            info = index.commits.get(sha)
            if info:
                return info.subject
        return ""


# -- the two entry points ---------------------------------------------------------
def audit_target(
    target: str,
    *,
    fixes: Sequence[int] = (),
    repo: Path | None = None,
    kb: KnowledgeBase | None = None,
    discover: bool = False,
    since: str | None = None,
    profile_resolver: ProfileResolver | None = None,
) -> AuditReport:
    """`spark-images audit TARGET`: the report for the KB (or only `fixes`);
    with `discover`, also the Spark-relevant PRs of `since..TARGET` the KB lacks.
    A profile TARGET is resolved by `profile_resolver` (the build's own)."""
    spec = classify(target, exists=path_exists(target) and not target.endswith((".yaml", ".yml")))
    history = open_history(repo)
    auditor = Auditor(history, kb)
    auditor.profile_resolver = profile_resolver
    resolved = auditor.resolve(spec)
    prs = list(fixes) if fixes else None
    report = auditor.audit(
        resolved.commit,
        target=target,
        prs=prs,
        required=resolved.required,
        asked=fixes,
        patches=resolved.patches,
        notes=resolved.notes,
        strategy=resolved.strategy,
        base_dir=resolved.base_dir,
    )
    if not discover:
        return report
    found, shown = auditor.discover(resolved.commit, since)
    return replace(report, discovered=tuple(found), discover_range=shown)


def check_required(
    commit: str,
    required: Sequence[int],
    patches: Sequence[PatchRef | Path] = (),
    repo: Path | None = None,
    *,
    strategy: str | None = None,
    base_dir: Path | None = None,
) -> AuditReport:
    """The audit a build gate needs: every KB fix plus `required`, with `patches`
    (the plan's PatchRefs, as the build read them, their text under `base_dir`; or
    patch files) and the build's `strategy` (only `source` applies patches).

    `report.missing_required` lists the required fixes that are absent,
    reverted or effect-absent and not patched. Raises EnvironmentProblem when
    the history cannot be had (no network, shallow clone), so the caller can
    record the stage as skipped with that reason.
    """
    history = open_history(repo)
    auditor = Auditor(history)
    sha = auditor.resolve_commit(commit, f"vllm.commit {commit}")
    # a gate needs presence, not first releases: no network beyond the history
    return auditor.audit(sha, target=commit, required=required, patches=patches, releases=False,
                         strategy=strategy, base_dir=base_dir)


_NOT_APPLIED = {
    "wheel": "never applied: the wheel strategy installs the wheel as built and runs no git apply "
             "(build.strategy: source applies patches)",
}


def _build_patches(patches: Sequence[PatchRef | Path], strategy: str | None, base_dir: Path | None) -> BuildPatches:
    refs, texts = patch_texts(patches)
    why = _NOT_APPLIED.get(strategy or "", "no build applies it: only a profile of build.strategy source runs git apply")
    return BuildPatches(refs=refs, applies=strategy == "source", why_not=why, base_dir=base_dir, texts=texts)

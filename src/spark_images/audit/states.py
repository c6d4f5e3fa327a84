"""Per-PR verdicts and the audit report (pure decision logic, no I/O).

States, in the order they are decided:
  absent          no `(#N)` commit, cherry-pick or patch in a complete history
  unknown         not found, and the history is cut (shallow clone): never `absent`
  reverted        present, but a later revert is reachable too
  effect-absent   in the history, but a content marker fails or a PR that undid
                  it is reachable
  effect-unproven in the history, but nothing shows the change is in the tree:
                  the commit is empty (its tree equals its parent's) or a marker
                  could not be checked anywhere
  included        the knowledge base's full main commit is reachable, or a commit
                  on main with the same `git patch-id --stable` (a `(#N)` subject
                  whose change differs is effect-unproven), and, where the fix
                  has markers, every marker holds
  cherry-picked   the same change through a commit on a branch off main
  patched         not (effectively) present, but a listed patch declaring
                  `Backport-Of: vllm-project/vllm#N` is proven: the build applies
                  it (source strategy), it has hunks, `git apply --check` passes
                  at the commit and the fix's markers hold in the patched tree
Only included, cherry-picked and patched count as present for a gate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from spark_images.audit.history import HistoryIndex, Presence, is_empty_commit
from spark_images.audit.knowledge import Marker
from spark_images.audit.proof import ChangeProof, PatchProof, short_sha

STATES: tuple[str, ...] = (
    "included", "cherry-picked", "patched", "effect-unproven", "effect-absent", "reverted", "absent", "unknown",
)
PRESENT_STATES = frozenset({"included", "cherry-picked", "patched"})
FAILING_STATES = frozenset(STATES) - PRESENT_STATES


@dataclass(frozen=True)
class MarkerResult:
    marker: Marker
    outcome: str  # "ok", "failed", "unverified"
    detail: str = ""
    found_at: str = ""  # the path the text was checked in, when not `marker.path`

    def line(self) -> str:
        text = f"marker {self.outcome}: {self.marker.describe()}"
        return f"{text} ({self.detail})" if self.detail else text


def check_marker(marker: Marker, content: bytes | None, why_unread: str = "", *, found_at: str = "", how: str = "") -> MarkerResult:
    """A missing file never fails a marker: files move, so only content decides."""
    if content is None:
        return MarkerResult(marker, "unverified", why_unread or "path not in the tree at this commit")
    found = marker.text.encode("utf-8") in content
    ok = found == marker.expect_present
    where = found_at if found_at and found_at != marker.path else ""
    detail = f"checked at {where}{'; ' + how if how else ''}" if where else how
    return MarkerResult(marker, "ok" if ok else "failed", detail, found_at=where)


@dataclass(frozen=True)
class FixResult:
    pr: int
    state: str
    title: str = ""
    symptom: str = ""
    area: str = ""
    severity: str = ""
    first_release: str | None = None
    first_rc: str | None = None
    evidence: tuple[str, ...] = ()
    required: bool = False
    asked: bool = False
    # set when first_release / first_rc could not be proven (null above): the
    # release it shipped in at the latest, and the releases that could not be checked
    first_release_at_most: str | None = None
    first_rc_at_most: str | None = None
    unchecked_releases: tuple[str, ...] = ()
    excluded_before_merge: int = 0  # unchecked releases PyPI got before the fix's commit existed

    @property
    def failing(self) -> bool:
        return self.state not in PRESENT_STATES

    def to_json(self) -> dict[str, Any]:
        return {
            "pr": self.pr,
            "state": self.state,
            "first_release": self.first_release,
            "first_rc": self.first_rc,
            "first_release_at_most": self.first_release_at_most,
            "first_rc_at_most": self.first_rc_at_most,
            "unchecked_releases": list(self.unchecked_releases),
            "excluded_before_merge": self.excluded_before_merge,
            "title": self.title,
            "symptom": self.symptom,
            "area": self.area,
            "severity": self.severity,
            "evidence": list(self.evidence),
            "required": self.required,
        }


@dataclass(frozen=True)
class AuditReport:
    target: str
    commit: str
    fixes: tuple[FixResult, ...]
    repository: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    # committer time of `commit` (a reproducible build's SOURCE_DATE_EPOCH)
    commit_time: int | None = None
    # `--discover`: Spark-relevant PRs of a range that the knowledge base lacks (None: not asked)
    discovered: tuple[dict[str, Any], ...] | None = None
    discover_range: str = ""

    @property
    def missing_required(self) -> tuple[FixResult, ...]:
        """Required (profile) or asked (--fix) fixes that the target lacks."""
        return tuple(f for f in self.fixes if (f.required or f.asked) and f.failing)

    def included_prs(self) -> list[int]:
        """PRs whose change the target carries: included, cherry-picked or patched."""
        return sorted(f.pr for f in self.fixes if f.state in PRESENT_STATES)

    def get(self, pr: int) -> FixResult | None:
        return next((f for f in self.fixes if f.pr == pr), None)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "target": self.target,
            "commit": self.commit,
            "commit_time": self.commit_time,
            "repository": self.repository,
            "fixes": [f.to_json() for f in self.fixes],
            "missing_required": [f.pr for f in self.missing_required],
            "included": self.included_prs(),
            "notes": list(self.notes),
        }
        if self.discovered is not None:
            doc["discovered"] = [dict(d) for d in self.discovered]
            doc["discover_range"] = self.discover_range
        return doc


def presence_evidence(index: HistoryIndex, p: Presence) -> list[str]:
    lines: list[str] = []
    for sha in p.squash:
        where = "on main" if sha in index.chain or sha in index.reach else "in the target's history"
        empty = "; empty commit: its tree equals its parent's" if is_empty_commit(index, sha) else ""
        lines.append(f"squash {short_sha(sha)} {where}{empty}")
    for sha, origin in p.picks:
        src = f" (cherry picked from {short_sha(origin)})" if origin else f" (same (#{p.pr}) subject)"
        empty = "; empty commit: its tree equals its parent's" if is_empty_commit(index, sha) else ""
        lines.append(f"cherry-pick {short_sha(sha)} off main{src}{empty}")
    for sha, depth in p.reverts:
        verb = "reverted" if depth % 2 else "re-applied"
        lines.append(f"{verb} by {short_sha(sha)}")
    return lines


def decide(
    pr: int,
    index: HistoryIndex,
    here: Presence,
    *,
    undone_by: Sequence[tuple[int, Presence]] = (),
    markers: Sequence[MarkerResult] = (),
    patches: Sequence[PatchProof] = (),
    truncated: Sequence[str] = (),
    proof: ChangeProof | None = None,
) -> tuple[str, list[str]]:
    """The state of PR `pr` at the target and the evidence that decided it.

    `proof`: whether the knowledge base's change itself is in the history (its main
    commit, or a commit of the same patch-id); without it a `(#N)` subject proves
    nothing. `patches`: the listed patches declaring `pr`, each proven or not."""
    evidence = presence_evidence(index, here)
    patch_lines = [p.line(pr) for p in patches if p.proven]
    unproven_patches = [p.line(pr) for p in patches if not p.proven]
    if not here.present:
        if patch_lines:
            return "patched", patch_lines
        if truncated:
            cut = ", ".join(short_sha(s) for s in truncated[:3])
            return "unknown", [f"not found, but the history is cut at {cut} (shallow clone); cannot tell absent",
                               *unproven_patches]
        return "absent", [*(evidence or [f"no (#{pr}) commit, cherry-pick or patch in the target's history"]),
                          *unproven_patches]
    if here.reverted:
        return ("patched", [*evidence, *patch_lines]) if patch_lines else ("reverted", [*evidence, *unproven_patches])
    undoers = [(n, p) for n, p in undone_by if p.effective]
    failed = [m for m in markers if m.outcome == "failed"]
    if undoers or failed:
        lines = list(evidence)
        for n, p in undoers:
            shas = p.squash or tuple(sha for sha, _ in p.picks)
            lines.append(f"effect undone by #{n} ({', '.join(short_sha(s) for s in shas)})")
        lines += [m.line() for m in failed]
        return ("patched", [*lines, *patch_lines]) if patch_lines else ("effect-absent", [*lines, *unproven_patches])
    proof_lines = proof.lines() if proof is not None else []
    lines = evidence + proof_lines + [m.line() for m in markers]
    if proof is None or not proof.proven:
        if patch_lines:
            return "patched", [*lines, *patch_lines]
        return "effect-unproven", [*lines, *unproven_patches,
                                   "in the history, effect unproven: no reachable commit carries the knowledge base's change"]
    unverified = [m for m in markers if m.outcome != "ok"]
    carriers = here.squash or tuple(sha for sha, _ in here.picks)
    empty = bool(carriers) and all(is_empty_commit(index, sha) for sha in carriers)
    if unverified or (empty and not markers):
        why = (
            "a marker could not be checked at the target" if unverified
            else "the commit changed nothing and the fix has no marker to prove its effect"
        )
        if patch_lines:
            return "patched", [*lines, *patch_lines]
        return "effect-unproven", [*lines, *unproven_patches, f"in the history, effect unproven: {why}"]
    lines += [f"{p.path} also declares it (the patch may no longer apply)" for p in patches]
    return ("included" if proof.on_main(index) else "cherry-picked"), lines

"""Per-PR verdicts and the audit report (pure decision logic, no I/O).

States, in the order they are decided:
  included        the squash commit `(#N)` is reachable from the target
  cherry-picked   a commit with the same `(#N)` subject, or a `cherry picked from`
                  line naming it, is reachable on a branch off main
  reverted        present, but a later revert is reachable too
  effect-absent   present, but a content marker fails or a PR that undid it is reachable
  patched         not (effectively) present, but a listed patch declares
                  `Backport-Of: vllm-project/vllm#N`
  absent          none of the above in a complete history
  unknown         not found, and the history is cut (shallow clone): never `absent`
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from spark_images.audit.history import HistoryIndex, Presence, is_empty_commit
from spark_images.audit.knowledge import Marker

STATES: tuple[str, ...] = ("included", "cherry-picked", "reverted", "effect-absent", "patched", "absent", "unknown")
PRESENT_STATES = frozenset({"included", "cherry-picked", "patched"})
FAILING_STATES = frozenset({"absent", "reverted", "effect-absent", "unknown"})


@dataclass(frozen=True)
class MarkerResult:
    marker: Marker
    outcome: str  # "ok", "failed", "unverified"
    detail: str = ""

    def line(self) -> str:
        text = f"marker {self.outcome}: {self.marker.describe()}"
        return f"{text} ({self.detail})" if self.detail else text


def check_marker(marker: Marker, content: bytes | None, why_unread: str = "") -> MarkerResult:
    """A missing file never fails a marker: files move, so only content decides."""
    if content is None:
        return MarkerResult(marker, "unverified", why_unread or "path not in the tree at this commit")
    found = marker.text.encode("utf-8") in content
    ok = found == marker.expect_present
    return MarkerResult(marker, "ok" if ok else "failed")


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

    @property
    def failing(self) -> bool:
        return self.state in FAILING_STATES

    def to_json(self) -> dict[str, Any]:
        return {
            "pr": self.pr,
            "state": self.state,
            "first_release": self.first_release,
            "first_rc": self.first_rc,
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
        return {
            "target": self.target,
            "commit": self.commit,
            "commit_time": self.commit_time,
            "repository": self.repository,
            "fixes": [f.to_json() for f in self.fixes],
            "missing_required": [f.pr for f in self.missing_required],
            "included": self.included_prs(),
            "notes": list(self.notes),
        }


def _short(sha: str) -> str:
    return sha[:12]


def presence_evidence(index: HistoryIndex, p: Presence) -> list[str]:
    lines: list[str] = []
    for sha in p.squash:
        where = "on main" if sha in index.chain or sha in index.reach else "in the target's history"
        empty = "; empty commit: its tree equals its parent's" if is_empty_commit(index, sha) else ""
        lines.append(f"squash {_short(sha)} {where}{empty}")
    for sha, origin in p.picks:
        src = f" (cherry picked from {_short(origin)})" if origin else f" (same (#{p.pr}) subject)"
        empty = "; empty commit: its tree equals its parent's" if is_empty_commit(index, sha) else ""
        lines.append(f"cherry-pick {_short(sha)} off main{src}{empty}")
    for sha, depth in p.reverts:
        verb = "reverted" if depth % 2 else "re-applied"
        lines.append(f"{verb} by {_short(sha)}")
    return lines


def decide(
    pr: int,
    index: HistoryIndex,
    here: Presence,
    *,
    undone_by: Sequence[tuple[int, Presence]] = (),
    markers: Sequence[MarkerResult] = (),
    patches: Sequence[str] = (),
    truncated: Sequence[str] = (),
) -> tuple[str, list[str]]:
    """The state of PR `pr` at the target and the evidence that decided it."""
    evidence = presence_evidence(index, here)
    patch_lines = [f"{p}: Backport-Of #{pr}" for p in patches]
    if not here.present:
        if patch_lines:
            return "patched", patch_lines
        if truncated:
            cut = ", ".join(_short(s) for s in truncated[:3])
            return "unknown", [f"not found, but the history is cut at {cut} (shallow clone); cannot tell absent"]
        return "absent", evidence or [f"no (#{pr}) commit, cherry-pick or patch in the target's history"]
    if here.reverted:
        return ("patched", [*evidence, *patch_lines]) if patch_lines else ("reverted", evidence)
    undoers = [(n, p) for n, p in undone_by if p.effective]
    failed = [m for m in markers if m.outcome == "failed"]
    if undoers or failed:
        lines = list(evidence)
        for n, p in undoers:
            shas = p.squash or tuple(sha for sha, _ in p.picks)
            lines.append(f"effect undone by #{n} ({', '.join(_short(s) for s in shas)})")
        lines += [m.line() for m in failed]
        return ("patched", [*lines, *patch_lines]) if patch_lines else ("effect-absent", lines)
    lines = evidence + [m.line() for m in markers]
    lines += [f"{p} also declares it (the patch may no longer apply)" for p in patches]
    return ("included" if here.squash else "cherry-picked"), lines

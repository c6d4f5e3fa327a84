"""What proves a fix's change is in a tree (pure: no git, no I/O).

A `(#N)` subject is only a name. The change itself is proven by:

- `ChangeProof`: the knowledge base's full `main_commit` is reachable, or a
  reachable commit has the same `git patch-id --stable` as that commit (a
  cherry-pick under another SHA). A `(#N)` commit with another patch-id is a
  different change.
- `PatchProof`: a patch the build really applies (source strategy), with
  hunks, that `git apply --check` accepts at the pinned commit and after which
  the fix's markers hold in the patched tree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from spark_images.audit.history import HistoryIndex, View, contains


def short_sha(sha: str) -> str:
    """A commit or patch id as the audit's lines show it (12 hex digits, as git's --short)."""
    return sha[:12]


@dataclass(frozen=True)
class ChangeProof:
    """How the knowledge base's change of one PR shows in a tip's history."""

    pr: int
    main_commit: str = ""
    main_reachable: bool = False
    patch_id: str = ""
    same: tuple[str, ...] = ()  # reachable carriers whose patch-id equals the change's
    other: tuple[tuple[str, str], ...] = ()  # (carrier, its patch-id) whose change differs
    why_unknown: str = ""  # why carriers could not be compared

    @property
    def proven(self) -> bool:
        return self.main_reachable or bool(self.same)

    def on_main(self, index: HistoryIndex) -> bool:
        """Proven by the main commit itself, or by a same-change commit on main."""
        return self.main_reachable or any(sha in index.reach for sha in self.same)

    def lines(self) -> list[str]:
        if self.main_reachable:
            return [f"main commit {short_sha(self.main_commit)} (the knowledge base's) is in the history"]
        out = [f"{short_sha(sha)}: same change as the knowledge base's {short_sha(self.main_commit)} "
               f"(patch-id {short_sha(self.patch_id)})" for sha in self.same]
        if self.same:
            return out
        for sha, theirs in self.other:
            what = f"patch-id {short_sha(theirs)}" if theirs else "no diff"
            out.append(f"{short_sha(sha)} has the (#{self.pr}) subject, but its change differs from the knowledge base's "
                       f"{short_sha(self.main_commit)} ({what}, not {short_sha(self.patch_id)})")
        if self.why_unknown:
            out.append(f"the (#{self.pr}) commit's change cannot be compared: {self.why_unknown}")
        return out


def prove_change(
    index: HistoryIndex,
    view: View,
    pr: int,
    carriers: Iterable[str],
    *,
    main_commit: str,
    patch_id: str,
    ids: Mapping[str, str] | None,
    why_no_ids: str = "",
) -> ChangeProof:
    """`carriers`: the reachable `(#N)` commits and cherry-picks; `ids`: their patch-ids
    (None when they could not be computed, `why_no_ids`); `patch_id`: the knowledge base's
    change ("" when unknown)."""
    if not main_commit:
        return ChangeProof(pr, why_unknown=f"#{pr} has no main_commit in the knowledge base to compare with")
    if main_commit in index.commits and contains(index, view, main_commit):
        return ChangeProof(pr, main_commit, True, patch_id)
    found = [c for c in dict.fromkeys(carriers) if c != main_commit]
    if not found:
        return ChangeProof(pr, main_commit, False, patch_id)
    if not patch_id:
        why = ("the knowledge base records no patch_id for it (an empty commit has none) and it is not in this history")
        return ChangeProof(pr, main_commit, False, patch_id, why_unknown=why)
    if ids is None:
        return ChangeProof(pr, main_commit, False, patch_id, why_unknown=why_no_ids or "patch-ids not computed")
    same = tuple(c for c in found if ids.get(c) == patch_id)
    other = tuple((c, ids.get(c, "")) for c in found if ids.get(c) != patch_id)
    return ChangeProof(pr, main_commit, False, patch_id, same, other)


@dataclass(frozen=True)
class PatchProof:
    """One listed patch and whether it proves the PRs its header declares."""

    path: str
    prs: tuple[int, ...]
    proven: bool
    why: str  # the evidence line's reason

    def line(self, pr: int) -> str:
        if self.proven:
            return f"{self.path}: Backport-Of #{pr}; {self.why}"
        return f"{self.path}: Backport-Of #{pr}, but not patched: {self.why}"

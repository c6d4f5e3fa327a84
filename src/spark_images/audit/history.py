"""vLLM history as plain data, and reachability over it (pure: no git, no I/O).

`git.py` gathers commits; this module indexes them so that "is commit X in
the history of tip T" costs a dict lookup instead of a git process:

- every commit reachable from main gets a *reach position*: the index of the
  oldest first-parent commit of main from which it is reachable. X is an
  ancestor of a first-parent main commit B exactly when reach(X) <= reach(B).
- a tip that is not on main (a release tag, a commit on a release branch) is
  seen as its *branch* (commits reachable from it but not from main, a few
  dozen at most) plus the main commits it forks from (its bases).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import NamedTuple

CHERRY_LINE = re.compile(r"\(cherry picked from commit ([0-9a-f]{7,40})\)")
REVERTS_LINE = re.compile(r"This reverts commit ([0-9a-f]{7,40})")
_INNER_PR = re.compile(r"\(#(\d+)\)\s*\"")
_REVERT = 'Revert "'
_LOOSE_REVERT = re.compile(r"^revert(?:ing)?:?\s+(?:pr\s*)?#(\d+)\b", re.IGNORECASE)
_REAPPLY = 'Reapply "'


class CommitInfo(NamedTuple):
    """One commit (a NamedTuple: 20,000+ are made per audit, and tuples are cheap)."""

    sha: str
    tree: str
    parents: tuple[str, ...]
    subject: str
    body: str = ""
    time: int = 0  # committer time, seconds since the epoch


def subject_pr(subject: str) -> int | None:
    """The PR a squash (or cherry-pick) subject names: the trailing `(#N)`."""
    # plain string operations: this runs once per commit of main (20,000+)
    end = subject.rstrip()
    if not end.endswith(")"):
        return None
    start = end.rfind("(#")
    digits = end[start + 2 : -1] if start >= 0 else ""
    return int(digits) if digits.isdigit() and digits.isascii() else None


def subject_prs(subject: str) -> tuple[int, ...]:
    """Every trailing `(#N)`: a backport PR to a release branch can keep the
    original number before its own, `Fix foo (#123) (#456)`."""
    found: list[int] = []
    end = subject.rstrip()
    while end.endswith(")"):
        start = end.rfind("(#")
        digits = end[start + 2 : -1] if start >= 0 else ""
        if not (digits.isdigit() and digits.isascii()):
            break
        found.append(int(digits))
        end = end[:start].rstrip()
    return tuple(reversed(found))


def revert_of_subject(subject: str) -> tuple[int, int] | None:
    """(PR, depth) when the subject reverts a PR: depth 1 reverts it, 2 re-applies it...

    GitHub revert subjects nest: `Revert "Revert "Foo (#1)" (#2)" (#3)`. The
    innermost `(#N)` followed by a quote is the PR whose effect is toggled.
    """
    depth = 0
    rest = subject
    while True:
        if rest.startswith(_REVERT):
            depth += 1
            rest = rest[len(_REVERT) :]
        elif rest.startswith(_REAPPLY):
            depth += 2  # git's name for reverting a revert
            rest = rest[len(_REAPPLY) :]
        else:
            break
    if depth == 0:
        loose = _LOOSE_REVERT.match(subject)  # "Revert #123 (#456)", "Revert PR #123"
        return (int(loose.group(1)), 1) if loose else None
    m = _INNER_PR.search(rest)
    return (int(m.group(1)), depth) if m else None


@dataclass
class HistoryIndex:
    """Everything known about main and the branches of the tips of interest."""

    commits: dict[str, CommitInfo]
    main_head: str | None
    reach: dict[str, int]
    chain: set[str]
    by_pr: dict[int, list[str]]
    reverts: dict[int, list[tuple[str, int]]]
    cherry_from: dict[str, str]
    shallow: frozenset[str] = frozenset()
    # subjects of commits named in cherry-pick lines that are not in `commits`
    extra_subjects: dict[str, str] = field(default_factory=dict)
    # PR -> cherry-picks whose own subject does not name it but whose -x line does
    picked_for: dict[int, list[str]] = field(default_factory=dict)
    # what the scan found before the links by SHA (`_link`) were made, kept so
    # that more subjects can be linked in without scanning every commit again
    subject_reverts: dict[int, list[tuple[str, int]]] = field(default_factory=dict)
    body_reverts: tuple[tuple[str, str], ...] = ()  # (revert, the commit its body names)

    def pr_of(self, sha: str) -> int | None:
        """The PR of a commit given by full or abbreviated SHA, if known."""
        info = self.commits.get(sha)
        if info is None and len(sha) < 40:
            found = [c for c in self.commits if c.startswith(sha)]
            info = self.commits[found[0]] if len(found) == 1 else None
        subject = info.subject if info else self.extra_subjects.get(sha)
        return subject_pr(subject) if subject else None


def _chain(head: str, commits: dict[str, CommitInfo]) -> list[str]:
    """First-parent chain from head back to the root (newest first)."""
    out: list[str] = []
    cur: str | None = head
    seen: set[str] = set()
    while cur is not None and cur in commits and cur not in seen:
        seen.add(cur)
        out.append(cur)
        parents = commits[cur].parents
        cur = parents[0] if parents else None
    return out


def _reach_positions(chain_newest_first: list[str], commits: dict[str, CommitInfo]) -> dict[str, int]:
    reach: dict[str, int] = {}
    for pos, sha in enumerate(reversed(chain_newest_first)):
        reach[sha] = pos
        stack = list(commits[sha].parents[1:])
        while stack:
            cur = stack.pop()
            if cur in reach or cur not in commits:
                continue
            reach[cur] = pos
            stack.extend(commits[cur].parents)
    return reach


def build_index(
    main_head: str | None,
    main_commits: Iterable[CommitInfo],
    branch_commits: Iterable[CommitInfo] = (),
    shallow: Iterable[str] = (),
    bodies: dict[str, str] | None = None,
) -> HistoryIndex:
    """Index main (no bodies needed) and the branch commits (with bodies)."""
    commits: dict[str, CommitInfo] = {c.sha: c for c in main_commits}
    chain = _chain(main_head, commits) if main_head else []
    reach = _reach_positions(chain, commits)
    for c in branch_commits:
        commits.setdefault(c.sha, c)
    bodies = bodies or {}
    by_pr: dict[int, list[str]] = {}
    reverts: dict[int, list[tuple[str, int]]] = {}
    cherry_from: dict[str, str] = {}
    pending_body_reverts: list[tuple[str, str]] = []
    for sha, info in commits.items():
        subject = info.subject
        for pr in subject_prs(subject):
            by_pr.setdefault(pr, []).append(sha)
        body = info.body or bodies.get(sha, "")
        if body and "cherry picked from" in body:
            m = CHERRY_LINE.search(body)
            if m:
                cherry_from[sha] = m.group(1)
        if subject[:6].lower() not in ("revert", "reappl"):
            continue  # the common case, decided without a regex
        rev = revert_of_subject(subject)
        if rev is not None:
            reverts.setdefault(rev[0], []).append((sha, rev[1]))
        elif subject.startswith((_REVERT, _REAPPLY)):
            m = REVERTS_LINE.search(body)
            if m:
                pending_body_reverts.append((sha, m.group(1)))
    index = HistoryIndex(
        commits=commits,
        main_head=main_head,
        reach=reach,
        chain=set(chain),
        by_pr=by_pr,
        reverts={},
        cherry_from=cherry_from,
        shallow=frozenset(shallow),
        subject_reverts=reverts,
        body_reverts=tuple(pending_body_reverts),
    )
    return _link(index)


def with_extra_subjects(index: HistoryIndex, extra: dict[str, str]) -> HistoryIndex:
    """The index with the subjects of commits outside it (cherry-pick origins)
    known: only the links by SHA are made again, not the scan of every commit."""
    return _link(replace(index, extra_subjects={**index.extra_subjects, **extra}))


def _link(index: HistoryIndex) -> HistoryIndex:
    """Links that name a commit by SHA and need its PR: a cherry-pick's origin,
    and a revert whose subject lost the inner "(#N)" ("This reverts commit X")."""
    index.picked_for = {}
    for sha, origin in index.cherry_from.items():
        origin_pr = index.pr_of(origin)
        if origin_pr is not None and origin_pr not in subject_prs(index.commits[sha].subject):
            index.picked_for.setdefault(origin_pr, []).append(sha)
    index.reverts = reverts = {pr: list(entries) for pr, entries in index.subject_reverts.items()}
    for sha, target in index.body_reverts:
        pr = index.pr_of(target)
        if pr is None:
            continue
        inner = _revert_entry(index, target)
        depth = inner[1] + 1 if inner else 1
        pr = inner[0] if inner else pr
        reverts.setdefault(pr, []).append((sha, depth))
    return index


def _revert_entry(index: HistoryIndex, sha: str) -> tuple[int, int] | None:
    for pr, entries in index.reverts.items():
        for rsha, depth in entries:
            if rsha == sha or (len(sha) < 40 and rsha.startswith(sha)):
                return pr, depth
    return None


@dataclass(frozen=True)
class View:
    """The history of one tip: its branch commits and where it joins main."""

    tip: str
    branch: frozenset[str]
    base_pos: int
    side_ancestors: frozenset[str]
    missing_parents: tuple[str, ...]


def _ancestors_in_main(start: Iterable[str], index: HistoryIndex) -> set[str]:
    out: set[str] = set()
    stack = list(start)
    while stack:
        cur = stack.pop()
        if cur in out or cur not in index.reach:
            continue
        out.add(cur)
        stack.extend(index.commits[cur].parents)
    return out


def make_view(index: HistoryIndex, tip: str) -> View:
    branch: set[str] = set()
    bases: set[str] = set()
    missing: list[str] = []
    stack = [tip]
    while stack:
        cur = stack.pop()
        if cur in branch or cur in bases:
            continue
        if cur in index.reach:
            bases.add(cur)
            continue
        info = index.commits.get(cur)
        if info is None:
            missing.append(cur)
            continue
        branch.add(cur)
        stack.extend(info.parents)
    chain_bases = [b for b in bases if b in index.chain]
    side = [b for b in bases if b not in index.chain]
    base_pos = max((index.reach[b] for b in chain_bases), default=-1)
    side_anc = _ancestors_in_main(side, index) if side else set()
    return View(
        tip=tip,
        branch=frozenset(branch),
        base_pos=base_pos,
        side_ancestors=frozenset(side_anc),
        missing_parents=tuple(sorted(set(missing))),
    )


def contains(index: HistoryIndex, view: View, sha: str) -> bool:
    """Is `sha` the tip or one of its ancestors?"""
    if sha in view.branch or sha in view.side_ancestors:
        return True
    pos = index.reach.get(sha)
    return pos is not None and pos <= view.base_pos


def truncated_at(index: HistoryIndex, view: View) -> list[str]:
    """Commits where this tip's history is cut (shallow boundary or missing parents)."""
    cut = [s for s in index.shallow if contains(index, view, s)]
    return sorted(set(cut) | set(view.missing_parents))


@dataclass(frozen=True)
class Presence:
    """How PR N shows up in one tip's history."""

    pr: int
    squash: tuple[str, ...]
    picks: tuple[tuple[str, str | None], ...]
    reverts: tuple[tuple[str, int], ...]

    @property
    def present(self) -> bool:
        return bool(self.squash or self.picks)

    @property
    def reverted(self) -> bool:
        # Each odd-depth revert takes the change out, each even-depth one puts it
        # back; a revert can only exist after what it reverts, so counting is enough.
        net = sum(1 if depth % 2 else -1 for _, depth in self.reverts)
        return self.present and net > 0

    @property
    def effective(self) -> bool:
        return self.present and not self.reverted


def presence(index: HistoryIndex, view: View, pr: int) -> Presence:
    squash: list[str] = []
    picks: list[tuple[str, str | None]] = []
    has_main = index.main_head is not None
    for sha in index.by_pr.get(pr, ()):
        if not contains(index, view, sha):
            continue
        origin = index.cherry_from.get(sha)
        if sha in index.reach or (not has_main and origin is None):
            squash.append(sha)
        else:
            picks.append((sha, origin))
    # cherry-picks whose subject was reworded but whose -x line names a commit of PR N
    for sha in index.picked_for.get(pr, ()):
        if contains(index, view, sha):
            picks.append((sha, index.cherry_from[sha]))
    reverts = tuple((sha, d) for sha, d in index.reverts.get(pr, ()) if contains(index, view, sha))
    if squash:
        picks = []  # the squash commit decides; a duplicate pick adds nothing
    return Presence(pr=pr, squash=tuple(sorted(squash)), picks=tuple(sorted(picks, key=lambda p: p[0])), reverts=reverts)


def is_empty_commit(index: HistoryIndex, sha: str) -> bool:
    """True when the commit's tree equals its (first) parent's: it changed nothing."""
    info = index.commits.get(sha)
    if info is None or not info.parents or not info.tree:
        return False
    parent = index.commits.get(info.parents[0])
    return parent is not None and parent.tree == info.tree

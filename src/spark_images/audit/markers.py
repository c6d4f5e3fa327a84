"""Content markers that follow the code: find a marker's file at the target.

Order, cheapest and most certain first:
  1. the marker's path, then its hints (earlier paths), read in one batch;
  2. git's own rename detection: the commit that removed the path from the
     target's history, and where `diff-tree -M` says it went (a few hops);
  3. a search of the target's tree restricted to files of the same name or of
     the same directory family (e.g. any `.../c3x/`), for the marker's text.
A file found by 1 or 2 can fail the marker; one found by the search can only
pass it (an unrelated file that lacks the text proves nothing). What was not
found anywhere is `unverified`. Every answer says where the text was checked.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Sequence

from spark_images.audit import git as gitmod
from spark_images.audit.knowledge import Fix, Marker
from spark_images.audit.states import MarkerResult, check_marker
from spark_images.core.errors import EnvironmentProblem

MAX_HOPS = 4
MAX_CANDIDATES = 64


def family(path: str) -> tuple[str, str]:
    """(basename, last directory name) of a path: what a moved file keeps."""
    return posixpath.basename(path), posixpath.basename(posixpath.dirname(path))


def candidates(tree: Iterable[str], marker: Marker) -> list[str]:
    """Files of the target's tree named like, or living in a directory named like, the marker's paths (pure)."""
    names = {family(p)[0] for p in marker.paths}
    dirs = {family(p)[1] for p in marker.paths if family(p)[1]}
    same_name: list[str] = []
    same_dir: list[str] = []
    for path in tree:
        base, parent = family(path)
        if base in names:
            same_name.append(path)
        elif parent in dirs:
            same_dir.append(path)
    return (same_name + same_dir)[:MAX_CANDIDATES]


class MarkerChecker:
    """Checks markers at one commit; reads each file and the tree at most once."""

    def __init__(self, repo: gitmod.Repo, commit: str) -> None:
        self.repo, self.commit = repo, commit
        self.partial = repo.is_partial()
        self._files: dict[str, bytes | None] = {}
        self._tree: list[str] | bool | None = False
        self.why = "not in the tree, or not fetchable into the treeless clone" if self.partial else ""

    def read(self, paths: Sequence[str]) -> dict[str, bytes | None]:
        wanted = [p for p in dict.fromkeys(paths) if p not in self._files]
        if wanted:
            self._files.update(self.repo.read_paths(self.commit, wanted))
        return {p: self._files.get(p) for p in paths}

    def tree(self) -> list[str] | None:
        if self._tree is False:
            self._tree = self.repo.tree_paths(self.commit)
        return self._tree  # type: ignore[return-value]

    def follow_rename(self, path: str) -> tuple[str, str] | None:
        """(path at the target, how) when git's renames lead from `path` to a file there."""
        if self.partial:  # walking history for paths would fetch every tree lazily
            return None
        current, hops = path, []
        for _ in range(MAX_HOPS):
            gone = self.repo.deleted_by(self.commit, current)
            if gone is None:
                return None
            new = self.repo.renamed_in(gone, current)
            if new is None:
                return None
            hops.append(f"{current} -> {new} in {gone[:12]}")
            if self.read([new])[new] is not None:
                return new, "followed git's rename " + ", ".join(hops)
            current = new
        return None

    def check(self, marker: Marker) -> MarkerResult:
        files = self.read(marker.paths)
        for path in marker.paths:
            if files[path] is not None:
                how = "" if path == marker.path else "an earlier path (hint)"
                return check_marker(marker, files[path], found_at=path, how=how)
        for path in marker.paths:
            moved = self.follow_rename(path)
            if moved is not None:
                return check_marker(marker, self._files[moved[0]], found_at=moved[0], how=moved[1])
        tree = self.tree()
        if tree is None:
            return check_marker(marker, None, self.why or "the tree at this commit cannot be read")
        found = candidates(tree, marker)
        if marker.expect_present and found:
            contents = self.read(found)
            needle = marker.text.encode("utf-8")
            for path in found:
                data = contents.get(path)
                if data is not None and needle in data:
                    return check_marker(marker, data, found_at=path,
                                        how="found by searching files of the same name or directory family")
        searched = f"; searched {len(found)} file(s) of the same name or directory family" if found else ""
        return check_marker(marker, None, f"the path and its hints are not in the tree at this commit{searched}")


def check_fixes(repo: gitmod.Repo, commit: str, fixes: Sequence[Fix]) -> dict[int, list[MarkerResult]]:
    """Marker results per PR; an unreadable tree makes every marker unverified, never failed."""
    checker = MarkerChecker(repo, commit)
    out: dict[int, list[MarkerResult]] = {}
    for fix in fixes:
        results: list[MarkerResult] = []
        for marker in fix.markers:
            try:
                results.append(checker.check(marker))
            except EnvironmentProblem as exc:
                results.append(check_marker(marker, None, f"file not readable here: {exc.message}"))
        out[fix.pr] = results
    return out

"""The commits of main, kept between runs: parsing 40,000 commits from `git log`
is most of an audit's cost, and main only grows.

The cache file (one per repository, under the user cache) holds the lean
records of main up to a head. A later run reads it and asks git only for the
commits since that head, after checking that the old head is still an
ancestor of the new one (a force-pushed main is read again in full). A
damaged or foreign file is ignored; writing is atomic and best effort.
"""

from __future__ import annotations

import contextlib
import hashlib
import marshal
from pathlib import Path

from spark_images.audit import git as gitmod
from spark_images.audit.history import CommitInfo
from spark_images.core import atomic

_VERSION = 1
_LIMIT = 256 * 1024 * 1024


def _path(repo: gitmod.Repo) -> Path:
    key = hashlib.sha256(str(repo.git_dir.resolve()).encode()).hexdigest()[:20]
    return gitmod.cache_root() / "main-index" / f"{key}.marshal"


def _load(path: Path, git_dir: str) -> tuple[str, list[CommitInfo]] | None:
    try:
        if path.stat().st_size > _LIMIT:
            return None
        doc = marshal.loads(path.read_bytes())
    except (OSError, ValueError, EOFError, TypeError):
        return None
    if not (isinstance(doc, tuple) and len(doc) == 4 and doc[0] == _VERSION and doc[1] == git_dir):
        return None
    head, rows = doc[2], doc[3]
    try:
        return str(head), [CommitInfo(s, t, p, subj, "", when) for s, t, p, subj, when in rows]
    except (TypeError, ValueError):
        return None


def main_commits(repo: gitmod.Repo, head: str) -> list[CommitInfo]:
    """Every commit reachable from `head` (lean: no bodies), from the cache plus git."""
    path = _path(repo)
    git_dir = str(repo.git_dir.resolve())
    cached = _load(path, git_dir)
    if cached is not None and cached[0] == head:
        return cached[1]
    if cached is not None and repo.is_ancestor(cached[0], head):
        commits = repo.log([head, f"^{cached[0]}"], bodies=False) + cached[1]
    else:
        commits = repo.log([head], bodies=False)
    rows = [(c.sha, c.tree, c.parents, c.subject, c.time) for c in commits]
    with contextlib.suppress(OSError):
        atomic.write_bytes(path, marshal.dumps((_VERSION, git_dir, head, rows)))
    return commits

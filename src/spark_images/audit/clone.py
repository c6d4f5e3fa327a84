"""Where the audit's history comes from: `--repo` as given, or the cached
treeless clone of upstream vLLM, cloned on first use and fetched at most once
per run (all git work through `git.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from spark_images.audit import git as gitmod
from spark_images.core.errors import EnvironmentProblem

CACHE_MAX_AGE_S = 3600.0
FETCH_TIMEOUT_S = 120.0  # an update is optional: do not hang on a dead network


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
            why = exc.message
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

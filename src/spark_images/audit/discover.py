"""`audit TARGET --discover`: Spark-relevant merged PRs the knowledge base lacks.

Signals (each finding carries the line that raised it):
  - the subject or body names sm_120 / sm_121 / SM12x, GB10, DGX Spark or
    consumer Blackwell;
  - the diff adds `is_device_capability_family(120)`, `enable_sm120...`, or a
    `12.0f` / `12.1a` (family / arch-specific) target in CMake;
  - the change touches a FlashInfer or CUTLASS SM120 path.
The signal functions are pure; `discover` gathers the range with two git
calls (messages with changed paths, and a pickaxe `-G` over the diffs, so
only matching commits' patches are ever printed).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from spark_images.audit import git as gitmod
from spark_images.audit.history import subject_pr
from spark_images.core.inputs import short

MESSAGE_SIGNALS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bsm_?12[01x]\b|\bsm_?12\.x\b|\bsm12[01]a?\b", re.IGNORECASE), "SM12x"),
    (re.compile(r"\bGB10\b"), "GB10"),
    (re.compile(r"\bDGX[ -]?Spark\b", re.IGNORECASE), "DGX Spark"),
    (re.compile(r"\bconsumer[ -]Blackwell\b|\bBlackwell[ -]consumer\b", re.IGNORECASE), "consumer Blackwell"),
)
# ERE for git's -G (the C regex engine scans the diffs)
DIFF_REGEX = r"is_device_capability_family\(120\)|enable_sm120|12\.[01][af]"
_CAPABILITY = re.compile(r"is_device_capability_family\(120\)|enable_sm120\w*")
_CMAKE_ARCH = re.compile(r"(?<![\d.])12\.[01][af]\b")
_SM12_PATH = re.compile(r"sm_?12[01x]", re.IGNORECASE)


@dataclass(frozen=True)
class Found:
    pr: int
    title: str
    commit: str
    evidence: str

    def to_json(self) -> dict[str, object]:
        return {"pr": self.pr, "title": self.title, "commit": self.commit, "evidence": self.evidence}


def _clip(text: str, limit: int = 160) -> str:
    return short(" ".join(text.split()), limit)  # one line of a commit message or diff


def message_evidence(subject: str, body: str) -> str | None:
    for where, text in (("subject", subject), ("body", body)):
        for pattern, what in MESSAGE_SIGNALS:
            m = pattern.search(text)
            if m:
                line = next((ln for ln in text.splitlines() if pattern.search(ln)), text)
                return f"{where} names {what} ({m.group(0)!r}): {_clip(line)}"
    return None


def is_cmake(path: str) -> bool:
    return path.endswith(("CMakeLists.txt", ".cmake"))


def diff_evidence(added: Iterable[tuple[str, str]]) -> str | None:
    for path, line in added:
        m = _CAPABILITY.search(line)
        if m is None and is_cmake(path):
            m = _CMAKE_ARCH.search(line)
        if m is not None:
            return f"diff adds {m.group(0)!r} in {path}: {_clip(line.strip())}"
    return None


def path_evidence(paths: Iterable[str]) -> str | None:
    for path in paths:
        low = path.lower()
        if ("flashinfer" in low or "cutlass" in low) and _SM12_PATH.search(path):
            return f"touches the SM120 path {path}"
    return None


def findings(
    messages: Sequence[tuple[str, str, str, list[str]]],
    pickaxe: dict[str, list[tuple[str, str]]],
    known: Iterable[int],
) -> list[Found]:
    """One finding per PR not in `known`, newest first (pure)."""
    skip = set(known)
    out: list[Found] = []
    for sha, subject, body, paths in messages:
        pr = subject_pr(subject)
        if pr is None or pr in skip or subject.startswith(('Revert "', 'Reapply "')):
            continue
        evidence = message_evidence(subject, body) or diff_evidence(pickaxe.get(sha, ())) or path_evidence(paths)
        if evidence is None:
            continue
        skip.add(pr)
        out.append(Found(pr=pr, title=subject, commit=sha, evidence=evidence))
    return out


def discover(repo: gitmod.Repo, commit: str, since: str, known: Iterable[int]) -> list[Found]:
    revs = [commit, f"^{since}"]
    return findings(repo.range_messages(revs), repo.range_pickaxe(revs, DIFF_REGEX), known)

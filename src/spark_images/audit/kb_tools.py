"""The knowledge base as data for others and for its reviewers (pure).

- `draft_entry`: a `fixes.yaml` entry drafted from a PR's commit (title, a
  guessed area, marker candidates from the lines its diff adds), for review.
- `osv_records`: every entry as an OSV-style record: affected package `vllm`
  on PyPI, a GIT range on vllm-project/vllm with `introduced` / `fixed`
  events (a Spark deployment without the fix is "affected"), an ECOSYSTEM
  range when the first release is known, and our fields under
  `database_specific`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any

from spark_images import defaults
from spark_images.audit.discover import diff_evidence, message_evidence
from spark_images.audit.knowledge import AREAS, Fix, KnowledgeBase
from spark_images.core.errors import Finding, Problem

UPSTREAM_REPO = defaults.VLLM_REPOSITORY
OSV_SCHEMA = "1.6.0"
_AREA_WORDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("b12x", re.compile(r"b12x", re.IGNORECASE)),
    ("NVFP4", re.compile(r"nvfp4|fp4|w4a4", re.IGNORECASE)),
    ("MoE", re.compile(r"\bmoe\b|fused_moe|experts", re.IGNORECASE)),
    ("FP8", re.compile(r"fp8|w8a8|e4m3", re.IGNORECASE)),
    ("scheduler", re.compile(r"schedul|preempt|async[-_ ]decode|kv[-_ ]cache", re.IGNORECASE)),
    ("build", re.compile(r"cmake|CMakeLists|arch list|setup\.py|build", re.IGNORECASE)),
)
_DEFINITION = re.compile(r"^\s*(?:def |class |struct |template\b|#\s*define |#\s*if|set\(|using |[A-Z_]{4,}\s*=)")
_TRAILING_PR = re.compile(r"\s*\(#\d+\)\s*$")


def guess_area(subject: str, paths: Sequence[str]) -> str:
    text = " ".join([subject, *paths])
    for area, pattern in _AREA_WORDS:
        if pattern.search(text):
            return area
    return "build"


def marker_candidates(added: Sequence[tuple[str, str]], limit: int = 3) -> list[dict[str, str]]:
    """Lines the diff adds that would show the change is in a tree: signal lines
    first, then definitions; one per file, short enough to stay stable."""
    scored: list[tuple[int, int, str, str]] = []
    for order, (path, line) in enumerate(added):
        text = line.strip()
        if not (8 <= len(text) <= 120) or (path.endswith((".md", ".txt", ".rst")) and not path.endswith("CMakeLists.txt")):
            continue
        if diff_evidence([(path, line)]):
            rank = 0
        elif _DEFINITION.match(line):
            rank = 1
        else:
            continue
        scored.append((rank, order, path, text))
    out: list[dict[str, str]] = []
    seen: set[str] = set()
    for _, _, path, text in sorted(scored):
        if path in seen:
            continue
        seen.add(path)
        out.append({"path": path, "contains": text, "source": "drafted from the PR's diff (review before use)"})
        if len(out) == limit:
            break
    return out


def draft_entry(pr: int, commit: str, subject: str, body: str, added: Sequence[tuple[str, str]], *,
                patch_id: str = "", merged: int = 0) -> dict[str, Any]:
    """`commit`: the full squash commit; `patch_id`: its `git patch-id --stable` ("" for
    an empty commit); `merged`: its committer time (0: unknown)."""
    paths = list(dict.fromkeys(p for p, _ in added))
    title = _TRAILING_PR.sub("", subject).strip() or f"PR #{pr}"
    entry: dict[str, Any] = {
        "pr": pr,
        "title": title,
        "area": guess_area(subject, paths),
        "severity": "medium",
        "symptom": "TODO: what goes wrong on the DGX Spark without it",
        "main_commit": commit,
    }
    if patch_id:
        entry["patch_id"] = patch_id
    if merged:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(merged))
        entry["merged"] = entry["date"] = stamp
    markers = marker_candidates(added)
    if markers:
        entry["markers"] = markers
    why = message_evidence(subject, body) or diff_evidence(added)
    return {"entry": entry, "evidence": why or "", "paths": paths[:50]}


def _fixed_event(fix: Fix) -> list[dict[str, str]]:
    events = [{"introduced": "0"}]
    if fix.main_commit:
        events.append({"fixed": fix.main_commit})  # a full SHA: the knowledge base refuses prefixes
    return events


def osv_record(fix: Fix) -> dict[str, Any]:
    """One entry as an OSV record; `modified` is the entry's own date (never the export's)."""
    ranges: list[dict[str, Any]] = [{"type": "GIT", "repo": UPSTREAM_REPO, "events": _fixed_event(fix)}]
    if fix.first_release:
        ranges.append({"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": fix.first_release}]})
    ours: dict[str, Any] = {
        "pr": fix.pr,
        "area": fix.area,
        "severity": fix.severity,
        "symptom": fix.symptom,
        "main_commit": fix.main_commit or None,
        "patch_id": fix.patch_id or None,
        "merged": fix.merged or None,
        "first_release": fix.first_release or None,
        "undone_by": list(fix.undone_by),
        "markers": [
            {"path": m.path, "hints": list(m.hints), ("contains" if m.expect_present else "lacks"): m.text, "source": m.source}
            for m in fix.markers
        ],
        "hardware": ["sm_120", "sm_121 (DGX Spark, GB10)"],
    }
    if not fix.main_commit:
        ours["status"] = "no fix commit recorded (context entry, unmerged, or not read off history yet)"
    return {
        "schema_version": OSV_SCHEMA,
        "id": f"x_SPARK-VLLM-{fix.pr}",  # OSV: `x_` marks a local database that is not aggregated
        "modified": fix.date,
        "summary": fix.title,
        "details": fix.symptom,
        "affected": [{"package": {"ecosystem": "PyPI", "name": "vllm", "purl": "pkg:pypi/vllm"}, "ranges": ranges}],
        "references": [{"type": "FIX" if fix.main_commit else "WEB", "url": f"{UPSTREAM_REPO}/pull/{fix.pr}"}],
        "database_specific": {"spark_images": ours},
    }


def osv_records(kb: KnowledgeBase, *, file: str = "fixes.yaml") -> list[dict[str, Any]]:
    """Every entry as an OSV record, in the knowledge base's order. An entry without
    a `date` has no `modified`: a Finding names each one."""
    undated = [Problem(file, f"#{f.pr}.date", "missing: OSV's `modified` is the entry's own date",
                       'add date: "YYYY-MM-DDTHH:MM:SSZ" (the main commit\'s committer date where it has one)')
               for f in kb.fixes if not f.date]
    if undated:
        raise Finding(*undated)
    return [osv_record(f) for f in kb.fixes]


__all__ = ["AREAS", "draft_entry", "guess_area", "marker_candidates", "osv_record", "osv_records"]

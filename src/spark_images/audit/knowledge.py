"""The fixes knowledge base: parse and validate `fixes.yaml` into plain data.

`parse_knowledge(text, file)` is pure; `load_knowledge()` only reads the
package's own `fixes.yaml`. Every problem in the file is reported at once,
one line each, naming the entry and field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml

from spark_images.errors import Finding, Problem

AREAS: tuple[str, ...] = ("build", "FP8", "NVFP4", "MoE", "b12x", "scheduler")
SEVERITIES: tuple[str, ...] = ("critical", "high", "medium", "low", "info")
_HEX = re.compile(r"^[0-9a-f]{7,40}$")
_VERSION = re.compile(r"^\d+(\.\d+)+$")
_FIX_KEYS = {
    "pr", "title", "area", "severity", "symptom", "main_commit", "first_release", "undone_by", "markers",
}
_MARKER_KEYS = {"path", "contains", "lacks", "source"}


@dataclass(frozen=True)
class Marker:
    """Text that must be present (`expect_present`) or absent in `path` at the commit."""

    path: str
    text: str
    expect_present: bool
    source: str

    def describe(self) -> str:
        verb = "contains" if self.expect_present else "lacks"
        return f"{self.path} {verb} {self.text!r}"


@dataclass(frozen=True)
class Fix:
    pr: int
    title: str
    area: str
    severity: str
    symptom: str
    main_commit: str = ""
    first_release: str = ""
    undone_by: tuple[int, ...] = ()
    markers: tuple[Marker, ...] = ()


@dataclass(frozen=True)
class KnowledgeBase:
    fixes: tuple[Fix, ...] = field(default_factory=tuple)

    def get(self, pr: int) -> Fix | None:
        for fix in self.fixes:
            if fix.pr == pr:
                return fix
        return None

    def prs(self) -> tuple[int, ...]:
        return tuple(f.pr for f in self.fixes)


def _marker(raw: Any, where: str, file: str, problems: list[Problem]) -> Marker | None:
    if not isinstance(raw, dict):
        problems.append(Problem(file, where, "a marker must be a mapping", "give path, contains or lacks, source"))
        return None
    for key in sorted(set(raw) - _MARKER_KEYS):
        problems.append(Problem(file, f"{where}.{key}", "unknown marker key", f"use one of {', '.join(sorted(_MARKER_KEYS))}"))
    path, source = raw.get("path"), raw.get("source")
    has_contains, has_lacks = "contains" in raw, "lacks" in raw
    ok = True
    if not isinstance(path, str) or not path or path.startswith("/"):
        problems.append(Problem(file, f"{where}.path", "must be a path relative to the vLLM repository root", "e.g. CMakeLists.txt"))
        ok = False
    if has_contains == has_lacks:
        problems.append(Problem(file, where, "give exactly one of contains or lacks", "contains: TEXT (or lacks: TEXT)"))
        ok = False
    text = raw.get("contains" if has_contains else "lacks")
    if (has_contains or has_lacks) and (not isinstance(text, str) or not text):
        problems.append(Problem(file, where, "the marker text must be a non-empty string", "quote it"))
        ok = False
    if not isinstance(source, str) or not source.strip():
        problems.append(Problem(file, f"{where}.source", "every marker must say where it comes from", "name the reference section"))
        ok = False
    if not ok:
        return None
    return Marker(path=str(path), text=str(text), expect_present=has_contains, source=str(source))


def _fix(raw: Any, where: str, file: str, problems: list[Problem]) -> Fix | None:
    if not isinstance(raw, dict):
        problems.append(Problem(file, where, "an entry must be a mapping", "see the header of fixes.yaml"))
        return None
    before = len(problems)
    for key in sorted(set(raw) - _FIX_KEYS):
        problems.append(Problem(file, f"{where}.{key}", "unknown key", f"use one of {', '.join(sorted(_FIX_KEYS))}"))
    pr = raw.get("pr")
    if not isinstance(pr, int) or isinstance(pr, bool) or pr <= 0:
        problems.append(Problem(file, f"{where}.pr", f"{pr!r} is not a PR number", "a positive integer"))
    for key in ("title", "symptom"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            problems.append(Problem(file, f"{where}.{key}", "missing or empty", "a one-line text"))
    if raw.get("area") not in AREAS:
        problems.append(Problem(file, f"{where}.area", f"{raw.get('area')!r} is not an area", f"one of {', '.join(AREAS)}"))
    if raw.get("severity") not in SEVERITIES:
        problems.append(Problem(file, f"{where}.severity", f"{raw.get('severity')!r} is not a severity", f"one of {', '.join(SEVERITIES)}"))
    main_commit = str(raw.get("main_commit", "") or "")
    if main_commit and not _HEX.match(main_commit):
        problems.append(Problem(file, f"{where}.main_commit", f"{main_commit!r} is not a hex commit prefix", "7 to 40 lower-case hex digits"))
    first_release = str(raw.get("first_release", "") or "")
    if first_release and not _VERSION.match(first_release):
        problems.append(Problem(file, f"{where}.first_release", f"{first_release!r} is not a release", 'e.g. "0.22.0"'))
    undone = raw.get("undone_by") or []
    if not isinstance(undone, list) or not all(isinstance(n, int) and n > 0 for n in undone):
        problems.append(Problem(file, f"{where}.undone_by", "must be a list of PR numbers", "e.g. [39959]"))
        undone = []
    markers_raw = raw.get("markers") or []
    if not isinstance(markers_raw, list):
        problems.append(Problem(file, f"{where}.markers", "must be a list", "a list of {path, contains|lacks, source}"))
        markers_raw = []
    markers = [_marker(m, f"{where}.markers[{i}]", file, problems) for i, m in enumerate(markers_raw)]
    if len(problems) > before:
        return None
    return Fix(
        pr=int(pr),  # type: ignore[arg-type]
        title=raw["title"].strip(),
        area=raw["area"],
        severity=raw["severity"],
        symptom=raw["symptom"].strip(),
        main_commit=main_commit,
        first_release=first_release,
        undone_by=tuple(undone),
        markers=tuple(m for m in markers if m is not None),
    )


def parse_knowledge(text: str, file: str = "fixes.yaml") -> KnowledgeBase:
    """Parse and validate the knowledge base; raises Finding with every problem."""
    try:
        # the C loader when PyYAML has it: the pure-Python one costs ~0.1 s per run
        doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise Finding(Problem(file, "", f"not valid YAML: {exc}".replace("\n", " "), "fix the syntax")) from None
    if not isinstance(doc, dict) or doc.get("schema") != 1 or not isinstance(doc.get("fixes"), list):
        raise Finding(Problem(file, "fixes", "expected `schema: 1` and a `fixes:` list", "see the file header"))
    problems: list[Problem] = []
    fixes: list[Fix] = []
    seen: set[int] = set()
    for i, raw in enumerate(doc["fixes"]):
        fix = _fix(raw, f"fixes[{i}]", file, problems)
        if fix is None:
            continue
        if fix.pr in seen:
            problems.append(Problem(file, f"fixes[{i}].pr", f"#{fix.pr} is listed twice", "merge the entries"))
        seen.add(fix.pr)
        fixes.append(fix)
    for fix in fixes:
        for other in fix.undone_by:
            if other == fix.pr:
                problems.append(Problem(file, f"#{fix.pr}.undone_by", "a PR cannot undo itself", "remove it"))
    if problems:
        raise Finding(*problems)
    return KnowledgeBase(fixes=tuple(fixes))


def load_knowledge() -> KnowledgeBase:
    """The knowledge base shipped with the package."""
    text = resources.files("spark_images.audit").joinpath("fixes.yaml").read_text(encoding="utf-8")
    return parse_knowledge(text, "spark_images/audit/fixes.yaml")

"""The fixes knowledge base: parse and validate `fixes.yaml` into plain data.

`parse_knowledge(text, file)` is pure; `load_knowledge(path)` reads the
package's own `fixes.yaml` (or a file the user names), bounded in size.
Duplicate YAML keys are refused (YAML would silently keep the last one, and a
second `markers:` would hide the first). Every problem in the file is
reported at once, one line each, naming the entry and field.
"""

from __future__ import annotations

import calendar
import os
import re
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from spark_images import defaults
from spark_images.core.errors import Finding, Problem

AREAS: tuple[str, ...] = ("build", "FP8", "NVFP4", "MoE", "b12x", "scheduler")
SEVERITIES: tuple[str, ...] = ("critical", "high", "medium", "low", "info")
_FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
# RFC 3339 in UTC, as OSV's `modified` wants it: 2026-05-28T07:30:26Z
_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
_VERSION = re.compile(r"^\d+(\.\d+)+$")
_FIX_KEYS = {
    "pr", "title", "area", "severity", "symptom", "main_commit", "patch_id", "merged", "date", "first_release",
    "undone_by", "markers",
}
_MARKER_KEYS = {"path", "hints", "contains", "lacks", "source"}
KB_LIMIT = 1024 * 1024  # the shipped file is ~10 KiB; a KB of thousands of entries still fits


@dataclass(frozen=True)
class Marker:
    """Text that must be present (`expect_present`) or absent at the commit.

    `path` is where the text is today; `hints` are earlier paths of the same
    file (files move: the audit looks there, follows git's renames and then
    searches files of the same name or directory family).
    """

    path: str
    text: str
    expect_present: bool
    source: str
    hints: tuple[str, ...] = ()

    def describe(self) -> str:
        verb = "contains" if self.expect_present else "lacks"
        return f"{self.path} {verb} {self.text!r}"

    @property
    def paths(self) -> tuple[str, ...]:
        """The path, then its hints: the places to read first."""
        return tuple(dict.fromkeys((self.path, *self.hints)))


@dataclass(frozen=True)
class Fix:
    pr: int
    title: str
    area: str
    severity: str
    symptom: str
    main_commit: str = ""  # the full 40-hex squash commit on main
    first_release: str = ""
    undone_by: tuple[int, ...] = ()
    markers: tuple[Marker, ...] = ()
    patch_id: str = ""  # `git patch-id --stable` of main_commit (proves a cherry-pick without it)
    merged: str = ""  # main_commit's committer date (RFC 3339, UTC): the earliest a release can carry it
    date: str = ""  # the entry's own date (OSV `modified`)

    @property
    def merged_epoch(self) -> int | None:
        return _epoch(self.merged) if self.merged else None


def _epoch(stamp: str) -> int:
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))


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
    if not _relative_path(path):
        problems.append(Problem(file, f"{where}.path", "must be a path relative to the vLLM repository root", "e.g. CMakeLists.txt"))
        ok = False
    hints = raw.get("hints") or []
    if not isinstance(hints, list) or not all(_relative_path(h) for h in hints):
        problems.append(Problem(file, f"{where}.hints", "must be a list of earlier paths relative to the repository root",
                                "e.g. [csrc/quantization/fp4/nvfp4_scaled_mm_entry.cu]"))
        hints, ok = [], False
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
    return Marker(path=str(path), text=str(text), expect_present=has_contains, source=str(source), hints=tuple(hints))


def _relative_path(value: Any) -> bool:
    return (
        isinstance(value, str) and bool(value) and not value.startswith("/") and "\n" not in value
        and ".." not in value.split("/") and len(value) <= 400
    )


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
    if main_commit and not _FULL_SHA.match(main_commit):
        problems.append(Problem(file, f"{where}.main_commit", f"{main_commit!r} is not a full commit SHA",
                                "40 lower-case hex digits: git rev-parse PREFIX in a vLLM clone"))
    patch_id = str(raw.get("patch_id", "") or "")
    if patch_id and not _FULL_SHA.match(patch_id):
        problems.append(Problem(file, f"{where}.patch_id", f"{patch_id!r} is not a patch-id",
                                "40 lower-case hex digits: git show MAIN_COMMIT | git patch-id --stable"))
    if patch_id and not main_commit:
        problems.append(Problem(file, f"{where}.patch_id", "a patch-id without a main_commit", "give main_commit too"))
    stamps: dict[str, str] = {}
    for key in ("merged", "date"):
        value = raw.get(key)
        if value is not None and not (isinstance(value, str) and _TIMESTAMP.match(value) and _valid_time(value)):
            problems.append(Problem(file, f"{where}.{key}", f"{value!r} is not a UTC timestamp",
                                    'RFC 3339 in UTC, quoted: "2026-05-28T07:30:26Z"'))
        elif value is not None:
            stamps[key] = value
    if "merged" in stamps and not main_commit:
        problems.append(Problem(file, f"{where}.merged", "a merge date without a main_commit", "give main_commit too"))
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
        patch_id=patch_id,
        merged=stamps.get("merged", ""),
        date=stamps.get("date", ""),
        first_release=first_release,
        undone_by=tuple(undone),
        markers=tuple(m for m in markers if m is not None),
    )


def _valid_time(stamp: str) -> bool:
    try:
        _epoch(stamp)
    except ValueError:
        return False
    return True


def parse_knowledge(text: str, file: str = "fixes.yaml") -> KnowledgeBase:
    """Parse and validate the knowledge base; raises Finding with every problem."""
    doc = _parse_yaml(text, file)
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


def _parse_yaml(text: str, file: str) -> Any:
    """YAML that refuses duplicate keys: the inputs module's loader when this
    build has it, else the profiles' unique-key loader (both raise Finding)."""
    from spark_images.core import inputs

    loads_yaml = getattr(inputs, "loads_yaml", None)
    if loads_yaml is not None:
        return loads_yaml(text, file=file, what="knowledge base", error=Finding)
    from spark_images.profiles.profile import parse_yaml

    return parse_yaml(text, file)


def load_knowledge(path: str | os.PathLike[str] | None = None) -> KnowledgeBase:
    """The knowledge base shipped with the package, or the file at `path` (else the
    file $SPARK_IMAGES_KB names: a knowledge base of another history, e.g. a fork's)."""
    if path is None:
        path = defaults.setting(defaults.Env.KB)
    if path is None:
        data = resources.files("spark_images.audit").joinpath("fixes.yaml").read_bytes()
        if len(data) > KB_LIMIT:
            raise Finding(Problem("spark_images/audit/fixes.yaml", "", f"over {KB_LIMIT} bytes", "split the knowledge base"))
        return parse_knowledge(data.decode("utf-8", "replace"), "spark_images/audit/fixes.yaml")
    from spark_images.core.inputs import read_text

    return parse_knowledge(read_text(path, what="knowledge base", limit=KB_LIMIT), os.fsdecode(path))

"""The cubin report: per-unit classes rolled up per library and overall (pure).

A unit is one fatbin of a shared object (usually one translation unit) or
one bare `.cubin` file; bare cubins are grouped per directory into one
"library" so that a directory of thousands of cubins reads as one line.
"""

from __future__ import annotations

import fnmatch
import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from spark_images.cubins import verdict as v
from spark_images.cubins.fatbin import EMBEDDED, BinaryScan, Entry


@dataclass(frozen=True)
class Unit:
    """One fatbin, or one bare cubin file."""

    name: str
    cls: str  # native | jit_only | missing
    sass: tuple[str, ...]
    ptx: tuple[str, ...]
    other: tuple[str, ...] = ()  # LTO-IR and unknown kinds
    # entries the header claims but whose payload did not prove it: never counted
    rejected: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": self.name, "class": self.cls, "sass": list(self.sass), "ptx": list(self.ptx)}
        if self.other:
            doc["other"] = list(self.other)
        if self.rejected:
            doc["unreadable"] = list(self.rejected)
        return doc


@dataclass
class Library:
    path: str
    kind: str  # "shared-object" | "cubins" | "fatbin"
    units: list[Unit] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    kernels: dict[str, set[str]] | None = None  # kernel -> targets it exists for
    # fatbins whose (small) cubins hold no kernel: CUDA 13's device-link stub, or units
    # with no __global__ function; nothing there can be launched, so they are not counted
    link_stubs: int = 0
    # fatbins found by magic outside .nv_fatbin/__nv_relfatbin (CUPTI embeds its own): seen and
    # listed, but not counted, since no CUDA loader registers them for this library's launches
    embedded: list[Unit] = field(default_factory=list)

    @property
    def counts(self) -> v.Counts:
        counts = v.Counts()
        for unit in self.units:
            counts = counts.add(unit.cls)
        return counts

    @property
    def verdict(self) -> str:
        return v.rollup(self.counts)

    def add_kernels(self, names: Iterable[str], target: str) -> None:
        """Record that `names` exist for `target`; the first call switches the listing on."""
        if self.kernels is None:
            self.kernels = {}
        for name in names:
            self.kernels.setdefault(name, set()).add(target)

    def targets(self, which: str) -> list[str]:
        names: list[str] = []
        for unit in self.units:
            names.extend(unit.sass if which == "sass" else unit.ptx)
        return v.sort_targets(names)

    def kernel_classes(self, gpu: v.Gpu) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {v.NATIVE: [], v.JIT_ONLY: [], v.MISSING: []}
        for name, targets in sorted((self.kernels or {}).items()):
            out[v.classify_targets(map(v.split_target, targets), gpu)].append(name)
        return out

    def to_json(self, gpu: v.Gpu) -> dict[str, Any]:
        counts = self.counts
        doc: dict[str, Any] = {
            "path": self.path,
            "kind": self.kind,
            "fatbins": counts.units,
            "native": counts.native,
            "jit_only": counts.jit_only,
            "missing": counts.missing,
            "sass": self.targets("sass"),
            "ptx": self.targets("ptx"),
            "verdict": self.verdict,
            "link_stubs": self.link_stubs,
            "embedded": len(self.embedded),
            # per translation unit: where a per-library target list hides a gap
            "units": [unit.to_json() for unit in self.units],
        }
        if self.embedded:
            doc["embedded_units"] = [unit.to_json() for unit in self.embedded]
        if self.problems:
            doc["unreadable"] = list(self.problems)
        if self.warnings:
            doc["warnings"] = list(self.warnings)
        if self.kernels is not None:
            doc["kernels"] = {k: v.sort_targets(t) for k, t in sorted(self.kernels.items())}
            doc["kernel_classes"] = self.kernel_classes(gpu)
        return doc


def unit_from_entries(
    name: str, entries: tuple[Entry, ...], gpu: v.Gpu, rejected: Mapping[int, str] | None = None
) -> Unit:
    """One unit; `rejected`: index of an entry -> why its payload does not prove its header."""
    bad = rejected or {}
    kept = [e for i, e in enumerate(entries) if i not in bad]
    sass = v.sort_targets(e.target for e in kept if e.kind == "cubin")
    ptx = v.sort_targets(e.target for e in kept if e.kind == "ptx")
    other = v.sort_targets(e.target for e in kept if e.kind not in ("cubin", "ptx"))
    cls = v.classify_targets(((e.kind, e.sm, e.variant) for e in kept), gpu)
    return Unit(
        name=name, cls=cls, sass=tuple(sass), ptx=tuple(ptx), other=tuple(other),
        rejected=tuple(bad[i] for i in sorted(bad)),
    )


def library_from_scan(
    path: str,
    scan: BinaryScan,
    gpu: v.Gpu,
    stubs: frozenset[int] = frozenset(),
    rejected: Mapping[tuple[int, int], str] | None = None,
) -> Library:
    """A shared object's (or bare fatbin file's) library entry.

    `stubs`: offsets of link stubs; `rejected`: (fatbin offset, entry index) -> reason.
    """
    kind = "fatbin" if scan.kind == "fatbin" else "shared-object"
    lib = Library(path=path, kind=kind, problems=list(scan.problems), warnings=list(scan.warnings))
    bad = rejected or {}
    for fb in scan.fatbins:
        if fb.section == EMBEDDED:
            unit = unit_from_entries(f"{EMBEDDED}@{fb.offset:#x}", fb.entries, gpu)
            lib.embedded.append(unit if not fb.problem else replace(unit, rejected=(fb.problem,)))
            continue
        if fb.offset in stubs:
            lib.link_stubs += 1
            continue
        name = f"{fb.section}@{fb.offset:#x}"
        mine = {i: reason for (off, i), reason in bad.items() if off == fb.offset}
        lib.problems.extend(f"{name}: {reason}" for _i, reason in sorted(mine.items()))
        lib.units.append(unit_from_entries(name, fb.entries, gpu, mine))
    if lib.embedded:
        first = lib.embedded[0].name
        lib.warnings.append(f"{len(lib.embedded)} fatbin(s) embedded outside .nv_fatbin (first: {first}): listed apart, not counted")
    return lib


def glob_matches(pattern: str, path: str) -> bool:
    """A site-packages-relative glob ('vllm/_C*.so') against any path ending in it."""
    pat_parts = pattern.strip("/").split("/")
    path_parts = path.strip("/").split("/")
    if len(path_parts) < len(pat_parts):
        return False
    tail = path_parts[len(path_parts) - len(pat_parts) :]
    return all(fnmatch.fnmatchcase(p, g) for p, g in zip(tail, pat_parts, strict=True))


def _counts_of(path: str, by_path: dict[str, Library]) -> v.Counts | None:
    """Unit counts of the file at `path`: its library, or its own unit in a cubins directory."""
    lib = by_path.get(path)
    if lib is not None and lib.kind != "cubins":
        return lib.counts
    # bare cubins are grouped under their directory (a lone cubin target under itself)
    group = by_path.get(posixpath.dirname(path) or path)
    if group is None or group.kind != "cubins":
        return None
    name = posixpath.basename(path)
    counts = v.Counts()
    for unit in group.units:
        if unit.name == name:
            counts = counts.add(unit.cls)
    return counts if counts.units else None


@dataclass
class CubinReport:
    """What `spark-images cubins` found; `.verdict`, `.missing_required`, `.to_json()`."""

    target: str
    gpu: v.Gpu
    libraries: list[Library]
    scanned: list[str]  # every file looked at, device code or not
    required: tuple[str, ...] = ()
    unreadable: list[dict[str, str]] = field(default_factory=list)
    warnings: list[dict[str, str]] = field(default_factory=list)

    @property
    def counts(self) -> v.Counts:
        total = v.Counts()
        for lib in self.libraries:
            total = total + lib.counts
        return total

    @property
    def verdict(self) -> str:
        return v.rollup(self.counts)

    @property
    def missing_required(self) -> list[str]:
        """One line per required glob that has no library with native code for the GPU."""
        out: list[str] = []
        by_path = {lib.path: lib for lib in self.libraries}
        for pattern in self.required:
            matched = [p for p in self.scanned if glob_matches(pattern, p)]
            if not matched:
                out.append(f"{pattern}: no such library in {self.target}")
                continue
            for path in matched:
                counts = _counts_of(path, by_path)
                if counts is None or counts.native == 0:
                    broken = [u["error"] for u in self.unreadable if u.get("path") == path]
                    if broken:
                        what = f"unreadable: {broken[0]}"
                    else:
                        what = "no device code" if counts is None else f"verdict {v.rollup(counts)}"
                    out.append(f"{path}: no native {self.gpu.name} code ({what}; required by {pattern})")
        return out

    def to_json(self) -> dict[str, Any]:
        counts = self.counts
        doc: dict[str, Any] = {
            "target": self.target,
            "gpu": self.gpu.name,
            "verdict": self.verdict,
            "summary": {
                "libraries": len(self.libraries),
                "files_scanned": len(self.scanned),
                "fatbins": counts.units,
                "native": counts.native,
                "jit_only": counts.jit_only,
                "missing": counts.missing,
                # fatbins outside the fatbin sections, counted apart (see Library.embedded)
                "embedded": sum(len(lib.embedded) for lib in self.libraries),
                "embedded_in": sum(1 for lib in self.libraries if lib.embedded),
            },
            "libraries": [lib.to_json(self.gpu) for lib in self.libraries],
            "required": list(self.required),
            "missing_required": self.missing_required,
            "unreadable": list(self.unreadable),
            "warnings": list(self.warnings),
        }
        return doc


def record_section(report: CubinReport) -> dict[str, Any]:
    """The build record's `cubins` stage: failed when a required library lacks native code."""
    doc = report.to_json()
    missing = report.missing_required
    status = "failed" if missing else "passed"
    reason = "; ".join(missing) if missing else ""
    section: dict[str, Any] = {"status": status}
    if reason:
        section["reason"] = reason
    section.update(doc)
    return section

"""ready / degraded / broken from the reasons, and the check's JSON document (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from spark_images.check import rules
from spark_images.check.inventory import Inventory

READY = "ready"
DEGRADED = "degraded"
BROKEN = "broken"
VERDICTS = (READY, DEGRADED, BROKEN)


def decide(reasons: Sequence[rules.Reason]) -> str:
    """broken if any reason breaks serving on the GPU, degraded if any other, else ready."""
    if any(r.impact == "broken" for r in reasons):
        return BROKEN
    return DEGRADED if reasons else READY


@dataclass
class CheckResult:
    target: str
    kind: str
    gpu: str
    digest: str | None
    inventory: Inventory
    libraries: list[dict[str, Any]]
    audit: dict[str, Any]
    unreadable: list[dict[str, str]] = field(default_factory=list)
    files_seen: int = 0
    reasons: list[rules.Reason] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return decide(self.reasons)

    def summary(self) -> dict[str, int]:
        total = {"libraries": len(self.libraries), "fatbins": 0, "native": 0, "jit_only": 0, "missing": 0}
        for lib in self.libraries:
            for key in ("fatbins", "native", "jit_only", "missing"):
                total[key] += int(lib.get(key, 0))
        # fatbins outside the fatbin sections (CUPTI's): counted apart, in how many files
        total["embedded"] = sum(int(lib.get("embedded", 0)) for lib in self.libraries)
        total["embedded_in"] = sum(1 for lib in self.libraries if lib.get("embedded"))
        return total

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "kind": self.kind,
            "gpu": self.gpu,
            "digest": self.digest,
            "verdict": self.verdict,
            "reasons": [r.to_json() for r in self.reasons],
            "inventory": self.inventory.to_json(),
            "device_code": {"summary": self.summary(), "libraries": self.libraries},
            "fixes": self.audit,
            "unreadable": self.unreadable,
            "files_read": self.files_seen,
        }


def judge(result: CheckResult) -> CheckResult:
    """Apply the rules to the gathered facts (fills `reasons`)."""
    result.reasons = rules.apply(result.inventory, result.libraries, result.audit, result.gpu)
    return result

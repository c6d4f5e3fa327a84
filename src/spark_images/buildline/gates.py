"""Whether the build line stops, and whether the lock may be written (pure).

Decided from the stage results alone (`stages`), never from record dicts.

Which skipped stages still allow the lock (a gate that did not run is not a
pass, and the lock entry says which ones did not run):
- coherence skipped (no sm_121 GPU here): allowed, recorded with its reason.
Every entry `build` writes is a `candidate` (even one whose coherence gate
passed here); only `publish` with a passed Spark record makes it `promoted`
(`lock.promote`);
- audit skipped (no vLLM history) while the profile requires no fix:
  allowed, recorded with its reason;
- audit skipped while the profile requires fixes: NOT allowed. The line still
  builds and inspects the image (so the record is useful), but the lock is
  not written and the exit code is 1: the required fixes are unproven.

The `check` verdict of the built archive (`after_check`) is recorded on every
run and is a gate: a `broken` one, for any reason (a toolchain rule, a missing
essential fact such as a CUDA torch, a package that is not installed), stops
the line and the lock is not written. The record's `verdict` stage follows
that verdict alone (`verdict_status`): broken -> failed with its reasons,
degraded -> passed with its reasons as warnings, ready -> passed. The cubin
gate runs first: the profile's verify.native_libraries says which device code
this image must carry, and its reasons name libraries the verdict also sees.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from spark_images.buildline.stages import FAILED, PASSED, SKIPPED, Audited, Gated, Scanned
from spark_images.core.errors import EXIT_FINDING

if TYPE_CHECKING:  # types only: importing the check room pulls in its readers
    from spark_images.check.verdict import CheckResult

# check.verdict.BROKEN / DEGRADED: a verdict, and the impact of each of its reasons
BROKEN = "broken"
DEGRADED = "degraded"

# cubin verdicts under which nothing in the image runs natively on the GPU
NO_NATIVE_CODE = ("missing", "no-gpu-code", "jit-only")


@dataclass(frozen=True)
class Stop:
    """The line ends at `stage` with `exit_code`; `reason` goes to the record."""

    stage: str
    reason: str
    exit_code: int = EXIT_FINDING
    status: str = FAILED


@dataclass(frozen=True)
class LockDecision:
    allowed: bool
    reason: str = ""  # why not, when not allowed


def _prs(numbers: tuple[int, ...]) -> str:
    return ", ".join(f"#{n}" for n in numbers)


def after_audit(audited: Audited, vllm_commit: str) -> Stop | None:
    """A required fix the history proves missing stops the line."""
    if audited.status == FAILED and audited.missing:
        return Stop("audit", f"required fixes missing from vLLM {vllm_commit[:12]}: {_prs(audited.missing)}")
    return None


def after_scan(scanned: Scanned, gpu: str) -> Stop | None:
    """Every required library must carry native code, and the image some at all.

    An image-wide `partial` is expected (torch and friends ship code for other
    GPUs too); the required globs are the profile's real demand.
    """
    if scanned.missing_required:
        return Stop("cubins", "; ".join(scanned.missing_required))
    if scanned.verdict in NO_NATIVE_CODE:
        return Stop("cubins", f"verdict {scanned.verdict}: no {gpu} code at all")
    return None


@dataclass(frozen=True)
class VerdictStatus:
    """The record's `verdict` stage, from the verdict computed from content alone."""

    status: str  # failed for broken; passed for degraded (with warnings) and ready
    reason: str = ""  # the broken reasons, one line each, joined
    warnings: tuple[str, ...] = ()  # the degraded reasons' lines


def verdict_status(check: CheckResult) -> VerdictStatus:
    lines = {impact: tuple(r.line() for r in check.reasons if r.impact == impact) for impact in (BROKEN, DEGRADED)}
    if check.verdict == BROKEN:
        return VerdictStatus(FAILED, "; ".join(lines[BROKEN]), lines[DEGRADED])
    return VerdictStatus(PASSED, "", lines[DEGRADED])


def after_check(scanned: Scanned) -> Stop | None:
    """A `broken` check stops the line, whatever its reasons (see the module doc)."""
    if scanned.check is None:
        return None
    found = verdict_status(scanned.check)
    return Stop("verdict", found.reason) if found.status == FAILED else None


def after_coherence(gated: Gated) -> Stop | None:
    if gated.status in (PASSED, SKIPPED):
        return None
    return Stop("coherence", gated.reason or f"status {gated.status}")


def lock_decision(audited: Audited, scanned: Scanned, gated: Gated) -> LockDecision:
    """May the lock be written, and as what (the gates before it passed or stopped the line)."""
    if audited.status != PASSED and audited.required:
        return LockDecision(
            False, f"not written: the profile requires fixes {_prs(audited.required)} and the audit did not run"
        )
    if after_scan(scanned, "") is not None or after_check(scanned) is not None or after_coherence(gated) is not None:
        return LockDecision(False, "not written: a gate failed")
    return LockDecision(True)

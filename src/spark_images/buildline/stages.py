"""What each stage of the build line hands to the next: frozen, typed results.

validate -> Validated(plan) -> audit -> Audited(report) -> render -> Rendered
-> build -> Built(ref, oci_archive) -> cubins -> Scanned(report, check) -> coherence
-> Gated(section, recipes) -> lock -> Locked(path, image, state). `gates` decides
from these alone whether the line goes on and whether the lock may be written;
the record, the Markdown report, the lock entry and the audit predicate are
serialised from them at the end (`serialise`). No stage reads another stage's
record section.

A stage that cannot run for a reason outside the input raises `StageError`
(its exit code says finding or environment); a verdict (a missing fix, a
library without sm_121 code, incoherent output) is a field of the result.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_images.core.errors import EXIT_FINDING, SparkImagesError

if TYPE_CHECKING:  # types only: importing the stage results pulls in no stage
    from spark_images.audit.states import AuditReport
    from spark_images.buildline.plan import BuildPlan
    from spark_images.check.verdict import CheckResult
    from spark_images.cubins.report import CubinReport
    from spark_images.recipes.gate import RecipeRun
    from spark_images.recipes.model import Recipe

PASSED = "passed"
FAILED = "failed"
SKIPPED = "skipped"
ERROR = "error"


class StageError(Exception):
    """A stage could not produce its result: what the record says about it."""

    def __init__(self, stage: str, reason: str, exit_code: int, **details: Any) -> None:
        super().__init__(reason)
        self.stage = stage
        self.reason = reason
        self.exit_code = exit_code
        self.details = details

    @property
    def status(self) -> str:
        return FAILED if self.exit_code == EXIT_FINDING else ERROR

    @classmethod
    def of(cls, stage: str, exc: SparkImagesError, **details: Any) -> StageError:
        """From another room's error: its exit code decides failed (1) or error (2)."""
        reason = "; ".join(line.removeprefix(": ") for line in exc.lines())
        return cls(stage, reason, exc.exit_code, **details)


@dataclass(frozen=True)
class Validated:
    plan: BuildPlan
    base_dir: Path
    warnings: tuple[str, ...] = ()
    recipes: tuple[Recipe, ...] = ()  # what plan.coherence.recipes names, read and checked at validate


@dataclass(frozen=True)
class Audited:
    """The audit of the plan's vLLM commit; `report` is None when it was skipped."""

    status: str  # passed, failed (a required fix is missing) or skipped (no history)
    required: tuple[int, ...]
    from_patches: tuple[int, ...]  # PRs the plan's patches backport: known without history
    report: AuditReport | None = None
    reason: str = ""  # why skipped, or which fixes are missing
    commit_time: int | None = None

    @property
    def missing(self) -> tuple[int, ...]:
        return tuple(sorted({f.pr for f in self.report.missing_required})) if self.report else ()

    @property
    def fixes_included(self) -> tuple[int, ...]:
        """What the audit found present (with the patches'), or the patches' alone when skipped."""
        found = set(self.report.included_prs()) if self.report else set()
        return tuple(sorted(found | set(self.from_patches)))

    @property
    def source(self) -> str:
        return "audit of the vLLM history" if self.report else "plan patches only (no history)"


@dataclass(frozen=True)
class Rendered:
    context: Path
    dockerfile: Path


@dataclass(frozen=True)
class Built:
    """The image the build made: by digest, in the local engine and perhaps a registry.

    `oci_archive` is the archive buildx wrote; it exists until the line ends
    (or stays at build/NAME/image.oci.tar with --keep-oci).
    """

    repository: str
    digest: str
    config_digest: str
    oci_archive: Path
    local_image: str
    source_date_epoch: int
    source_date_epoch_from: str
    platform: str
    emulated: bool
    build_seconds: float
    pushed: bool = False
    registry_digest: str | None = None
    ca_cert: str | None = None
    cache: str | None = None
    kept_oci: Path | None = None
    seconds: float = 0.0

    @property
    def ref(self) -> str:
        """REPOSITORY@DIGEST: the pushed image, or the local repository's name for it."""
        return f"{self.repository}@{self.digest}"

    @property
    def runnable(self) -> str:
        """What the engine can run: the pushed image by digest, else the loaded local name."""
        return self.ref if self.pushed else self.local_image


@dataclass(frozen=True)
class ScanKey:
    """What a cubin verdict depends on: reuse one only when all four are equal."""

    digest: str
    tool_version: str
    gpu: str
    globs: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"digest": self.digest, "tool_version": self.tool_version, "gpu": self.gpu, "globs": list(self.globs)}


@dataclass(frozen=True)
class Scanned:
    """The cubin inspector's answer for the built image.

    Always a scan of this build's own archive, from the one read `check` shares:
    an earlier record's verdict is never reused, since that read is cheap (see
    benchmarks/build_scan.py) and a reused verdict would need its own proof."""

    key: ScanKey
    target: str  # what was read: the OCI archive, a registry image or docker://NAME
    verdict: str
    missing_required: tuple[str, ...]
    report: CubinReport | None = None  # the record's `cubins` section is its JSON
    # `check` of the same archive, from the same read (the record's `verdict` section)
    check: CheckResult | None = None


@dataclass(frozen=True)
class Gated:
    """The coherence gate on the built image: its verdict, its runner's JSON, its recipes' runs.

    `section` is the record's `coherence` section as the runner wrote it;
    `recipes` are the same runs typed, one per recipe the profile lists (what
    the lock keeps of them).
    """

    status: str  # passed, failed or skipped
    reason: str
    section: Mapping[str, Any] = field(default_factory=dict)
    recipes: tuple[RecipeRun, ...] = ()


@dataclass(frozen=True)
class Locked:
    """The lock stage: the candidate entry written to the lock, or why it was not.

    `path`, `image` and `state` are set when it passed: the lock file, the
    entry's image and the state the lock holds for it now (a rebuild to a
    promoted digest stays promoted).
    """

    status: str  # passed, or skipped (`gates.lock_decision` did not allow it)
    reason: str = ""  # why skipped
    path: Path | None = None
    image: str = ""
    state: str = ""

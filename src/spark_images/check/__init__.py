"""One verdict for any vLLM image or wheel set before it runs: `spark-images check`.

`check_target(target, gpu="sm_121", repo=None, audit=True) -> CheckResult` reads
the target once (`collect`), applies the toolchain rules to what is inside
(`rules`, keyed by the ids of `spark_images.profiles.toolchain.RULES`) and decides
ready / degraded / broken (`verdict`). The build line calls `gather` (with the
profile's required globs) and `judge_gathered` on the OCI archive it built: one
read gives both the check and the cubin gate's report (`Gathered.cubins`).
`diff.compare` sets two results side by side; `report` renders terminal text
and Markdown; `vllm_source` reads the serve flags, environment variables and
backend names from the image's own vLLM source (with `ast`, never imported).
`collect` is the only module here that does I/O.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spark_images import defaults
from spark_images.check.collect import Gathered, audit_doc, gather, run_audit
from spark_images.check.verdict import CheckResult, judge
from spark_images.core.errors import UsageError
from spark_images.cubins.verdict import parse_gpu
from spark_images.readers import artifacts


def check_target(
    target: str,
    gpu: str = defaults.GPU,
    *,
    repo: Path | None = None,
    audit: bool = True,
    progress: artifacts.Progress | None = None,
) -> CheckResult:
    """Read `target`, judge it; raises UsageError / EnvironmentProblem when it cannot be read."""
    try:
        gpu = parse_gpu(gpu).name
    except ValueError as exc:
        raise UsageError(f"--gpu {gpu}: {exc}") from exc
    found = gather(target, gpu, progress=progress)
    if audit:
        fixes = run_audit(found.inventory.vllm_commit, repo)
    else:
        fixes = {"status": "skipped", "reason": "--no-audit given"}
    return judge_gathered(found, gpu, fixes)


def judge_gathered(found: Gathered, gpu: str, fixes: dict[str, Any]) -> CheckResult:
    """The verdict on what `gather` read, with `fixes` from `run_audit` (or the build's own audit)."""
    result = CheckResult(
        target=found.target, kind=found.kind, gpu=gpu, digest=found.digest, inventory=found.inventory,
        libraries=found.libraries, audit=fixes, unreadable=found.unreadable, files_seen=found.files_seen,
    )  # fmt: skip
    return judge(result)


__all__ = ["CheckResult", "Gathered", "audit_doc", "check_target", "gather", "judge_gathered"]

"""Is there a DGX Spark GPU (compute capability 12.1) here?

Coherence and speed mean something only on sm_121; anywhere else the stage
is recorded `skipped` with the reason found, never passed.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

SPARK_CAPABILITY = "12.1"
QUERY = ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"]


@dataclass(frozen=True)
class GpuCheck:
    ok: bool
    reason: str
    capabilities: tuple[str, ...] = ()


def judge_capabilities(output: str) -> GpuCheck:
    """Pure: the verdict on nvidia-smi's `compute_cap` column."""
    caps = tuple(line.strip() for line in output.splitlines() if line.strip())
    if not caps:
        return GpuCheck(False, "nvidia-smi lists no GPU")
    if SPARK_CAPABILITY in caps:
        return GpuCheck(True, f"GPU compute capability {SPARK_CAPABILITY}", caps)
    shown = ", ".join(dict.fromkeys(caps))
    return GpuCheck(False, f"GPU compute capability {shown}", caps)


def detect_sm121(timeout_s: float = 30.0) -> GpuCheck:
    if shutil.which("nvidia-smi") is None:
        return GpuCheck(False, "no nvidia-smi")
    try:
        proc = subprocess.run(QUERY, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return GpuCheck(False, f"nvidia-smi did not run ({exc.__class__.__name__})")
    if proc.returncode != 0:
        first = (proc.stderr or proc.stdout).strip().splitlines()[:1]
        return GpuCheck(False, f"nvidia-smi failed: {first[0] if first else f'exit {proc.returncode}'}")
    return judge_capabilities(proc.stdout)

"""The rendered Dockerfile's nvcc version check, run against what a real nvcc prints.

The render itself (golden, deterministic, pinned): tests/unit/spine/test_spine_render.py.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from spark_images.buildline.render import render_dockerfile
from spark_images.buildline.resolve import resolve_profile

REPO = Path(__file__).resolve().parents[3]
PROFILES = sorted((REPO / "profiles").glob("*.yaml"))


def _nvcc_check(profile: Path) -> str:
    """The toolchain stage's nvcc version test, as the rendered Dockerfile runs it."""
    text = render_dockerfile(resolve_profile(profile).plan)
    line = next(line for line in text.splitlines() if 'case "$nvcc_version" in' in line)
    return line.strip().removesuffix("\\").strip()


def _run_check(check: str, nvcc: str) -> subprocess.CompletedProcess[str]:
    script = f'set -euo pipefail; nvcc_version="$({shlex.quote(nvcc)} --version)"; {check}'
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)


def test_nvcc_check_accepts_what_a_real_nvcc_prints_and_refuses_another_release(nvcc: str, tmp_path: Path) -> None:
    """A real nvcc prints e.g. `Cuda compilation tools, release 13.0, V13.0.88`: the check
    of the profile of that release passes on it, the check of another release stops the build."""
    printed = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    release = re.search(r"release (\d+\.\d+), V(\d+\.\d+)\.\d+", printed)
    assert release is not None, printed
    by_release = {".".join(p["cuda"]["version"].split(".")[:2]): p for p in map(_profile_doc, PROFILES)}
    own = by_release.get(release.group(1))
    if own is None:
        pytest.skip(f"no shipped profile pins CUDA {release.group(1)}, the release of {nvcc}")
    assert _run_check(_nvcc_check(own["_path"]), nvcc).returncode == 0, _nvcc_check(own["_path"])
    for mm, other in by_release.items():
        if mm != release.group(1):
            refused = _run_check(_nvcc_check(other["_path"]), nvcc)
            assert refused.returncode == 1 and f"nvcc is not CUDA {mm}:" in refused.stderr, refused
    # what an older check looked for ("release 13,") is not in what nvcc prints
    assert f"release {release.group(1).split('.')[0]}," not in printed


def _profile_doc(path: Path) -> dict[str, Any]:
    import yaml

    return {**yaml.safe_load(path.read_text()), "_path": path}

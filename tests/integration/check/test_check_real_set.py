"""`check` on what `pip install vllm==0.33.0` puts on a Spark, and on a CPU-only torch variant.

The site-packages is made here by pip itself, from the real PyPI wheels
(sha256-checked against the index, cached under the test cache):

    pip install --target DIR --platform manylinux_2_28_aarch64 --only-binary=:all: \\
        --no-deps --python-version 3.12 --implementation cp WHEEL...

(plus the older manylinux tags pip does not derive from that one by itself,
so that the manylinux2014 CUDA wheels are accepted). The wheels are vllm,
torch (the PyPI aarch64 build, CUDA 13.0), triton, flashinfer-python and
nvidia-cutlass-dsl at the versions vllm 0.33.0 resolves to, and of the
CUDA wheels pip resolves with them (`pip install --dry-run --report`, on
2026-12-01) the ones the toolkit rules read: cuda-toolkit 13.0.3.0,
nvidia-cuda-runtime 13.0.96 and nvidia-nvjitlink 13.5.37. The other CUDA
wheels of that resolution (cuBLAS, cuDNN, NCCL, ...: 2.6 GB more) decide no
rule, so they are not downloaded: 1.17 GB in all, 3.3 GB installed.

The CPU-only variant is that tree with torch/lib/libtorch_cuda.so removed and
`cuda = None` in torch/version.py, as a CPU build of torch has them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support import check_fixtures

pytestmark = [pytest.mark.network, pytest.mark.slow]

# (project, exact file) of every wheel of the set
WHEEL_FILES = (
    ("vllm", "vllm-0.33.0-cp38-abi3-manylinux_2_28_aarch64.whl"),
    ("torch", "torch-2.14.0-cp312-cp312-manylinux_2_28_aarch64.whl"),
    ("triton", "triton-3.8.0-cp312-cp312-manylinux_2_27_aarch64.manylinux_2_28_aarch64.whl"),
    ("flashinfer-python", "flashinfer_python-0.7.2.post1-py3-none-any.whl"),
    ("nvidia-cutlass-dsl", "nvidia_cutlass_dsl-4.8.0-py3-none-any.whl"),
    ("cuda-toolkit", "cuda_toolkit-13.0.3.0-py2.py3-none-any.whl"),
    ("nvidia-cuda-runtime", "nvidia_cuda_runtime-13.0.96-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl"),
    ("nvidia-nvjitlink", "nvidia_nvjitlink-13.5.37-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl"),
)
PLATFORMS = ["manylinux_2_28_aarch64", *(f"manylinux_2_{n}_aarch64" for n in range(27, 16, -1)), "manylinux2014_aarch64"]
SET_DIR = check_fixtures.TEST_CACHE / "check-real-set"
CPU_FIX = ("cuda: Optional[str] = '13.0'", "cuda: Optional[str] = None")


def _pip_target(dest: Path, wheels: list[Path]) -> None:
    platform_args = [arg for p in PLATFORMS for arg in ("--platform", p)]
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--target", str(dest), *platform_args,
         "--only-binary=:all:", "--no-deps", "--python-version", "3.12", "--implementation", "cp",
         *map(str, wheels)],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def real_set(pypi_reachable: None) -> Path:
    """The site-packages pip installs from the set (made once, kept in the test cache)."""
    site = SET_DIR / "site"
    done = SET_DIR / "site.complete"
    names = "\n".join(f for _p, f in WHEEL_FILES)
    if not (done.is_file() and done.read_text() == names):
        wheels = [check_fixtures.fetch_file(project, filename) for project, filename in WHEEL_FILES]
        subprocess.run(["rm", "-rf", str(site), str(done)], check=True)
        _pip_target(site, wheels)
        done.write_text(names)
    return site


@pytest.fixture(scope="module")
def cpu_only(real_set: Path) -> Path:
    """The same tree (hard links), torch made CPU-only the way a CPU build ships."""
    variant = SET_DIR / "cpu-only"
    subprocess.run(["rm", "-rf", str(variant)], check=True)
    subprocess.run(["cp", "-al", str(real_set), str(variant)], check=True)
    (variant / "torch" / "lib" / "libtorch_cuda.so").unlink()
    version = variant / "torch" / "version.py"
    text = version.read_text()
    assert CPU_FIX[0] in text, "torch/version.py no longer names its CUDA the way this test expects"
    version.unlink()  # a new file: the hard link to the real tree stays untouched
    version.write_text(text.replace(*CPU_FIX))
    return variant


def check(target: Path) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "spark_images", "check", str(target), "--no-audit", "--json"],
        capture_output=True, text=True, timeout=900, env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def test_the_real_set_is_degraded_for_exactly_two_rules(real_set: Path) -> None:
    rc, doc, stderr = check(real_set)
    assert rc == 1, stderr
    assert doc["verdict"] == "degraded"
    assert {r["rule"] for r in doc["reasons"] if r["rule"]} == {"no-nvcc-for-jit", "cuda-mixed-toolkits"}
    assert not [r for r in doc["reasons"] if r["impact"] == "broken"]
    mixed = next(r for r in doc["reasons"] if r["rule"] == "cuda-mixed-toolkits")["message"]
    assert "nvidia-nvjitlink 13.5.37 is 13.5 (newer)" in mixed and "cuda-toolkit 13.0.3.0 is 13.0" in mixed
    # the essential facts, each read from the files
    assert doc["inventory"]["torch"] == {"version": "2.14.0+cu130", "cuda": "13.0"}
    libs = {lib["path"]: lib for lib in doc["device_code"]["libraries"]}
    assert libs["torch/lib/libtorch_cuda.so"]["native"] > 0
    assert libs["vllm/_C_stable_libtorch.abi3.so"]["native"] > 0
    # Triton's two ptxas, versions from their bytes
    assert sorted(t["version"] for t in doc["inventory"]["cuda"]["triton_ptxas"]) == ["12.9.86", "13.3.33"]


def test_cuptis_fatbins_outside_nv_fatbin_are_seen_and_counted_apart(real_set: Path) -> None:
    _rc, doc, _stderr = check(real_set)
    embedded = {p: lib for p, lib in ((lib["path"], lib) for lib in doc["device_code"]["libraries"]) if lib["embedded"]}
    assert len(embedded) == 8 and all(p.startswith("triton/backends/nvidia/lib/cupti") for p in embedded), sorted(embedded)
    summary = doc["device_code"]["summary"]
    assert summary["embedded_in"] == 8 and summary["embedded"] == sum(lib["embedded"] for lib in embedded.values())
    for lib in embedded.values():
        assert lib["fatbins"] == 0 and lib["verdict"] == "no-gpu-code"  # not counted in any verdict


def test_a_cpu_only_torch_is_broken_naming_torch(cpu_only: Path) -> None:
    rc, doc, stderr = check(cpu_only)
    assert rc == 1, stderr
    assert doc["verdict"] == "broken"
    broken = {r["rule"]: r for r in doc["reasons"] if r["impact"] == "broken"}
    assert set(broken) == {"torch-no-cuda", "torch-no-gpu-code"}
    assert all(r["subject"] == "torch" for r in broken.values())
    assert "torch.version.cuda is None" in broken["torch-no-cuda"]["message"]
    assert doc["inventory"]["torch"]["cuda"] is None

"""The rules on facts read from real CUDA tool binaries from PyPI: the ptxas of CUDA 13.0 and 12.8.

The collector reads the tools' own bytes, laid into a directory target like an
image's root file system beside the facts of tests/unit/check/test_check_rules.py.
"""

from __future__ import annotations

import json
import zipfile

import pytest

from spark_images.check.inventory import ImageConfig, parse_tool
from spark_images.readers import artifacts
from support.build_helpers import CACHE, NVCC_WHEEL, NVCC_WHEEL_SHA256, NVCC_WHEEL_URL, _download
from support.check_facts import SITE, collect, metadata, reason_keys

OLD_NVCC = "nvidia-cuda-nvcc-cu12==12.8.93"  # CUDA 12.8: knows sm_120a, not yet sm_121a


@pytest.fixture(scope="module")
def ptxas_13(pypi_reachable: None) -> bytes:
    wheel = _download(NVCC_WHEEL_URL, NVCC_WHEEL_SHA256, CACHE / NVCC_WHEEL)
    with zipfile.ZipFile(wheel) as zf:
        return zf.read("nvidia/cu13/bin/ptxas")


@pytest.fixture(scope="module")
def ptxas_12_8(pypi_reachable: None) -> bytes:
    data = artifacts.read_one(OLD_NVCC, "bin/ptxas")
    assert data is not None
    return bytes(data)


def test_tool_versions_come_from_the_binaries(ptxas_13: bytes, ptxas_12_8: bytes) -> None:
    new, old = parse_tool("a/bin/ptxas", ptxas_13), parse_tool("b/bin/ptxas", ptxas_12_8)
    assert (new.release, new.build, new.knows_sm121a) == ("13.0", "13.0.88", True)
    assert (old.release, old.build, old.knows_sm121a) == ("12.8", "12.8.93", False)


def test_triton_with_an_old_bundled_ptxas_is_broken(ptxas_12_8: bytes, ptxas_13: bytes) -> None:
    files = {
        f"{SITE}/triton-3.3.1.dist-info/METADATA": metadata("triton", "3.3.1"),
        f"{SITE}/triton/backends/nvidia/bin/ptxas": ptxas_12_8,
        "usr/local/cuda-13.0/bin/ptxas": ptxas_13,
    }
    found = reason_keys(collect(files))
    reason = found["triton-ptxas-too-old:triton"]
    assert reason.impact == "broken" and "CUDA 12.8" in reason.message and "TRITON_PTXAS_PATH" in reason.fix
    # pointing TRITON_PTXAS_PATH at the toolkit's ptxas (through the usual cuda -> cuda-13.0 link) fixes it
    fixed = collect(files, ImageConfig(env=(("TRITON_PTXAS_PATH", "/usr/local/cuda/bin/ptxas"),)))
    assert fixed.triton_ptxas_target is not None and fixed.triton_ptxas_target.path == "usr/local/cuda-13.0/bin/ptxas"
    assert "triton-ptxas-too-old:triton" not in reason_keys(fixed)
    # ... and pointing it at a path the image lacks is named as such
    gone = reason_keys(collect(files, ImageConfig(env=(("TRITON_PTXAS_PATH", "/nowhere/ptxas"),))))
    assert "not in the image" in gone["triton-ptxas-too-old:triton"].message


def test_mixed_toolkits_and_torch_major(ptxas_13: bytes) -> None:
    files = {
        "usr/local/cuda-13.0/version.json": json.dumps({"cuda": {"name": "CUDA SDK", "version": "13.0.2"}}).encode(),
        "usr/local/cuda-13.0/bin/ptxas": ptxas_13,
        f"{SITE}/nvidia_cuda_nvcc-13.5.10.dist-info/METADATA": metadata("nvidia-cuda-nvcc", "13.5.10"),
        f"{SITE}/nvidia_nvjitlink-13.5.12.dist-info/METADATA": metadata("nvidia-nvjitlink", "13.5.12"),
        f"{SITE}/nvidia_cuda_runtime-13.0.96.dist-info/METADATA": metadata("nvidia-cuda-runtime", "13.0.96"),
        f"{SITE}/torch-2.9.0.dist-info/METADATA": metadata("torch", "2.9.0"),
        f"{SITE}/torch/version.py": b"__version__ = '2.9.0+cu129'\ncuda: Optional[str] = '12.9'\n",
    }
    inv = collect(files)
    assert inv.cuda_version() == ("13.0.2", "usr/local/cuda-13.0/version.json")
    assert (inv.torch_version, inv.torch_cuda) == ("2.9.0+cu129", "12.9")
    found = reason_keys(inv)
    mixed = found["cuda-mixed-toolkits:cuda"].message
    assert "nvidia-nvjitlink 13.5.12 is 13.5 (newer), used by PTX/LTO JIT linking" in mixed
    assert "toolkit usr/local/cuda-13.0 is 13.0" in mixed and "13.0.2" in found["cuda-mixed-toolkits:cuda"].fix
    assert found["torch-cuda-major-mismatch:torch"].impact == "broken"
    # one release everywhere: no mixed-toolkit reason
    files[f"{SITE}/nvidia_cuda_nvcc-13.5.10.dist-info/METADATA"] = metadata("nvidia-cuda-nvcc", "13.0.88")
    files[f"{SITE}/nvidia_nvjitlink-13.5.12.dist-info/METADATA"] = metadata("nvidia-nvjitlink", "13.0.88")
    assert "cuda-mixed-toolkits:cuda" not in reason_keys(collect(files))

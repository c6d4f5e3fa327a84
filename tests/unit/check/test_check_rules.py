"""The rules on facts read from real files: CUDA tool binaries from PyPI, real file formats.

The rules and the verdict are pure; these tests feed them what the collector
reads from a directory target laid out like an image's root file system
(dist-info METADATA, torch/version.py, CUDA version.json, ptxas binaries).
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from build_helpers import CACHE, NVCC_WHEEL, NVCC_WHEEL_SHA256, NVCC_WHEEL_URL, _download

from spark_images.check import rules
from spark_images.check.inventory import Collector, ImageConfig, parse_tool
from spark_images.check.verdict import decide
from spark_images.profiles import toolchain
from spark_images.readers import artifacts

OLD_NVCC = "nvidia-cuda-nvcc-cu12==12.8.93"  # CUDA 12.8: knows sm_120a, not yet sm_121a
SITE = "opt/venv/lib/python3.12/site-packages"


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


def metadata(name: str, version: str) -> bytes:
    return f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: x\n\nlong description\nName: not-this\n".encode()


def collect(files: dict[str, bytes], config: ImageConfig | None = None) -> Any:
    c = Collector(config)
    for path, data in files.items():
        assert c.wants(path), path
        c.add(path, data)
    return c.finish()


def reason_keys(inv: Any, libs: list[dict[str, Any]] | None = None) -> dict[str, rules.Reason]:
    return {r.key(): r for r in rules.apply(inv, libs or [], {"status": "skipped"}, "sm_121")}


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


def test_every_image_rule_is_in_the_one_table() -> None:
    # the rules `check` applies are exactly the table's image-scope rules
    assert set(rules.IMPACT) == set(toolchain.rules_for("image"))
    assert {"flashinfer-mismatch", "known-bad-pin", "no-nvcc-for-jit", "triton-ptxas-too-old", "removed-env-var",
            "torch-cuda-major-mismatch", "cuda-too-old", "cuda-mixed-toolkits", "no-native-moe-kernels",
            "torch-no-cuda", "torch-no-gpu-code", "vllm-no-native-main"} <= set(rules.IMPACT)  # fmt: skip


def test_flashinfer_mismatch_and_old_cuda() -> None:
    files = {
        f"{SITE}/flashinfer_python-0.6.18.dist-info/METADATA": metadata("flashinfer_python", "0.6.18"),
        f"{SITE}/flashinfer_cubin-0.6.17.dist-info/METADATA": metadata("flashinfer-cubin", "0.6.17"),
        f"{SITE}/torch/version.py": b"__version__ = '2.6.0+cu126'\ncuda = '12.6'\n",
    }
    found = reason_keys(collect(files))
    assert found["flashinfer-mismatch:flashinfer-cubin"].message == "flashinfer-python 0.6.18 and flashinfer-cubin 0.6.17 differ"
    assert found["cuda-too-old:torch/version.py"].impact == "broken"
    assert "no-nvcc-for-jit:nvcc" in found


def _lib(path: str, native: int, jit: int, missing: int, sass: list[str], ptx: list[str]) -> dict[str, Any]:
    units = native + jit + missing
    verdict = "native" if native == units else "partial" if native else "jit-only" if jit else "missing"
    return {"path": path, "fatbins": units, "native": native, "jit_only": jit, "missing": missing,
            "sass": sass, "ptx": ptx, "verdict": verdict}  # fmt: skip


def test_library_reasons_and_verdict() -> None:
    inv = collect({
        f"{SITE}/vllm-0.30.0.dist-info/METADATA": metadata("vllm", "0.30.0"),
        f"{SITE}/vllm/_version.py": b"__version__ = version = '0.30.0'\n__commit_id__ = commit_id = 'g0123456789'\n",
        f"{SITE}/torch-2.10.0.dist-info/METADATA": metadata("torch", "2.10.0"),
        f"{SITE}/torch/version.py": b"__version__ = '2.10.0+cu130'\ncuda: Optional[str] = '13.0'\n",
    })  # fmt: skip
    assert inv.vllm_commit == "0123456789"
    torch_lib = _lib(f"{SITE}/torch/lib/libtorch_cuda.so", 5, 0, 0, ["sm_120"], [])
    ok = [_lib(f"{SITE}/vllm/_C.abi3.so", 3, 0, 1, ["sm_90", "sm_120f"], []),
          _lib(f"{SITE}/vllm/_moe_C.abi3.so", 2, 0, 0, ["sm_120f"], []), torch_lib]  # fmt: skip
    assert reason_keys(inv, ok) == {} and decide(rules.apply(inv, ok, {}, "sm_121")) == "ready"
    jit = [_lib(f"{SITE}/vllm/_C.abi3.so", 0, 4, 0, ["sm_90"], ["compute_90"]),
           _lib(f"{SITE}/vllm/_moe_C.abi3.so", 0, 0, 2, ["sm_90"], []),
           _lib(f"{SITE}/vllm/_vllm_fa3_C.abi3.so", 0, 0, 9, ["sm_90a"], []), torch_lib]  # fmt: skip
    found = reason_keys(inv, jit)
    # a main library without native code is an essential fact missing, JIT-only or not
    assert set(found) == {"vllm-no-native-main:vllm/_C.abi3.so", "no-native-moe-kernels:vllm/_moe_C.abi3.so"}
    assert found["vllm-no-native-main:vllm/_C.abi3.so"].impact == "broken"
    assert decide(list(found.values())) == "broken"
    gone = [_lib(f"{SITE}/vllm/_C.abi3.so", 0, 0, 4, ["sm_90"], []), torch_lib]
    assert decide(rules.apply(inv, gone, {}, "sm_121")) == "broken"
    moe_only = [_lib(f"{SITE}/vllm/_moe_C.abi3.so", 2, 0, 0, ["sm_120f"], []), torch_lib]
    assert "vllm-no-native-main:vllm/_C*.so" in reason_keys(inv, moe_only)
    failing = {"status": "failed", "failing": [{"pr": 40082, "state": "absent", "title": "fix"}]}
    fix = rules.apply(inv, ok, failing, "sm_121")
    assert [r.subject for r in fix] == ["#40082"] and decide(fix) == "degraded"


def test_a_cpu_only_torch_is_broken_naming_torch() -> None:
    files = {
        f"{SITE}/torch-2.14.0.dist-info/METADATA": metadata("torch", "2.14.0"),
        f"{SITE}/torch/version.py": b"__version__ = '2.14.0+cpu'\ncuda: Optional[str] = None\n",
    }
    torch_lib = _lib(f"{SITE}/torch/lib/libtorch_cuda.so", 4, 0, 0, ["sm_120"], [])
    found = reason_keys(collect(files), [torch_lib])
    assert found["torch-no-cuda:torch"].impact == "broken" and "torch.version.cuda is None" in found["torch-no-cuda:torch"].message
    assert "torch-no-gpu-code:torch" not in found  # the library is there with native code
    files[f"{SITE}/torch/version.py"] = b"__version__ = '2.14.0+cu130'\ncuda: Optional[str] = '13.0'\n"
    found = reason_keys(collect(files), [])
    assert set(found) - {"library:vllm"} == {"torch-no-gpu-code:torch"} and found["torch-no-gpu-code:torch"].impact == "broken"
    hopper = _lib(f"{SITE}/torch/lib/libtorch_cuda.so", 0, 0, 3, ["sm_90"], [])
    assert "no code for it (missing" in reason_keys(collect(files), [hopper])["torch-no-gpu-code:torch"].message
    ptx = _lib(f"{SITE}/torch/lib/libtorch_cuda.so", 0, 3, 0, [], ["compute_90"])
    # PTX runs after a JIT: a library line, not an essential fact missing
    assert set(reason_keys(collect(files), [ptx])) - {"library:vllm"} == {"library:torch/lib/libtorch_cuda.so"}


def test_a_site_packages_directory_is_a_target(tmp_path: Path) -> None:
    site = tmp_path / "lib" / "python3.12" / "site-packages"
    (site / "nvidia_cutlass_dsl-4.5.0.dist-info").mkdir(parents=True)
    (site / "nvidia_cutlass_dsl-4.5.0.dist-info" / "METADATA").write_bytes(metadata("nvidia-cutlass-dsl", "4.5.0"))
    proc = subprocess.run(
        [sys.executable, "-m", "spark_images", "check", str(tmp_path), "--json", "--no-audit"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["verdict"] == "broken" and doc["kind"] == "directory"
    assert {r["rule"] or r["subject"] for r in doc["reasons"]} == {"known-bad-pin", "vllm", "torch"}
    assert doc["fixes"] == {"status": "skipped", "reason": "--no-audit given"}
    assert doc["inventory"]["packages"][0]["location"] == "lib/python3.12/site-packages"


def test_arch_list_in_the_image_env() -> None:
    gh200 = collect({}, ImageConfig(env=(("TORCH_CUDA_ARCH_LIST", "9.0 10.0+PTX"),)))
    assert "arch-gh200-example:TORCH_CUDA_ARCH_LIST" in reason_keys(gh200)
    hopper = collect({}, ImageConfig(env=(("TORCH_CUDA_ARCH_LIST", "9.0a"),)))
    assert reason_keys(hopper)["arch-no-spark-target:TORCH_CUDA_ARCH_LIST"].impact == "degraded"
    spark = collect({}, ImageConfig(env=(("TORCH_CUDA_ARCH_LIST", "12.0f"),)))
    assert not any(k.startswith("arch-") for k in reason_keys(spark))

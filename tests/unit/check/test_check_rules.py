"""The rules on facts read from real file formats: laid out by hand, the way an image holds them.

The rules and the verdict are pure; these tests feed them what the collector
reads from a directory target laid out like an image's root file system
(dist-info METADATA, torch/version.py, CUDA version.json). The rules on real
CUDA tool binaries from PyPI (ptxas) are tests/integration/check/test_check_rules_pypi.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from spark_images.check import rules
from spark_images.check.inventory import ImageConfig
from spark_images.check.verdict import decide
from spark_images.profiles import toolchain
from support.check_facts import SITE, collect, metadata, reason_keys


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

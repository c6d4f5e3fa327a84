"""`spark-images check` and `diff` on three real images, through the registry and docker://.

The images (conftest.py) hold real PyPI wheels; every verdict and reason is
computed by the CLI from the pushed bytes. The fix audit runs for real and is
`skipped` here because no vLLM history can be had (github.com is unreachable,
and the test points the history at a path that does not exist).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.registry, pytest.mark.network, pytest.mark.slow]

VIAS = ("registry", "docker")
FA2 = "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"


def _env(tmp: Path) -> dict[str, str]:
    import os

    return {**os.environ, "SPARK_IMAGES_VLLM_GIT_URL": f"file://{tmp}/no-vllm-history", "XDG_CACHE_HOME": str(tmp)}


def cli(tmp: Path, *args: str) -> tuple[int, str, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "spark_images", *args], capture_output=True, text=True, timeout=900, env=_env(tmp)
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stdout, proc.stderr


def _targets(image: tuple[str, str]) -> dict[str, str]:
    local, remote = image
    return {"registry": remote, "docker": f"docker://{local}"}


@pytest.fixture(scope="module")
def checked(
    image_a: tuple[str, str], image_b: tuple[str, str], image_c: tuple[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, dict[str, tuple[int, dict[str, Any]]]]:  # fmt: skip
    """name -> via -> (exit code, check JSON), each image checked once per path."""
    tmp = tmp_path_factory.mktemp("check")
    out: dict[str, dict[str, tuple[int, dict[str, Any]]]] = {}
    for name, image in (("a", image_a), ("b", image_b), ("c", image_c)):
        for via, target in _targets(image).items():
            rc, stdout, stderr = cli(tmp, "check", target, "--json")
            assert stdout, stderr
            out.setdefault(name, {})[via] = (rc, json.loads(stdout))
    return out


def keys(doc: dict[str, Any]) -> set[str]:
    return {f"{r['rule'] or 'library'}:{r['subject']}" for r in doc["reasons"]}


def _same_everywhere(result: dict[str, tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    (rc_r, reg), (rc_d, dock) = result["registry"], result["docker"]
    assert rc_r == rc_d
    assert reg["verdict"] == dock["verdict"]
    assert reg["reasons"] == dock["reasons"]
    assert reg["inventory"] == dock["inventory"]
    assert reg["device_code"] == dock["device_code"]
    return reg


def test_a_old_vllm_with_flashinfer_and_no_nvcc(checked: dict[str, Any]) -> None:
    doc = _same_everywhere(checked["a"])
    assert checked["a"]["registry"][0] == 1
    assert doc["verdict"] == "broken"
    assert keys(doc) == {"library:torch", "no-nvcc-for-jit:nvcc", f"library:{FA2}"}
    by_key = {f"{r['rule'] or 'library'}:{r['subject']}": r for r in doc["reasons"]}
    assert by_key["library:torch"]["impact"] == "broken"
    assert by_key["no-nvcc-for-jit:nvcc"]["impact"] == "degraded"
    assert "0.6.11.post2" in by_key["no-nvcc-for-jit:nvcc"]["message"]
    assert "jit-only" in by_key[f"library:{FA2}"]["message"]
    versions = {p["name"]: p["version"] for p in doc["inventory"]["packages"]}
    assert versions["vllm"] == "0.22.0"
    assert versions["flashinfer-python"] == versions["flashinfer-cubin"] == "0.6.11.post2"
    assert doc["inventory"]["vllm"]["commit"], "vllm/_version.py names the release's commit"
    assert doc["inventory"]["cuda"]["nvcc"] == [] and doc["inventory"]["cuda"]["ptxas"] == []
    libs = {lib["path"].rsplit("dist-packages/", 1)[-1]: lib for lib in doc["device_code"]["libraries"]}
    assert libs["vllm/_C.abi3.so"]["native"] > 0 and libs["vllm/_moe_C.abi3.so"]["native"] > 0
    # flashinfer-cubin's trtllm-gen cubins exist for Blackwell datacenter parts only: listed, no reason
    assert any("flashinfer_cubin/cubins" in p for p in libs)
    fixes = doc["fixes"]
    assert fixes["status"] == "skipped" and "history unavailable" in fixes["reason"]


def test_b_current_vllm_with_bad_cutlass_and_removed_env(checked: dict[str, Any]) -> None:
    doc = _same_everywhere(checked["b"])
    assert doc["verdict"] == "broken"
    assert keys(doc) == {
        "known-bad-pin:nvidia-cutlass-dsl", "removed-env-var:VLLM_USE_FLASHINFER_MOE_FP4",
        "library:torch", f"library:{FA2}",
    }  # fmt: skip
    lines = [r["line"] for r in doc["reasons"]]
    assert any("nvidia-cutlass-dsl==4.5.0" in line and "4.5.1" in line for line in lines)
    assert any("--moe-backend" in line for line in lines)
    assert doc["inventory"]["config"]["env"]["VLLM_USE_FLASHINFER_MOE_FP4"] == "1"
    # no flashinfer in this image, so the nvcc rule has nothing to say
    assert "no-nvcc-for-jit:nvcc" not in keys(doc)


def test_c_built_by_our_template(checked: dict[str, Any]) -> None:
    doc = _same_everywhere(checked["c"])
    # the test profile installs the CUDA torch stand-in (tests/support/build_helpers.make_torch_wheel):
    # torch is proven from its files, and only vLLM's MoE library is missing
    assert doc["verdict"] == "degraded" and checked["c"]["registry"][0] == 1
    assert keys(doc) == {"no-native-moe-kernels:vllm/_moe_C*.so"}
    assert doc["inventory"]["torch"] == {"version": "2.13.0", "cuda": "13.0"}
    cuda = doc["inventory"]["cuda"]
    assert cuda["version"] == "13.0.88" and cuda["nvcc"]
    # TRITON_PTXAS_PATH names /usr/local/cuda/bin/ptxas, a path through the toolkit's link
    assert cuda["triton_ptxas_path"] == "/usr/local/cuda/bin/ptxas"
    target = cuda["triton_ptxas_path_target"]
    assert target["knows_sm_121a"] and target["release"] == "13.0"
    cfg = doc["inventory"]["config"]
    assert cfg["entrypoint"][:2] == ["vllm", "serve"]
    assert cfg["env"]["TORCH_CUDA_ARCH_LIST"] == "12.0f"
    assert any(k.startswith("org.opencontainers.image.") for k in cfg["labels"])
    (main,) = [lib for lib in doc["device_code"]["libraries"] if lib["path"].endswith("vllm/_C.abi3.so")]
    assert main["verdict"] == "native"
    (torch,) = [lib for lib in doc["device_code"]["libraries"] if lib["path"].endswith("torch/lib/libtorch_cuda.so")]
    assert torch["verdict"] == "native"


def test_diff_a_to_c_lists_packages_and_native_delta(
    image_a: tuple[str, str], image_c: tuple[str, str], tmp_path: Path
) -> None:
    md = tmp_path / "diff.md"
    rc, stdout, stderr = cli(tmp_path, "diff", image_a[1], image_c[1], "--json", "--markdown", str(md))
    assert rc in (0, 1), stderr
    diff = json.loads(stdout)
    changed = {p["name"]: (p["from"], p["to"]) for p in diff["packages"]["changed"]}
    assert changed["vllm"] == ("0.22.0", "0.29.0")
    removed = {p["name"] for p in diff["packages"]["removed"]}
    assert {"flashinfer-python", "flashinfer-cubin"} <= removed
    assert "six" in {p["name"] for p in diff["packages"]["added"]}
    libs = {lib["path"]: lib for lib in diff["libraries"]}
    main = libs["vllm/_C.abi3.so"]
    assert main["before"]["native"] > 0 and main["after"]["verdict"] == "native"
    assert main["native_delta"] == main["after"]["native"] - main["before"]["native"]
    moe = libs["vllm/_moe_C.abi3.so"]
    assert moe["before"]["native"] > 0 and not moe["after"]["present"] and moe["change"] == "lost native"
    assert rc == 1, "B loses native MoE code, so the diff reports a regression"
    assert any(r["rule"] == "no-native-moe-kernels" for r in diff["reasons"]["new"])
    text = md.read_text()
    assert "| vllm | 0.22.0 | 0.29.0 |" in text and "`vllm/_moe_C.abi3.so` | lost native" in text


def test_terminal_and_markdown_reports(image_b: tuple[str, str], tmp_path: Path) -> None:
    md = tmp_path / "b.md"
    rc, stdout, _stderr = cli(tmp_path, "check", image_b[1], "--markdown", str(md))
    assert rc == 1
    assert all(len(line) <= 100 for line in stdout.splitlines()), stdout
    assert "BROKEN" in stdout.splitlines()[0]
    text = md.read_text()
    assert "| impact | rule / library | reason | fix |" in text
    assert text.count("\n| broken |") + text.count("\n| degraded |") == 4  # one row per reason
    assert "<details><summary>Device code:" in text


def test_an_oci_archive_gives_the_registry_verdict(
    image_b: tuple[str, str], checked: dict[str, Any], tmp_path: Path
) -> None:
    archive = tmp_path / "b.oci.tar"
    subprocess.run(["docker", "save", "-o", str(archive), image_b[0]], check=True, capture_output=True, timeout=600)
    rc, stdout, stderr = cli(tmp_path, "check", str(archive), "--json")
    doc = json.loads(stdout)
    reg = checked["b"]["registry"][1]
    assert (rc, doc["kind"]) == (1, "oci-archive"), stderr
    assert doc["reasons"] == reg["reasons"] and doc["device_code"] == reg["device_code"]
    assert doc["inventory"]["config"] == reg["inventory"]["config"]

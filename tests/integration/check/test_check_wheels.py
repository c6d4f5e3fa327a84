"""check and diff on real PyPI wheels: a single wheel, a wheel set, and the diff of two releases."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support.check_fixtures import FLASHINFER_A, VLLM_A, VLLM_B, fetch_wheel

pytestmark = [pytest.mark.network, pytest.mark.slow]


def cli(*args: str) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "spark_images", *args, "--no-audit"],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def wheels(pypi_reachable: None) -> dict[str, Path]:
    return {
        "old": fetch_wheel(*VLLM_A, platform="aarch64"),
        "new": fetch_wheel(*VLLM_B, platform="aarch64"),
        "flashinfer": fetch_wheel("flashinfer-python", FLASHINFER_A),
    }


def test_a_wheel_set_directory_reads_every_wheel(wheels: dict[str, Path], tmp_path: Path) -> None:
    for key in ("old", "flashinfer"):
        (tmp_path / wheels[key].name).symlink_to(wheels[key])
    rc, stdout, stderr = cli("check", str(tmp_path), "--json")
    assert rc == 1, stderr
    doc = json.loads(stdout)
    assert {p["name"]: p["version"] for p in doc["inventory"]["packages"]} == {
        "vllm": "0.22.0", "flashinfer-python": FLASHINFER_A,
    }  # fmt: skip
    rules = {r["rule"] for r in doc["reasons"]}
    assert "no-nvcc-for-jit" in rules and "flashinfer-mismatch" not in rules  # no cubin wheel: nothing to mismatch
    assert any(lib["path"] == "vllm/_C.abi3.so" for lib in doc["device_code"]["libraries"])


def test_diff_of_two_releases(wheels: dict[str, Path], tmp_path: Path) -> None:
    md = tmp_path / "d.md"
    rc, stdout, stderr = cli("diff", str(wheels["old"]), str(wheels["new"]), "--json", "--markdown", str(md))
    diff: dict[str, Any] = json.loads(stdout)
    assert rc in (0, 1), stderr
    assert diff["packages"]["changed"] == [{"name": "vllm", "from": "0.22.0", "to": "0.33.0"}]
    libs = {lib["path"]: lib for lib in diff["libraries"]}
    # 0.33.0 ships only the stable-ABI builds of _C and _moe_C
    assert libs["vllm/_C.abi3.so"]["after"]["present"] is False and libs["vllm/_C.abi3.so"]["change"] == "lost native"
    assert libs["vllm/_moe_C_stable_libtorch.abi3.so"]["before"]["present"] is False
    assert libs["vllm/_moe_C_stable_libtorch.abi3.so"]["change"] == "gained native"
    for lib in diff["libraries"]:
        assert lib["native_delta"] == lib["after"]["native"] - lib["before"]["native"]
    assert rc == 1  # a library lost its native code (the file is gone)
    assert "| vllm | 0.22.0 | 0.33.0 |" in md.read_text()
    rc_text, text, _ = cli("diff", str(wheels["old"]), str(wheels["new"]))
    assert rc_text == rc and all(len(line) <= 100 for line in text.splitlines()), text

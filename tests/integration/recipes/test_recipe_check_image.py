"""`recipe check` on an image in the loopback registry: the same one pass `check` makes, over the registry API."""

from __future__ import annotations

import json

from support.recipe_support import RECIPES, run_cli


def test_recipe_check_reads_an_image_by_reference(image_b: tuple[str, str]) -> None:
    _local, remote = image_b
    proc = run_cli(["recipe", "check", str(RECIPES / "nemotron-3-super-120b-nvfp4.yaml"), "--image", remote, "--json"])
    assert proc.returncode == 1, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["kind"] == "registry" and doc["vllm"]["version"] == "0.33.0"
    assert {r["subject"] for r in doc["reasons"] if r["rule"] == "ignored-env-var"} == {
        "VLLM_NVFP4_GEMM_BACKEND", "VLLM_USE_FLASHINFER_MOE_FP4"}

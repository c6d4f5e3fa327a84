"""`spark-images recipe check` against site-packages made from the real vLLM 0.22.0 and 0.33.0 wheels.

The facts the check judges by come from the wheels' own files (arg_utils.py,
cli_args.py, envs.py, kernel.py, cache.py, the quantization registry, and
the cubin scan of `_C` / `_moe_C`); these tests name flags, variables and
kernels that differ between the two releases as measured from those files.
Its usage errors: tests/unit/recipes/test_recipe_check.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from support.recipe_support import RECIPES, run_cli, write_recipe

SUPER = "nemotron-3-super-120b-nvfp4"
ONLY_022 = "--max-num-partial-prefills"  # SchedulerConfig field gone from 0.33.0's EngineArgs
ONLY_033 = "--max-num-scheduled-tokens"  # new in 0.33.0's EngineArgs


def _check(recipe: Path, site: Path) -> tuple[int, dict]:
    proc = run_cli(["recipe", "check", str(recipe), "--image", str(site), "--json"])
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def _rules(doc: dict) -> set[str]:
    return {f"{r['rule']}:{r['subject']}" for r in doc["reasons"]}


def test_0_33_names_the_nvfp4_gemm_backend_variable_as_ignored(vllm_site: Callable[[str], Path]) -> None:
    rc, doc = _check(RECIPES / f"{SUPER}.yaml", vllm_site("0.33.0"))
    assert rc == 1 and doc["vllm"]["version"] == "0.33.0"
    assert "ignored-env-var:VLLM_NVFP4_GEMM_BACKEND" in _rules(doc)
    assert "ignored-env-var:VLLM_USE_FLASHINFER_MOE_FP4" in _rules(doc)
    reason = next(r for r in doc["reasons"] if r["subject"] == "VLLM_NVFP4_GEMM_BACKEND")
    assert reason["impact"] == "degraded"
    # counted from the wheels' own files: the issue's figures
    assert doc["facts"]["engine_args_fields"] == 259 and doc["facts"]["env_vars"] == 318


def test_0_22_knows_both_variables_and_says_they_are_deprecated(vllm_site: Callable[[str], Path]) -> None:
    _rc, doc = _check(RECIPES / f"{SUPER}.yaml", vllm_site("0.22.0"))
    assert not any(r["rule"] == "ignored-env-var" for r in doc["reasons"])
    assert any("VLLM_NVFP4_GEMM_BACKEND is deprecated" in n for n in doc["notes"])
    assert doc["facts"]["engine_args_fields"] == 209


@pytest.mark.parametrize(("flag", "known_in", "unknown_in"), [(ONLY_022, "0.22.0", "0.33.0"), (ONLY_033, "0.33.0", "0.22.0")])
def test_a_flag_one_release_lacks_is_unknown_there_and_accepted_in_the_other(
    flag: str, known_in: str, unknown_in: str, vllm_site: Callable[[str], Path], tmp_path: Path
) -> None:
    recipe = write_recipe(tmp_path, "gpt-oss-120b", "flag", serve__args=["--enable-prefix-caching", flag, "2"])
    rc, doc = _check(recipe, vllm_site(unknown_in))
    assert rc == 1 and f"unknown-flag:{flag}" in _rules(doc)
    assert next(r for r in doc["reasons"] if r["rule"] == "unknown-flag")["impact"] == "broken"
    rc, doc = _check(recipe, vllm_site(known_in))
    assert rc == 0, doc["reasons"]
    assert not doc["reasons"]


def test_spellings_vllm_accepts_are_accepted(vllm_site: Callable[[str], Path], tmp_path: Path) -> None:
    """FlexibleArgumentParser: underscores, =value, --no-X of a bool field, dotted JSON keys, -O3."""
    args = ["--enable_prefix_caching", "--no-enable-prefix-caching", "--max-num-batched-tokens=8192",
            "--compilation-config.cudagraph_mode", "FULL", "-O3", "-tp", "1"]
    recipe = write_recipe(tmp_path, "gpt-oss-120b", "spell", serve__args=args)
    rc, doc = _check(recipe, vllm_site("0.33.0"))
    assert rc == 0, doc["reasons"]


def test_a_typo_is_unknown_with_the_close_flag_offered(vllm_site: Callable[[str], Path], tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, "gpt-oss-120b", "typo", serve__args=["--enable-prefix-cachin"])
    rc, doc = _check(recipe, vllm_site("0.33.0"))
    assert rc == 0  # argparse takes an unambiguous prefix: vLLM accepts it
    recipe = write_recipe(tmp_path, "gpt-oss-120b", "typo2", serve__args=["--enable-prefx-caching"])
    rc, doc = _check(recipe, vllm_site("0.33.0"))
    assert rc == 1 and "did you mean --enable-prefix-caching?" in doc["reasons"][0]["fix"]


def test_b12x_linear_backend_is_unknown_on_0_22_and_known_on_0_33(vllm_site: Callable[[str], Path], tmp_path: Path) -> None:
    """0.22.0's LinearBackend Literal has no flashinfer_b12x (its opt-in was VLLM_NVFP4_GEMM_BACKEND)."""
    recipe = write_recipe(tmp_path, "qwen3.6-35b-a3b-nvfp4", "b12x",
                          serve__args=["--moe-backend", "flashinfer-b12x", "--linear-backend", "flashinfer_b12x"])
    _rc, doc = _check(recipe, vllm_site("0.22.0"))
    assert "unknown-backend:--linear-backend" in _rules(doc)
    assert "unknown-backend:--moe-backend" not in _rules(doc)  # dashes read as underscores, as vLLM does
    _rc, doc = _check(recipe, vllm_site("0.33.0"))
    assert not any(r["rule"] == "unknown-backend" for r in doc["reasons"])
    # the target is vLLM alone: FlashInfer's kernels are not in it
    assert "kernels-missing:flashinfer-python" in _rules(doc)


def test_unknown_attention_backend_and_kv_dtype(vllm_site: Callable[[str], Path], tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, "gpt-oss-120b", "attn", serve__args=["--attention-backend", "FLASH_ATTN_SM121"],
                          limits__kv_cache_dtype="fp3")
    rc, doc = _check(recipe, vllm_site("0.33.0"))
    assert rc == 1
    assert {"unknown-backend:--attention-backend", "unsupported-quantization:--kv-cache-dtype"} <= _rules(doc)


def test_gguf_is_gone_from_0_33_quantization_registry(vllm_site: Callable[[str], Path]) -> None:
    recipe = RECIPES / "smollm2-135m-instruct-gguf.yaml"
    rc, doc = _check(recipe, vllm_site("0.33.0"))
    assert rc == 1 and "unsupported-quantization:model.quantization" in _rules(doc)
    rc, doc = _check(recipe, vllm_site("0.22.0"))
    assert rc == 0, doc["reasons"]


def test_marlin_nvfp4_moe_kernels_are_jit_only_on_0_22_and_native_on_0_33(vllm_site: Callable[[str], Path]) -> None:
    """The cubin scan's kernel names: Marlin<bf16|fp16, fp4e2m1, ...> in _moe_C."""
    recipe = RECIPES / "nemotron-3-nano-30b-a3b-nvfp4.yaml"
    rc, doc = _check(recipe, vllm_site("0.22.0"))
    missing = [r for r in doc["reasons"] if r["rule"] == "kernels-missing"]
    assert rc == 1 and {r["subject"] for r in missing} == {"vllm/_moe_C.abi3.so", "vllm/_C.abi3.so"}
    assert all(r["impact"] == "degraded" and "only as PTX" in r["message"] for r in missing)
    rc, doc = _check(recipe, vllm_site("0.33.0"))
    assert rc == 0, doc["reasons"]


def test_a_recipe_with_nothing_wrong_exits_0_and_prints_the_command(vllm_site: Callable[[str], Path]) -> None:
    rc, doc = _check(RECIPES / "gpt-oss-120b.yaml", vllm_site("0.33.0"))
    assert rc == 0 and doc["verdict"] == "ok"
    assert doc["argv"][:3] == ["vllm", "serve", "openai/gpt-oss-120b"]
    assert "--revision" in doc["argv"] and "--max-model-len" in doc["argv"]

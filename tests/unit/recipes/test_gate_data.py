"""What the gate consumes of a recipe: the exact command, the record, the skip (never a pass)."""

from __future__ import annotations

from pathlib import Path

import yaml

from spark_images.profiles.profile import parse_profile
from spark_images.recipes import gate
from spark_images.recipes.model import load_recipe
from support.recipe_support import RECIPES, REPO, run_cli

DIGEST = "sha256:" + "ab" * 32


def test_serve_command_is_the_model_then_the_args_revision_and_limits() -> None:
    recipe = load_recipe(RECIPES / "gpt-oss-120b.yaml")
    argv, env = gate.serve_command(recipe)
    assert argv == ["vllm", "serve", "openai/gpt-oss-120b", "--enable-prefix-caching",
                    "--revision", "b5c939de8f754692c1647ca79fbf85e8c1e70f8a", "--max-model-len", "131072",
                    "--max-num-seqs", "4", "--gpu-memory-utilization", "0.8", "--kv-cache-dtype", "auto"]
    assert env == {}


def test_a_cluster_recipe_carries_its_interface_variables() -> None:
    recipe = load_recipe(RECIPES / "qwen3-235b-a22b-gptq-int4-2x.yaml")
    _argv, env = gate.serve_command(recipe)
    assert env == {"NCCL_SOCKET_IFNAME": "enp1s0f1np1", "GLOO_SOCKET_IFNAME": "enp1s0f1np1",
                   "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1", "UCX_NET_DEVICES": "enp1s0f1np1"}
    assert recipe.cluster is not None and recipe.cluster.ray_port == 6379


def test_without_a_spark_every_recipe_is_skipped_with_the_reason_never_passed() -> None:
    recipes = [load_recipe(p) for p in sorted(RECIPES.glob("*.yaml"))]
    out = gate.plan(recipes, gpu=None, digest=DIGEST)
    assert not out["serve"] and len(out["skipped"]) == len(recipes)
    for record in out["skipped"]:
        assert record["status"] == "skipped" and record["reason"].startswith("no sm_121 GPU")
        assert not gate.counts_as_passed(record)
    on_spark = gate.plan(recipes, gpu="sm_121", digest=DIGEST)
    reasons = {r["recipe"]: r["reason"] for r in on_spark["skipped"]}
    assert reasons["nemotron-3-super-120b-nvfp4"] == "the recipe pins no model revision"
    assert "gpt-oss-120b" in {s["recipe"] for s in on_spark["serve"]}


def test_the_lock_line_ties_recipe_digest_and_speed() -> None:
    recipe = load_recipe(RECIPES / "gpt-oss-120b.yaml")
    passed = gate.run_record(recipe, digest=DIGEST, status="passed", decode_tok_s=58.4, coherent=True, gpu="sm_121")
    assert gate.lock_line(passed) == f"recipe gpt-oss-120b passed on {DIGEST} at 58.4 tok/s"
    incoherent = gate.run_record(recipe, digest=DIGEST, status="passed", decode_tok_s=58.4, coherent=False, gpu="sm_121")
    assert not gate.counts_as_passed(incoherent)


def test_a_typed_run_keeps_for_the_lock_what_lock_recipes_keeps_of_its_record() -> None:
    """The build line hands the lock its recipes' runs typed (`RecipeRun`); their lock lines are
    those `lock_recipes` makes of the gate's records, key for key."""
    import json

    recipe = load_recipe(RECIPES / "gpt-oss-120b.yaml")
    argv, env = gate.serve_command(recipe)
    checked = {"status": "passed", "reasons": [], "speed": {"decode_tokens_per_s": 58.4}}
    records = [
        gate.judge_run(recipe, checked, digest=DIGEST, gpu="sm_121", ran={"argv": argv, "env": env}),
        gate.judge_run(recipe, checked, digest=DIGEST, gpu="sm_121", ran=None),  # passed checks, never seen run
        gate.judge_run(recipe, {**checked, "speed": {"decode_tokens_per_s": 0}}, digest=DIGEST, gpu="sm_121",
                       ran={"argv": argv, "env": env}),
        gate.skipped(recipe, DIGEST, "no sm_121 GPU (no nvidia-smi)"),
    ]
    assert [r["status"] for r in records] == ["passed", "failed", "failed", "skipped"]
    for record, kept in zip(records, gate.lock_recipes(records), strict=True):
        run = gate.RecipeRun.of(record)
        assert run.line == gate.lock_line(record) and run.decode_tok_s == record["decode_tok_s"]
        assert json.dumps(run.lock(), sort_keys=True) == json.dumps(kept, sort_keys=True)  # as the lock writes it
    assert "decode_tok_s" not in gate.RecipeRun.of(records[3]).lock()


def test_a_profile_lists_the_recipes_it_serves(tmp_path: Path) -> None:
    doc = yaml.safe_load((REPO / "profiles" / "cu130.yaml").read_text())
    doc["verify"].setdefault("coherence", {"models": ["openai/gpt-oss-120b"]})["recipes"] = ["gpt-oss-120b"]
    profile = parse_profile(yaml.safe_dump(doc), "cu130.yaml")
    assert profile.verify.coherence is not None and profile.verify.coherence.recipes == ("gpt-oss-120b",)
    doc["verify"]["coherence"]["recipes"] = ["../etc"]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc))
    proc = run_cli(["validate", "--no-audit", str(path)])
    assert proc.returncode == 1 and "verify.coherence.recipes[0]" in proc.stderr


def test_ten_or_more_shipped_recipes_validate_and_stay_unvalidated() -> None:
    paths = sorted(RECIPES.glob("*.yaml"))
    assert len(paths) >= 10
    proc = run_cli(["recipe", "validate", *map(str, paths)])
    assert proc.returncode == 0, proc.stderr
    assert all(load_recipe(p).status == "unvalidated" for p in paths)  # no gate has run them yet

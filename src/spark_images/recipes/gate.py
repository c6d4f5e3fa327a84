"""What the gate consumes of a recipe, and the record of one run (pure).

`serve_command(recipe)` is the exact `vllm serve` argv and environment a
Spark runs (the same list `recipe check` judges). `run_record(...)` is the
shape the coherence room writes per recipe and the lock keeps: "recipe X
passed on digest D at T tok/s"; where no Spark ran it, `skipped(...)` says
why, and a skipped run is never a pass (`counts_as_passed`).
"""

from __future__ import annotations

from typing import Any

from spark_images.recipes.model import LIMIT_FLAGS, Recipe

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


def limit_args(recipe: Recipe) -> list[str]:
    limits = recipe.limits
    values = {
        "max_model_len": str(limits.max_model_len),
        "max_num_seqs": str(limits.max_num_seqs),
        "gpu_memory_utilization": f"{limits.gpu_memory_utilization:g}",
        "kv_cache_dtype": limits.kv_cache_dtype,
    }
    return [part for key, flag in LIMIT_FLAGS.items() for part in (flag, values[key])]


def serve_args(recipe: Recipe) -> list[str]:
    """Everything after `vllm serve MODEL`: the recipe's args, then the revision and the limits."""
    revision = ["--revision", recipe.model.revision] if recipe.model.revision else []
    return [*recipe.serve_args, *revision, *limit_args(recipe)]


def serve_command(recipe: Recipe) -> tuple[list[str], dict[str, str]]:
    """(argv, env) of the served model; a cluster recipe adds its NCCL/Gloo interface variables."""
    env = dict(recipe.serve_env)
    if recipe.cluster is not None:
        env = {**recipe.cluster.link_env(), **env}
    return ["vllm", "serve", recipe.model.reference(), *serve_args(recipe)], env


def run_record(recipe: Recipe, *, digest: str, status: str, decode_tok_s: float | None,
               coherent: bool | None, gpu: str, reason: str = "") -> dict[str, Any]:
    """One recipe's result on one image digest, as the record and the lock keep it."""
    argv, env = serve_command(recipe)
    return {
        "recipe": recipe.name,
        "file": recipe.path,
        "digest": digest,
        "status": status,
        "decode_tok_s": decode_tok_s,
        "coherent": coherent,
        "gpu": gpu,
        "reason": reason,
        "argv": argv,
        "env": env,
        "expected_decode_tok_s": recipe.decode_tok_s.value,
    }


def skipped(recipe: Recipe, digest: str, reason: str) -> dict[str, Any]:
    """A recipe the gate could not serve here (no sm_121 GPU, no pinned revision): never a pass."""
    return run_record(recipe, digest=digest, status=SKIPPED, decode_tok_s=None, coherent=None, gpu="", reason=reason)


def why_not_runnable(recipe: Recipe, gpu: str | None) -> str | None:
    """The reason a gate must skip this recipe, or None when it can serve it."""
    if gpu != "sm_121":
        return f"no sm_121 GPU ({gpu or 'none found'})"
    if recipe.model.hub and not recipe.model.revision:
        return "the recipe pins no model revision"
    if recipe.cluster is not None:
        return "a two-Spark recipe runs under cluster plan, not on one Spark"
    return None


def counts_as_passed(record: dict[str, Any]) -> bool:
    """Only a run that served coherent output with a measured speed passes."""
    return record.get("status") == PASSED and record.get("coherent") is True and record.get("decode_tok_s") is not None


def lock_line(record: dict[str, Any]) -> str:
    """'recipe X passed on digest D at T tok/s' (or why it did not)."""
    if counts_as_passed(record):
        return f"recipe {record['recipe']} passed on {record['digest']} at {record['decode_tok_s']:g} tok/s"
    return f"recipe {record['recipe']} {record.get('status')} on {record['digest']}: {record.get('reason') or 'no reason given'}"


def plan(recipes: list[Recipe], *, gpu: str | None, digest: str) -> dict[str, list[Any]]:
    """What the gate does with a profile's `verify.coherence.recipes` on one digest:
    `serve` lists (name, argv, env) to run; `skipped` the records of those it cannot run here."""
    out: dict[str, list[Any]] = {"serve": [], "skipped": []}
    for recipe in recipes:
        reason = why_not_runnable(recipe, gpu)
        if reason is not None:
            out["skipped"].append(skipped(recipe, digest, reason))
        else:
            argv, env = serve_command(recipe)
            out["serve"].append({"recipe": recipe.name, "argv": argv, "env": env})
    return out

"""What the gate consumes of a recipe, and the record of one run (pure).

`serve_command(recipe)` is the exact `vllm serve` argv and environment a
Spark runs (the same list `recipe check` judges). `run_record(...)` is the
shape the coherence room writes per recipe and the lock keeps: "recipe X
passed on digest D at T tok/s"; where no Spark ran it, `skipped(...)` says
why, and a skipped run is never a pass (`counts_as_passed`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from spark_images import defaults
from spark_images.coherence.signatures import normalize_backend
from spark_images.coherence.verdict import AUTO, Combination
from spark_images.core.errors import Problem
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
    if gpu != defaults.GPU:
        return f"no {defaults.GPU} GPU ({gpu or 'none found'})"
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


# --- a profile's recipes, and the gate's verdict on one served recipe (still pure) ----------


def recipe_file(name: str) -> str:
    """Where a profile's `verify.coherence.recipes` entry lives, relative to the folder that holds profiles/."""
    return f"recipes/{name}.yaml"


def profile_problems(recipe: Recipe, profile: str, file: str, field: str) -> list[Problem]:
    """Why `profile` may not list this recipe for its gate: one line each, at the profile's field.

    The recipe must call itself by its file name, be meant for the profile
    (its `profiles` names it), and be servable by the single-Spark gate of a
    build: a hub model pinned by its commit (a local file is not in the
    image, and the build mounts none), one Spark (a cluster recipe runs under
    `cluster plan`).
    """
    where = recipe_file(recipe.name)
    out: list[Problem] = []
    if recipe.path.rsplit("/", 1)[-1] != f"{recipe.name}.yaml":
        out.append(Problem(file, field, f"{recipe.path} calls itself {recipe.name!r}",
                           f"rename the file to {where} or set its name to the file's"))
    if profile not in recipe.profiles:
        listed = ", ".join(recipe.profiles) or "none"
        out.append(Problem(file, field, f"{recipe.path} is meant for profiles {listed}, not {profile}",
                           f"add {profile} to the recipe's profiles once it suits this image, or drop it from the list"))
    if recipe.cluster is not None:
        out.append(Problem(file, field, f"{recipe.path} is a two-Spark recipe",
                           "gate it with `spark-images cluster plan`, not from a profile"))
    if recipe.model.hub is None:
        out.append(Problem(file, field, f"{recipe.path} serves a local file ({recipe.model.reference()}), "
                           "which the built image does not hold", "list a hub recipe pinned by its revision"))
    elif recipe.model.revision is None:
        out.append(Problem(file, field, f"{recipe.path} pins no model revision: the gate would skip it on every Spark",
                           "pin model.revision to the model repository's 40-hex commit"))
    return out


def _flag_value(args: tuple[str, ...], flag: str) -> str | None:
    """The value of `flag` in a `vllm serve` argument list (`--flag V` or `--flag=V`), the last one given."""
    value = None
    for i, arg in enumerate(args):
        name, eq, given = arg.partition("=")
        if name.replace("_", "-") != flag:
            continue
        if eq:
            value = given
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            value = args[i + 1]
    return value


def served_name(recipe: Recipe) -> str:
    """The model name the server answers to: `--served-model-name` (its first name), else the model."""
    named = _flag_value(recipe.serve_args, "--served-model-name")
    return named.split()[0] if named and named.split() else recipe.model.reference()


def combination(recipe: Recipe) -> Combination:
    """The recipe as a gate combination: the name the checks ask for, the backends its args set."""
    def backend(flag: str) -> str:
        return normalize_backend(_flag_value(recipe.serve_args, flag) or AUTO)

    return Combination(served_name(recipe), backend("--moe-backend"), backend("--linear-backend"),
                       normalize_backend(recipe.limits.kv_cache_dtype))


def _measured(speed: Any) -> float | None:
    rate = speed.get("decode_tokens_per_s") if isinstance(speed, dict) else None
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate) or rate <= 0:
        return None
    return float(rate)


def judge_run(recipe: Recipe, checked: dict[str, Any], *, digest: str, gpu: str,
              ran: dict[str, Any] | None) -> dict[str, Any]:
    """The run record of a recipe the gate served: its checks' combination record judged.

    Coherent when every check passed (`checked["status"]`); passed only when
    coherent, with a measured decode speed (an `unknown` speed proves
    nothing), and when the container ran the recipe's exact command: `ran` is
    what the engine says it ran (argv, and the recipe's variables as the
    container holds them), None when it never started. `checks` keeps the
    whole combination record as the evidence.
    """
    argv, env = serve_command(recipe)
    coherent = checked.get("status") == PASSED and not checked.get("reasons")
    speed = checked.get("speed")
    rate = _measured(speed)
    reasons = [str(r) for r in checked.get("reasons") or []]
    if coherent and rate is None:
        why = speed.get("unknown_reason") if isinstance(speed, dict) else None
        reasons.append("decode speed not measured" + (f" ({why})" if why else ""))
    exact = ran is not None and ran.get("argv") == argv and ran.get("env") == env
    if ran is not None and not exact:
        reasons.append(f"the container ran {ran.get('argv')!r:.300}, not the recipe's exact command")
    status = PASSED if coherent and rate is not None and exact else FAILED
    doc = run_record(recipe, digest=digest, status=status, decode_tok_s=round(rate, 2) if rate is not None else None,
                     coherent=coherent, gpu=gpu, reason="; ".join(reasons))
    doc["ran"] = ran
    doc["checks"] = checked
    doc["line"] = lock_line(doc)
    return doc


def with_recipes(section: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The coherence section with the recipes' runs, its status folded with theirs.

    A skipped section stays skipped (its recipes are skipped for the same
    reason). Otherwise every recipe must pass: a failed one fails the
    section, and so does one skipped where the gate ran, since a skip is never a pass.
    """
    out = {**section, "recipes": runs}
    if section.get("status") == SKIPPED or not runs:
        return out
    bad = [r for r in runs if not counts_as_passed(r)]
    if bad:
        why = "; ".join(lock_line(r) for r in bad)
        out["status"] = FAILED
        out["reason"] = "; ".join(x for x in (str(section.get("reason") or ""), why) if x)
    return out


def lock_recipes(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the lock keeps of each recipe run: who, on which digest, how fast, and the line."""
    keep = ("recipe", "file", "digest", "status", "decode_tok_s", "reason")
    return [{**{k: r.get(k) for k in keep if r.get(k) not in (None, "")}, "line": lock_line(r)} for r in runs]



class _RecipeLine(TypedDict):
    recipe: str  # the recipe's name (recipes/NAME.yaml)
    status: str  # "passed" | "skipped"
    line: str  # "recipe X passed on sha256:... at T tok/s", or why it did not


class RecipeLine(_RecipeLine, total=False):
    """What the lock keeps of one recipe's run (`images.<profile>.recipes[]`)."""

    file: str  # recipes/NAME.yaml
    digest: str  # the digest it was served on: the entry's
    decode_tok_s: float  # the measured batch-1 decode speed, when it passed
    reason: str  # why it was skipped


@dataclass(frozen=True)
class RecipeRun:
    """One of the gate's own run records (`run_record`, `judge_run`), typed: what the lock keeps of it.

    `lock()` is the record's `lock_recipes` line, for a build whose gate just
    made the record; a record read back from a file (publish) stays a dict.
    """

    recipe: str
    file: str
    digest: str
    status: str
    decode_tok_s: float | None
    coherent: bool | None
    reason: str
    line: str  # `lock_line` of the record

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> RecipeRun:
        return cls(recipe=record["recipe"], file=record["file"], digest=record["digest"], status=record["status"],
                   decode_tok_s=record["decode_tok_s"], coherent=record["coherent"], reason=record["reason"],
                   line=lock_line(dict(record)))  # fmt: skip

    def lock(self) -> RecipeLine:
        """What the lock keeps: who, on which digest, how fast, and the line (unset fields left out)."""
        out: RecipeLine = {"recipe": self.recipe, "status": self.status, "line": self.line}
        if self.file:
            out["file"] = self.file
        if self.digest:
            out["digest"] = self.digest
        if self.decode_tok_s is not None:
            out["decode_tok_s"] = self.decode_tok_s
        if self.reason:
            out["reason"] = self.reason
        return out

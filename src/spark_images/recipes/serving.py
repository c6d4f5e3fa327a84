"""The gate serves recipes: each one's exact `vllm serve` command, in the image or as a local process, checked.

A profile lists the recipes it serves (`verify.coherence.recipes`). Each is
served in its own container (`container.serve_in_container`, the machinery
the backend matrix uses) with the recipe's argv and environment exactly as
`recipes.gate.serve_command` gives them (nothing added: vLLM listens on
every interface, port 8000, by default, the port the container publishes),
then the same checks run (known
answers, degeneracy, concurrency, decode speed). What the engine says the
container ran is recorded next to the recipe's command. Without an sm_121
GPU every recipe is `skipped` with the reason, never passed. The verdicts
are `recipes.gate`'s (pure); this module only sequences them, on the
coherence room's machinery (the recipe room stands above it: coherence
imports no recipe). `gate_recipe` serves one recipe file as a local process
(`coherence --recipe FILE`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spark_images import defaults
from spark_images.coherence import gpu
from spark_images.coherence.checks import GateOptions, Progress, quiet
from spark_images.coherence.container import serve_in_container
from spark_images.coherence.local import gate_argv, parse_argv
from spark_images.core.errors import Problem, UsageError
from spark_images.recipes import gate
from spark_images.recipes.model import Recipe, load_recipe


def gpu_here(assume_gpu: bool) -> tuple[str | None, str]:
    """(the GPU the recipes see, what the record says of it): sm_121 or None with the reason."""
    if assume_gpu:
        return defaults.GPU, "not checked (--assume-gpu: stand-in server testing)"
    found = gpu.detect_sm121()
    return (defaults.GPU if found.ok else None), found.reason


def gate_recipes(
    image_ref: str,
    recipes: Sequence[Recipe],
    *,
    digest: str,
    gpus: str | None = "all",
    assume_gpu: bool = False,
    options: GateOptions | None = None,
    volumes: Sequence[tuple[str, str]] = (),
    progress: Progress = quiet,
) -> list[dict[str, Any]]:
    """One run record per recipe (`recipes.gate.run_record`), in the profile's order."""
    opts = options or GateOptions()
    found, said = gpu_here(assume_gpu)
    runs: list[dict[str, Any]] = []
    for recipe in recipes:
        reason = f"no sm_121 GPU ({said})" if found is None else gate.why_not_runnable(recipe, found)
        if reason is not None:
            run = gate.skipped(recipe, digest, reason)
            runs.append({**run, "line": gate.lock_line(run)})
            progress(f"recipe {recipe.name}: skipped ({reason})")
            continue
        argv, env = gate.serve_command(recipe)
        combo = gate.combination(recipe)
        progress(f"recipe {recipe.name}: starting")
        checked, _greedy, ran = serve_in_container(image_ref, argv, combo, opts, gpus=gpus, env=env,
                                                   volumes=volumes, progress=progress)  # fmt: skip
        run = gate.judge_run(recipe, checked, digest=digest, gpu=said if assume_gpu else defaults.GPU, ran=ran)
        runs.append(run)
        progress(run["line"])
    return runs


def gate_recipe(path: str | Path, *, options: GateOptions | None = None, progress: Progress = quiet) -> dict[str, Any]:
    """The record's `coherence` section for a recipe's exact `vllm serve` command and environment.

    A file that is missing or unreadable is a usage error (exit 2), a recipe
    that does not validate is a finding (exit 1, one line per problem), as
    for every command that reads a recipe; a two-Spark recipe is served by
    `cluster up` and judged with `--cluster`, so it is a usage error here.
    """
    recipe = load_recipe(path)
    if recipe.cluster is not None:
        raise UsageError(Problem(file=recipe.path, field="cluster", message="a two-Spark recipe is not served on one host",
                                 fix="`cluster plan` and `cluster up` it, then `coherence --cluster PLAN`"))  # fmt: skip
    argv, env = gate.serve_command(recipe)
    parse_argv(argv, "--recipe")
    section = gate_argv(argv, env=env, options=options, progress=progress)
    section["recipe"] = {"name": recipe.name, "file": recipe.path, "env": dict(env)}
    return section

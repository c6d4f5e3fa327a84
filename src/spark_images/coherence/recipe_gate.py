"""The gate serves recipes: each one's exact `vllm serve` command in the image, checked.

A profile lists the recipes it serves (`verify.coherence.recipes`). Each is
served in its own container (`container.serve_in_container`, the machinery
the backend matrix uses) with the recipe's argv and environment exactly as
`recipes.gate.serve_command` gives them (nothing added: vLLM listens on
every interface, port 8000, by default, the port the container publishes),
then the same checks run (known
answers, degeneracy, concurrency, decode speed). What the engine says the
container ran is recorded next to the recipe's command. Without an sm_121
GPU every recipe is `skipped` with the reason, never passed. The verdicts
are `recipes.gate`'s (pure); this module only sequences them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spark_images.coherence import gpu
from spark_images.coherence.checks import GateOptions, Progress, quiet
from spark_images.coherence.container import serve_in_container
from spark_images.recipes import gate
from spark_images.recipes.model import Recipe

SPARK_GPU = "sm_121"


def gpu_here(assume_gpu: bool) -> tuple[str | None, str]:
    """(the GPU the recipes see, what the record says of it): sm_121 or None with the reason."""
    if assume_gpu:
        return SPARK_GPU, "not checked (--assume-gpu: stand-in server testing)"
    found = gpu.detect_sm121()
    return (SPARK_GPU if found.ok else None), found.reason


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
        run = gate.judge_run(recipe, checked, digest=digest, gpu=said if assume_gpu else SPARK_GPU, ran=ran)
        runs.append(run)
        progress(run["line"])
    return runs

"""The coherence gate: serve each combination, check it, pick the fastest coherent one.

`gate_image` serves every combination of an image in its own container
(`container`), round after round when asked (`rounds`: A B A B ..., every
round judged, the speed runs pooled), runs the checks (`checks`) and, when
asked, the A/B against a known-good backend; `gate_endpoint` runs the same checks on a server that is
already running. The decisions are made by the pure modules (`verdict` and
`judge` above all); this module only sequences them and assembles the
record's `coherence` section.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from spark_images.coherence import gpu, judge, rounds, verdict
from spark_images.coherence.checks import (
    GateOptions,
    Outcome,
    Progress,
    check_server,
    quiet,
)
from spark_images.coherence.client import OpenAIClient
from spark_images.coherence.container import run_in_container
from spark_images.coherence.readiness import wait_for_health
from spark_images.coherence.verdict import Combination
from spark_images.core.errors import EnvironmentProblem
from spark_images.profiles.profile import DEFAULT_KV_CACHE_DTYPES, DEFAULT_MOE_BACKENDS

# --- A/B --------------------------------------------------------------------------------


def apply_ab(
    results: list[dict[str, Any]], greedy: Mapping[int, list[judge.Greedy]], reference_moe: str, opts: GateOptions
) -> list[dict[str, Any]]:
    """New combination records with the A/B against the reference backend judged in."""
    judged = judge.judge_ab(results, greedy, reference_moe, opts.ab_tokens)
    return [judge.with_judgement(r, "ab", judged[i]) if i in judged else r for i, r in enumerate(results)]


# --- the gate ---------------------------------------------------------------------------


def _skip_reason(assume_gpu: bool) -> tuple[str | None, dict[str, Any]]:
    if assume_gpu:
        return None, {"assumed_gpu": True, "gpu": "not checked (--assume-gpu: stand-in server testing)"}
    found = gpu.detect_sm121()
    if not found.ok:
        return f"no sm_121 GPU ({found.reason})", {"gpu": found.reason}
    return None, {"gpu": found.reason}


def gate_image(
    image_ref: str,
    models: Sequence[str],
    moe_backends: Sequence[str] = DEFAULT_MOE_BACKENDS,
    linear_backends: Sequence[str] | None = None,
    kv_cache_dtypes: Sequence[str] = DEFAULT_KV_CACHE_DTYPES,
    *,
    health_timeout_s: float = 1800.0,
    gpus: str | None = "all",
    assume_gpu: bool = False,
    options: GateOptions | None = None,
    serve_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    volumes: Sequence[tuple[str, str]] = (),
    progress: Progress = quiet,
) -> dict[str, Any]:
    """The record's `coherence` section for an image: passed, failed or skipped."""
    opts = options or GateOptions(health_timeout_s=health_timeout_s)
    if options is not None and health_timeout_s != GateOptions.health_timeout_s:
        opts = dataclasses.replace(options, health_timeout_s=health_timeout_s)
    skip, gpu_doc = _skip_reason(assume_gpu)
    if skip:
        return {"status": "skipped", "reason": skip, "image": image_ref, **gpu_doc, "combinations": []}
    combos = verdict.combinations(models, moe_backends, linear_backends, kv_cache_dtypes)
    served: dict[int, list[tuple[int, dict[str, Any]]]] = {i: [] for i in range(len(combos))}
    greedy: dict[int, list[judge.Greedy]] = {}
    order: list[dict[str, Any]] = []
    for rnd, i in rounds.round_robin(len(combos), opts.rounds):
        combo = combos[i]
        label = combo.label() + (f" (round {rnd} of {opts.rounds})" if opts.rounds > 1 else "")
        failed = next((r for r, d in served[i] if d["status"] == "failed"), None)
        if failed is not None:  # it can no longer be selected, and each round is a model load
            order.append({"round": rnd, **combo.to_json(), "served": False, "why": f"failed round {failed}"})
            progress(f"{label}: not served again (failed round {failed})")
            continue
        progress(f"{label}: starting")
        doc, samples = run_in_container(image_ref, combo, opts, gpus=gpus, serve_args=serve_args,
                                        env=env, volumes=volumes, progress=progress)  # fmt: skip
        if rnd == 1:
            greedy[i] = samples  # the A/B compares the first round's greedy answers
        served[i].append((rnd, doc))
        order.append({"round": rnd, **combo.to_json(), "served": True, "status": doc["status"]})
        progress(f"{label}: {doc['status']}" + (f" ({doc['reasons'][0]})" if doc["reasons"] else ""))
    results = [served[i][0][1] if opts.rounds == 1 else rounds.merge(served[i]) for i in range(len(combos))]
    if opts.ab_reference:
        results = apply_ab(results, greedy, opts.ab_reference, opts)
    section = _section(results, models, image_ref, serve_args, env, gpu_doc)
    if opts.rounds > 1:
        section["rounds"] = rounds.section_doc(opts.rounds, order)
    return section


def gate_endpoint(
    url: str, model: str, *, options: GateOptions | None = None, progress: Progress = quiet
) -> dict[str, Any]:
    """Check a server that is running or still starting (no container, no log to scan).

    A refused connection is a server still loading its model (real vLLM keeps
    its port closed until then), waited for up to `health_timeout_s`. When
    nothing ever accepted a connection in that time, there is no server to
    judge: an environment problem (exit 2), with how long it waited.
    """
    opts = options or GateOptions()
    client = OpenAIClient(url, model, seed=opts.seed, timeout_s=opts.request_timeout_s)
    wait = wait_for_health(client, opts.health_timeout_s, poll_s=opts.health_poll_s,
                           failed=lambda: None, progress=progress)  # fmt: skip
    if wait.no_host:
        raise EnvironmentProblem(f"--endpoint {url}: no such host (fix: correct the URL, e.g. http://127.0.0.1:8000)")
    if wait.never_answered:
        raise EnvironmentProblem(
            f"--endpoint {url}: nothing answered in {wait.waited_s:.0f} s (--health-timeout "
            f"{opts.health_timeout_s:g}); last seen: {wait.last_seen} "
            "(fix: start the server, give a longer --health-timeout for a slow model load, or correct the URL)"
        )
    reason, waited = wait.reason, wait.waited_s
    outcome = Outcome()
    if reason:
        outcome.reasons.append(reason)
    else:

        def alive() -> str | None:
            return None if client.health() is not None else "the server stopped answering"

        outcome = check_server(client, opts, alive=alive, progress=progress)
    combo = Combination(model)
    doc = judge.combination_record(combo, outcome.doc, outcome.reasons, outcome.warnings, None,
                                     endpoint=url, startup_s=round(waited, 2))  # fmt: skip
    doc["moe_backend"] = doc["linear_backend"] = doc["kv_cache_dtype"] = "unknown"
    doc["warnings"].append("endpoint mode: no server log, so no signature scan or backend check")
    doc["warnings"].append("endpoint mode: the server's GPU is not checked (it may not be an sm_121 GPU)")
    status, why = verdict.gate_status([doc], [model])
    section: dict[str, Any] = {"status": status, "endpoint": url, "combinations": [doc]}
    if why:
        section["reason"] = why
    return section


def _label(result: Mapping[str, Any]) -> str:
    return f"moe={result['moe_backend']} linear={result['linear_backend']} kv={result['kv_cache_dtype']}"


def _section(
    results: list[dict[str, Any]],
    models: Sequence[str],
    image: str,
    serve_args: Sequence[str],
    env: Mapping[str, str] | None,
    gpu_doc: Mapping[str, Any],
) -> dict[str, Any]:
    status, why = verdict.gate_status(results, models)
    section: dict[str, Any] = {"status": status, "image": image, **gpu_doc, "combinations": results}
    if why:
        section["reason"] = why
    per_model: dict[str, Any] = {}
    for model in models:
        best, tied = verdict.rank_fastest([r for r in results if r["model"] == model])
        if best is not None:
            per_model[model] = verdict.selection(image, best, serve_args, env)
            per_model[model]["speed_basis"] = (
                {"tie": True, "tied_with": [_label(r) for r in tied],
                 "broken_by": "profile order (the first listed combination of the tie)"}
                if tied else {"tie": False}
            )  # fmt: skip
    if per_model:
        section["selected"] = per_model[next(m for m in models if m in per_model)]
        section["selected_per_model"] = per_model
    else:  # the same keys as a selection, so a reader meets one shape
        section["selected"] = None
        section["selected_per_model"] = {}
        section["selected_reason"] = why or "no combination passed"
    return section

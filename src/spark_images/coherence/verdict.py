"""Combinations, verdicts, the fastest coherent pick and its serve command (pure).

A combination is one model served with one MoE backend, one linear backend
and one KV-cache dtype. It passes only if every check ran and none found a
problem; the fastest passing one (median decode tok/s) is selected and
written to the record with a `vllm serve` command that reproduces it.
"""

from __future__ import annotations

import itertools
import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spark_images.coherence.signatures import normalize_backend

AUTO = "auto"


@dataclass(frozen=True)
class Combination:
    model: str
    moe_backend: str = AUTO
    linear_backend: str = AUTO
    kv_cache_dtype: str = AUTO

    def flags(self) -> list[str]:
        """vLLM flags for this combination; `auto` is vLLM's default and is left out."""
        out: list[str] = []
        if self.moe_backend != AUTO:
            out += ["--moe-backend", self.moe_backend]
        if self.linear_backend != AUTO:
            out += ["--linear-backend", self.linear_backend]
        if self.kv_cache_dtype != AUTO:
            out += ["--kv-cache-dtype", self.kv_cache_dtype]
        return out

    def label(self) -> str:
        return (
            f"{self.model} moe={self.moe_backend} linear={self.linear_backend} "
            f"kv={self.kv_cache_dtype}"
        )

    def to_json(self) -> dict[str, str]:
        return {
            "model": self.model,
            "moe_backend": self.moe_backend,
            "linear_backend": self.linear_backend,
            "kv_cache_dtype": self.kv_cache_dtype,
        }


def combinations(
    models: Sequence[str],
    moe_backends: Sequence[str],
    linear_backends: Sequence[str] | None,
    kv_cache_dtypes: Sequence[str],
) -> list[Combination]:
    """Every combination to try, in the order given.

    Without linear backends each MoE backend is paired with the linear backend of
    the same name (auto/auto, flashinfer_b12x/flashinfer_b12x, marlin/marlin): the
    guide's order (a) auto, (b) explicit b12x, (c) forced Marlin. With them, the
    full cross product.
    """
    moe = [normalize_backend(b) for b in moe_backends] or [AUTO]
    kv = [normalize_backend(k) for k in kv_cache_dtypes] or [AUTO]
    out: list[Combination] = []
    for model in models:
        if linear_backends:
            linear = [normalize_backend(b) for b in linear_backends]
            pairs = list(itertools.product(moe, linear))
        else:
            pairs = [(m, m) for m in moe]
        for (m, lin), k in itertools.product(pairs, kv):
            combo = Combination(model, m, lin, k)
            if combo not in out:
                out.append(combo)
    return out


def serve_argv(
    combo: Combination, *, extra_args: Sequence[str] = (), host: str | None = None, port: int | None = None
) -> list[str]:
    argv = ["vllm", "serve", combo.model]
    if host is not None:
        argv += ["--host", host]
    if port is not None:
        argv += ["--port", str(port)]
    return argv + combo.flags() + list(extra_args)


def serve_command(combo: Combination, extra_args: Sequence[str] = ()) -> str:
    return shlex.join(serve_argv(combo, extra_args=extra_args))


def docker_command(
    image: str, combo: Combination, extra_args: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> str:
    argv = ["docker", "run", "--rm", "--gpus", "all", "--ipc", "host", "-p", "8000:8000"]
    for key in sorted(env or {}):
        argv += ["-e", key]  # by name: the value comes from the caller's environment
    argv += ["--entrypoint", "vllm", image, *serve_argv(combo, extra_args=extra_args)[1:]]
    return shlex.join(argv)


@dataclass(frozen=True)
class ProbeVerdict:
    ok: bool
    passed: int
    total: int
    reasons: tuple[str, ...]


def judge_probes(
    results: Sequence[Mapping[str, Any]], *, min_pass_rate: float, upstream_ids: Sequence[str]
) -> ProbeVerdict:
    """Upstream's four must all pass, and at least `min_pass_rate` of all answers.

    A healthy model may fumble one of two dozen answers; a broken kernel gets
    the easy ones wrong too.
    """
    total = len(results)
    passed = sum(1 for r in results if r.get("ok"))
    reasons: list[str] = []
    failed_upstream = [
        f"{r['probe']} ({r['endpoint']})" for r in results if r["probe"] in upstream_ids and not r.get("ok")
    ]
    if failed_upstream:
        reasons.append("upstream known-answer probes failed: " + ", ".join(failed_upstream))
    if total == 0:
        reasons.append("no known-answer probe ran")
    elif passed / total < min_pass_rate:
        reasons.append(f"known-answer probes: {passed} of {total} passed (need {min_pass_rate:.0%})")
    return ProbeVerdict(not reasons, passed, total, tuple(reasons))


def _rate_and_interval(result: Mapping[str, Any]) -> tuple[float, list[float]] | None:
    measured = result.get("speed") or {}
    rate = measured.get("decode_tokens_per_s")
    # NaN, infinity, zero or less is no measurement (and NaN would compare false with everything)
    if not isinstance(rate, int | float) or isinstance(rate, bool) or not math.isfinite(rate) or rate <= 0:
        return None
    ci = (measured.get("spread") or {}).get("ci95")
    ok = isinstance(ci, list) and len(ci) == 2 and all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in ci
    )
    return float(rate), [float(v) for v in ci] if ok else [float(rate), float(rate)]


def rank_fastest(results: Sequence[Mapping[str, Any]]) -> tuple[Mapping[str, Any] | None, list[Mapping[str, Any]]]:
    """(the selected passed combination, the others it is tied with).

    The fastest median is only "fastest" when its bootstrap 95% interval
    separates from every other's. Combinations whose interval overlaps the
    leader's are a tie, and a tie goes to the one listed first: the profile's
    order (its `moe_backends`, then `linear_backends`, then `kv_cache_dtypes`)
    is the documented preference. A passed combination whose speed could not be
    measured ranks below every measured one.
    """
    passed = [r for r in results if r.get("status") == "passed"]
    measured = [(r, m) for r in passed if (m := _rate_and_interval(r)) is not None]
    if not measured:
        return (passed[0] if passed else None), []
    _, (_, leader_ci) = max(measured, key=lambda item: item[1][0])  # max keeps the first of equals
    tied = [r for r, (_, ci) in measured if speed_overlap(ci, leader_ci)] or [measured[0][0]]
    chosen = tied[0]  # results are in profile order
    return chosen, [r for r in tied if r is not chosen]


def speed_overlap(a: Sequence[float], b: Sequence[float]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def select_fastest(results: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The selected passed combination (see `rank_fastest`)."""
    return rank_fastest(results)[0]


def selection(
    image: str | None,
    result: Mapping[str, Any],
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    combo = Combination(
        result["model"], result["moe_backend"], result["linear_backend"], result["kv_cache_dtype"]
    )
    doc: dict[str, Any] = {
        **combo.to_json(),
        "decode_tokens_per_s": (result.get("speed") or {}).get("decode_tokens_per_s"),
        "serve_command": serve_command(combo, extra_args),
    }
    if image:
        doc["docker_command"] = docker_command(image, combo, extra_args, env)
    return doc


def served_selection(result: Mapping[str, Any], command: str) -> tuple[dict[str, Any] | None, str]:
    """(the selection, why none) of a server started from one exact `command` (local-process mode).

    One model and one combination, so there is nothing to rank: the selection
    is that combination, served as it was, when it passed with a measured
    speed; otherwise there is none and the reason says why. The entry has the
    shape of container mode's (`selection` plus `speed_basis`), less the
    docker command: there is no image.
    """
    label = f"{result.get('model')} ({_combo_label(result)})"
    if result.get("status") != "passed":
        return None, f"{label} did not pass"
    if _rate_and_interval(result) is None:
        why = (result.get("speed") or {}).get("unknown_reason")
        return None, f"{label} passed without a measured speed" + (f" ({why})" if why else "")
    doc: dict[str, Any] = {
        "model": result["model"], "moe_backend": result["moe_backend"], "linear_backend": result["linear_backend"],
        "kv_cache_dtype": result["kv_cache_dtype"],
        "decode_tokens_per_s": (result.get("speed") or {}).get("decode_tokens_per_s"),
        "serve_command": command, "speed_basis": {"tie": False},
    }  # fmt: skip
    return doc, ""


def _combo_label(result: Mapping[str, Any]) -> str:
    return f"moe={result.get('moe_backend')} linear={result.get('linear_backend')} kv={result.get('kv_cache_dtype')}"


def gate_status(results: Sequence[Mapping[str, Any]], models: Sequence[str]) -> tuple[str, str]:
    """Passed when every model has a passing combination; else failed, naming who has none."""
    if not results:
        return "failed", "no combination was tried"
    missing = [m for m in models if not any(r["model"] == m and r["status"] == "passed" for r in results)]
    if missing:
        return "failed", "no coherent combination for " + ", ".join(missing)
    return "passed", ""


def record_status(section: Mapping[str, Any]) -> tuple[str, str]:
    """A coherence section's status re-derived from its combinations (for a record read back).

    A combination counts as passed only when it says so and lists no reason;
    the models are those the combinations name. A `skipped` section stays
    skipped; any other section is judged by `gate_status`.
    """
    if section.get("status") == "skipped":
        return "skipped", str(section.get("reason") or "")
    combos = section.get("combinations")
    if not isinstance(combos, list) or not all(isinstance(c, Mapping) for c in combos):
        return "failed", "the record's `combinations` is not a list of objects"
    checked = []
    for c in combos:
        model = c.get("model")
        reasons = c.get("reasons")
        ok = c.get("status") == "passed" and (reasons is None or (isinstance(reasons, list) and not reasons))
        checked.append({"model": model if isinstance(model, str) else repr(model)[:80], "status": "passed" if ok else "failed"})
    models = list(dict.fromkeys(c["model"] for c in checked))
    return gate_status(checked, models)

"""Combinations, verdicts, the fastest coherent pick and its serve command (pure).

A combination is one model served with one MoE backend, one linear backend
and one KV-cache dtype. It passes only if every check ran and none found a
problem; the fastest passing one (median decode tok/s) is selected and
written to the record with a `vllm serve` command that reproduces it.
"""

from __future__ import annotations

import itertools
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


def select_fastest(results: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The passed combination with the highest median decode tok/s (first wins ties).

    A passed combination whose speed could not be measured ranks below every
    measured one.
    """
    best: Mapping[str, Any] | None = None
    best_key: tuple[int, float] | None = None
    for result in results:
        if result.get("status") != "passed":
            continue
        rate = (result.get("speed") or {}).get("decode_tokens_per_s")
        key = (1, float(rate)) if isinstance(rate, int | float) else (0, 0.0)
        if best_key is None or key > best_key:
            best, best_key = result, key
    return best


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


def gate_status(results: Sequence[Mapping[str, Any]], models: Sequence[str]) -> tuple[str, str]:
    """Passed when every model has a passing combination; else failed, naming who has none."""
    if not results:
        return "failed", "no combination was tried"
    missing = [m for m in models if not any(r["model"] == m and r["status"] == "passed" for r in results)]
    if missing:
        return "failed", "no coherent combination for " + ", ".join(missing)
    return "passed", ""


# --- observations and their judgement -------------------------------------------------
# The runner only observes (what the server answered, when); these functions decide.


@dataclass(frozen=True)
class Judgement:
    """A check's record section, what fails the combination, and what only warns."""

    doc: dict[str, Any]
    reasons: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Greedy:
    """One greedy answer: its text and, when the server gave logprobs, tokens and top-k."""

    text: str
    tokens: tuple[str, ...] | None = None
    top_logprobs: tuple[Mapping[str, float], ...] | None = None


@dataclass(frozen=True)
class ConcurrencyObservation:
    """The serial answer and each parallel answer (an error as its message)."""

    requests: int
    tokens: int
    top_k: int
    serial: Greedy
    parallel: tuple[Greedy | str, ...]


def judge_concurrency(obs: ConcurrencyObservation) -> Judgement:
    """Parallel greedy answers must equal the serial one (or be a near-tie within the top-k)."""
    from spark_images.coherence import compare

    differences: list[dict[str, Any]] = []
    counts = {"identical": 0, "close": 0, "diverged": 0, "error": 0}
    serial = obs.serial
    for i, got in enumerate(obs.parallel):
        if isinstance(got, str):
            counts["error"] += 1
            differences.append({"request": i, "verdict": "error", "detail": got[:200]})
            continue
        if serial.tokens is not None and got.tokens is not None:
            cmp = compare.compare_greedy(serial.tokens, serial.top_logprobs, got.tokens, got.top_logprobs, n=obs.tokens)
        else:  # no logprobs from this server: compare the text
            same = serial.text == got.text
            cmp = compare.TokenComparison("identical" if same else "diverged", None, "texts " + ("equal" if same else "differ"))
        counts[cmp.verdict] += 1
        if cmp.verdict != "identical":
            differences.append({"request": i, **cmp.to_json(), "sample": got.text[:120]})
    doc = {"requests": obs.requests, "tokens": obs.tokens, **counts, "serial_sample": serial.text[:120],
           "differences": differences}  # fmt: skip
    reasons: list[str] = []
    warnings: list[str] = []
    if counts["error"]:
        reasons.append(f"concurrency: {counts['error']} of {obs.requests} parallel requests failed")
    if counts["diverged"]:
        reasons.append(
            f"concurrency: {counts['diverged']} of {obs.requests} parallel answers differ from the "
            f"serial greedy answer in the first {obs.tokens} tokens"
        )
    if counts["close"]:
        warnings.append(f"concurrency: {counts['close']} parallel answers diverge from serial within the top-{obs.top_k}")
    return Judgement(doc, tuple(reasons), tuple(warnings))


@dataclass(frozen=True)
class SpeedRun:
    """One timed stream: the count the server reported (unjudged), the pieces and their arrival."""

    reported_tokens: object
    pieces: int
    times: tuple[float, ...]
    t_sent: float


@dataclass(frozen=True)
class SpeedObservation:
    asked_tokens: int
    runs: tuple[SpeedRun, ...]
    metrics_before: Mapping[str, float] | None = None
    metrics_after: Mapping[str, float] | None = None
    metrics_problems: tuple[str, ...] = ()


def judge_speed(obs: SpeedObservation) -> Judgement:
    """Median decode tok/s of runs whose token count can be believed; `unknown` with the reason otherwise."""
    from spark_images.coherence import speed

    runs: list[dict[str, Any]] = []
    rates: list[float] = []
    warnings = list(obs.metrics_problems)
    unknown: list[str] = []
    total_tokens = 0
    for run in obs.runs:
        count = speed.token_count(run.reported_tokens, run.pieces, obs.asked_tokens)
        rate = None
        if count.value is None:
            unknown.append(str(count.problem))
        else:
            total_tokens += count.value
            if run.times:
                rate = speed.decode_tokens_per_s(count.value, run.times[0], run.times[-1])
            if count.value != obs.asked_tokens:
                warnings.append(f"speed: asked {obs.asked_tokens} tokens with ignore_eos, got {count.value}")
        if rate is not None:
            rates.append(rate)
        runs.append({
            "tokens": count.value,
            "tokens_source": count.source,
            "decode_tokens_per_s": round(rate, 2) if rate is not None else None,
            "ttft_s": round(run.times[0] - run.t_sent, 4) if run.times else None,
            **({"unknown_reason": count.problem} if count.problem else {}),
        })  # fmt: skip
    med = speed.median(rates) if not unknown else None
    doc: dict[str, Any] = {
        "decode_tokens_per_s": round(med, 2) if med is not None else None,
        "runs": runs,
        "tokens_per_run": obs.asked_tokens,
    }
    if unknown:
        doc["decode_tokens_per_s"] = "unknown"
        doc["unknown_reason"] = "; ".join(dict.fromkeys(unknown))
        warnings.append(f"speed: unknown ({doc['unknown_reason']})")
    elif med is None:
        warnings.append("speed: the stream could not be timed (fewer than 2 timed tokens)")
    if not unknown and obs.metrics_before is not None and obs.metrics_after is not None:
        cross = speed.cross_check(dict(obs.metrics_before), dict(obs.metrics_after), total_tokens, med)
        doc["cross_check"] = cross.to_json()
        if not cross.ok:
            warnings.append(f"speed cross-check: {cross.detail}")
    return Judgement(doc, (), tuple(warnings))


def judge_ab(
    results: Sequence[Mapping[str, Any]],
    greedy: Mapping[int, Sequence[Greedy]],
    reference_moe: str,
    tokens: int,
) -> dict[int, Judgement]:
    """For each passed combination (by index), its A/B against the reference MoE backend.

    `doc` is the record's `ab` section; a reason fails the combination.
    """
    from spark_images.coherence import compare

    out: dict[int, Judgement] = {}
    for model in dict.fromkeys(r["model"] for r in results):
        refs = [i for i, r in enumerate(results) if r["model"] == model and r["moe_backend"] == reference_moe]
        ref_i = next((i for i in refs if results[i]["status"] == "passed"), None)
        for i, r in enumerate(results):
            if r["model"] != model or i == ref_i or r["status"] != "passed":
                continue
            if ref_i is None:
                out[i] = Judgement({"reference": reference_moe, "status": "skipped", "reason": "no passing reference"},
                                   warnings=(f"A/B: no passing {reference_moe} combination to compare with",))  # fmt: skip
                continue
            diffs = []
            for a, b in zip(greedy.get(ref_i, ()), greedy.get(i, ()), strict=False):
                cmp = compare.compare_greedy(a.tokens or (), a.top_logprobs, b.tokens or (), b.top_logprobs, n=tokens)
                if not cmp.ok:
                    diffs.append(cmp.detail)
            doc = {"reference": reference_moe, "compared": len(greedy.get(i, ())), "diverged": diffs}
            reasons = (f"A/B against {reference_moe}: {len(diffs)} greedy samples diverge",) if diffs else ()
            out[i] = Judgement(doc, reasons)
    return out


def with_judgement(result: Mapping[str, Any], key: str, judged: Judgement) -> dict[str, Any]:
    """A new combination record with `key` set and its status re-derived from all its reasons."""
    reasons = list(dict.fromkeys([*result.get("reasons", []), *judged.reasons]))
    warnings = list(dict.fromkeys([*result.get("warnings", []), *judged.warnings]))
    return {**result, key: judged.doc, "reasons": reasons, "warnings": warnings,
            "status": "failed" if reasons else "passed"}  # fmt: skip


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

"""Judges what the checks observed on a running server (pure, no I/O).

The checks (`checks`) only observe: what the server answered and when. These
functions decide: the concurrency probe's answers against the serial one,
decode speed from the timed streams, the A/B against a reference MoE backend,
and one combination's record with its server log judged in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spark_images.coherence.signatures import backend_mismatches

if TYPE_CHECKING:
    from spark_images.coherence.signatures import LogScan
    from spark_images.coherence.verdict import Combination


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
    measured = speed.spread(rates) if not unknown else None
    if measured is not None:
        doc["spread"] = measured.to_json()
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


def combination_record(
    combo: Combination, found: Mapping[str, Any], reasons: Sequence[str], warnings: Sequence[str],
    scan: LogScan | None, /, **extra: Any,
) -> dict[str, Any]:
    """One combination's record: what its checks found, its server log judged in (a fatal
    line fails it unless a reason names it already; a degraded line or an unexpected
    backend only warns), and its status derived from all its reasons."""
    reasons, warnings = list(reasons), list(warnings)
    doc: dict[str, Any] = {**combo.to_json(), **extra, **found}
    if scan is not None:
        doc["signatures"] = [h.to_json() for h in scan.hits]
        doc["backends"] = scan.backends.to_json()
        mismatches = backend_mismatches(scan.backends, combo.moe_backend, combo.linear_backend)
        doc["backend_mismatch"] = mismatches
        warnings += [f"backend: {m}" for m in mismatches]
        warnings += [f"log: {h.name}: {h.line[:200]}" for h in scan.degraded()]
        fatal = [h for h in scan.fatal() if not any(h.name in r for r in reasons)]
        reasons += [f"log: fatal {h.name}: {h.line[:200]}" for h in fatal]
        if reasons:
            doc["log_tail"] = list(scan.tail)
    doc["status"] = "failed" if reasons else "passed"
    doc["reasons"] = list(dict.fromkeys(reasons))
    doc["warnings"] = list(dict.fromkeys(warnings))
    return doc

"""Decode speed from streamed timestamps, cross-checked with /metrics (pure).

Decode tok/s = (n - 1) / (t_last - t_first): the first token carries the
prefill, so it starts the clock instead of counting. The server's own
counters (`vllm:generation_tokens_total`, `vllm:inter_token_latency_seconds`)
must agree with what the client saw, or the measurement is not trusted.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

_SAMPLE_RE = re.compile(
    r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)"
)

GENERATION_TOKENS = "vllm:generation_tokens_total"
# vLLM renamed the per-token latency histogram; older servers export the first name.
ITL_HISTOGRAMS = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")


@dataclass(frozen=True)
class TokenCount:
    """How many tokens a run produced, and where that number came from.

    `value` is None when the server's count cannot be believed; `problem`
    then says why, and the speed figure is `unknown` for that reason.
    """

    value: int | None
    source: str  # "usage" | "stream pieces"
    problem: str | None = None


def token_count(reported: object, pieces: int, asked: int) -> TokenCount:
    """Judge `usage.completion_tokens` against the request and the streamed text.

    A usable count is a finite, non-negative integer, at most the `asked`
    max_tokens (a server cannot generate more), and at least the number of
    non-empty pieces streamed minus one (each piece is one or more tokens; a
    final piece may carry none). Without a count the pieces are the count.
    """
    if reported is None:
        return TokenCount(pieces, "stream pieces")
    if isinstance(reported, bool) or not isinstance(reported, int | float):
        return TokenCount(None, "usage", f"usage.completion_tokens is a {type(reported).__name__}, not a number")
    if isinstance(reported, float):
        if not math.isfinite(reported):
            return TokenCount(None, "usage", f"usage.completion_tokens is {reported!r}, not a finite number")
        if not reported.is_integer():
            return TokenCount(None, "usage", f"usage.completion_tokens is {reported!r}, not a whole number")
        reported = int(reported)
    if reported < 0:
        return TokenCount(None, "usage", f"usage.completion_tokens is {reported}, below zero")
    if reported > asked:
        return TokenCount(None, "usage", f"usage.completion_tokens is {reported}, more than the {asked} asked for")
    if pieces > reported + 1:
        return TokenCount(None, "usage", f"usage.completion_tokens is {reported}, fewer than the {pieces} pieces streamed")
    return TokenCount(reported, "usage")


def decode_tokens_per_s(n_tokens: int, t_first: float, t_last: float) -> float | None:
    """None when there is nothing to time (fewer than 2 tokens or no elapsed time)."""
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 2:
        return None
    if not (math.isfinite(t_first) and math.isfinite(t_last)) or t_last <= t_first:
        return None
    rate = (n_tokens - 1) / (t_last - t_first)
    return rate if math.isfinite(rate) else None


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 23  # fixed: the same runs always give the same interval


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of a non-empty sample (numpy's default method)."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass(frozen=True)
class Spread:
    """The median of the runs with its spread: the interquartile range and a bootstrap 95% interval.

    Real decode runs on an idle server spread widely (25-47 tok/s, and two 3-run
    medians 33% apart), so a median alone ranks noise.
    """

    median: float
    iqr: tuple[float, float]
    ci95: tuple[float, float]
    runs: int

    def to_json(self) -> dict[str, object]:
        return {"median": round(self.median, 2), "iqr": [round(v, 2) for v in self.iqr],
                "ci95": [round(v, 2) for v in self.ci95], "runs": self.runs}  # fmt: skip


def spread(rates: Sequence[float]) -> Spread | None:
    """The median and its spread; the interval is of the median, by a seeded bootstrap."""
    if not rates:
        return None
    import random

    rng = random.Random(BOOTSTRAP_SEED)
    n = len(rates)
    medians = [statistics.median(rng.choices(rates, k=n)) for _ in range(BOOTSTRAP_RESAMPLES)]
    return Spread(statistics.median(rates), (quantile(rates, 0.25), quantile(rates, 0.75)),
                  (quantile(medians, 0.025), quantile(medians, 0.975)), n)  # fmt: skip


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum of each metric over its label sets (one engine, one model: a plain value)."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_RE.match(line)
        if not m:
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        if not math.isfinite(value):
            continue
        totals[m.group("name")] = totals.get(m.group("name"), 0.0) + value
    return totals


@dataclass(frozen=True)
class CrossCheck:
    ok: bool
    detail: str
    metrics_tokens: float | None = None
    metrics_tokens_per_s: float | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "detail": self.detail,
            "metrics_generation_tokens": self.metrics_tokens,
            "metrics_tokens_per_s": (
                round(self.metrics_tokens_per_s, 2) if self.metrics_tokens_per_s else None
            ),
        }


def cross_check(
    before: dict[str, float],
    after: dict[str, float],
    client_tokens: int,
    client_tokens_per_s: float | None,
    *,
    rel_tolerance: float = 0.10,  # issue 23: beyond 10% the two views disagree (a warning)
) -> CrossCheck:
    """Compare the server's counters over the timed runs with the client's view."""
    if GENERATION_TOKENS not in after:
        return CrossCheck(False, f"/metrics has no {GENERATION_TOKENS}")
    generated = after[GENERATION_TOKENS] - before.get(GENERATION_TOKENS, 0.0)
    problems: list[str] = []
    # The server may count a token or two more per request (EOS/abort bookkeeping).
    if abs(generated - client_tokens) > max(3, 0.02 * client_tokens):
        problems.append(f"server generated {generated:.0f} tokens, the client received {client_tokens}")
    server_rate: float | None = None
    for name in ITL_HISTOGRAMS:
        s_name, c_name = f"{name}_sum", f"{name}_count"
        if s_name in after and c_name in after:
            d_sum = after[s_name] - before.get(s_name, 0.0)
            d_count = after[c_name] - before.get(c_name, 0.0)
            if d_sum > 0 and d_count > 0:
                server_rate = d_count / d_sum
            break
    if server_rate is not None and client_tokens_per_s:
        rel = abs(server_rate - client_tokens_per_s) / client_tokens_per_s
        if rel > rel_tolerance:
            problems.append(
                f"server inter-token latency gives {server_rate:.1f} tok/s, "
                f"the stream {client_tokens_per_s:.1f} tok/s"
            )
    if problems:
        return CrossCheck(False, "; ".join(problems), generated, server_rate)
    detail = f"server counted {generated:.0f} tokens"
    if server_rate is not None:
        detail += f", {server_rate:.1f} tok/s by inter-token latency"
    return CrossCheck(True, detail, generated, server_rate)

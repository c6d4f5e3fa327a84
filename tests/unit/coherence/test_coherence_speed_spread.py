"""Speeds with their spread: ties are called ties, and the real runs' noise is one."""

from __future__ import annotations

import json

from spark_images.coherence import speed, verdict
from support.coherence_captured import exchanges


def _real_rates() -> list[float]:
    """First-to-last-token decode tok/s of the ten recorded real vLLM 0.26 runs."""
    rates = []
    for run in exchanges()["decode_runs"]:
        times = [t for t, line in run["lines"] if line.startswith("data: {")
                 and (json.loads(line[6:]).get("choices") or [{}])[0].get("text")]  # fmt: skip
        rates.append(speed.decode_tokens_per_s(256, times[0], times[-1]))
    return rates


def _combo(moe: str, rates: list[float]) -> dict[str, object]:
    measured = speed.spread(rates)
    assert measured is not None
    return {"status": "passed", "model": "m", "moe_backend": moe, "linear_backend": "auto", "kv_cache_dtype": "auto",
            "speed": {"decode_tokens_per_s": measured.median, "spread": measured.to_json()}}  # fmt: skip


def test_the_spread_holds_the_median_iqr_and_a_bootstrap_interval_of_real_runs() -> None:
    rates = _real_rates()
    assert len(rates) == 10
    measured = speed.spread(rates)
    assert measured is not None
    lo, hi = measured.ci95
    assert lo <= measured.median <= hi
    assert measured.iqr[0] <= measured.median <= measured.iqr[1]
    assert 44 < min(rates) < max(rates) < 54  # what the recorded host gave
    assert speed.spread(rates) == measured  # seeded: the same runs give the same interval


def test_two_halves_of_the_same_real_runs_are_a_tie_broken_by_profile_order() -> None:
    rates = _real_rates()
    first, second = _combo("marlin", rates[1::2]), _combo("cutlass", rates[0::2])
    best, tied = verdict.rank_fastest([first, second])
    assert best is first  # listed first in the profile, although its median may be lower
    assert tied == [second]


def test_separated_intervals_pick_the_faster_whatever_the_order() -> None:
    slow, fast = _combo("marlin", [30.0, 31.0, 30.5, 29.8, 30.2]), _combo("cutlass", [45.0, 44.2, 46.1, 45.5, 44.9])
    best, tied = verdict.rank_fastest([slow, fast])
    assert best is fast
    assert tied == []


def test_the_metrics_cross_check_warns_beyond_ten_percent() -> None:
    before = {speed.GENERATION_TOKENS: 0.0, "vllm:inter_token_latency_seconds_sum": 0.0,
              "vllm:inter_token_latency_seconds_count": 0.0}  # fmt: skip
    after = {speed.GENERATION_TOKENS: 768.0, "vllm:inter_token_latency_seconds_sum": 765 / 30.9,
             "vllm:inter_token_latency_seconds_count": 765.0}  # fmt: skip
    assert speed.cross_check(before, after, 768, 33.1).ok  # the recorded 7%: agreement
    disagree = speed.cross_check(before, after, 768, 36.0)  # 14%
    assert not disagree.ok and "tok/s" in disagree.detail

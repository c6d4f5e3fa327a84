"""Rounds: each combination served N times, interleaved A B A B ..., its speeds pooled (pure).

Decode speed drifts from one server start to the next and over time on one
host (real vLLM 0.26 on an idle H200: single runs from 25 to 47 tok/s, two
identical 3-run medians 33% apart). Serving each combination once and ranking
its runs ranks that drift along with the backends. With `rounds` N the gate
serves every combination once (round 1, in the profile's order), then every
combination again (round 2), and so on, so a slow spell of the host falls on
all combinations alike instead of on whichever was served during it; the
timed runs of all rounds are pooled into one median and spread per
combination.

Coherence is judged on every round: each round is a fresh model load, and a
load that comes up wrong (a kernel picked differently, a fault under load) is
a failure of that combination whatever the other rounds showed. A
combination that failed a round is not served again: it can no longer be
selected, and each round costs a model load.

The default is one round (the gate as it always was): each round reloads the
model, minutes per combination on a Spark, so the cost of N rounds is asked
for (`--rounds`, `verify.coherence.rounds`), never assumed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from spark_images.coherence import speed


def round_robin(count: int, rounds: int) -> list[tuple[int, int]]:
    """(round, combination index) in serving order: 1..count in each round, round after round.

    >>> round_robin(2, 3)
    [(1, 0), (1, 1), (2, 0), (2, 1), (3, 0), (3, 1)]
    """
    if count < 0 or rounds < 1:
        raise ValueError(f"count {count} and rounds {rounds}: need count >= 0 and rounds >= 1")
    return [(r, i) for r in range(1, rounds + 1) for i in range(count)]


def _rate(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def pool_speed(per_round: Sequence[tuple[int, Mapping[str, Any] | None]]) -> dict[str, Any] | None:
    """One speed section from the rounds' speed sections: every timed run, one median and spread.

    The pooled figures are computed from the runs as recorded (each run's
    `decode_tokens_per_s`), so anyone can recompute them from the record. A
    round whose speed was `unknown` (a token count that cannot be believed)
    makes the pool unknown too: its runs cannot be counted, and leaving them
    out would hide that. Rounds that never reached the speed check (the
    server failed first) add nothing. None when no round measured speed.
    """
    measured = [(r, doc) for r, doc in per_round if doc]
    if not measured:
        return None
    runs = [{"round": r, **run} for r, doc in measured for run in doc.get("runs") or []]
    rates = [rate for run in runs if (rate := _rate(run.get("decode_tokens_per_s"))) is not None]
    rounds_doc = [
        {"round": r, "decode_tokens_per_s": doc.get("decode_tokens_per_s"),
         **({"spread": doc["spread"]} if "spread" in doc else {}),
         **({"cross_check": doc["cross_check"]} if "cross_check" in doc else {})}
        for r, doc in measured
    ]  # fmt: skip
    pooled: dict[str, Any] = {
        "decode_tokens_per_s": None,
        "runs": runs,
        "tokens_per_run": measured[0][1].get("tokens_per_run"),
        "pooled": {"rounds": [r for r, _ in measured], "runs": len(rates)},
        "per_round": rounds_doc,
    }
    unknown = [str(doc.get("unknown_reason") or "unknown") for _, doc in measured
               if doc.get("decode_tokens_per_s") == "unknown"]  # fmt: skip
    if unknown:
        pooled["decode_tokens_per_s"] = "unknown"
        pooled["unknown_reason"] = "; ".join(dict.fromkeys(unknown))
        return pooled
    spread = speed.spread(rates)
    if spread is not None:
        pooled["decode_tokens_per_s"] = round(spread.median, 2)
        pooled["spread"] = spread.to_json()
    return pooled


def _prefixed(items: Sequence[str], rnd: int, seen: Sequence[str]) -> list[str]:
    return [f"round {rnd}: {item}" for item in items if item not in seen]


def merge(per_round: Sequence[tuple[int, Mapping[str, Any]]]) -> dict[str, Any]:
    """One combination's record from its rounds' records.

    The first round's record is the base (its probes, degeneracy, concurrency
    and log scan stay as they were); a later round's reasons and new warnings
    are added with their round named, so a failure in any round fails the
    combination; `speed` is the pool of every round's runs; `rounds` lists
    each round's status, reasons, start-up time and median.
    """
    if not per_round:
        raise ValueError("no round to merge")
    _, first = per_round[0]
    doc: dict[str, Any] = dict(first)
    reasons = list(first.get("reasons") or [])
    warnings = list(first.get("warnings") or [])
    for rnd, later in per_round[1:]:
        reasons += _prefixed(list(later.get("reasons") or []), rnd, reasons)
        warnings += _prefixed(list(later.get("warnings") or []), rnd, warnings)
        if "log_tail" in later and "log_tail" not in doc:
            doc["log_tail"] = later["log_tail"]
    doc["rounds"] = [
        {"round": rnd, "status": d.get("status"), "reasons": list(d.get("reasons") or []),
         "startup_s": d.get("startup_s"), "wall_s": d.get("wall_s"),
         "decode_tokens_per_s": (d.get("speed") or {}).get("decode_tokens_per_s"),
         **({"container": d["container"]} if "container" in d else {})}
        for rnd, d in per_round
    ]  # fmt: skip
    pooled = pool_speed([(rnd, d.get("speed")) for rnd, d in per_round])
    if pooled is not None:
        doc["speed"] = pooled
    doc["reasons"] = list(dict.fromkeys(reasons))
    doc["warnings"] = list(dict.fromkeys(warnings))
    doc["status"] = "failed" if doc["reasons"] else "passed"
    return doc


def section_doc(rounds: int, order: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The section's `rounds`: how many, how coherence was judged, and the order served."""
    return {
        "rounds": rounds,
        "coherence": "judged on every round; a combination that failed a round is not served again",
        "speed": "the timed runs of every round pooled: one median, IQR and bootstrap 95% interval",
        "order": list(order),
    }

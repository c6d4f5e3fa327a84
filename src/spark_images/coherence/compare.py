"""Greedy token comparison with top-logprob tolerance (pure).

Two correct backends can disagree on a greedy token where two candidates are
nearly tied; upstream's `check_logprobs_close` accepts a divergence when each
side's token is in the other's top-k at that position. Used for the
concurrency probe (parallel vs serial on one server) and for the A/B test
against a known-good backend.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TokenComparison:
    verdict: str  # "identical" | "close" | "diverged"
    position: int | None  # first differing token, None when identical
    detail: str

    @property
    def ok(self) -> bool:
        return self.verdict != "diverged"

    def to_json(self) -> dict[str, object]:
        return {"verdict": self.verdict, "position": self.position, "detail": self.detail}


def compare_greedy(
    ref_tokens: Sequence[str],
    ref_top: Sequence[Mapping[str, float]] | None,
    got_tokens: Sequence[str],
    got_top: Sequence[Mapping[str, float]] | None,
    *,
    n: int,
) -> TokenComparison:
    """Compare the first `n` tokens.

    After the first divergence the two continuations condition on different
    text, so only that first position is judged (as upstream does).
    """
    a, b = list(ref_tokens[:n]), list(got_tokens[:n])
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x == y:
            continue
        if ref_top is None or got_top is None or i >= len(ref_top) or i >= len(got_top):
            return TokenComparison("diverged", i, f"token {i}: {x!r} vs {y!r} (no logprobs)")
        if y in ref_top[i] and x in got_top[i]:
            return TokenComparison(
                "close", i, f"token {i}: {x!r} vs {y!r}, each in the other's top-{len(ref_top[i])}"
            )
        return TokenComparison("diverged", i, f"token {i}: {x!r} vs {y!r}, outside the top-k")
    if len(a) != len(b):
        short = min(len(a), len(b))
        return TokenComparison(
            "diverged", short, f"one side ended after {short} tokens, the other went on"
        )
    return TokenComparison("identical", None, f"first {len(a)} tokens identical")

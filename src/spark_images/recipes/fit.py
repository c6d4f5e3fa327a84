"""Does a recipe fit one Spark's unified memory? (pure: figures in, a verdict out)

need(L) = weights + CUDA graphs + activations + the KV cache of one sequence
of L tokens (vLLM refuses to start without room for one max_model_len
sequence). The budget is what vLLM may take: the usable pool less the host
headroom (`defaults`). Verdict: `does-not-fit` when need(max_model_len) is
over the budget, `tight` when it is over TIGHT_SHARE of it or when
max_num_seqs full-length sequences are not all in it, else `fits`. With it:
the largest max_model_len that fits (capped by the model's own context), and
the --gpu-memory-utilization to set: what the recipe needs with every
sequence at full length, as a share of the device total, never past the budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from spark_images.recipes import defaults as d
from spark_images.recipes.kvcache import KvCache
from spark_images.recipes.model import Recipe

FITS, TIGHT, DOES_NOT_FIT = "fits", "tight", "does-not-fit"


@dataclass(frozen=True)
class Weights:
    bytes: int
    source: str  # what they were read from
    files: int
    detail: dict[str, int]  # dtype / ggml type -> bytes


def _gib(n: float) -> float:
    return round(n / d.GiB, 3)


def largest_len(room: float, kv: KvCache, cap: int | None) -> int:
    """The largest L with kv.bytes_for(L) <= room (0 when none), at most `cap`."""
    if room <= 0:
        return 0
    hi = cap or 16_777_216
    if kv.bytes_for(hi) <= room:
        return hi
    lo = 0
    while lo < hi:  # bytes_for is monotone in L
        mid = (lo + hi + 1) // 2
        if kv.bytes_for(mid) <= room:
            lo = mid
        else:
            hi = mid - 1
    return lo


def judge(recipe: Recipe, weights: Weights, kv: KvCache, context: int | None) -> dict[str, Any]:
    limits = recipe.limits
    reserves = sum(r.gib for r in d.RESERVES if r.name != "host headroom") * d.GiB
    headroom = next(r.gib for r in d.RESERVES if r.name == "host headroom") * d.GiB
    budget = d.USABLE.gib * d.GiB - headroom
    fixed = weights.bytes + reserves
    one = kv.bytes_for(limits.max_model_len)
    need = fixed + one
    want = fixed + one * limits.max_num_seqs
    if need > budget:
        verdict = DOES_NOT_FIT
    elif need > d.TIGHT_SHARE * budget or want > budget:
        verdict = TIGHT
    else:
        verdict = FITS
    total = d.DEVICE_TOTAL.gib * d.GiB
    utilization = min(math.ceil(min(want, budget) / total * 100) / 100, math.floor(budget / total * 100) / 100)
    seqs = int((budget - fixed) // one) if one and budget > fixed else 0
    notes = list(kv.not_handled)
    if limits.gpu_memory_utilization * total > budget:
        notes.append(f"the recipe's gpu_memory_utilization {limits.gpu_memory_utilization:g} reserves "
                     f"{_gib(limits.gpu_memory_utilization * total)} GiB, more than the {_gib(budget)} GiB budget: "
                     "the OS and container lose their headroom (unified memory: the reservation cannot be swapped)")
    if context and limits.max_model_len > context:
        notes.append(f"max_model_len {limits.max_model_len} is over the model's own context of {context} tokens")
    return {
        "recipe": recipe.name,
        "verdict": verdict,
        "weights": {"bytes": weights.bytes, "gib": _gib(weights.bytes), "source": weights.source,
                    "files": weights.files, "by_type": weights.detail},
        "kv_cache": {**kv.to_json(), "kv_cache_dtype": limits.kv_cache_dtype,
                     "bytes_one_sequence": one, "gib_one_sequence": _gib(one),
                     "gib_all_sequences": _gib(one * limits.max_num_seqs)},
        "reserves": [r.to_json() for r in d.RESERVES],
        "pool": {"spec_gib": round(d.SPEC_POOL.gib, 3), "device_total_gib": d.DEVICE_TOTAL.gib,
                 "usable_gib": d.USABLE.gib, "budget_gib": _gib(budget),
                 "sources": [d.SPEC_POOL.source, d.DEVICE_TOTAL.source, d.USABLE.source]},
        "need_gib": _gib(need),
        "want_gib": _gib(want),
        "max_model_len": limits.max_model_len,
        "max_num_seqs": limits.max_num_seqs,
        "full_length_sequences_that_fit": seqs,
        "largest_max_model_len": largest_len(budget - fixed, kv, context),
        "gpu_memory_utilization": utilization,
        "recipe_gpu_memory_utilization": limits.gpu_memory_utilization,
        "expected_memory_gib": recipe.memory_gib.value,
        "notes": notes,
    }

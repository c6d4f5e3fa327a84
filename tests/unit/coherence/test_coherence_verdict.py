"""Combinations, selection, serve commands, speed maths and greedy comparison."""

from __future__ import annotations

import shlex

import pytest

from spark_images.coherence import GateOptions, compare, gpu, speed, verdict
from spark_images.coherence.client import Completion
from spark_images.coherence.runner import apply_ab
from spark_images.coherence.verdict import Combination


def test_default_pairs_linear_with_moe_backend() -> None:
    combos = verdict.combinations(["m"], ["auto", "flashinfer-b12x", "marlin"], None, ["auto", "fp8"])
    assert [(c.moe_backend, c.linear_backend, c.kv_cache_dtype) for c in combos] == [
        ("auto", "auto", "auto"), ("auto", "auto", "fp8"),
        ("flashinfer_b12x", "flashinfer_b12x", "auto"), ("flashinfer_b12x", "flashinfer_b12x", "fp8"),
        ("marlin", "marlin", "auto"), ("marlin", "marlin", "fp8"),
    ]  # fmt: skip
    cross = verdict.combinations(["a", "b"], ["auto", "marlin"], ["auto", "marlin"], ["auto"])
    assert len(cross) == 8


def test_serve_command_is_ready_to_run() -> None:
    combo = Combination("org/model", "flashinfer_b12x", "flashinfer_b12x", "fp8")
    cmd = verdict.serve_command(combo, ["--max-model-len", "8192"])
    assert shlex.split(cmd) == [
        "vllm", "serve", "org/model", "--moe-backend", "flashinfer_b12x",
        "--linear-backend", "flashinfer_b12x", "--kv-cache-dtype", "fp8", "--max-model-len", "8192",
    ]  # fmt: skip
    assert verdict.serve_command(Combination("m")) == "vllm serve m"
    docker = shlex.split(verdict.docker_command("r@sha256:" + "a" * 64, combo, env={"HF_TOKEN": "secret"}))
    assert docker[:6] == ["docker", "run", "--rm", "--gpus", "all", "--ipc"]
    assert "secret" not in " ".join(docker) and "HF_TOKEN" in docker


def _result(moe: str, status: str, rate: float | None, model: str = "m") -> dict:
    return {"model": model, "moe_backend": moe, "linear_backend": moe, "kv_cache_dtype": "auto",
            "status": status, "speed": {"decode_tokens_per_s": rate}}  # fmt: skip


def test_fastest_coherent_is_selected() -> None:
    results = [_result("auto", "failed", 99.0), _result("flashinfer_b12x", "passed", 61.0),
               _result("marlin", "passed", 50.0)]  # fmt: skip
    best = verdict.select_fastest(results)
    assert best is not None and best["moe_backend"] == "flashinfer_b12x"
    assert verdict.select_fastest([_result("a", "passed", None), _result("b", "passed", 1.0)])["moe_backend"] == "b"
    assert verdict.select_fastest([_result("a", "failed", 9.0)]) is None
    assert verdict.gate_status(results, ["m"]) == ("passed", "")
    assert verdict.gate_status(results, ["m", "other"])[0] == "failed"
    assert verdict.gate_status([], ["m"])[0] == "failed"


def test_probe_judgement() -> None:
    rows = [{"probe": f"p{i}", "endpoint": "chat", "ok": i != 3} for i in range(20)]
    assert verdict.judge_probes(rows, min_pass_rate=0.9, upstream_ids=["p0"]).ok
    assert not verdict.judge_probes(rows, min_pass_rate=0.9, upstream_ids=["p3"]).ok
    assert not verdict.judge_probes(rows[:5], min_pass_rate=0.9, upstream_ids=[]).ok


def test_decode_rate_and_metrics_cross_check() -> None:
    assert speed.decode_tokens_per_s(257, 10.0, 14.0) == pytest.approx(64.0)
    assert speed.decode_tokens_per_s(1, 10.0, 14.0) is None
    text = (
        "# TYPE vllm:generation_tokens_total counter\n"
        'vllm:generation_tokens_total{engine="0",model_name="m"} 900.0\n'
        'vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 12.0\n'
        'vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 765.0\n'
    )
    before = {"vllm:generation_tokens_total": 132.0}
    after = speed.parse_prometheus(text)
    assert after["vllm:generation_tokens_total"] == 900.0
    ok = speed.cross_check(before, after, 768, 64.0)
    assert ok.ok, ok.detail
    assert not speed.cross_check(before, after, 500, 64.0).ok  # token counts disagree
    assert not speed.cross_check(before, after, 768, 200.0).ok  # rates disagree
    assert not speed.cross_check({}, {}, 768, 64.0).ok


def test_greedy_comparison_with_top_logprobs() -> None:
    a = ["The", " cat", " sat"]
    assert compare.compare_greedy(a, None, a, None, n=3).verdict == "identical"
    top_a = [{"The": -0.1}, {" cat": -0.6, " dog": -0.8}, {" sat": -0.1}]
    top_b = [{"The": -0.1}, {" dog": -0.6, " cat": -0.8}, {" ran": -0.1}]
    close = compare.compare_greedy(a, top_a, ["The", " dog", " ran"], top_b, n=3)
    assert close.verdict == "close" and close.position == 1
    far = compare.compare_greedy(a, top_a, ["The", "!", "!"], [{}, {"!": -0.1}, {}], n=3)
    assert far.verdict == "diverged" and not far.ok
    assert compare.compare_greedy(a, None, a[:1], None, n=3).verdict == "diverged"


@pytest.mark.parametrize(
    ("output", "ok", "reason"),
    [
        ("12.1\n", True, "GPU compute capability 12.1"),
        ("9.0\n9.0\n", False, "GPU compute capability 9.0"),
        ("", False, "nvidia-smi lists no GPU"),
    ],
)
def test_gpu_capability_verdict(output: str, ok: bool, reason: str) -> None:
    found = gpu.judge_capabilities(output)
    assert (found.ok, found.reason) == (ok, reason)


def _greedy(tokens: list[str], top: list[dict[str, float]] | None = None) -> Completion:
    return Completion(text="".join(tokens), tokens=tokens, top_logprobs=top or [{t: -0.1} for t in tokens])


def test_ab_against_a_known_good_backend() -> None:
    good = [_greedy(["The", " capital", " is", " Paris"],
                    [{"The": -0.1}, {" capital": -0.1}, {" is": -0.5, " was": -0.6}, {" Paris": -0.1}])]  # fmt: skip
    close = [_greedy(["The", " capital", " was", " Paris"],
                     [{"The": -0.1}, {" capital": -0.1}, {" was": -0.5, " is": -0.6}, {" Paris": -0.1}])]  # fmt: skip
    wrong = [_greedy(["The", " capital", " is", " Berlin"])]
    results = [
        {**_result("marlin", "passed", 40.0), "reasons": [], "warnings": []},
        {**_result("flashinfer_b12x", "passed", 60.0), "reasons": [], "warnings": []},
        {**_result("auto", "passed", 70.0), "reasons": [], "warnings": []},
    ]
    opts = GateOptions(ab_reference="marlin", ab_tokens=4)
    results = apply_ab(results, {0: good, 1: close, 2: wrong}, "marlin", opts)
    assert "ab" not in results[0]
    assert results[1]["status"] == "passed" and results[1]["ab"]["diverged"] == []
    assert results[2]["status"] == "failed" and "A/B against marlin" in results[2]["reasons"][0]
    best = verdict.select_fastest(results)
    assert best is not None and best["moe_backend"] == "flashinfer_b12x"


def test_ab_without_a_passing_reference_warns() -> None:
    results = [
        {**_result("marlin", "failed", None), "reasons": ["x"], "warnings": []},
        {**_result("auto", "passed", 70.0), "reasons": [], "warnings": []},
    ]
    results = apply_ab(results, {0: [], 1: []}, "marlin", GateOptions(ab_reference="marlin"))
    assert results[1]["status"] == "passed" and results[1]["ab"]["status"] == "skipped"
    assert any("A/B" in w for w in results[1]["warnings"])

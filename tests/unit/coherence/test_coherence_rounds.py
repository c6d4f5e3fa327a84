"""Rounds (pure): the round-robin order, the pooled speed, the merged record, the options.

The container runs in test_coherence_rounds_engine.py prove the same on the real
engine; these cover the planner and the merge case by case.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import yaml

from spark_images.coherence import GateOptions, rounds, speed
from spark_images.core.errors import Finding, UsageError
from spark_images.profiles.profile import load_profile


def test_round_robin_serves_every_combination_once_per_round_in_the_given_order() -> None:
    assert rounds.round_robin(3, 2) == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]
    assert [i for _, i in rounds.round_robin(2, 4)] == [0, 1, 0, 1, 0, 1, 0, 1]  # A B A B ...


def test_one_round_is_the_gate_as_it_was_and_nothing_to_serve_is_empty() -> None:
    assert rounds.round_robin(3, 1) == [(1, 0), (1, 1), (1, 2)]
    assert rounds.round_robin(0, 5) == []


@pytest.mark.parametrize(("count", "n"), [(2, 0), (2, -1), (-1, 2)])
def test_round_robin_refuses_a_plan_that_means_nothing(count: int, n: int) -> None:
    with pytest.raises(ValueError, match="rounds"):
        rounds.round_robin(count, n)


def _speed(rates: list[float]) -> dict[str, object]:
    measured = speed.spread(rates)
    assert measured is not None
    return {"decode_tokens_per_s": round(measured.median, 2), "spread": measured.to_json(), "tokens_per_run": 32,
            "runs": [{"tokens": 32, "decode_tokens_per_s": r} for r in rates],
            "cross_check": {"ok": True, "detail": "x"}}  # fmt: skip


def test_the_pool_is_the_median_and_spread_of_every_run_of_every_round() -> None:
    first, second = [100.0, 101.0, 99.0], [300.0, 302.0, 298.0]
    pooled = rounds.pool_speed([(1, _speed(first)), (2, _speed(second))])
    assert pooled is not None
    every = first + second
    assert pooled["decode_tokens_per_s"] == round(statistics.median(every), 2) == 199.5
    assert pooled["spread"] == speed.spread(every).to_json()  # type: ignore[union-attr]
    assert pooled["spread"]["runs"] == 6
    assert [r["round"] for r in pooled["runs"]] == [1, 1, 1, 2, 2, 2]
    assert [r["decode_tokens_per_s"] for r in pooled["per_round"]] == [100.0, 300.0]
    assert pooled["pooled"] == {"rounds": [1, 2], "runs": 6}
    # each round alone claims a tight interval; the pool shows the drift between them
    assert pooled["spread"]["iqr"] == [100.25, 299.5]
    assert [r["spread"]["iqr"] for r in pooled["per_round"]] == [[99.5, 100.5], [299.0, 301.0]]


def test_an_unknown_round_makes_the_pool_unknown_and_an_unmeasured_round_adds_nothing() -> None:
    unknown = {
        "decode_tokens_per_s": "unknown",
        "unknown_reason": "usage.completion_tokens is nan",
        "runs": [],
    }
    pooled = rounds.pool_speed([(1, _speed([50.0, 51.0])), (2, unknown)])
    assert pooled is not None
    assert pooled["decode_tokens_per_s"] == "unknown" and "nan" in pooled["unknown_reason"]
    assert "spread" not in pooled
    only = rounds.pool_speed([(1, None), (2, _speed([50.0, 52.0]))])
    assert (
        only is not None and only["pooled"]["rounds"] == [2] and only["decode_tokens_per_s"] == 51.0
    )
    assert rounds.pool_speed([(1, None)]) is None


def _record(
    status: str, reasons: list[str], rates: list[float] | None, **extra: object
) -> dict[str, object]:
    doc: dict[str, object] = {"model": "m", "moe_backend": "marlin", "linear_backend": "marlin",
                              "kv_cache_dtype": "auto", "status": status, "reasons": reasons,
                              "warnings": ["log: degraded"], "startup_s": 1.0, "wall_s": 9.0, **extra}  # fmt: skip
    if rates is not None:
        doc["speed"] = _speed(rates)
    return doc


def test_a_failure_in_a_later_round_fails_the_combination_and_names_its_round() -> None:
    merged = rounds.merge([(1, _record("passed", [], [40.0, 41.0])),
                           (2, _record("failed", ["log: fatal cuda-illegal-address: x"], None, log_tail=["x"]))])  # fmt: skip
    assert merged["status"] == "failed"
    assert merged["reasons"] == ["round 2: log: fatal cuda-illegal-address: x"]
    assert merged["warnings"] == ["log: degraded"]  # the same warning is not repeated per round
    assert merged["log_tail"] == ["x"]
    assert [(r["round"], r["status"]) for r in merged["rounds"]] == [(1, "passed"), (2, "failed")]
    assert merged["speed"]["pooled"]["rounds"] == [1]


def test_rounds_that_all_pass_keep_the_first_rounds_checks_and_pool_the_speed() -> None:
    merged = rounds.merge([(1, _record("passed", [], [40.0, 41.0], probes={"passed": 24})),
                           (2, _record("passed", [], [44.0, 45.0], probes={"passed": 23}))])  # fmt: skip
    assert merged["status"] == "passed" and merged["reasons"] == []
    assert merged["probes"] == {"passed": 24}
    assert merged["speed"]["decode_tokens_per_s"] == 42.5
    assert [r["decode_tokens_per_s"] for r in merged["rounds"]] == [40.5, 44.5]
    with pytest.raises(ValueError):
        rounds.merge([])


@pytest.mark.parametrize("value", [0, -1, 21, True, 2.0])
def test_gate_options_refuse_rounds_outside_one_to_twenty(value: object) -> None:
    with pytest.raises(UsageError, match="--rounds"):
        GateOptions(rounds=value)  # type: ignore[arg-type]
    assert GateOptions().rounds == 1


PROFILE = Path(__file__).resolve().parents[3] / "profiles" / "cu130.yaml"


def _profile(tmp_path: Path, rounds: object) -> Path:
    doc = yaml.safe_load(PROFILE.read_text())
    doc["verify"]["coherence"]["rounds"] = rounds
    path = tmp_path / "cu130.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_profiles_rounds_reach_the_gate_and_the_flag_overrides_them(tmp_path: Path) -> None:
    from spark_images.cli import build_parser
    from spark_images.cli import coherence as cli

    path = _profile(tmp_path, 3)
    assert load_profile(path).verify.coherence.rounds == 3  # type: ignore[union-attr]
    assert load_profile(PROFILE).verify.coherence.rounds == 1  # type: ignore[union-attr]
    for argv, want in ((["coherence", "img", "--profile", str(path)], 3),
                       (["coherence", "img", "--profile", str(path), "--rounds", "1"], 1),
                       (["coherence", "img", "--model", "m"], 1)):  # fmt: skip
        args = build_parser().parse_args(argv)
        cli._matrix(args)
        assert cli._options(args).rounds == want, argv


@pytest.mark.parametrize("value", [0, 21, True, "2"])
def test_a_profiles_rounds_outside_one_to_twenty_is_one_line_naming_the_field(
    tmp_path: Path, value: object
) -> None:
    with pytest.raises(Finding) as caught:
        load_profile(_profile(tmp_path, value))
    (problem,) = caught.value.problems
    assert problem.field == "verify.coherence.rounds"

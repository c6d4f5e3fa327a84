"""The acceptance run's judgement, on what the real main job gave.

The fixture is trimmed from the first acceptance run that passed every stage of
the real cu130 lock (its `origin` field says how it was made). The run itself
takes ~45 minutes on two cores, so CI runs it only on request; these tests hold
its judgement to what that run saw, and show each written-down expectation can fail.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]
FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "acceptance-cu130-2026-12-02.json").read_text())


@pytest.fixture(scope="module")
def acceptance() -> ModuleType:
    spec = importlib.util.spec_from_file_location("acceptance", ROOT / ".ci" / "acceptance.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_real_run_holds(acceptance: ModuleType) -> None:
    problems, withheld = acceptance.judge_build(FIXTURE["build_exit_code"], FIXTURE["record"])
    assert problems == [] and withheld  # the lock is withheld only because the audit could not run
    assert acceptance.judge_check(FIXTURE["check"]) == []
    assert FIXTURE["check"]["verdict"] == "degraded"


def test_a_build_that_fails_for_another_reason_fails(acceptance: ModuleType) -> None:
    record = copy.deepcopy(FIXTURE["record"])
    record["result"]["reason"] = "stage build: docker buildx build exited 1"
    problems, withheld = acceptance.judge_build(1, record)
    assert not withheld and any("exited 1" in line for line in problems)
    # an audit that ran and still left the lock unwritten is not the history's absence either
    record = copy.deepcopy(FIXTURE["record"])
    record["audit"]["status"] = "passed"
    assert acceptance.judge_build(1, record)[0]


@pytest.mark.parametrize("stage", ["build", "cubins", "verdict"])
def test_every_stage_must_hold(acceptance: ModuleType, stage: str) -> None:
    record = copy.deepcopy(FIXTURE["record"])
    record[stage]["status"] = "failed"
    problems, _ = acceptance.judge_build(FIXTURE["build_exit_code"], record)
    assert any(f"record stage {stage}: failed" in line for line in problems)


def test_a_coherence_pass_off_a_spark_is_a_problem(acceptance: ModuleType) -> None:
    record = copy.deepcopy(FIXTURE["record"])
    record["coherence"]["status"] = "passed"
    assert acceptance.judge_build(FIXTURE["build_exit_code"], record)[0]


def test_a_broken_verdict_or_a_new_reason_fails(acceptance: ModuleType) -> None:
    broken = {**FIXTURE["check"], "verdict": "broken"}
    assert any("check verdict broken" in line for line in acceptance.judge_check(broken))
    new_library = {"rule": "", "subject": "vllm/_moe_C.abi3.so", "line": "degraded: vllm/_moe_C.abi3.so: no native sm_121 code"}
    more = {**FIXTURE["check"], "reasons": [*FIXTURE["check"]["reasons"], new_library]}
    (line,) = acceptance.judge_check(more)
    assert "vllm/_moe_C.abi3.so" in line
    assert acceptance.judge_check({"verdict": "degraded", "reasons": []}) == ["check verdict degraded without a named reason"]

"""Pure promotion rules: tag names, which lock entries may be promoted, tag steps."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import date
from typing import Any

import pytest

from spark_images.release import lock as lockfile
from spark_images.release import publish as rules

COMMIT = "98dff2a81d747d1dba01a47f939f48c3526d4206"
DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64


def _lock(entry: dict[str, Any] | None) -> dict[str, Any]:
    return {"lock_version": 1, "images": {} if entry is None else {"cu130": entry}}


@pytest.fixture
def good(make_entry: Any) -> dict[str, Any]:
    return make_entry("ghcr.io/spark/vllm", DIGEST_A)


def test_immutable_tag_names_line_short_commit_and_date() -> None:
    tag = rules.immutable_tag("cu130", COMMIT, date(2026, 12, 1))
    assert tag == f"cu130-{COMMIT[: rules.SHORT_SHA_LEN]}-20261201"
    assert rules.is_immutable_tag(tag)
    assert not rules.is_immutable_tag("cu130")
    assert not rules.is_immutable_tag("latest")
    assert rules.tag_problems([tag, "cu130"]) == []


def test_bad_tags_are_named() -> None:
    lines = rules.tag_problems(["ok", "-dash", "x" * 129, "a/b"])
    assert len(lines) == 3
    assert "'-dash'" in lines[0]


def test_gated_entry_may_be_promoted(good: dict[str, Any]) -> None:
    assert rules.promotion_problems(_lock(good), "cu130", "images.lock.json") == []
    ref = rules.image_ref(good)
    assert (ref.host, ref.repository, ref.digest) == ("ghcr.io", "spark/vllm", DIGEST_A)
    assert str(ref) == f"ghcr.io/spark/vllm@{DIGEST_A}"


def test_missing_entry_is_refused_and_names_the_known_ones(good: dict[str, Any]) -> None:
    problems = rules.promotion_problems(_lock(good), "cu129", "images.lock.json")
    assert len(problems) == 1
    line = problems[0].line()
    assert line.startswith("images.lock.json: images.cu129: no lock entry")
    assert "cu130" in line


def test_lock_without_images_table_is_refused() -> None:
    problems = rules.promotion_problems({"lock_version": 1}, "cu130", "L.json")
    assert [p.field for p in problems] == ["images"]


@pytest.mark.parametrize(
    ("cubins", "coherence", "fields"),
    [
        ("missing", "passed", ["images.cu130.cubins.verdict"]),
        ("jit-only", "passed", ["images.cu130.cubins.verdict"]),
        ("partial", "passed", []),  # other libraries carry code for other GPUs: normal
        ("native", "passed", []),
        ("native", "skipped", ["images.cu130.coherence.status"]),
        ("native", "failed", ["images.cu130.coherence.status"]),
        ("no-gpu-code", "skipped", ["images.cu130.cubins.verdict", "images.cu130.coherence.status"]),
    ],
)
def test_which_gate_results_allow_promotion(
    make_entry: Any, cubins: str, coherence: str, fields: list[str]
) -> None:
    entry = make_entry("ghcr.io/spark/vllm", DIGEST_A, cubins=cubins, coherence=coherence,
                       reason="no sm_121 GPU")
    problems = rules.promotion_problems(_lock(entry), "cu130", "images.lock.json")
    assert [p.field for p in problems] == fields


def test_skipped_coherence_reason_is_reported(make_entry: Any) -> None:
    entry = make_entry("ghcr.io/spark/vllm", DIGEST_A, coherence="skipped", reason="no sm_121 GPU")
    (problem,) = rules.promotion_problems(_lock(entry), "cu130", "L")
    assert "no sm_121 GPU" in problem.message


def test_skipped_audit_is_refused(make_entry: Any) -> None:
    entry = make_entry("ghcr.io/spark/vllm", DIGEST_A, audit="skipped", reason="no vLLM history")
    (problem,) = rules.promotion_problems(_lock(entry), "cu130", "L")
    assert problem.field == "images.cu130.audit.status"
    assert "no vLLM history" in problem.message


def test_gate_sections_missing_entirely_are_refused(good: dict[str, Any]) -> None:
    entry = {k: v for k, v in good.items() if k not in ("cubins", "coherence", "audit")}
    problems = rules.promotion_problems(_lock(entry), "cu130", "L")
    assert {p.field for p in problems} == {
        "images.cu130.cubins.verdict", "images.cu130.coherence.status", "images.cu130.audit.status"
    }


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"digest": "sha256:1234"}, "images.cu130.digest"),
        ({"repository": "vllm"}, "images.cu130.repository"),
        ({"repository": "ghcr.io/Spark/VLLM"}, "images.cu130.repository"),
        ({"image": "ghcr.io/spark/vllm:cu130"}, "images.cu130.image"),
        ({"vllm_commit": "main"}, "images.cu130.vllm_commit"),
    ],
)
def test_malformed_entries_name_the_field(good: dict[str, Any], change: dict[str, str], field: str) -> None:
    problems = rules.promotion_problems(_lock({**good, **change}), "cu130", "L")
    assert [p.field for p in problems] == [field]


def test_plan_tags_creates_moves_and_keeps() -> None:
    immutable = rules.immutable_tag("cu130", COMMIT, date(2026, 12, 1))
    steps, refusals = rules.plan_tags(
        DIGEST_A, ["cu130", immutable, "stable", "cu130"],
        {"cu130": DIGEST_B, immutable: None, "stable": DIGEST_A},
    )
    assert refusals == []
    assert [(s.tag, s.action, s.previous) for s in steps] == [
        ("cu130", "move", DIGEST_B),
        (immutable, "create", None),
        ("stable", "unchanged", DIGEST_A),
    ]
    assert all(s.digest == DIGEST_A for s in steps)


def test_plan_tags_never_moves_an_immutable_tag() -> None:
    immutable = rules.immutable_tag("cu130", COMMIT, date(2026, 12, 1))
    steps, refusals = rules.plan_tags(DIGEST_A, [immutable], {immutable: DIGEST_B})
    assert steps == []
    assert len(refusals) == 1 and DIGEST_B in refusals[0]
    # the same digest again is not a move: re-running a promotion is harmless
    steps, refusals = rules.plan_tags(DIGEST_A, [immutable], {immutable: DIGEST_A})
    assert refusals == [] and steps[0].action == "unchanged"


def test_entry_with_tags_adds_without_duplicates(good: dict[str, Any]) -> None:
    before = {**good, "tags": ["cu130-0123456789-20261101"]}
    after = rules.entry_with_tags(before, ["cu130", "cu130"])
    assert after["tags"] == ["cu130", "cu130-0123456789-20261101"]
    assert before["tags"] == ["cu130-0123456789-20261101"]  # not mutated


def test_lock_pr_body_names_digest_gates_and_tags(good: dict[str, Any]) -> None:
    steps, _ = rules.plan_tags(DIGEST_A, ["cu130"], {"cu130": DIGEST_B})
    body = rules.lock_pr_body("cu130", good, steps)
    assert f"ghcr.io/spark/vllm@{DIGEST_A}" in body
    assert f"| `cu130` | move | `{DIGEST_B}` |" in body
    assert "| cubins gate | native |" in body
    assert "| audit gate | passed |" in body
    assert "| coherence gate | passed |" in body
    assert "#38126, #40082" in body
    assert rules.lock_pr_title("cu130", good).startswith("lock: promote cu130 to sha256:aaaaaaaaaaaa")


def test_gate_result_must_pass_on_the_locked_digest_on_a_real_gpu() -> None:
    passed = {"status": "passed", "image": f"ghcr.io/spark/vllm@{DIGEST_A}", "gpu": "sm_121 (NVIDIA GB10)",
              "combinations": [{"model": "org/m", "status": "passed", "reasons": []}]}  # fmt: skip
    assert rules.gate_result_problems(passed, DIGEST_A, "gate.json") == []
    # a build record carrying the section works the same way
    assert rules.gate_result_problems({"profile": "cu130", "coherence": passed}, DIGEST_A, "r.json") == []
    assert [p.field for p in rules.gate_result_problems(passed, DIGEST_B, "g")] == ["coherence.image"]
    by_tag = {**passed, "image": "ghcr.io/spark/vllm:cu130"}
    assert [p.field for p in rules.gate_result_problems(by_tag, DIGEST_A, "g")] == ["coherence.image"]
    stand_in = {**passed, "assumed_gpu": True}
    assert [p.field for p in rules.gate_result_problems(stand_in, DIGEST_A, "g")] == ["coherence.assumed_gpu"]
    skipped = {"status": "skipped", "reason": "no sm_121 GPU (no nvidia-smi)", "image": passed["image"]}
    (problem,) = rules.gate_result_problems(skipped, DIGEST_A, "g")
    assert "no nvidia-smi" in problem.message
    assert [p.field for p in rules.gate_result_problems({"profile": "x"}, DIGEST_A, "g")] == ["coherence"]


def test_entry_with_coherence_keeps_only_the_lock_fields(good: dict[str, Any]) -> None:
    section = {"status": "passed", "image": "x", "combinations": [{}], "selected": {}}
    entry = rules.entry_with_coherence({**good, "coherence": {"status": "skipped", "reason": "no GPU"}}, section)
    assert entry["coherence"] == {"status": "passed"}
    assert entry["digest"] == good["digest"]



def test_schema_lock_is_the_declaration_the_lock_reader_checks(good: dict[str, Any]) -> None:
    """`spark-images schema lock` prints the JSON Schema of the one declaration
    (lock.LOCK_SPEC) that the lock reader checks files against: an entry make_entry
    wrote passes, and what the reader refuses by shape the exported schema names."""
    proc = subprocess.run([sys.executable, "-m", "spark_images", "schema", "lock"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    exported = json.loads(proc.stdout)
    assert exported == lockfile.lock_json_schema()
    entry_schema = exported["properties"]["images"]["additionalProperties"]
    assert set(entry_schema["properties"]) == set(lockfile.ENTRY_SPEC)
    assert entry_schema["properties"]["fixes_included"]["type"] == "array"
    assert entry_schema["properties"]["digest"]["pattern"].startswith("^(?:sha256:")
    assert lockfile.lock_problems(_lock(good), "f") == []
    bad = _lock({**good, "fixes_included": [True, False]})  # bool is an int in Python: refused here
    fields = [p.field for p in lockfile.lock_problems(bad, "f")]
    assert fields == ["images.cu130.fixes_included"]


MATRIX = [("org/a", "auto", "auto", "auto"), ("org/a", "marlin", "marlin", "fp8"), ("org/b", "auto", "auto", "auto")]


def _result(combo: tuple[str, str, str, str], rate: Any = 40.0, status: str = "passed") -> dict[str, Any]:
    keys = ("model", "moe_backend", "linear_backend", "kv_cache_dtype")
    return {**dict(zip(keys, combo, strict=True)), "status": status, "reasons": [], "speed": {"decode_tokens_per_s": rate}}


def test_a_record_must_cover_the_matrix_and_its_choice_must_be_measured() -> None:
    whole = {"combinations": [_result(c) for c in MATRIX]}
    assert rules.matrix_problems(whole, MATRIX, "r.json") == []
    # vLLM's spelling of a backend (`Marlin`, `flashinfer-b12x`) is the same combination
    spelled = {"combinations": [_result(c) for c in MATRIX[:1]] + [_result(("org/a", "Marlin", "marlin", "FP8")),
                                                                   _result(MATRIX[2])]}
    assert rules.matrix_problems(spelled, MATRIX, "r.json") == []
    (short,) = rules.matrix_problems({"combinations": [_result(c) for c in MATRIX[:2]]}, MATRIX, "r.json")
    assert "1 of 3 combinations missing" in short.message and "org/b" in short.message
    (other,) = rules.matrix_problems({"combinations": [_result(("org/x", *c[1:])) for c in MATRIX]}, MATRIX, "r.json")
    assert "3 of 3" in other.message
    # a failed combination still ran: coverage holds, the choice is the passed one
    one_failed = {"combinations": [_result(MATRIX[0], status="failed"), *(_result(c) for c in MATRIX[1:])]}
    assert rules.matrix_problems(one_failed, MATRIX, "r.json") == []
    for rate in ("unknown", None, True, float("nan"), 0, -3.0):
        unknown = {"combinations": [_result(MATRIX[0], rate), _result(MATRIX[1], rate), _result(MATRIX[2])]}
        (slow,) = rules.matrix_problems(unknown, MATRIX, "r.json")
        assert "org/a" in slow.message and "no measured speed" in slow.message, rate
    # a measured combination is chosen over an unmeasured one
    mixed = {"combinations": [_result(MATRIX[0], "unknown"), _result(MATRIX[1], 12.5), _result(MATRIX[2])]}
    assert rules.matrix_problems(mixed, MATRIX, "r.json") == []
    assert rules.matrix_problems(whole, [], "r.json")[0].field == "coherence.combinations"

"""A profile's recipes in the build line: read and checked at validate, skipped (never passed) without a Spark.

The served path (a recipe's exact command in a container, judged) runs against
the stand-in vLLM image in tests/integration/coherence/test_coherence_recipe_gate.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_images.buildline import serialise, steps
from spark_images.buildline.resolve import resolve_profile
from spark_images.buildline.stages import SKIPPED, Audited, Built, ScanKey, Scanned
from spark_images.coherence import gpu
from spark_images.core.errors import Finding
from spark_images.recipes import gate
from spark_images.recipes.model import load_recipe
from spark_images.release import lock
from spark_images.release import publish as rules
from support.recipe_projects import write_project
from support.recipe_support import REPO, run_cli, shipped

DIGEST = "sha256:" + "cd" * 32
REV = "0123456789abcdef0123456789abcdef01234567"


def project(tmp: Path, listed: list[str], recipes: dict[str, dict[str, Any]]) -> Path:
    """TMP/profiles/cu130.yaml (the shipped one, its gate listing LISTED) and TMP/recipes/NAME.yaml."""
    return write_project(tmp, lambda verify: verify["coherence"].update(recipes=listed), recipes)


def test_the_plan_carries_the_profiles_recipes_read_and_checked(tmp_path: Path) -> None:
    path = project(tmp_path, ["gpt-oss-20b"], {"gpt-oss-20b": shipped("gpt-oss-20b")})
    resolved = resolve_profile(path)
    assert resolved.plan.coherence is not None and resolved.plan.coherence.recipes == ("gpt-oss-20b",)
    assert [r.name for r in resolved.recipes] == ["gpt-oss-20b"]
    assert resolved.recipes[0].path == "recipes/gpt-oss-20b.yaml"
    assert list(resolved.plan.to_json()["coherence"]["recipes"]) == ["gpt-oss-20b"]
    # `plan` shows each recipe the gate serves with its exact command
    proc = run_cli(["plan", str(path), "--json"])
    assert proc.returncode == 0, proc.stderr
    (shown,) = json.loads(proc.stdout)["coherence"]["recipes"]
    assert shown["argv"] == gate.serve_command(resolved.recipes[0])[0] and shown["file"] == "recipes/gpt-oss-20b.yaml"
    text = run_cli(["plan", str(path)]).stdout
    assert "recipe gpt-oss-20b: vllm serve openai/gpt-oss-20b --enable-prefix-caching --revision" in text
    # a profile without recipes plans exactly as before (plan.json is part of the image)
    plain = resolve_profile(REPO / "profiles" / "cu129.yaml").plan.to_json()
    assert "recipes" not in plain["coherence"]


@pytest.mark.parametrize(
    ("listed", "recipes", "field", "says"),
    [
        (["nope"], {}, "verify.coherence.recipes[0]", "recipes/nope.yaml does not exist"),
        (["gpt-oss-20b"], {"gpt-oss-20b": {**shipped("gpt-oss-20b"), "profiles": ["cu129"]}},
         "verify.coherence.recipes[0]", "is meant for profiles cu129, not cu130"),
        (["gpt-oss-20b"], {"gpt-oss-20b": {**shipped("gpt-oss-20b"), "name": "other"}},
         "verify.coherence.recipes[0]", "calls itself 'other'"),
        (["nemotron-3-super-120b-nvfp4"], {"nemotron-3-super-120b-nvfp4": shipped("nemotron-3-super-120b-nvfp4")},
         "verify.coherence.recipes[0]", "pins no model revision"),
        (["smollm2-135m-instruct-gguf"], {"smollm2-135m-instruct-gguf": shipped("smollm2-135m-instruct-gguf")},
         "verify.coherence.recipes[0]", "serves a local file"),
        (["gpt-oss-20b", "gpt-oss-20b"], {"gpt-oss-20b": shipped("gpt-oss-20b")},
         "verify.coherence.recipes[1]", "listed twice"),
        (["gpt-oss-20b"], {"gpt-oss-20b": {**shipped("gpt-oss-20b"), "limits": "many"}},
         "limits", "recipes/gpt-oss-20b.yaml"),
    ],
    ids=["missing", "another-profile", "misnamed", "unpinned", "local-file", "twice", "invalid"],
)
def test_a_profile_naming_a_recipe_its_gate_cannot_serve_is_one_line(
    tmp_path: Path, listed: list[str], recipes: dict[str, dict[str, Any]], field: str, says: str
) -> None:
    path = project(tmp_path, listed, recipes)
    with pytest.raises(Finding) as caught:
        resolve_profile(path)
    lines = caught.value.lines()
    assert len(lines) == 1 and field in lines[0] and says in lines[0], lines
    proc = run_cli(["validate", "--no-audit", str(path)])
    assert proc.returncode == 1 and says in proc.stderr and "Traceback" not in proc.stderr
    assert "fix:" in proc.stderr or "(fix" in proc.stderr


def _built(image: str) -> Built:
    return Built(repository="127.0.0.1:5000/spark-images-test/line", digest=DIGEST, config_digest=DIGEST,
                 oci_archive=Path("/nonexistent.oci.tar"), local_image=image, source_date_epoch=1_700_000_000,
                 source_date_epoch_from="profile pin", platform="linux/arm64", emulated=True, build_seconds=1.0)  # fmt: skip


def test_without_a_spark_the_build_skips_every_recipe_with_the_reason_and_locks_no_pass(tmp_path: Path) -> None:
    found = gpu.detect_sm121()
    if found.ok:
        pytest.skip("this host has an sm_121 GPU: the gate would serve the recipes")
    path = project(tmp_path, ["gpt-oss-20b", "gpt-oss-120b"],
                   {"gpt-oss-20b": shipped("gpt-oss-20b"), "gpt-oss-120b": shipped("gpt-oss-120b")})  # fmt: skip
    v = steps.validate(path, lambda _line: None)
    g = steps.coherence(v, _built("spark-images/cu130:build"), lambda _line: None)
    assert g.status == SKIPPED and g.reason.startswith("no sm_121 GPU")
    runs = g.section["recipes"]
    assert [r["recipe"] for r in runs] == ["gpt-oss-20b", "gpt-oss-120b"]
    for run in runs:
        assert run["status"] == "skipped" and run["reason"] == f"no sm_121 GPU ({found.reason})"
        assert run["digest"] == DIGEST and run["decode_tok_s"] is None and run["coherent"] is None
        assert not gate.counts_as_passed(run)
        assert run["line"] == f"recipe {run['recipe']} skipped on {DIGEST}: no sm_121 GPU ({found.reason})"
    # the exact command the Spark would serve is in the record already
    assert runs[0]["argv"][:3] == ["vllm", "serve", "openai/gpt-oss-20b"]

    # the lock keeps the skipped lines, and publish will not promote on them
    a = Audited(SKIPPED, (), (), reason="no vLLM history")
    s = Scanned(key=ScanKey(DIGEST, "0", "sm_121", ()), target="", verdict="native", missing_required=())
    assert [r.recipe for r in g.recipes] == ["gpt-oss-20b", "gpt-oss-120b"]  # the same runs, typed
    entry = serialise.lock_entry(v, a, _built("x"), s, g, tags=[])
    assert entry["recipes"] == gate.lock_recipes(runs)  # what the lock kept of the section's runs
    assert [line["status"] for line in entry["recipes"]] == ["skipped", "skipped"]
    assert entry["recipes"][0]["line"] == runs[0]["line"]
    written = lock.record_candidate(tmp_path / "images.lock.json", "cu130", entry)
    assert written["recipes"] == entry["recipes"]
    doc = json.loads((tmp_path / "images.lock.json").read_text())
    # every other gate passed: the skipped recipes alone stop the promotion
    others_passed = {**doc["images"]["cu130"], "coherence": {"status": "passed"}, "audit": {"status": "passed"}}
    problems = rules.promotion_problems({**doc, "images": {"cu130": others_passed}}, "cu130", "images.lock.json")
    assert [p.field for p in problems] == ["images.cu130.recipes[0].status", "images.cu130.recipes[1].status"]
    assert "skipped" in problems[0].message


def test_the_lock_schema_holds_recipe_lines_and_refuses_a_pass_without_its_speed(tmp_path: Path) -> None:
    proc = run_cli(["schema", "lock"])
    assert proc.returncode == 0, proc.stderr
    entry_schema = json.loads(proc.stdout)["properties"]["images"]["additionalProperties"]
    line = entry_schema["properties"]["recipes"]["items"]
    assert set(line["required"]) == {"recipe", "status", "line"}
    assert line["properties"]["status"]["enum"] == ["passed", "skipped"]

    base = {"recipe": "gpt-oss-20b", "status": "passed", "line": "recipe gpt-oss-20b passed", "digest": DIGEST}
    entry = lock.make_entry(profile_path="profiles/cu130.yaml", repository="r.example/x", digest=DIGEST,
                            plan=resolve_profile(REPO / "profiles" / "cu130.yaml").plan.to_json(), fixes_included=[],
                            audit={"status": "passed"}, cubins={"verdict": "native"}, coherence={"status": "passed"},
                            source_date_epoch=0, recipes=[base])  # type: ignore[list-item]  # fmt: skip
    fields = [p.field for p in lock.entry_problems(entry, "images.lock.json", "cu130")]
    assert fields == ["images.cu130.recipes[0].decode_tok_s"]
    other = {**base, "decode_tok_s": 41.5, "digest": "sha256:" + "00" * 32}
    entry["recipes"] = [other]  # type: ignore[list-item]
    fields = [p.field for p in lock.entry_problems(entry, "images.lock.json", "cu130")]
    assert fields == ["images.cu130.recipes[0].digest"]
    # promoted with a recipe that did not pass: refused, as a promoted entry whose coherence was skipped is
    entry["recipes"] = [{"recipe": "gpt-oss-20b", "status": "skipped", "line": "x"}]  # type: ignore[typeddict-item]
    entry["state"] = lock.PROMOTED
    found = lock.entry_problems(entry, "images.lock.json", "cu130")
    assert [p.field for p in found] == ["images.cu130.recipes[0]", "images.cu130.state"]
    assert "did not pass" in found[1].message and "skipped without a reason" in found[0].message
    entry["recipes"] = "all passed"  # type: ignore[typeddict-item]
    assert [p.field for p in lock.entry_problems(entry, "images.lock.json", "cu130")] == ["images.cu130.recipes"]


def test_publish_needs_a_passed_run_of_every_listed_recipe_on_the_digest() -> None:
    recipe = load_recipe(REPO / "recipes" / "gpt-oss-20b.yaml")
    command = gate.serve_command(recipe)
    wants = {"gpt-oss-20b": command}
    skipped = gate.skipped(recipe, DIGEST, "no sm_121 GPU (no nvidia-smi)")
    problems = rules.recipe_problems({"recipes": [skipped]}, wants, DIGEST, "rec.json")
    assert [p.field for p in problems] == ["coherence.recipes[0]"] and "skipped" in problems[0].message
    missing = rules.recipe_problems({"recipes": []}, wants, DIGEST, "rec.json")
    assert "no run of recipe gpt-oss-20b" in missing[0].message
    argv, env = command
    checked = {"status": "passed", "reasons": [], "speed": {"decode_tokens_per_s": 52.25}}
    passed = gate.judge_run(recipe, checked, digest=DIGEST, gpu="sm_121", ran={"argv": argv, "env": env})
    assert gate.counts_as_passed(passed) and passed["line"] == f"recipe gpt-oss-20b passed on {DIGEST} at 52.25 tok/s"
    assert rules.recipe_problems({"recipes": [passed]}, wants, DIGEST, "rec.json") == []
    elsewhere = rules.recipe_problems({"recipes": [passed]}, wants, "sha256:" + "00" * 32, "rec.json")
    assert [p.field for p in elsewhere] == ["coherence.recipes[0].digest"]
    # a record that claims a pass its evidence does not show, or for another command, stands for nothing
    claims = {**passed, "checks": {**checked, "reasons": ["open prompt: loops"]}}
    assert [p.field for p in rules.recipe_problems({"recipes": [claims]}, wants, DIGEST, "r")] == ["coherence.recipes[0].checks"]
    changed = {"gpt-oss-20b": ([*argv, "--enforce-eager"], env)}
    found = rules.recipe_problems({"recipes": [passed]}, changed, DIGEST, "r")
    assert [p.field for p in found] == ["coherence.recipes[0].argv"] and "recipe file gives it now" in found[0].message
    unseen = {**passed, "ran": None}
    assert [p.field for p in rules.recipe_problems({"recipes": [unseen]}, wants, DIGEST, "r")] == ["coherence.recipes[0].ran"]
    # the container ran something else: not the recipe, so not a pass, whatever it answered
    wrong = gate.judge_run(recipe, checked, digest=DIGEST, gpu="sm_121", ran={"argv": argv[:-2], "env": env})
    assert wrong["status"] == "failed" and "not the recipe's exact command" in wrong["reason"]
    # coherent but with no measured speed: failed, with the reason
    unknown = gate.judge_run(recipe, {**checked, "speed": {"decode_tokens_per_s": "unknown", "unknown_reason": "no usage"}},
                             digest=DIGEST, gpu="sm_121", ran={"argv": argv, "env": env})  # fmt: skip
    assert unknown["status"] == "failed" and unknown["coherent"] is True and "no usage" in unknown["reason"]
    # the Spark record's lines replace the entry's skipped ones
    entry = rules.entry_with_coherence({"coherence": {"status": "skipped", "reason": "x"}},
                                       {"status": "passed", "recipes": [passed]})  # fmt: skip
    assert entry["recipes"] == [{"recipe": "gpt-oss-20b", "file": recipe.path, "digest": DIGEST,
                                 "status": "passed", "decode_tok_s": 52.25, "line": passed["line"]}]  # fmt: skip


def test_a_failed_or_skipped_recipe_fails_a_gate_that_ran() -> None:
    recipe = load_recipe(REPO / "recipes" / "gpt-oss-20b.yaml")
    skipped = gate.skipped(recipe, DIGEST, "the recipe pins no model revision")
    section = gate.with_recipes({"status": "passed", "combinations": []}, [skipped])
    assert section["status"] == "failed" and "recipe gpt-oss-20b skipped" in section["reason"]
    still = gate.with_recipes({"status": "skipped", "reason": "no sm_121 GPU (no nvidia-smi)"}, [skipped])
    assert still["status"] == "skipped" and still["reason"] == "no sm_121 GPU (no nvidia-smi)"


def test_coherence_with_a_profile_skips_its_recipes_without_a_spark(tmp_path: Path) -> None:
    found = gpu.detect_sm121()
    if found.ok:
        pytest.skip("this host has an sm_121 GPU: the gate would serve the recipes")
    path = project(tmp_path, ["gpt-oss-20b"], {"gpt-oss-20b": shipped("gpt-oss-20b")})
    proc = run_cli(["coherence", f"r.example/x@{DIGEST}", "--profile", str(path), "--json"])
    assert proc.returncode == 0, proc.stderr
    section = json.loads(proc.stdout)
    assert section["status"] == "skipped"
    (run,) = section["recipes"]
    assert run["status"] == "skipped" and run["digest"] == DIGEST
    assert run["line"] == f"recipe gpt-oss-20b skipped on {DIGEST}: no sm_121 GPU ({found.reason})"
    text = run_cli(["coherence", f"r.example/x@{DIGEST}", "--profile", str(path)]).stdout
    assert run["line"] in text
    # a profile naming a recipe meant for another line is refused before anything is served
    (tmp_path / "recipes" / "gpt-oss-20b.yaml").write_text(yaml.safe_dump({**shipped("gpt-oss-20b"), "profiles": ["cu129"]}))
    proc = run_cli(["coherence", f"r.example/x@{DIGEST}", "--profile", str(path), "--json"])
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "verify.coherence.recipes[0]" in proc.stderr and "not cu130" in proc.stderr

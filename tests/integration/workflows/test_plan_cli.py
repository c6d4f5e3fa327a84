"""`spark-images plan` (what the workflow steps read) and `coherence --profile` (the gate's matrix).

The CLI runs as a subprocess, as the steps call it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from spark_images.cli import build_parser
from spark_images.cli.coherence import _matrix
from spark_images.profiles.profile import DEFAULT_KV_CACHE_DTYPES, DEFAULT_MOE_BACKENDS

pytestmark = pytest.mark.processes  # the CLI as a process per test, as the workflows' steps call it

ROOT = Path(__file__).resolve().parents[3]
CU130 = "profiles/cu130.yaml"
CLI = "import sys; from spark_images.cli import main; sys.exit(main(sys.argv[1:]))"


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def profile_doc(path: str = CU130) -> dict:
    return yaml.safe_load((ROOT / path).read_text())


def test_plan_json_names_what_the_workflow_needs() -> None:
    proc = cli("plan", CU130, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    source = profile_doc()
    assert doc["name"] == source["name"] == doc["tags"]["line"]
    assert doc["repository"] == source["image"]["repository"]
    assert doc["platform"] == "linux/arm64"
    assert doc["vllm_commit"] == source["vllm"]["commit"] and doc["vllm_version"] == source["vllm"]["version"]
    assert doc["tags"]["immutable_prefix"] == f"{doc['cuda_line']}-{source['vllm']['commit'][:9]}-"
    assert doc["arch_list"] == doc["labels"]["io.spark-images.arch-list"] == doc["plan"]["arch_list"]
    coherence = source["verify"]["coherence"]
    matrix = doc["coherence"]
    assert matrix["models"] == coherence["models"]
    assert matrix["moe_backends"] == coherence["moe_backends"]
    assert matrix["kv_cache_dtypes"] == coherence["kv_cache_dtypes"]
    # linear_backends unset: each MoE backend with the linear backend of its name
    assert matrix["linear_backends"] is None
    combos = matrix["combinations"]
    assert len(combos) == len(coherence["models"]) * len(coherence["moe_backends"]) * len(coherence["kv_cache_dtypes"])
    assert all(c["moe_backend"] == c["linear_backend"] for c in combos)
    assert {c["kv_cache_dtype"] for c in combos} == set(coherence["kv_cache_dtypes"])


def test_field_prints_one_plain_value_and_a_matrix_as_one_json_line() -> None:
    proc = cli("plan", CU130, "--field", "repository")
    assert proc.returncode == 0 and proc.stdout == profile_doc()["image"]["repository"] + "\n"
    models = cli("plan", CU130, "--field", "coherence.models")
    assert models.stdout.splitlines() == profile_doc()["verify"]["coherence"]["models"]
    names = cli("plan", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "profiles").glob("*.yaml")),
                "--field", "name", "--json")  # fmt: skip
    assert names.returncode == 0, names.stderr
    assert names.stdout.count("\n") == 1  # one line: a `name=value` line of $GITHUB_OUTPUT
    assert json.loads(names.stdout) == sorted(p.stem for p in (ROOT / "profiles").glob("*.yaml"))
    # one profile is still an array: a matrix of one leg (a bare string would break fromJSON's matrix)
    one = cli("plan", CU130, "--field", "name", "--json")
    assert json.loads(one.stdout) == ["cu130"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--field", "no.such.field"], "no value at 'no'"),
        (["--field", "coherence"], "an object, not a plain value"),
        (["--field", "lock.digest"], "no value at 'lock'"),
    ],
)
def test_a_field_without_a_plain_value_is_exit_2_in_one_line(args: list[str], needle: str) -> None:
    proc = cli("plan", CU130, *args)
    assert proc.returncode == 2 and proc.stdout == ""
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_lock_entry_and_its_pull_request_title(tmp_path: Path) -> None:
    digest = "sha256:" + "ab" * 32
    source = profile_doc()
    repo = "127.0.0.1:5000/spark-images-test/plan"
    entry = {
        "profile": CU130, "image": f"{repo}@{digest}", "repository": repo, "digest": digest,
        "vllm_commit": source["vllm"]["commit"], "vllm_version": source["vllm"]["version"],
        "cuda_version": source["cuda"]["version"], "cuda_line": "cu130", "arch_list": "12.0f",
        "base_image": source["cuda"]["base_image"], "pins": {}, "fixes_included": [],
        "audit": {"status": "passed"}, "cubins": {"verdict": "native"}, "coherence": {"status": "passed"},
        "created": "2026-01-01T00:00:00Z", "source_date_epoch": 1767225600, "tags": [],
    }  # fmt: skip
    lock = tmp_path / "images.lock.json"
    lock.write_text(json.dumps({"lock_version": 1, "images": {"cu130": entry}}))
    image = cli("plan", CU130, "--lock", str(lock), "--field", "lock.image")
    assert image.returncode == 0, image.stderr
    assert image.stdout == f"{repo}@{digest}\n"
    title = cli("plan", CU130, "--lock", str(lock), "--field", "lock.pr_title")
    assert title.stdout.startswith(f"lock: promote cu130 to {digest[:19]}")
    other = cli("plan", "profiles/cu129.yaml", "--lock", str(lock), "--json")
    assert other.returncode == 0 and json.loads(other.stdout)["lock"] is None
    missing = cli("plan", CU130, "--lock", str(tmp_path / "none.json"))
    assert missing.returncode == 2 and "no such lock file" in missing.stderr


def test_an_invalid_profile_is_exit_1(tmp_path: Path) -> None:
    (tmp_path / "profiles").mkdir()
    bad = tmp_path / "profiles" / "bad.yaml"
    bad.write_text((ROOT / CU130).read_text().replace("version: \"13.0.2\"", "version: \"12.4\""))
    proc = cli("plan", str(bad), "--json")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "cuda" in proc.stderr


def test_coherence_takes_the_matrix_plan_shows_from_the_profile() -> None:
    plan = json.loads(cli("plan", CU130, "--json").stdout)["coherence"]
    args = build_parser().parse_args(["coherence", "IMAGE@sha256:" + "0" * 64, "--profile", str(ROOT / CU130)])
    models, moe, linear, kv = _matrix(args)
    assert (models, moe, linear, kv) == (plan["models"], plan["moe_backends"], plan["linear_backends"],
                                         plan["kv_cache_dtypes"])  # fmt: skip
    # a flag replaces that one setting of the profile
    args = build_parser().parse_args(["coherence", "I", "--profile", str(ROOT / CU130), "--backends", "marlin"])
    assert _matrix(args) == (plan["models"], ["marlin"], None, plan["kv_cache_dtypes"])
    # without a profile, an unnamed backend or dtype takes the profile model's one default
    args = build_parser().parse_args(["coherence", "I", "--model", "org/m"])
    assert _matrix(args) == (["org/m"], list(DEFAULT_MOE_BACKENDS), None, list(DEFAULT_KV_CACHE_DTYPES))
    assert DEFAULT_MOE_BACKENDS == DEFAULT_KV_CACHE_DTYPES == ("auto",)


def test_coherence_needs_a_profile_or_a_model(tmp_path: Path) -> None:
    proc = cli("coherence", "img@sha256:" + "0" * 64)
    assert proc.returncode == 2 and "--profile profiles/NAME.yaml" in proc.stderr
    source = profile_doc()
    del source["verify"]["coherence"]
    bare = tmp_path / "bare.yaml"
    bare.write_text(yaml.safe_dump(source))
    proc = cli("coherence", "img@sha256:" + "0" * 64, "--profile", str(bare))
    assert proc.returncode == 2 and "verify.coherence" in proc.stderr and "Traceback" not in proc.stderr

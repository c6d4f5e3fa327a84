"""The workflows' real steps, executed in order as a GitHub runner would (steprunner.py).

Every `run:` step of ci.yml, publish.yml (and the publish-profile.yml it
calls) and upstream-monitor.yml runs with bash -eo pipefail against the local
engine and the loopback registry 127.0.0.1:5000. What cannot run here is said
per step: signing and attestation need GitHub's OIDC token; actions other
than checkout, setup-python and the artifact pair are skipped with their
reason; ci.yml's tests job is this suite itself.

No DGX Spark exists here, so the publish pipeline's gate job runs on a stand-in
Spark runner (standins.py): the real engine serves the very digest the build
pushed, whose `vllm` is the stand-in server of tests/support/fake_vllm.py; only
the GPU query and docker's `--gpus` are stood in for. A gate record made that
way is good for nothing outside this test's throw-away registry repository.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import requests
import yaml
from standins import github_cli, spark_runner
from steprunner import Run, Runner, run_workflow, step_name
from workflow_project import ROOT, StandinProfile, VllmHistory, git, make_origin

from support.paths import DATA

pytestmark = pytest.mark.processes  # the CI's own steps as processes (ruff, actionlint, the CLI)

WORKFLOWS = ROOT / ".github" / "workflows"
OIDC = "needs GitHub's OIDC token"
SUITE = "ci.yml's tests job is this test suite on a fresh machine (bash .ci/run): not run from inside itself"


def runner_env(scratch: Path, **extra: str) -> dict[str, str]:
    """This machine's environment as a runner's: no project venv on PATH, a private cache."""
    venv = str(ROOT / ".venv")
    path = os.pathsep.join(p for p in os.environ.get("PATH", os.defpath).split(os.pathsep) if not p.startswith(venv))
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV" and not k.startswith(("GITHUB_", "PYTEST_"))}
    env.update(PATH=path, XDG_CACHE_HOME=str(scratch / "xdg-cache"), NOX_ENVDIR=str(scratch / "nox"))
    env.update(extra)
    return env


def skipped(run: Run) -> set[tuple[str, str]]:
    return {(s.job, s.name) for s in run.skipped}


def assert_green(run: Run) -> None:
    assert not run.failed, run.report()
    assert all(j.result == "success" for j in run.jobs), run.report()


# --- the runner itself -------------------------------------------------------------


def test_a_broken_step_fails_the_run_naming_that_step(tmp_path: Path) -> None:
    """Proof that a failing step fails the run: golden's install step, broken in a copy of ci.yml."""
    copy = tmp_path / "workflows"
    shutil.copytree(WORKFLOWS, copy)
    doc = yaml.safe_load((copy / "ci.yml").read_text())
    text = (copy / "ci.yml").read_text()
    # keep the golden job only (the others are not what this test is about), break one step
    head, _, _ = text.partition("\njobs:\n")
    _, _, golden = text.partition("\n  golden:\n")
    broken = golden.replace("run: python -m pip install .", "run: python -m pip install ./no-such-project")
    assert broken != golden and "golden" in doc["jobs"]
    (copy / "ci.yml").write_text(head + "\njobs:\n  golden:\n" + broken)
    runner = Runner(origin=make_origin(tmp_path), scratch=tmp_path / "run", event_name="push",
                    env=runner_env(tmp_path))  # fmt: skip
    run = run_workflow(runner, copy, "ci.yml")
    assert [(s.job, s.name) for s in run.failed] == [("golden", "Install spark-images")], run.report()
    failed = run.failed[0]
    assert failed.exit_code == 1 and "no-such-project" in failed.log, failed.log[-2000:]
    assert run.job("golden").result == "failure"
    # the steps before it ran (checkout, setup-python), the one after it did not
    assert [s.status for s in run.job("golden").steps[:2]] == ["success", "success"]
    after = run.step("golden", "Golden Dockerfiles equal a fresh render")
    assert after.how == "not-run" and after.reason == "an earlier step failed"


# --- ci.yml ------------------------------------------------------------------------


def test_ci_lint_and_golden_jobs_run_every_step(tmp_path: Path) -> None:
    tests_job = yaml.safe_load((WORKFLOWS / "ci.yml").read_text())["jobs"]["tests"]["steps"]
    names = [step_name(s, i) for i, s in enumerate(tests_job)]
    skip_runs = {("ci.yml", "tests", n): SUITE for n in names}
    runner = Runner(origin=make_origin(tmp_path), scratch=tmp_path / "run", event_name="pull_request",
                    env=runner_env(tmp_path), skip_runs=skip_runs)  # fmt: skip
    run = run_workflow(runner, WORKFLOWS, "ci.yml")
    assert_green(run)
    # skipped: exactly the tests job's `run:` steps (its checkout is done, harmlessly)
    run_names = {step_name(s, i) for i, s in enumerate(tests_job) if "run" in s}
    assert skipped(run) == {("tests", n) for n in run_names}, run.report()
    assert all(s.reason == SUITE for s in run.skipped)
    lint = run.job("lint")
    assert [s.status for s in lint.steps] == ["success"] * len(lint.steps)
    assert run.step("lint", "actionlint").how == "ran"
    golden = run.step("golden", "Golden Dockerfiles equal a fresh render")
    assert golden.how == "ran" and golden.exit_code == 0
    workspace = run.job("golden").workspace
    assert workspace is not None
    for profile in (ROOT / "profiles").glob("*.yaml"):
        assert (workspace / "build" / "render" / profile.stem / "Dockerfile").is_file()


# --- publish.yml -> publish-profile.yml ------------------------------------------------

PUBLISH_SKIPS = {
    ("build", "docker/setup-buildx-action"),
    ("build", "docker/login-action"),
    ("build", "anchore/sbom-action"),
    ("build", "SBOM attestation"),
    ("build", "Build provenance attestation (SLSA)"),
    ("build", "sigstore/cosign-installer"),
    ("build", "Sign the digest (keyless)"),
    ("gate", "docker/login-action"),
    ("gate", "sigstore/cosign-installer"),
    ("gate", "Verify the signature before running the candidate"),
}


def _tags(repository: str) -> dict[str, str]:
    host, name = repository.split("/", 1)
    listed = requests.get(f"http://{host}/v2/{name}/tags/list", timeout=30)
    if listed.status_code == 404:
        return {}
    listed.raise_for_status()
    out = {}
    for tag in listed.json().get("tags") or []:
        head = requests.head(f"http://{host}/v2/{name}/manifests/{tag}", timeout=30, headers={
            "Accept": "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json"})  # fmt: skip
        out[tag] = head.headers["Docker-Content-Digest"]
    return out


@pytest.mark.engine
@pytest.mark.registry
@pytest.mark.nvcc
@pytest.mark.network
@pytest.mark.slow
def test_publish_builds_gates_and_promotes_by_digest(
    tmp_path: Path, standin_profile: StandinProfile, vllm_history: VllmHistory
) -> None:
    profile = standin_profile
    origin = make_origin(tmp_path, {f"{profile.name}.yaml": profile.text, "test.requirements.lock": profile.lock_text})
    tools = tmp_path / "tools"
    gh = github_cli(tools / "gh", tmp_path / "gh-log", vllm_history.release_tag)
    spark = spark_runner(tools / "spark")
    skip_runs = {
        ("publish-profile.yml", "build", "Sign the digest (keyless)"): f"cosign sign --yes: keyless signing {OIDC}",
        ("publish-profile.yml", "gate", "Verify the signature before running the candidate"):
            "cosign verify: the keyless signature it checks is made by the build's OIDC step, skipped here",
    }  # fmt: skip
    from support.build_helpers import CA_BUNDLE

    env = runner_env(
        tmp_path,
        # the audit's history: a real git clone, of the local vLLM-shaped history instead of github.com
        SPARK_IMAGES_VLLM_GIT_URL=vllm_history.path.as_uri(),
        # a runner behind a TLS proxy: the host's bundle plus the CA of the test wheel server
        SPARK_IMAGES_CA_CERT=str(CA_BUNDLE),
    )
    runner = Runner(
        origin=origin, scratch=tmp_path / "run", event_name="workflow_dispatch",
        event_inputs={"profile": profile.name}, env=env, skip_runs=skip_runs,
        tools=lambda labels: [spark, gh] if "dgx-spark" in labels else [gh],
    )  # fmt: skip
    run = run_workflow(runner, WORKFLOWS, "publish.yml")
    assert_green(run)
    leg = f"publish ({profile.name})"
    assert [j.job for j in run.jobs] == ["profiles", f"{leg}/build", f"{leg}/gate", f"{leg}/promote"]
    assert {(j.rsplit("/", 1)[-1], n) for j, n in skipped(run)} == PUBLISH_SKIPS, run.report()
    for s in run.skipped:
        assert s.reason, s

    assert run.job("profiles").outputs["names"] == json.dumps([profile.name])
    build = run.job("build")
    digest = build.outputs["digest"]
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest)
    assert build.outputs["repository"] == profile.repository
    assert build.outputs["image"] == f"{profile.repository}@{digest}"
    assert run.job("gate").outputs["digest"] == digest

    # the build's record: cubins and audit passed; coherence skipped there (no GPU on the build runner)
    assert build.workspace is not None
    record = json.loads((build.workspace / "build" / profile.name / "record.json").read_text())
    assert record["cubins"]["status"] == "passed"
    assert record["audit"]["status"] == "passed", record["audit"]
    assert record["coherence"]["status"] == "skipped"
    assert digest in build.summary  # report.md went to the job summary

    # the gate served the candidate digest from the stand-in Spark runner and passed
    gate = run.job("gate")
    assert gate.workspace is not None
    gate_record = json.loads((gate.workspace / "gate" / "record.json").read_text())["coherence"]
    assert gate_record["status"] == "passed", gate_record
    assert gate_record["image"] == build.outputs["image"]
    assert "assumed_gpu" not in gate_record and gate_record["gpu"] == "GPU compute capability 12.1"
    combos = [(c["model"], c["moe_backend"], c["kv_cache_dtype"]) for c in gate_record["combinations"]]
    assert combos == [("spark-images-test/no-model", "auto", "auto")]  # the profile's matrix
    assert "coherence: passed" in gate.summary and build.outputs["image"] in gate.summary

    # promote: tags exist only now, on the gated digest; the lock pull request names them
    tags = _tags(profile.repository)
    immutable = [t for t in tags if t != profile.name]
    assert tags.get(profile.name) == digest and len(immutable) == 1 and tags[immutable[0]] == digest, tags
    promote = run.job("promote")
    body = (tmp_path / "gh-log" / "pr-0.md").read_text()
    assert body in promote.summary
    assert f"`{profile.repository}@{digest}`" in body and "| coherence gate | passed |" in body
    assert "| audit gate | passed |" in body
    args = (tmp_path / "gh-log" / "pr-0.args").read_text()
    assert "--base main" in args and f"lock/{profile.name}-{digest[7:19]}-4242" in args
    branch = f"lock/{profile.name}-{digest[7:19]}-4242"
    lock = json.loads(git(origin, "show", f"{branch}:images.lock.json"))
    entry = lock["images"][profile.name]
    assert entry["digest"] == digest and sorted(entry["tags"]) == sorted(tags)
    assert entry["coherence"]["status"] == "passed"
    subject = git(origin, "log", "-1", "--format=%s", branch)
    assert subject.startswith(f"lock: promote {profile.name} to {digest[:19]}")


# --- upstream-monitor.yml ---------------------------------------------------------------


@pytest.mark.network
@pytest.mark.slow
def test_upstream_monitor_audits_and_decides(
    tmp_path: Path, vllm_history: VllmHistory
) -> None:
    text = (DATA / "build" / "profile.yaml.in").read_text()
    for key, value in {"@NAME@": "mon", "@COMMIT@": vllm_history.release_commit, "@REQUIRED@": "[]",
                       "@BASE@": "nvidia/cuda:13.0.2-devel-ubuntu24.04@sha256:" + "5" * 64,
                       "@WHEEL_URL@": "https://files.example.invalid/vllm.whl", "@WHEEL_SHA256@": "ab" * 32,
                       "@REGISTRY@": "ghcr.io"}.items():  # fmt: skip
        text = text.replace(key, value)
    origin = make_origin(tmp_path, {"mon.yaml": text, "test.requirements.lock": (
        DATA / "build" / "test.requirements.lock").read_text()})
    gh = github_cli(tmp_path / "tools", tmp_path / "gh-log", vllm_history.release_tag)
    gitconfig = tmp_path / "gitconfig"
    # git's own URL rewriting: the workflow's clone of github.com reads the local history
    gitconfig.write_text(f'[url "{vllm_history.path.as_uri()}"]\n\tinsteadOf = https://github.com/vllm-project/vllm.git\n')
    runner = Runner(origin=origin, scratch=tmp_path / "run", event_name="schedule",
                    env=runner_env(tmp_path, GIT_CONFIG_GLOBAL=str(gitconfig)), tools=lambda labels: [gh])  # fmt: skip
    run = run_workflow(runner, WORKFLOWS, "upstream-monitor.yml")
    assert_green(run)
    assert skipped(run) == set(), run.report()
    assert run.job("profiles").outputs["names"] == '["mon"]'
    monitor = run.job("monitor (mon)")
    decide = run.step("monitor (mon)", "Audit the pin, every newer release and rc, and main; decide")
    assert decide.how == "ran"
    assert monitor.workspace is not None
    decision = json.loads((monitor.workspace / "monitor" / "decision.json").read_text())
    # the pin (0.29.0 in the profile) is newer than the release the stand-in gh names: no bump
    assert decision["bump"] is False
    body = (monitor.workspace / "monitor" / "body.md").read_text()
    assert body and body in monitor.summary
    for name in ("Validate the bumped profile", "Open the bump pull request"):
        assert run.step("monitor (mon)", name).how == "not-run"
    for target in ("pinned", "main"):
        doc = json.loads((monitor.workspace / "monitor" / f"{target}.json").read_text())
        assert doc, target
    # main was audited with discovery; the step outputs came from the monitor itself
    assert "discovered" in json.loads((monitor.workspace / "monitor" / "main.json").read_text())
    assert decide.outputs.get("bump") == "false", decide.outputs
    # every release newer than the pin was listed (from PyPI), and each one in this history audited
    listed = (monitor.workspace / "monitor" / "new-releases.tsv").read_text().splitlines()
    in_history = [line.split("\t")[0] for line in listed if line and line.split("\t")[1] != "-"]
    audited = sorted(p.name for p in (monitor.workspace / "monitor").glob("release-*.json"))
    assert audited == sorted(f"release-{tag}.json" for tag in in_history)
    assert subprocess.run(["git", "-C", str(monitor.workspace), "diff", "--quiet"]).returncode == 0

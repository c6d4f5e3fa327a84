"""Runs a workflow's jobs and `run:` steps as a GitHub runner does, on this machine.

Jobs run in `needs` order; a job's `if:` (default `success()`) and each step's
`if:` are evaluated; every `${{ ... }}` is replaced with what the runner would
give (github, env at workflow/job/step level, inputs, matrix, secrets,
`needs.*.result/outputs`, `steps.*.outputs` read back from the step's
$GITHUB_OUTPUT file). Each `run:` step is a script executed with GitHub's
default shell, `bash --noprofile --norc -eo pipefail {0}`, in a fresh
workspace per job, with $GITHUB_OUTPUT, $GITHUB_ENV, $GITHUB_PATH and
$GITHUB_STEP_SUMMARY files. A reusable workflow (`uses: ./.github/...`) runs
its own jobs once per matrix leg, with its `with:` as `inputs`.

`uses:` steps are actions, not commands: the few whose effect the later steps
depend on are done here the way the action does them (see `ACTIONS`: checkout is
a real `git clone` of the origin, setup-python a venv of this machine's python3,
the artifact actions copy files between jobs); the rest are skipped, each with
its reason. A `run:` step is skipped only when the caller names it in
`skip_runs` with the reason. Every skip is recorded, so a test can assert the
exact set. A failing step fails its job (and the run), named in `failed`.
Not modelled: a job's `container:`, concurrency groups, `timeout-minutes`
(each step has one limit), shells other than bash (refused, not guessed).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from expressions import as_text, evaluate, substitute, truthy

GITHUB_SHELL = ["bash", "--noprofile", "--norc", "-eo", "pipefail"]


def load_workflow(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    if True in doc:  # YAML 1.1 reads the key `on` as a boolean
        doc["on"] = doc.pop(True)
    return doc


@dataclass
class StepResult:
    workflow: str
    job: str  # the job's id, with the matrix leg and the caller's job when called
    name: str
    status: str  # success, failure, skipped
    how: str  # ran, emulated, skipped
    reason: str = ""
    exit_code: int | None = None
    log: str = ""
    outputs: dict[str, str] = field(default_factory=dict)  # what it wrote to $GITHUB_OUTPUT


@dataclass
class JobResult:
    workflow: str
    job: str
    result: str  # success, failure, skipped
    outputs: dict[str, str] = field(default_factory=dict)
    steps: list[StepResult] = field(default_factory=list)
    summary: str = ""
    workspace: Path | None = None


@dataclass(frozen=True)
class Runner:
    """Where the jobs run: the origin repository, scratch space, the event and the machine's tools."""

    origin: Path  # a bare git repository: what `actions/checkout` clones
    scratch: Path
    event_name: str
    event_inputs: Mapping[str, Any] = field(default_factory=dict)
    # the runner's environment (what a GitHub runner has besides the GITHUB_* values)
    env: Mapping[str, str] = field(default_factory=dict)
    # extra PATH entries of a runner, chosen from its runs-on labels (e.g. the Spark's tools)
    tools: Callable[[Sequence[str]], Sequence[Path]] = lambda labels: ()
    # (workflow file, job id, step name) -> why that `run:` step does not run here
    skip_runs: Mapping[tuple[str, str, str], str] = field(default_factory=dict)
    ref_name: str = "main"
    repository: str = "spark-images/spark-images"
    actor: str = "spark-images-bot"
    step_timeout_s: int = 1800

    @property
    def artifacts(self) -> Path:
        return self.scratch / "artifacts"


@dataclass
class Run:
    """The result of one workflow run: every job, every step, in order."""

    jobs: list[JobResult] = field(default_factory=list)

    @property
    def steps(self) -> list[StepResult]:
        return [s for j in self.jobs for s in j.steps]

    @property
    def failed(self) -> list[StepResult]:
        return [s for s in self.steps if s.status == "failure"]

    @property
    def skipped(self) -> list[StepResult]:
        return [s for s in self.steps if s.how == "skipped"]

    def job(self, suffix: str) -> JobResult:
        found = [j for j in self.jobs if j.job == suffix or j.job.endswith("/" + suffix)]
        assert len(found) == 1, f"{suffix}: {[j.job for j in self.jobs]}"
        return found[0]

    def step(self, job: str, name: str) -> StepResult:
        found = [s for s in self.job(job).steps if s.name == name]
        assert len(found) == 1, f"{job}: {name}: {[s.name for s in self.job(job).steps]}"
        return found[0]

    def report(self) -> str:
        lines = []
        for s in self.steps:
            extra = f" ({s.reason})" if s.reason else ""
            lines.append(f"{s.status:8} {s.how:9} {s.workflow}: {s.job}: {s.name}{extra}")
            if s.status == "failure":
                lines.append("    " + s.log[-4000:].replace("\n", "\n    "))
        return "\n".join(lines)


def step_name(step: Mapping[str, Any], index: int) -> str:
    """The step's label as GitHub shows it: its name, else `Run <first line>` or `<action>`."""
    if step.get("name"):
        return str(step["name"])
    if "run" in step:
        return "Run " + str(step["run"]).strip().splitlines()[0]
    if "uses" in step:
        return str(step["uses"]).split("@", 1)[0]
    return f"step {index}"


def _action(step: Mapping[str, Any]) -> str:
    return str(step["uses"]).split("@", 1)[0]


# --- actions -------------------------------------------------------------------------


@dataclass
class _JobState:
    runner: Runner
    workflow: str
    job: str
    workspace: Path
    temp: Path
    env: dict[str, str]
    path: list[str]
    context: dict[str, Any]
    summary: list[str] = field(default_factory=list)


ActionFn = Callable[[_JobState, Mapping[str, Any]], str]  # returns a note; raises StepFailed


class StepFailed(Exception):
    pass


def _checkout(job: _JobState, _with: Mapping[str, Any]) -> str:
    proc = subprocess.run(["git", "clone", "--quiet", str(job.runner.origin), str(job.workspace)],
                          capture_output=True, text=True)  # fmt: skip
    if proc.returncode != 0:
        raise StepFailed(proc.stderr)
    return f"git clone of {job.runner.origin}"


def _setup_python(job: _JobState, with_: Mapping[str, Any]) -> str:
    venv = job.temp / "setup-python"
    subprocess.run(["python3", "-m", "venv", str(venv)], check=True, capture_output=True)
    job.path.insert(0, str(venv / "bin"))
    found = subprocess.run([str(venv / "bin" / "python"), "--version"], capture_output=True, text=True).stdout.strip()
    return f"a venv of this machine's python3 ({found}) for python-version {with_.get('python-version')}"


def _upload(job: _JobState, with_: Mapping[str, Any]) -> str:
    store = job.runner.artifacts / str(with_["name"])
    copied = 0
    for line in str(with_["path"]).splitlines():
        rel = line.strip()
        if not rel:
            continue
        source = job.workspace / rel
        if source.is_dir():
            shutil.copytree(source, store / rel, dirs_exist_ok=True)
            copied += sum(1 for p in source.rglob("*") if p.is_file())
        elif source.is_file():
            (store / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, store / rel)
            copied += 1
    if copied == 0 and with_.get("if-no-files-found", "warn") == "error":
        raise StepFailed(f"no files found for artifact {with_['name']}: {with_['path']}")
    return f"{copied} file(s) into artifact {with_['name']}"


def _common_root(store: Path) -> Path:
    # upload-artifact drops the paths' least common ancestor, as the action does
    root = store
    while True:
        entries = list(root.iterdir())
        if len(entries) == 1 and entries[0].is_dir():
            root = entries[0]
        else:
            return root


def _download(job: _JobState, with_: Mapping[str, Any]) -> str:
    store = job.runner.artifacts / str(with_["name"])
    if not store.is_dir():
        raise StepFailed(f"Unable to download artifact(s): Artifact not found for name: {with_['name']}")
    dest = job.workspace / str(with_.get("path") or ".")
    shutil.copytree(_common_root(store), dest, dirs_exist_ok=True)
    return f"artifact {with_['name']} into {with_.get('path') or '.'}"


# action -> what is done here (a function) or why it is skipped (a string)
ACTIONS: dict[str, ActionFn | str] = {
    "actions/checkout": _checkout,
    "actions/setup-python": _setup_python,
    "actions/upload-artifact": _upload,
    "actions/download-artifact": _download,
    "docker/setup-buildx-action": "sets up a buildx builder: the local engine's buildx builds here",
    "docker/login-action": "logs in to GHCR: the loopback registry needs no login",
    "anchore/sbom-action": "a GitHub action (syft) writing the SBOM for the attestation, which needs OIDC",
    "actions/attest": "needs GitHub's OIDC token and attestation API",
    "sigstore/cosign-installer": "installs cosign for the keyless signing steps, which need GitHub's OIDC",
}


# --- jobs ----------------------------------------------------------------------------


def _status(failed: Callable[[], bool]) -> dict[str, Callable[[], bool]]:
    return {
        "success": lambda: not failed(),
        "failure": failed,
        "always": lambda: True,
        "cancelled": lambda: False,
    }


def _read_output_file(path: Path) -> dict[str, str]:
    """`name=value` lines and `name<<DELIM` ... `DELIM` blocks, as the runner reads them."""
    out: dict[str, str] = {}
    if not path.is_file():
        return out
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delim = line.split("<<", 1)
            body = []
            i += 1
            while i < len(lines) and lines[i] != delim:
                body.append(lines[i])
                i += 1
            out[name] = "\n".join(body)
        elif "=" in line:
            name, value = line.split("=", 1)
            out[name] = value
        elif line.strip():
            raise StepFailed(f"Invalid format '{line}' in {path.name}")
        i += 1
    return out


def _run_script(job: _JobState, step: Mapping[str, Any], index: int, env: dict[str, str]) -> tuple[int, str]:
    script = job.temp / f"step-{index}.sh"
    script.write_text(substitute(str(step["run"]), job.context, _status(lambda: False)), encoding="utf-8")
    if step.get("shell", "bash") != "bash":
        raise StepFailed(f"shell {step['shell']!r} is not run here")
    cwd = job.workspace / str(step.get("working-directory") or ".")
    log = job.temp / f"step-{index}.log"
    with log.open("w", encoding="utf-8") as fh:
        try:
            proc = subprocess.run([*GITHUB_SHELL, str(script)], cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                  timeout=job.runner.step_timeout_s)  # fmt: skip
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = 124
    return code, log.read_text(encoding="utf-8", errors="replace")


def run_job(
    runner: Runner, workflow: str, doc: Mapping[str, Any], job_id: str, label: str,
    context: dict[str, Any], needs_ok: bool,
) -> JobResult:  # fmt: skip
    job = doc["jobs"][job_id]
    result = JobResult(workflow=workflow, job=label, result="skipped")
    condition = job.get("if")
    status = _status(lambda: not needs_ok)
    go = needs_ok if condition is None else truthy(evaluate(str(condition), context, status))
    if not go:
        return result
    # a plain directory name: pip writes it into script shebangs, where "(" breaks them
    root = runner.scratch / "jobs" / f"{re.sub(r'[^A-Za-z0-9_.-]+', '-', label)}-{uuid.uuid4().hex[:6]}"
    state = _JobState(
        runner=runner, workflow=workflow, job=label, workspace=root / "work", temp=root / "temp",
        env={}, path=[], context={**context, "steps": {}, "runner": {"os": "Linux", "temp": str(root / "temp")}},
    )  # fmt: skip
    state.workspace.mkdir(parents=True)
    state.temp.mkdir(parents=True)
    labels = job.get("runs-on")
    labels = [str(x) for x in labels] if isinstance(labels, list) else [str(labels)]
    state.path = [str(p) for p in runner.tools(labels)]
    for scope in (doc.get("env") or {}, job.get("env") or {}):
        state.env.update({k: as_text(substitute(v, state.context)) for k, v in scope.items()})
    state.context["env"] = dict(state.env)
    failed = False
    for index, step in enumerate(job.get("steps") or []):
        name = step_name(step, index)
        res = StepResult(workflow=workflow, job=label, name=name, status="skipped", how="skipped")
        result.steps.append(res)
        state.context["env"] = {**state.env}
        cond = step.get("if")
        so_far = failed
        run_it = (not so_far) if cond is None else truthy(
            evaluate(str(cond), state.context, _status(lambda: so_far))  # noqa: B023 (called at once)
        )
        if not run_it:
            res.reason = f"if: {cond}" if cond is not None else "an earlier step failed"
            res.how = "not-run"
            continue
        step_env = {**state.env, **{k: as_text(substitute(v, state.context)) for k, v in (step.get("env") or {}).items()}}
        outputs: dict[str, str] = {}
        if "uses" in step:
            action = ACTIONS.get(_action(step))
            if action is None:
                raise AssertionError(f"{workflow}: {label}: {name}: action {_action(step)} is unknown to the step runner")
            if isinstance(action, str):
                res.reason = action
                continue
            try:
                res.log = action(state, substitute(step.get("with") or {}, state.context))
                res.status, res.how = "success", "emulated"
            except StepFailed as exc:
                res.status, res.how, res.log = "failure", "emulated", str(exc)
        else:
            why = runner.skip_runs.get((workflow, job_id, name))
            if why:
                res.reason = why
                continue
            files = {key: state.temp / f"{key.lower()}-{index}" for key in
                     ("GITHUB_OUTPUT", "GITHUB_ENV", "GITHUB_PATH", "GITHUB_STEP_SUMMARY")}  # fmt: skip
            for f in files.values():
                f.touch()
            env = {
                **runner.env,
                **_github_env(runner, state),
                **{k: str(v) for k, v in files.items()},
                **step_env,
                "PATH": os.pathsep.join([*state.path, runner.env.get("PATH", os.defpath)]),
            }
            res.exit_code, res.log = _run_script(state, step, index, env)
            res.how = "ran"
            res.status = "success" if res.exit_code == 0 else "failure"
            try:
                outputs = _read_output_file(files["GITHUB_OUTPUT"])
                res.outputs = dict(outputs)
                state.env.update(_read_output_file(files["GITHUB_ENV"]))
            except StepFailed as exc:
                res.status, res.log = "failure", res.log + str(exc)
            state.path[:0] = [ln for ln in files["GITHUB_PATH"].read_text().splitlines() if ln.strip()][::-1]
            state.summary.append(files["GITHUB_STEP_SUMMARY"].read_text(encoding="utf-8"))
        if res.status == "failure":
            failed = True
            res.reason = f"exit code {res.exit_code}" if res.exit_code is not None else "the action failed"
        if step.get("id"):
            state.context["steps"][step["id"]] = {"outputs": outputs, "outcome": res.status, "conclusion": res.status}
    result.result = "failure" if failed else "success"
    result.outputs = {k: as_text(substitute(v, state.context)) for k, v in (job.get("outputs") or {}).items()}
    result.summary = "".join(state.summary)
    result.workspace = state.workspace
    return result


def _github_env(runner: Runner, job: _JobState) -> dict[str, str]:
    github = job.context["github"]
    return {
        "CI": "true",
        "GITHUB_ACTIONS": "true",
        "GITHUB_WORKSPACE": str(job.workspace),
        "GITHUB_REPOSITORY": runner.repository,
        "GITHUB_REF": f"refs/heads/{runner.ref_name}",
        "GITHUB_REF_NAME": runner.ref_name,
        "GITHUB_EVENT_NAME": runner.event_name,
        "GITHUB_ACTOR": runner.actor,
        "GITHUB_RUN_ID": str(github["run_id"]),
        "GITHUB_SHA": str(github["sha"]),
        "GITHUB_JOB": job.job.rsplit("/", 1)[-1],
        "RUNNER_TEMP": str(job.temp),
        "RUNNER_OS": "Linux",
    }


def _order(jobs: Mapping[str, Any]) -> list[str]:
    done: list[str] = []
    while len(done) < len(jobs):
        ready = [j for j, body in jobs.items() if j not in done and set(_needs(body)) <= set(done)]
        assert ready, f"a needs cycle among {set(jobs) - set(done)}"
        done.extend(ready[:1])
    return done


def _needs(job: Mapping[str, Any]) -> list[str]:
    needs = job.get("needs") or []
    return [needs] if isinstance(needs, str) else list(needs)


def _legs(job: Mapping[str, Any], context: Mapping[str, Any]) -> list[dict[str, Any]]:
    matrix = (job.get("strategy") or {}).get("matrix")
    if not matrix:
        return [{}]
    matrix = substitute(matrix, context)
    assert isinstance(matrix, dict) and len(matrix) == 1, f"only one-axis matrices are run here: {matrix}"
    ((axis, values),) = matrix.items()
    assert isinstance(values, list), f"matrix {axis}: {values!r} is not a list"
    return [{axis: v} for v in values]


def run_workflow(
    runner: Runner, workflows_dir: Path, name: str, inputs: Mapping[str, Any] | None = None, prefix: str = ""
) -> Run:
    """Every job of `workflows_dir/name`, in needs order, with the event's inputs (or the caller's `with:`)."""
    doc = load_workflow(workflows_dir / name)
    run = Run()
    given = dict(runner.event_inputs if inputs is None else inputs)
    declared = ((doc["on"].get("workflow_call") or doc["on"].get("workflow_dispatch") or {}) if isinstance(doc["on"], dict) else {})
    for key, spec in ((declared or {}).get("inputs") or {}).items():
        if key not in given and "default" in (spec or {}):
            given[key] = spec["default"]
    needs_ctx: dict[str, dict[str, Any]] = {}
    for job_id in _order(doc["jobs"]):
        job = doc["jobs"][job_id]
        needs = _needs(job)
        base = {
            "github": {
                "event_name": runner.event_name, "ref": f"refs/heads/{runner.ref_name}", "ref_name": runner.ref_name,
                "repository": runner.repository, "actor": runner.actor, "run_id": 4242, "sha": "0" * 40,
                "token": "github-token-of-the-test-run", "event": {"inputs": dict(runner.event_inputs)},
            },
            "inputs": given,
            "secrets": {"GITHUB_TOKEN": "github-token-of-the-test-run"},
            "needs": {n: needs_ctx[n] for n in needs},
            "vars": {},
        }  # fmt: skip
        needs_ok = all(needs_ctx[n]["result"] == "success" for n in needs)
        if not needs_ok and "if" not in job:  # skipped as a whole: its matrix is never expanded
            needs_ctx[job_id] = {"result": "skipped", "outputs": {}}
            run.jobs.append(JobResult(workflow=name, job=prefix + job_id, result="skipped"))
            continue
        results: list[str] = []
        outputs: dict[str, str] = {}
        for leg in _legs(job, base):
            context = {**base, "matrix": leg}
            label = prefix + job_id + (f" ({', '.join(str(v) for v in leg.values())})" if leg else "")
            if "uses" in job:  # a reusable workflow of this repository
                called = str(job["uses"]).removeprefix("./.github/workflows/")
                if not needs_ok:
                    results.append("skipped")
                    continue
                sub = run_workflow(runner, workflows_dir, called, substitute(job.get("with") or {}, context),
                                   prefix=f"{label}/")  # fmt: skip
                run.jobs.extend(sub.jobs)
                results.append("failure" if any(j.result == "failure" for j in sub.jobs) else "success")
                continue
            jr = run_job(runner, name, doc, job_id, label, context, needs_ok)
            run.jobs.append(jr)
            results.append(jr.result)
            outputs.update(jr.outputs)
        result = "failure" if "failure" in results else ("skipped" if set(results) == {"skipped"} else "success")
        needs_ctx[job_id] = {"result": result, "outputs": outputs}
    return run

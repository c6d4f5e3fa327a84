"""The Docker engine of one cluster node, local or `ssh://user@host`, as plain data.

python-on-whales reaches an SSH host itself (`DockerClient(host="ssh://...")`:
the docker CLI runs `docker system dial-stdio` over ssh), so there is no SSH
code here. Every call that can hang (pull, exec) runs under a timeout and
names the node and the step when it runs out; the containers are created
with python-on-whales' `run`, from a `RunRequest` the caller filled in.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

from python_on_whales import DockerClient
from python_on_whales.exceptions import DockerException, NoSuchContainer, NoSuchImage

from spark_images.core.errors import EnvironmentProblem

VERSION_TIMEOUT_S = 60
REMOVE_TIMEOUT_S = 120


class StepTimedOut(Exception):
    """A bounded step ran past its deadline; the message names the node and the step."""


class StepFailed(Exception):
    """A step ran and failed (the engine answered with an error); the message says which."""


@dataclass(frozen=True)
class RunRequest:
    name: str
    image: str
    entrypoint: str
    command: tuple[str, ...]
    network: str
    ipc: str
    gpus: str | None
    shm_size: str
    devices: tuple[str, ...]
    volumes: tuple[tuple[str, str], ...]
    env: tuple[tuple[str, str], ...]
    labels: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ContainerState:
    name: str
    running: bool
    exit_code: int | None
    image_id: str
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ExecResult:
    returncode: int
    stdout: str
    stderr: str


def _detail(exc: BaseException) -> str:
    text = getattr(exc, "stderr", None) or str(exc)
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return (lines[-1] if lines else exc.__class__.__name__)[:300]


class NodeEngine:
    """One node's engine; `label` names it in every message ("node 1 (ssh://me@spark2)")."""

    def __init__(self, host: str | None, label: str) -> None:
        self.host = host
        self.label = label
        self.docker = DockerClient(host=host) if host else DockerClient()

    def _cmd(self, *args: str) -> list[str]:
        return [*(str(part) for part in self.docker.client_config.docker_cmd), *args]

    def _run_cli(self, args: Sequence[str], timeout_s: float, step: str) -> ExecResult:
        try:
            proc = subprocess.run(self._cmd(*args), capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            raise StepTimedOut(f"{self.label}: {step} did not finish within {timeout_s:.0f} s") from exc
        except FileNotFoundError as exc:
            raise EnvironmentProblem(f"{self.label}: no `docker` command on PATH") from exc
        return ExecResult(proc.returncode, proc.stdout, proc.stderr)

    def server_version(self) -> str:
        """The engine's version; EnvironmentProblem naming the node when none answers."""
        result = self._run_cli(["version", "--format", "{{.Server.Version}}"], VERSION_TIMEOUT_S, "docker version")
        if result.returncode != 0 or not result.stdout.strip():
            detail = (result.stderr.strip().splitlines() or ["no answer"])[-1][:300]
            raise EnvironmentProblem(f"{self.label}: no Docker engine answers ({detail})")
        return result.stdout.strip()

    def pull(self, reference: str, timeout_s: float) -> None:
        result = self._run_cli(["pull", "--quiet", reference], timeout_s, f"docker pull {reference}")
        if result.returncode != 0:
            detail = (result.stderr.strip().splitlines() or ["no message"])[-1][:300]
            raise StepFailed(f"{self.label}: docker pull {reference} failed ({detail})")

    def repo_digests(self, reference: str) -> tuple[str, ...]:
        """REPOSITORY@sha256:... names the engine has for the image `reference` names."""
        try:
            image = self.docker.image.inspect(reference)
        except NoSuchImage:
            return ()
        except DockerException as exc:
            raise StepFailed(f"{self.label}: image inspect {reference} failed ({_detail(exc)})") from exc
        return tuple(sorted(image.repo_digests or ()))

    def run(self, request: RunRequest) -> str:
        """`docker run --detach` of the request; the container id."""
        try:
            container = self.docker.run(
                request.image,
                list(request.command),
                detach=True,
                name=request.name,
                entrypoint=request.entrypoint,
                networks=[request.network],
                ipc=request.ipc,
                gpus=request.gpus,
                shm_size=request.shm_size,
                devices=list(request.devices),
                volumes=list(request.volumes),
                envs=dict(request.env),
                labels=dict(request.labels),
            )
        except DockerException as exc:
            raise StepFailed(f"{self.label}: docker run {request.name} failed ({_detail(exc)})") from exc
        return str(container.id)

    def exec(self, container: str, argv: Sequence[str], timeout_s: float, step: str, *, detach: bool = False) -> ExecResult:
        args = ["exec", *(["--detach"] if detach else []), container, *argv]
        return self._run_cli(args, timeout_s, f"{step} in {container}")

    def state(self, name: str) -> ContainerState | None:
        try:
            inspected = self.docker.container.inspect(name)
        except NoSuchContainer:
            return None
        except DockerException as exc:
            if "No such" in _detail(exc):
                return None
            raise StepFailed(f"{self.label}: container inspect {name} failed ({_detail(exc)})") from exc
        st = inspected.state
        return ContainerState(name=name, running=bool(st.running), exit_code=None if st.running else st.exit_code,
                              image_id=str(inspected.image), labels=dict(inspected.config.labels or {}))  # fmt: skip

    def logs_tail(self, name: str, lines: int = 5) -> list[str]:
        result = self._run_cli(["logs", "--tail", str(lines), name], 30, f"docker logs {name}")
        text = (result.stdout + result.stderr).splitlines()
        return [ln.strip() for ln in text if ln.strip()][-lines:]

    def labelled(self, label: str, value: str) -> list[str]:
        """Names of every container, running or not, that carries label=value."""
        try:
            found = self.docker.container.list(all=True, filters=[("label", f"{label}={value}")])
        except DockerException as exc:
            raise StepFailed(f"{self.label}: container list failed ({_detail(exc)})") from exc
        return sorted(c.name for c in found)

    def remove(self, names: Sequence[str]) -> None:
        if not names:
            return
        result = self._run_cli(["rm", "--force", "--volumes", *names], REMOVE_TIMEOUT_S, "docker rm")
        if result.returncode != 0 and "No such container" not in result.stderr:
            raise StepFailed(f"{self.label}: docker rm failed ({(result.stderr.strip().splitlines() or [''])[-1][:300]})")

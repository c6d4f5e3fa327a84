"""Serve containers for the coherence gate: run, follow logs, inspect, remove.

The container is always removed when the `served` block ends, whatever ends
it: a failed check, an exception, Ctrl-C. It is created under a known name,
so even an interrupt that lands between create and the return of `docker run`
leaves nothing behind. The port is published on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from python_on_whales import DockerClient
from python_on_whales.exceptions import DockerException, NoSuchContainer

from spark_images.core.errors import EnvironmentProblem
from spark_images.engine import require_engine

LABEL = "io.spark-images.coherence"
# `docker run` errors that are the image's fault (no such entrypoint), not the engine's.
_IMAGE_FAULTS = ("executable file not found", "no such file or directory", "exec format error")


class ImageCannotServe(Exception):
    """The engine is fine but the image cannot start the server (a finding about the image)."""


@dataclass
class ServedContainer:
    name: str
    id: str
    host_port: int
    docker: DockerClient

    def state(self) -> tuple[bool, int | None]:
        """(running, exit code once it has stopped)."""
        try:
            inspected = self.docker.container.inspect(self.id)
        except NoSuchContainer:
            return False, None
        st = inspected.state
        return bool(st.running), (None if st.running else st.exit_code)

    def command(self, keys: tuple[str, ...] = ()) -> dict[str, Any] | None:
        """What the engine says this container runs: its process argv, and the variables
        named by `keys` as its environment holds them; None once it is gone."""
        try:
            inspected = self.docker.container.inspect(self.id)
        except NoSuchContainer:
            return None
        env = dict(item.split("=", 1) for item in (inspected.config.env or []) if "=" in item)
        return {"argv": [str(inspected.path), *(str(a) for a in inspected.args or [])],
                "env": {k: env[k] for k in keys if k in env}}


def _host_port(docker: DockerClient, container_id: str, container_port: int) -> int:
    """The loopback port Docker picked; 0 when the container already stopped (no ports then)."""
    inspected = docker.container.inspect(container_id)
    ports = inspected.network_settings.ports or {}
    for binding in ports.get(f"{container_port}/tcp") or []:
        port = getattr(binding, "host_port", None) or (binding.get("HostPort") if isinstance(binding, dict) else None)
        if port:
            return int(port)
    if not inspected.state.running:
        return 0  # exited at once: the caller's health wait sees it stopped and reports the exit
    raise EnvironmentProblem(f"container {container_id[:12]}: port {container_port} was not published")


def _follow(docker: DockerClient, container_id: str, on_line: Callable[[str], None]) -> None:
    try:
        for _source, content in docker.container.logs(container_id, follow=True, stream=True):
            for line in content.decode("utf-8", errors="replace").splitlines():
                on_line(line)
    except (DockerException, NoSuchContainer):
        return  # the container went away: the log ends here


def remove(docker: DockerClient, name: str) -> None:
    """Force-remove by name; twice if Ctrl-C lands during the first attempt."""
    for _attempt in range(2):
        try:
            docker.container.remove(name, force=True, volumes=True)
            return
        except NoSuchContainer:
            return
        except DockerException as exc:
            if "No such container" in str(exc):
                return
            raise
        except KeyboardInterrupt:
            continue


@contextlib.contextmanager
def served(
    image: str,
    command: Sequence[str],
    *,
    on_line: Callable[[str], None],
    entrypoint: str = "vllm",
    container_port: int = 8000,
    gpus: str | None = "all",
    env: Mapping[str, str] | None = None,
    volumes: Sequence[tuple[str, str]] = (),
    name_prefix: str = "spark-images-coherence",
) -> Iterator[ServedContainer]:
    """`docker run --gpus G --ipc host -p 127.0.0.1::PORT IMAGE` with a log follower."""
    docker = require_engine()
    name = f"{name_prefix}-{uuid.uuid4().hex[:12]}"
    env_file: str | None = None
    follower: threading.Thread | None = None
    try:
        if env:
            # Values go through a private file, not the docker command line (ps shows that).
            fd, env_file = tempfile.mkstemp(prefix="spark-images-env-", suffix=".env")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.writelines(f"{k}={v}\n" for k, v in env.items())
        try:
            container = docker.run(
                image,
                list(command),
                detach=True,
                name=name,
                entrypoint=entrypoint,
                gpus=gpus,
                ipc="host",
                publish=[("127.0.0.1:", container_port)],
                env_files=[env_file] if env_file else [],
                volumes=list(volumes),
                labels={LABEL: str(os.getpid())},  # the owning process: see leftover_containers
            )
        except DockerException as exc:
            lines = [ln for ln in (exc.stderr or str(exc)).splitlines() if ln.strip()]
            errors = [ln for ln in lines if ln.startswith("docker:") or "Error" in ln]
            detail = (errors or lines or [str(exc)])[0].strip()
            if any(marker in detail for marker in _IMAGE_FAULTS):
                raise ImageCannotServe(f"docker run {image}: {detail}") from exc
            raise EnvironmentProblem(f"docker run {image} failed: {detail}") from exc
        if env_file:
            Path(env_file).unlink(missing_ok=True)
            env_file = None
        cid = str(container.id)
        follower = threading.Thread(target=_follow, args=(docker, cid, on_line), daemon=True)
        follower.start()
        try:
            port = _host_port(docker, cid, container_port)
        except NoSuchContainer:
            port = 0  # already gone (exited at once and was reaped): the caller sees it stopped
        yield ServedContainer(name=name, id=cid, host_port=port, docker=docker)
    finally:
        if env_file:
            Path(env_file).unlink(missing_ok=True)
        remove(docker, name)
        if follower is not None:
            follower.join(timeout=10)


def leftover_containers(docker: DockerClient | None = None, owner: int | None = None) -> list[str]:
    """Names of gate containers that still exist (there should be none); `owner`
    narrows them to the ones a given process started, when several gates share an engine."""
    docker = docker or require_engine()
    label = LABEL if owner is None else f"{LABEL}={owner}"
    return [c.name for c in docker.container.list(all=True, filters=[("label", label)])]

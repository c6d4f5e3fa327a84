"""The engine room: the ONLY package that talks to a Docker engine.

Every module here may import python_on_whales; nothing outside `engine/` may.
Submodules: `images` (save/inspect local images), `build` (buildx builds),
`containers` (run/stop/logs for the coherence runner), `nodes` (one cluster
node's engine, local or ssh://, for `cluster up|down|status`). They share the
client and the availability check below (`nodes` makes one client per node).
"""

from __future__ import annotations

import functools
import shutil

from python_on_whales import DockerClient
from python_on_whales.exceptions import DockerException

from spark_images.core.errors import EnvironmentProblem

ENGINE_FIX = (
    "start a Docker engine (on Debian: `bash .ci/engine-up.sh`, which installs docker.io "
    "and docker-buildx and starts dockerd), or point DOCKER_HOST at one"
)


@functools.cache
def client() -> DockerClient:
    """The one Docker client of the process."""
    return DockerClient()


def require_engine() -> DockerClient:
    """Return the client if a daemon answers; else EnvironmentProblem (exit 2)."""
    if shutil.which("docker") is None:
        raise EnvironmentProblem(f"no `docker` command on PATH ({ENGINE_FIX})")
    docker = client()
    try:
        version = docker.version()
    except DockerException as exc:
        raise EnvironmentProblem(f"no Docker engine answers ({ENGINE_FIX})") from exc
    if version.server is None:
        raise EnvironmentProblem(f"no Docker engine answers ({ENGINE_FIX})")
    return docker


def engine_available() -> bool:
    try:
        require_engine()
    except EnvironmentProblem:
        return False
    return True

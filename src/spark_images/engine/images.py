"""Local images: `docker save` to a file, and image inspect.

`docker save` of the containerd image store writes the layer blobs first and
`manifest.json` (which orders them) last, so a stream cannot be read in layer
order without holding it: the archive is written to a temporary file and read
with random access by `spark_images.readers.artifacts`.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from python_on_whales.exceptions import DockerException, NoSuchImage

from spark_images.core.errors import EnvironmentProblem, UsageError
from spark_images.engine import require_engine

SAVE_TIMEOUT_S = 3600


@dataclass(frozen=True)
class LocalImage:
    name: str
    id: str
    os: str
    architecture: str
    repo_digests: tuple[str, ...]


def inspect_image(name: str) -> LocalImage:
    """Inspect a local image; UsageError when the engine does not have it."""
    docker = require_engine()
    try:
        image = docker.image.inspect(name)
    except NoSuchImage as exc:
        raise UsageError(
            f"docker://{name}: no such local image (build or load it first; `docker images` lists them)"
        ) from exc
    except DockerException as exc:
        raise EnvironmentProblem(f"docker://{name}: image inspect failed ({exc.return_code})") from exc
    return LocalImage(
        name=name,
        id=str(image.id),
        os=str(image.os),
        architecture=str(image.architecture),
        repo_digests=tuple(image.repo_digests or ()),
    )


def save_image(name: str, dest: Path) -> Path:
    """`docker save NAME -o DEST`; the archive holds blobs, index.json and manifest.json."""
    docker = require_engine()
    inspect_image(name)
    cmd = [*(str(part) for part in docker.client_config.docker_cmd), "save", "-o", str(dest), name]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SAVE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise EnvironmentProblem(f"docker://{name}: docker save took longer than {SAVE_TIMEOUT_S} s") from exc
    if proc.returncode != 0:
        detail = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise EnvironmentProblem(f"docker://{name}: docker save failed ({detail})")
    return dest

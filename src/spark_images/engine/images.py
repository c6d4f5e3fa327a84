"""Local images: `docker save` to a file, and image inspect.

What leaves this module is plain data (`LocalImage`: strings and tuples), never a
python-on-whales object: callers outside `engine/` do not read the client's types.

`docker save` of the containerd image store writes the layer blobs first and
`manifest.json` (which orders them) last, so a stream cannot be read in layer
order without holding it: the archive is written to a temporary file and read
with random access by `spark_images.readers.artifacts`.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from python_on_whales.exceptions import DockerException, NoSuchImage

from spark_images.core.errors import EnvironmentProblem, UsageError
from spark_images.engine import require_engine

SAVE_TIMEOUT_S = 3600


@dataclass(frozen=True)
class LocalImage:
    """One local image as the engine reports it, with the run config `check` judges."""

    name: str
    id: str
    os: str
    architecture: str
    repo_digests: tuple[str, ...]
    env: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()

    def config_doc(self) -> dict[str, Any]:
        """The run config in the shape of an OCI image config's `config` object."""
        return {"Env": list(self.env), "Entrypoint": list(self.entrypoint), "Cmd": list(self.cmd),
                "Labels": dict(self.labels)}  # fmt: skip


def _strings(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    return tuple(str(item) for item in value) if isinstance(value, list | tuple) else ()


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
    config = image.config
    labels = getattr(config, "labels", None)
    return LocalImage(
        name=name,
        id=str(image.id),
        os=str(image.os),
        architecture=str(image.architecture),
        repo_digests=tuple(image.repo_digests or ()),
        env=_strings(getattr(config, "env", None)),
        entrypoint=_strings(getattr(config, "entrypoint", None)),
        cmd=_strings(getattr(config, "cmd", None)),
        labels=tuple((str(k), str(v)) for k, v in labels.items()) if isinstance(labels, dict) else (),
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

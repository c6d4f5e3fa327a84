"""The engine hands `check` plain data: a local image's run config, read once.

A real image is built on the engine (no RUN step, so no emulation) with a known
env, entrypoint, cmd and labels; `engine.images.inspect_image` must give them
back as strings and tuples, and `check`'s config reader must see the same
values through it as `docker image inspect` prints.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from spark_images.check.collect import read_config
from spark_images.core.errors import UsageError
from spark_images.engine.images import LocalImage, inspect_image
from spark_images.readers import artifacts

NAME = "spark-images-test/config-probe:1"


@pytest.fixture(scope="module")
def probe(arm64_base: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    ctx: Path = tmp_path_factory.mktemp("config-probe")
    (ctx / "Dockerfile").write_text(
        f"FROM {arm64_base}\n"
        'ENV SPARK_A=1 SPARK_B="two words"\n'
        'LABEL org.example.kind="probe" org.example.n="3"\n'
        'ENTRYPOINT ["/bin/sh", "-c"]\n'
        'CMD ["echo hello"]\n'
    )
    subprocess.run(["docker", "buildx", "build", "--platform", "linux/arm64", "--load", "-t", NAME, str(ctx)],
                   check=True, capture_output=True, timeout=600)  # fmt: skip
    return NAME


def _is_plain(value: object) -> bool:
    if isinstance(value, str | int | float | bool) or value is None:
        return True
    if isinstance(value, tuple):
        return all(_is_plain(item) for item in value)
    return False


def test_inspect_image_returns_plain_data_with_the_run_config(probe: str) -> None:
    local = inspect_image(probe)
    assert isinstance(local, LocalImage)
    assert all(_is_plain(getattr(local, f.name)) for f in dataclasses.fields(local)), local
    assert "SPARK_A=1" in local.env and "SPARK_B=two words" in local.env
    assert local.entrypoint == ("/bin/sh", "-c") and local.cmd == ("echo hello",)
    assert dict(local.labels) == {"org.example.kind": "probe", "org.example.n": "3"}
    assert local.architecture == "arm64" and local.id.startswith("sha256:")


def test_check_reads_the_same_config_as_docker_inspect(probe: str) -> None:
    printed = subprocess.run(["docker", "image", "inspect", probe], capture_output=True, text=True, check=True)
    expected = json.loads(printed.stdout)[0]
    config, digest = read_config(f"docker://{probe}", artifacts.KIND_DOCKER)
    assert config is not None and digest == expected["Id"]
    assert dict(config.env) == dict(item.partition("=")[::2] for item in expected["Config"]["Env"])
    assert list(config.entrypoint) == expected["Config"]["Entrypoint"]
    assert list(config.cmd) == expected["Config"]["Cmd"]
    assert dict(config.labels) == expected["Config"]["Labels"]


def test_a_missing_local_image_is_one_usage_line(docker_engine: None) -> None:
    with pytest.raises(UsageError) as caught:
        read_config("docker://spark-images-test/no-such-image:0", artifacts.KIND_DOCKER)
    (line,) = caught.value.lines()
    assert "docker://spark-images-test/no-such-image:0" in line and "no such local image" in line

"""Fixtures of the build line, for the build, check and workflow tests (helpers and the why: build_helpers.py)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from support.build_helpers import (
    AMD64_ROOTFS,
    CACHE,
    CUDA_BASE,
    DATA,
    NVCC_WHEEL,
    NVCC_WHEEL_SHA256,
    NVCC_WHEEL_URL,
    TEST_COMMIT,
    LineProject,
    WheelServer,
    _bridge_gateway,
    _docker,
    _download,
    _QuietHandler,
    compile_library,
    make_torch_wheel,
    make_vllm_wheel,
    requirements_lock,
    server_tls_context,
)
from support.cache_lock import cache_lock
from support.loopback import Loopback


@pytest.fixture(scope="session")
def cuda_test_base(
    arm64_base: str, pypi_reachable: None, local_registry: str, tmp_path_factory: pytest.TempPathFactory
) -> str:
    """`REGISTRY/NAME:TAG@sha256:INDEX` of a two-platform CUDA test base, as nvidia/cuda is.

    linux/arm64: the debootstrapped arm64 Debian with a real CUDA 13.0 nvcc/ptxas;
    linux/amd64: the debootstrapped amd64 Ubuntu 24.04 (Python 3 with venv), which
    the native installer stage runs on this x86-64 host (`FROM --platform=$BUILDPLATFORM`).
    BuildKit (docker driver) resolves `FROM name@sha256:...` only at a
    registry, even when the engine holds that exact image, so the base is
    pushed to the loopback registry and pinned there by its index digest: a
    real pull by digest, as `nvidia/cuda:...@sha256:...` is on a connected host.
    """
    if not AMD64_ROOTFS.is_file():
        reason = f"engine unavailable: no amd64 rootfs at {AMD64_ROOTFS} (run .ci/engine-up.sh)"
        if "engine" in os.environ.get("SPARK_IMAGES_REQUIRE", "").split(","):
            pytest.fail(f"engine required (SPARK_IMAGES_REQUIRE) but {reason}")
        pytest.skip(reason)
    with cache_lock("cuda-test-base"):  # one build and push, whichever worker comes first
        probe = subprocess.run(
            ["docker", "image", "inspect", "--format", "{{.Id}}", CUDA_BASE], capture_output=True, text=True
        )
        local = probe.stdout.strip()
        if probe.returncode != 0:
            ctx = tmp_path_factory.mktemp("cuda-base")
            shutil.copy(_download(NVCC_WHEEL_URL, NVCC_WHEEL_SHA256, CACHE / NVCC_WHEEL), ctx / "nvcc.whl")
            os.link(AMD64_ROOTFS, ctx / "rootfs-amd64.tar") if AMD64_ROOTFS.stat().st_dev == ctx.stat().st_dev else shutil.copy(AMD64_ROOTFS, ctx / "rootfs-amd64.tar")
            (ctx / "Dockerfile").write_text(
                "FROM scratch AS base-amd64\n"
                "ADD rootfs-amd64.tar /\n"
                f"FROM --platform=linux/arm64 {arm64_base} AS base-arm64\n"
                "RUN --mount=type=bind,source=nvcc.whl,target=/tmp/nvcc.whl \\\n"
                "    python3 -m zipfile -e /tmp/nvcc.whl /tmp/nvcc \\\n"
                "    && mv /tmp/nvcc/nvidia/cu13 /usr/local/cuda-13.0 && rm -rf /tmp/nvcc \\\n"
                "    && chmod 0755 /usr/local/cuda-13.0/bin/* && ln -s cuda-13.0 /usr/local/cuda \\\n"
                "    && /usr/local/cuda/bin/nvcc --version\n"
                "FROM base-${TARGETARCH}\n"
            )
            subprocess.run(
                ["docker", "buildx", "build", "--platform", "linux/arm64,linux/amd64", "--load", "-t", CUDA_BASE, str(ctx)],
                check=True,
                capture_output=True,
            )
            local = _docker("image", "inspect", "--format", "{{.Id}}", CUDA_BASE)
        remote = f"{local_registry}/{CUDA_BASE}"
        pinned = _registry_index_digest(local_registry)
        # every worker reaches here: push only what the registry lacks (a second push of the
        # same index is no test of anything, and one such push once failed late in a CI run)
        if pinned != local:
            _docker("tag", CUDA_BASE, remote)
            _docker("push", "--quiet", remote)
            pinned = _registry_index_digest(local_registry)
        assert pinned, f"the loopback registry {local_registry} holds no {CUDA_BASE} after its push"
        return f"{remote}@{pinned}"


def _registry_index_digest(registry: str) -> str | None:
    """The digest the loopback registry answers for the CUDA test base's tag, or None."""
    name, tag = CUDA_BASE.split(":")
    resp = requests.head(
        f"http://{registry}/v2/{name}/manifests/{tag}",
        headers={"Accept": "application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json"},
        timeout=30,
    )
    if resp.status_code == 404:
        return None
    resp.raise_for_status()
    return resp.headers["Docker-Content-Digest"]


@pytest.fixture(scope="session")
def wheel_server(docker_engine: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WheelServer]:
    """An HTTPS file server the build containers reach on the bridge gateway (test CA)."""
    directory = tmp_path_factory.mktemp("wheels")
    gateway = _bridge_gateway()
    context = server_tls_context(gateway, tmp_path_factory.mktemp("tls"))
    handler = functools.partial(_QuietHandler, directory=str(directory))
    with Loopback(handler, bind="0.0.0.0", tls=context) as server:
        yield WheelServer(directory, f"https://{gateway}:{server.port}")


@pytest.fixture(scope="session")
def make_project(
    cuda_test_base: str, wheel_server: WheelServer, nvcc: str, local_registry: str, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., LineProject]:
    """Factory: a project with one test profile, its wheel built for `arch_flags`.

    Its requirements lock installs the torch stand-in (`make_torch_wheel`): the CUDA
    13.0 build with sm_121a code (`torch="cuda"`), or a CPU-only torch (`torch="cpu"`).
    """
    libs: dict[tuple[str, ...], Path] = {}
    torches: dict[str, tuple[str, str]] = {}

    def library(arch_flags: list[str]) -> Path:
        key = tuple(arch_flags)
        if key not in libs:
            libs[key] = compile_library(nvcc, arch_flags, tmp_path_factory.mktemp("lib") / "_C.abi3.so")
        return libs[key]

    def torch_wheel(kind: str) -> tuple[str, str]:
        if kind not in torches:
            lib = library(["-gencode=arch=compute_121a,code=sm_121a"]) if kind == "cuda" else None
            wheel, sha = make_torch_wheel(wheel_server.directory / f"torch-{kind}", lib, "13.0" if kind == "cuda" else None)
            torches[kind] = (f"{wheel_server.url}/torch-{kind}/{wheel.name}", sha)
        return torches[kind]

    def make(name: str, arch_flags: list[str], required: list[int] | None = None, torch: str = "cuda") -> LineProject:
        wheel, sha = make_vllm_wheel(wheel_server.directory, library(arch_flags), TEST_COMMIT)
        root = tmp_path_factory.mktemp(f"project-{name}")
        (root / "profiles").mkdir()
        (root / "profiles" / "test.requirements.lock").write_text(requirements_lock(*torch_wheel(torch)))
        text = (DATA / "profile.yaml.in").read_text()
        for key_, value in {
            "@NAME@": name,
            "@COMMIT@": TEST_COMMIT,
            "@BASE@": cuda_test_base,
            "@WHEEL_URL@": f"{wheel_server.url}/{wheel.name}",
            "@WHEEL_SHA256@": sha,
            "@REQUIRED@": f"[{', '.join(str(n) for n in (required or []))}]",
            "@REGISTRY@": local_registry,
        }.items():
            text = text.replace(key_, value)
        profile = root / "profiles" / f"{name}.yaml"
        profile.write_text(text)
        return LineProject(root=root, profile=profile, lock=root / "images.lock.json", wheel_sha256=sha)

    return make

"""Fixtures of the coherence tests: the stand-in vLLM server, on the host or in an image."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from types import ModuleType

import pytest

from support.cache_lock import cache_lock
from support.coherence_fakes import FAKE_PATH, free_port


@pytest.fixture(scope="session")
def fake_vllm() -> ModuleType:
    """The stand-in server as a module (its garbage generators feed the scorer tests)."""
    spec = importlib.util.spec_from_file_location("fake_vllm", FAKE_PATH)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def fake_server(mode: str, *args: str, toks: str = "2000", **env: str) -> Iterator[str]:
    """Run the stand-in on the host; yields its base URL; always stops it."""
    port = free_port()
    full_env = {
        **os.environ,
        "FAKE_VLLM_MODE": mode,
        "FAKE_VLLM_STARTUP_S": "0.4",
        "FAKE_VLLM_TOKS_PER_S": toks,
        **env,
    }
    proc = subprocess.Popen(
        [sys.executable, str(FAKE_PATH), "serve", "test/model", "--port", str(port),
         "--host", "127.0.0.1", *args],
        env=full_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="session")
def run_fake() -> Callable[..., contextlib.AbstractContextManager[str]]:
    """`with run_fake(mode, *flags, toks=..., **env) as url:` the stand-in on the host."""
    return fake_server


@pytest.fixture(scope="session")
def fake_vllm_image(arm64_base: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A linux/arm64 image whose `vllm` entrypoint is the stand-in server."""
    source = FAKE_PATH.read_bytes()
    tag = f"spark-images-test/fake-vllm:{hashlib.sha256(source).hexdigest()[:12]}"
    with cache_lock("fake-vllm-image"):  # one build, whichever worker comes first
        probe = subprocess.run(["docker", "image", "inspect", tag], capture_output=True)
        if probe.returncode == 0:
            return tag
        ctx = tmp_path_factory.mktemp("fake-vllm-image")
        shutil.copy(FAKE_PATH, ctx / "fake_vllm.py")
        (ctx / "vllm").write_text('#!/bin/sh\nexec python3 /opt/fake_vllm/fake_vllm.py "$@"\n')
        (ctx / "Dockerfile").write_text(
            f"FROM {arm64_base}\n"
            "COPY fake_vllm.py /opt/fake_vllm/fake_vllm.py\n"
            "COPY --chmod=755 vllm /usr/local/bin/vllm\n"
            'ENTRYPOINT ["vllm"]\n'
        )
        started = time.monotonic()
        proc = subprocess.run(
            ["docker", "buildx", "build", "--platform", "linux/arm64", "--load", "-t", tag, str(ctx)],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, f"building the stand-in image failed: {proc.stderr[-2000:]}"
        assert time.monotonic() - started < 300
        return tag

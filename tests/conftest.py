"""Shared fixtures: real engine, loopback registry, arm64 base image, nvcc; the two trees' marks.

The folder decides a test's mark: `unit` for tests/unit, `integration` for
tests/integration (`pytest -m unit`, or `pytest tests/unit`, is the fast loop).
What a test needs is still read from pytest's own fixture closure and marks
(environment_needs), and tests/integration/test_collection.py proves the two
agree: no unit test reaches the engine, a registry, nvcc, PyPI or git history,
and no integration test is there without needing one of them.

Tests that need something this machine lacks are skipped with the reason.
CI sets SPARK_IMAGES_REQUIRE (comma list of engine, registry, nvcc, network)
so that a missing piece there FAILS instead of skipping: a green CI never
hides a stage that did not run. `network` means PyPI, which CI reaches;
`history` (vLLM's git history on github.com, which CI cannot reach) is a
kind of its own that CI never requires, so those tests stay skips with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from support.cache_lock import TEST_CACHE, cache_lock

TESTS = Path(__file__).resolve().parent
# the fixtures of more than one folder (tests/support/__init__.py says why they live there)
pytest_plugins = [
    "support.build_fixtures",
    "support.check_fixtures",
    "support.coherence_fixtures",
    "support.publish_fixtures",
    "support.recipe_fixtures",
]
REGISTRY = os.environ.get("SPARK_IMAGES_TEST_REGISTRY", "127.0.0.1:5000")
ARM64_BASE = "spark-images-test/base:bookworm-arm64"
ROOTFS_TAR = TEST_CACHE / "rootfs-arm64.tar"


def _required() -> set[str]:
    return {p.strip() for p in os.environ.get("SPARK_IMAGES_REQUIRE", "").split(",") if p.strip()}


def unavailable(kind: str, reason: str) -> None:
    """Skip with the reason, or fail when CI declared `kind` required."""
    if kind in _required():
        pytest.fail(f"{kind} required (SPARK_IMAGES_REQUIRE) but unavailable: {reason}")
    pytest.skip(f"{kind} unavailable: {reason}")


def _engine_answers() -> str | None:
    if shutil.which("docker") is None:
        return "no docker command"
    proc = subprocess.run(
        ["docker", "version", "--format", "{{.Server.Version}}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if proc.returncode != 0:
        return "no Docker engine answers (run .ci/engine-up.sh)"
    proc = subprocess.run(["docker", "buildx", "version"], capture_output=True, text=True)
    if proc.returncode != 0:
        return "docker buildx is missing (run .ci/engine-up.sh)"
    return None


@pytest.fixture(scope="session")
def docker_engine() -> None:
    reason = _engine_answers()
    if reason:
        unavailable("engine", reason)


@pytest.fixture(scope="session")
def local_registry() -> str:
    """HOST:PORT of the loopback registry (plain HTTP)."""
    try:
        with urllib.request.urlopen(f"http://{REGISTRY}/v2/", timeout=5) as resp:
            resp.read()
    except OSError as exc:
        unavailable("registry", f"no registry at {REGISTRY} ({exc}); run .ci/engine-up.sh")
    return REGISTRY


@pytest.fixture(scope="session")
def arm64_base(docker_engine: None, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A local linux/arm64 Debian image (python3, pip, ca-certificates).

    Made from the debootstrapped rootfs that .ci/engine-up.sh caches, because
    no image can be pulled here. Returns a local image name.
    """
    with cache_lock("arm64-base"):  # one build, whichever worker comes first
        probe = subprocess.run(
            ["docker", "image", "inspect", "--format", "{{.Architecture}}", ARM64_BASE],
            capture_output=True,
            text=True,
        )
        if probe.returncode == 0 and probe.stdout.strip() == "arm64":
            return ARM64_BASE
        if not ROOTFS_TAR.is_file():
            unavailable("engine", f"no arm64 rootfs at {ROOTFS_TAR} (run .ci/engine-up.sh)")
        ctx = tmp_path_factory.mktemp("arm64-base")
        os.link(ROOTFS_TAR, ctx / "rootfs.tar") if ROOTFS_TAR.stat().st_dev == ctx.stat().st_dev else shutil.copy(ROOTFS_TAR, ctx / "rootfs.tar")
        (ctx / "Dockerfile").write_text("FROM scratch\nADD rootfs.tar /\nCMD [\"/bin/bash\"]\n")
        subprocess.run(
            ["docker", "buildx", "build", "--platform", "linux/arm64", "--load", "-t", ARM64_BASE, str(ctx)],
            check=True,
            capture_output=True,
        )
        return ARM64_BASE


@pytest.fixture(scope="session")
def nvcc() -> str:
    path = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    if path is None:
        unavailable("nvcc", "nvcc not found on PATH or in /usr/local/cuda/bin")
    return str(path)


@pytest.fixture(scope="session")
def pypi_reachable() -> None:
    try:
        with urllib.request.urlopen("https://pypi.org/simple/pip/", timeout=10) as resp:
            resp.read(64)
    except OSError as exc:
        unavailable("network", f"PyPI unreachable ({exc})")


@pytest.fixture(scope="session")
def vllm_history_reachable() -> None:
    """vLLM's upstream git history answers (github.com: unreachable on CI)."""
    from spark_images.audit.git import upstream_url

    url = upstream_url()
    try:
        proc = subprocess.run(
            ["git", "ls-remote", "--heads", url, "main"],
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, "GIT_TERMINAL_PROMPT": "0"},
        )
    except subprocess.TimeoutExpired:
        unavailable("history", f"{url} did not answer within 30 s")
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or ["no answer"]
        unavailable("history", f"cannot reach {url} ({lines[-1]})")


# What an integration test needs, one of them at least (a unit test: none of them; no engine,
# network, registry, nvcc or git history, seconds in all). item.fixturenames is the whole
# closure, so a test that reaches one of these through another fixture
# (make_project -> cuda_test_base -> local_registry) counts.
ENVIRONMENT_FIXTURES = frozenset({
    "docker_engine", "local_registry", "nvcc", "pypi_reachable", "vllm_history_reachable",
    # real git histories built with git fast-import (tests/support/audit_histories.py)
    "vllm_like", "vllm_index", "vllm_history",
})  # fmt: skip
# `processes`: whole processes per test under a real clock, seconds each (pyproject.toml's markers)
ENVIRONMENT_MARKS = ("engine", "registry", "nvcc", "network", "history", "slow", "processes")
TREES = ("unit", "integration")
# SPARK_IMAGES_COLLECTION_REPORT=FILE: the collection writes, per test, its tree and its needs
# there (tests/integration/test_collection.py reads it from a --collect-only run)
REPORT_ENV = "SPARK_IMAGES_COLLECTION_REPORT"


def tree_of(item: pytest.Item) -> str | None:
    """`unit` or `integration`: the folder under tests/ the test lies in (None elsewhere)."""
    try:
        top = item.path.relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return None
    return top if top in TREES else None


def environment_needs(item: pytest.Item) -> list[str]:
    """What the test needs of the environment: fixtures of its closure, then marks."""
    fixtures = sorted(ENVIRONMENT_FIXTURES.intersection(getattr(item, "fixturenames", ())))
    marks = [f"mark:{name}" for name in ENVIRONMENT_MARKS if item.get_closest_marker(name)]
    return fixtures + marks


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tree = tree_of(item)
        if tree is not None and not item.get_closest_marker(tree):
            item.add_marker(tree)
    report = os.environ.get(REPORT_ENV)
    if report:
        doc = {item.nodeid: {"tree": tree_of(item), "needs": environment_needs(item)} for item in items}
        Path(report).write_text(json.dumps(doc, indent=0, sort_keys=True))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    """A command run with check=True and captured output fails with its stderr in the report:
    CalledProcessError's message names the command and its exit code only, and the cause of a
    fixture's failed `docker push` late in a CI run was lost that way."""
    report: pytest.TestReport = yield
    exc = call.excinfo.value if call.excinfo is not None else None
    if isinstance(exc, subprocess.CalledProcessError) and exc.stderr:
        err = exc.stderr if isinstance(exc.stderr, str) else exc.stderr.decode("utf-8", "replace")
        report.sections.append(("stderr of the failed command", err[-4000:]))
    return report

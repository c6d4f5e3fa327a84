"""Images on the real engine and the real loopback registry give the same report."""

from __future__ import annotations

import hashlib
import shutil
import subprocess

import pytest

from spark_images.cubins import CubinReport, scan_target
from spark_images.readers import artifacts
from spark_images.registry.client import RegistryClient
from support.cache_lock import tag_lock
from support.paths import ORACLE_BIN

pytestmark = [pytest.mark.engine, pytest.mark.registry, pytest.mark.slow]

SITE = "usr/local/lib/python3.11/dist-packages"

DOCKERFILE = f"""FROM {{base}}
COPY libsm120f.so /{SITE}/vllm/_C_stable_libtorch.abi3.so
COPY libsm120a.so /{SITE}/vllm/_moe_C.abi3.so
COPY libmixed.so /opt/gone/libmixed.so
COPY cubins/ /opt/cubins/
COPY libsm90.so /opt/replaced/lib.so
RUN rm /opt/gone/libmixed.so && rm -rf /opt/cubins && mkdir /opt/cubins
COPY k_sm121a.cubin /opt/cubins/
COPY libsm121a.so /opt/replaced/lib.so
"""


@pytest.fixture(scope="module")
def fixture_image(arm64_base: str, local_registry: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(local image name, registry reference) of an arm64 image with fixture libraries."""
    ctx = tmp_path_factory.mktemp("cubins-image")
    for name in ("libsm120f.so", "libsm120a.so", "libmixed.so", "libsm90.so", "libsm121a.so"):
        shutil.copy(ORACLE_BIN / "lib" / name, ctx / name)
    shutil.copytree(ORACLE_BIN / "cubins", ctx / "cubins")
    shutil.copy(ORACLE_BIN / "cubins" / "k_sm121a.cubin", ctx / "k_sm121a.cubin")
    text = DOCKERFILE.format(base=arm64_base)
    (ctx / "Dockerfile").write_text(text)
    tag = hashlib.sha256(text.encode()).hexdigest()[:12]
    local = f"spark-images-test/cubins-fixture:{tag}"
    remote = f"{local_registry}/spark-images-test/cubins-fixture:{tag}"
    # workers that run this module's tests build and push the one tag in turn (tag_lock says why)
    with tag_lock(remote):
        subprocess.run(
            ["docker", "buildx", "build", "--platform", "linux/arm64", "--load", "-t", local, "-t", remote, str(ctx)],
            check=True,
            capture_output=True,
            timeout=600,
        )
        subprocess.run(["docker", "push", "-q", remote], check=True, capture_output=True, timeout=300)
    return local, remote


def _libraries(doc: dict) -> dict[str, dict]:  # type: ignore[type-arg]
    return {lib["path"]: lib for lib in doc["libraries"]}


REQUIRED = ("vllm/_C*.so", "vllm/_moe_C*.so")


@pytest.fixture(scope="module")
def reports(fixture_image: tuple[str, str]) -> dict[str, CubinReport]:
    """The same image scanned through the engine and through the registry, once each."""
    local, remote = fixture_image
    return {
        "engine": scan_target(f"docker://{local}", required=REQUIRED),
        "registry": scan_target(remote, required=REQUIRED),
    }


def test_docker_and_registry_give_the_same_report(reports: dict[str, CubinReport]) -> None:
    a, b = reports["engine"].to_json(), reports["registry"].to_json()
    assert a.pop("target").startswith("docker://")
    assert not b.pop("target").startswith("docker://")
    assert a == b
    libs = _libraries(a)
    assert libs[f"{SITE}/vllm/_C_stable_libtorch.abi3.so"]["verdict"] == "native"
    assert libs[f"{SITE}/vllm/_moe_C.abi3.so"]["verdict"] == "missing"
    missing = reports["registry"].missing_required
    assert missing == reports["engine"].missing_required
    assert len(missing) == 1 and "_moe_C.abi3.so" in missing[0]


@pytest.mark.parametrize("via", ["engine", "registry"])
def test_whiteouts_and_replacements_are_honoured(reports: dict[str, CubinReport], via: str) -> None:
    libs = _libraries(reports[via].to_json())
    assert "opt/gone/libmixed.so" not in libs
    assert "opt/gone/libmixed.so" not in reports[via].scanned
    # the directory was emptied in a later layer: only the cubin copied after it remains
    assert libs["opt/cubins"]["fatbins"] == 1 and libs["opt/cubins"]["sass"] == ["sm_121a"]
    # a file overwritten in a later layer is read once, in its last version
    assert libs["opt/replaced/lib.so"]["sass"] == ["sm_121a"]
    assert reports[via].scanned.count("opt/replaced/lib.so") == 1


def test_registry_by_digest_and_read_one(fixture_image: tuple[str, str], reports: dict[str, CubinReport]) -> None:
    _local, remote = fixture_image
    host, _, rest = remote.partition("/")
    repo, _, tag = rest.rpartition(":")
    digest = RegistryClient(host, repo).image_manifest(tag).digest
    by_digest = scan_target(f"{host}/{repo}@{digest}").to_json()
    assert by_digest["libraries"] == reports["registry"].to_json()["libraries"]
    data = artifacts.read_one(remote, "vllm/_moe_C.abi3.so")
    assert data == (ORACLE_BIN / "lib/libsm120a.so").read_bytes()
    assert artifacts.read_one(remote, "opt/gone/libmixed.so") is None


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    import sys

    return subprocess.run(
        [sys.executable, "-m", "spark_images.cli", "cubins", *args], capture_output=True, text=True, timeout=300
    )


def test_progress_goes_to_stderr_only(fixture_image: tuple[str, str]) -> None:
    import json

    _local, remote = fixture_image
    proc = _cli(remote, "--json", "--progress", "--require", "vllm/_C*.so")
    assert proc.returncode == 0, proc.stderr
    assert "downloading" in proc.stderr
    assert json.loads(proc.stdout)["verdict"] == "partial"


def test_missing_local_image_is_a_usage_error(docker_engine: None) -> None:
    proc = _cli("docker://spark-images-test/no-such-image:0")
    assert proc.returncode == 2
    assert "no such local image" in proc.stderr
    assert "Traceback" not in proc.stderr

"""Targets that carry vLLM's `_version.py` (wheel, directory, images) and the
PyPI sdist lookup for a release that has no tag in the clone."""

from __future__ import annotations

import hashlib
import json
import subprocess
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pypi_index
import pytest
from pypi_index import version_file

from spark_images.cli import main
from support.audit_histories import VllmLike
from support.loopback import Loopback, QuietHandler


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = main(["audit", *argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_wheel_target(vllm_like: VllmLike, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sha = vllm_like.sha("p40923")
    wheel = tmp_path / "vllm-0.22.1rc0-cp38-abi3-manylinux_2_28_aarch64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("vllm/__init__.py", "")
        zf.writestr("vllm/_version.py", version_file("0.22.1rc0", sha))
    code, doc = run_cli(capsys, str(wheel), "--fix", "40923", "--repo", str(vllm_like.path))
    assert code == 0 and doc["commit"] == sha and doc["fixes"][0]["state"] == "included"


def test_directory_target(vllm_like: VllmLike, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sha = vllm_like.sha(vllm_like.builder.tips["releases/v0.22.1"])
    site = tmp_path / "site-packages" / "vllm"
    site.mkdir(parents=True)
    (site / "_version.py").write_bytes(version_file("0.22.1", sha))
    code, doc = run_cli(capsys, str(tmp_path / "site-packages"), "--fix", "40923", "--repo", str(vllm_like.path))
    assert code == 1 and doc["commit"] == sha and doc["fixes"][0]["state"] == "absent"


def _image_context(tmp_path: Path, sha: str) -> Path:
    ctx = tmp_path / "ctx"
    pkg = ctx / "site" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "_version.py").write_bytes(version_file("0.22.1rc0", sha))
    (ctx / "Dockerfile").write_text("FROM scratch\nCOPY site/ /usr/local/lib/python3.12/dist-packages/\n")
    return ctx


@pytest.mark.engine
def test_local_image_target(
    docker_engine: None, vllm_like: VllmLike, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sha = vllm_like.sha("p40923")
    name = "spark-images-test/audit-vllm:rc0"
    subprocess.run(["docker", "buildx", "build", "--platform", "linux/arm64", "--load", "-t", name, str(_image_context(tmp_path, sha))],
                   check=True, capture_output=True)
    code, doc = run_cli(capsys, f"docker://{name}", "--fix", "40923", "--repo", str(vllm_like.path))
    assert code == 0 and doc["commit"] == sha and doc["fixes"][0]["state"] == "included"


@pytest.mark.engine
@pytest.mark.registry
def test_registry_image_target(
    docker_engine: None, local_registry: str, vllm_like: VllmLike, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sha = vllm_like.sha("p40923")
    ref = f"{local_registry}/spark-images-test/audit-vllm:rc0"
    subprocess.run(["docker", "buildx", "build", "--platform", "linux/arm64", "--load", "-t", ref, str(_image_context(tmp_path, sha))],
                   check=True, capture_output=True)
    subprocess.run(["docker", "push", ref], check=True, capture_output=True)
    code, doc = run_cli(capsys, ref, "--fix", "40923", "--repo", str(vllm_like.path))
    assert code == 0 and doc["commit"] == sha and doc["fixes"][0]["state"] == "included"


# --- a release with no tag in the clone: its commit from the PyPI sdist ----------
class _Index(QuietHandler):
    """Serves a PEP 691 JSON simple index and one sdist, like PyPI does."""

    files: ClassVar[dict[str, tuple[str, bytes]]] = {}

    def do_GET(self) -> None:
        content_type, body = self.files.get(self.path, ("text/plain", b""))
        self.answer(200 if body else 404, body, content_type)


@pytest.fixture()
def local_index(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, dict[str, tuple[str, bytes]]]]:
    with Loopback(_Index) as server:
        monkeypatch.setenv("SPARK_IMAGES_PYPI_SIMPLE", f"{server.url}/simple")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
        _Index.files = {}
        yield server.url, _Index.files


def test_release_without_tag_resolves_through_the_sdist(
    vllm_like: VllmLike, local_index: tuple[str, dict[str, tuple[str, bytes]]], capsys: pytest.CaptureFixture[str]
) -> None:
    base, files = local_index
    sha = vllm_like.sha("p40923")
    archive = pypi_index.sdist("0.22.5", {"setup.py": b"", "vllm/_version.py": version_file("0.22.5", sha)})
    doc = {
        "meta": {"api-version": "1.1"},
        "name": "vllm",
        "files": [{"filename": "vllm-0.22.5.tar.gz", "url": f"{base}/files/vllm-0.22.5.tar.gz",
                   "hashes": {"sha256": hashlib.sha256(archive).hexdigest()}}],
    }
    files["/simple/vllm/"] = ("application/vnd.pypi.simple.v1+json", json.dumps(doc).encode())
    files["/files/vllm-0.22.5.tar.gz"] = ("application/octet-stream", archive)
    code, report = run_cli(capsys, "0.22.5", "--fix", "40923", "--repo", str(vllm_like.path))
    assert code == 0 and report["commit"] == sha
    assert any("PyPI sdist" in n for n in report["notes"])
    code = main(["audit", "0.22.6", "--repo", str(vllm_like.path)])
    assert code == 2 and "no sdist vllm-0.22.6.tar.gz" in capsys.readouterr().err

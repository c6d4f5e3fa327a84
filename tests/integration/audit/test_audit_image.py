"""`spark-images audit REGISTRY/REPO:TAG` reads an installed vLLM through the
registry: no daemon, no pull. The images are OCI layouts written here and
pushed to the loopback registry with the project's own distribution client.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
from pypi_index import version_file

from spark_images.audit.sources import decide_installed
from spark_images.cli import main
from support.audit_histories import VllmLike

SITE = "usr/local/lib/python3.12/dist-packages"


def _tar(members: dict[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def oci_archive(path: Path, files: dict[str, bytes]) -> Path:
    """An OCI image layout tarball (linux/arm64) with one gzip layer holding `files`."""
    layer = gzip.compress(_tar(files), mtime=0)
    config = json.dumps({"architecture": "arm64", "os": "linux", "rootfs": {"type": "layers",
                         "diff_ids": ["sha256:" + hashlib.sha256(_tar(files)).hexdigest()]}}).encode()

    def desc(media: str, data: bytes) -> dict[str, object]:
        return {"mediaType": media, "digest": "sha256:" + hashlib.sha256(data).hexdigest(), "size": len(data)}

    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": desc("application/vnd.oci.image.config.v1+json", config),
                           "layers": [desc("application/vnd.oci.image.layer.v1.tar+gzip", layer)]}).encode()
    index = json.dumps({"schemaVersion": 2, "manifests": [
        {**desc("application/vnd.oci.image.manifest.v1+json", manifest), "platform": {"os": "linux", "architecture": "arm64"}}]}).encode()
    blobs = {f"blobs/sha256/{hashlib.sha256(b).hexdigest()}": b for b in (layer, config, manifest)}
    path.write_bytes(_tar({"oci-layout": b'{"imageLayoutVersion": "1.0.0"}', "index.json": index, **blobs}))
    return path


def push(archive: Path, ref: str) -> None:
    from spark_images.readers.images import ImageArchive
    from spark_images.registry.push import push_oci_archive
    from spark_images.registry.reference import ImageReference

    parsed = ImageReference.parse(ref, allow_digest=False)
    tags = (parsed.tag,) if parsed.tag else ()
    push_oci_archive(ImageArchive(archive), ImageReference(parsed.host, parsed.repository), tags)


def metadata(version: str) -> bytes:
    return f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n".encode()


@pytest.mark.registry
def test_wheel_based_image_with_a_version_file(
    local_registry: str, vllm_like: VllmLike, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")  # proves no daemon is asked
    sha = vllm_like.sha("p40923")
    ref = f"{local_registry}/spark-images-test/audit-wheel:rc0"
    push(oci_archive(tmp_path / "a.tar", {
        f"{SITE}/vllm/_version.py": version_file("0.22.1rc0", sha),
        f"{SITE}/vllm-0.22.1rc0.dist-info/METADATA": metadata("0.22.1rc0"),
    }), ref)
    code = main(["audit", ref, "--fix", "40923", "--repo", str(vllm_like.path), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["commit"] == sha and doc["fixes"][0]["state"] == "included"
    assert any("through the registry (no daemon, no pull)" in n for n in doc["notes"])
    assert any(f"commit g{sha[:9]} read from the installed vllm/_version.py" in n for n in doc["notes"])


@pytest.mark.registry
def test_image_whose_version_file_has_no_commit_resolves_its_release(
    local_registry: str, vllm_like: VllmLike, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ref = f"{local_registry}/spark-images-test/audit-wheel:v0.22.1"
    push(oci_archive(tmp_path / "b.tar", {
        f"{SITE}/vllm/_version.py": b"__version__ = version = '0.22.1'\n",
        f"{SITE}/vllm-0.22.1.dist-info/METADATA": metadata("0.22.1"),
    }), ref)
    code = main(["audit", ref, "--fix", "40923", "--repo", str(vllm_like.path)])
    out = capsys.readouterr().out
    assert code == 1  # v0.22.1 lacks #40923
    assert "no commit recorded; the dist-info names release 0.22.1, resolved as that release" in out
    assert "release 0.22.1: tag v0.22.1" in out


def test_decide_installed_sources_in_order() -> None:
    sha = "0123456789abcdef0123456789abcdef01234567"
    direct = json.dumps({"url": "https://github.com/vllm-project/vllm", "vcs_info": {"vcs": "git", "commit_id": sha}}).encode()
    got = decide_installed("img", {"METADATA": metadata("0.23.0.dev5"), "direct_url.json": direct})
    assert got.commit == sha and "direct_url.json" in got.how
    local = decide_installed("img", {"METADATA": metadata("0.23.0.dev5+g0123456789.cu130")})
    assert local.commit == "0123456789" and "local version" in local.how
    assert decide_installed("img", {"METADATA": metadata("0.22.0")}).release == "0.22.0"
    with pytest.raises(Exception, match=r"no vllm/_version\.py and no vllm dist-info"):
        decide_installed("img", {})

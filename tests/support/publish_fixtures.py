"""Fixtures for the publish tests: small real images in the loopback registry, lock entries.

`push_candidate` pushes a real OCI image (one layer holding a file, an arm64
config) to the loopback registry by digest, through the same upload code the
build uses, and returns `(repository, digest)`. `lock_entry` writes a lock
entry of the build room's schema; its gate sections stand for what the
cubin check and the Spark coherence job record (no Spark GPU here).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from spark_images.readers.images import ImageArchive
from spark_images.registry.push import push_oci_archive
from spark_images.registry.reference import ImageReference

COMMIT = "98dff2a81d747d1dba01a47f939f48c3526d4206"


def _blob(tar: tarfile.TarFile, data: bytes) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
    return {"digest": f"sha256:{digest}", "size": len(data)}


def _layer(payload: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as layer:
        info = tarfile.TarInfo("etc/spark-images-candidate")
        info.size = len(payload)
        info.mtime = 0
        layer.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


def make_oci_archive(path: Path, payload: bytes) -> str:
    """Write a one-layer linux/arm64 OCI image archive; return its manifest digest."""
    layer = _layer(payload)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps(
        {
            "architecture": "arm64",
            "os": "linux",
            "config": {"Labels": {"io.spark-images.vllm.commit": COMMIT}},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        },
        sort_keys=True,
    ).encode()
    with tarfile.open(path, "w") as tar:
        layer_desc = _blob(tar, layer)
        config_desc = _blob(tar, config)
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **layer_desc}],
            },
            sort_keys=True,
        ).encode()
        manifest_desc = _blob(tar, manifest)
        index = json.dumps(
            {
                "schemaVersion": 2,
                "manifests": [
                    {"mediaType": "application/vnd.oci.image.manifest.v1+json", **manifest_desc}
                ],
            }
        ).encode()
        for name, data in (("index.json", index), ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(manifest_desc["digest"])


@pytest.fixture
def repo_name() -> str:
    """A repository name no other test uses."""
    return f"publish-test/{uuid.uuid4().hex[:12]}"


PushCandidate = Callable[[str, bytes], tuple[str, str]]


@pytest.fixture
def push_candidate(local_registry: str, tmp_path: Path) -> PushCandidate:
    def push(name: str, payload: bytes) -> tuple[str, str]:
        archive = tmp_path / f"{uuid.uuid4().hex}.tar"
        digest = make_oci_archive(archive, payload)
        result = push_oci_archive(ImageArchive(archive), ImageReference(local_registry, name), digest=digest)
        assert result.digest == digest
        return f"{local_registry}/{name}", digest

    return push


def _entry(
    repository: str,
    digest: str,
    *,
    cubins: str = "native",
    audit: str = "passed",
    coherence: str = "passed",
    reason: str = "",
    tags: list[str] | None = None,
) -> dict[str, Any]:
    coherence_doc: dict[str, Any] = {"status": coherence}
    if reason:
        coherence_doc["reason"] = reason
    return {
        "profile": "profiles/cu130.yaml",
        "image": f"{repository}@{digest}",
        "repository": repository,
        "digest": digest,
        "vllm_commit": COMMIT,
        "vllm_version": "0.29.0",
        "cuda_version": "13.0.2",
        "cuda_line": "cu130",
        "arch_list": "12.0f",
        "base_image": "nvidia/cuda:13.0.2-devel-ubuntu24.04@sha256:" + "5" * 64,
        "pins": {"torch": "2.13.0", "flashinfer-python": "0.6.18"},
        "fixes_included": [38126, 40082],
        "audit": {"status": audit, **({"reason": reason} if audit != "passed" else {})},
        "cubins": {"verdict": cubins},
        "coherence": coherence_doc,
        "created": "2026-12-01T00:00:00Z",
        "source_date_epoch": 1795996800,
        "tags": list(tags or []),
    }


def _write_lock(path: Path, entries: dict[str, dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"lock_version": 1, "images": entries}, indent=2, sort_keys=True) + "\n")
    return path


@pytest.fixture
def make_entry() -> Callable[..., dict[str, Any]]:
    """`make_entry(repository, digest, cubins=, audit=, coherence=, reason=, tags=)` -> a lock entry."""
    return _entry


@pytest.fixture
def write_lock() -> Callable[[Path, dict[str, dict[str, Any]]], Path]:
    """`write_lock(path, {profile: entry})` writes a lock file of schema version 1."""
    return _write_lock

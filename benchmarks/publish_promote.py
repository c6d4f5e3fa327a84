"""Promotion cost: moving a tag through the OCI API against the docker pull/tag/push route.

Pushes linux/arm64 candidates (4 MB and 64 MB of layers; real vLLM images
are 10-20 GB) to the loopback registry, then in one process times, per
promotion of one tag to the candidate's digest:

  ours  : `TagClient`: GET the manifest by digest, HEAD the tag, PUT the same
          bytes under the tag, HEAD it back (what `spark-images publish` does)
  docker: `docker pull REPO@DIGEST`, `docker tag`, `docker push REPO:TAG` (the
          usual re-tag; it needs a daemon and the layers locally)

Both leave the tag on the same digest; the script checks that. Needs the
engine and the registry (.ci/engine-up.sh). Ours is constant in the image
size; the docker route grows with it. Target: >= 3x at 4 MB, >= 10x at 64 MB.
Run: .venv/bin/python benchmarks/publish_promote.py
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import statistics
import subprocess
import tarfile
import tempfile
import time
import uuid
from pathlib import Path

from spark_images.readers.images import ImageArchive
from spark_images.registry.push import push_oci_archive
from spark_images.registry.reference import ImageReference
from spark_images.registry.tags import TagClient

REGISTRY = os.environ.get("SPARK_IMAGES_TEST_REGISTRY", "127.0.0.1:5000")
ROUNDS = 5


def _blob(tar: tarfile.TarFile, data: bytes) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
    return {"digest": f"sha256:{digest}", "size": len(data)}


def candidate_archive(path: Path, megabytes: int) -> str:
    """A one-layer arm64 OCI image of incompressible data; its manifest digest."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as layer:
        payload = os.urandom(megabytes << 20)
        info = tarfile.TarInfo("opt/payload.bin")
        info.size = len(payload)
        layer.addfile(info, io.BytesIO(payload))
    layer_bytes = buf.getvalue()
    config = json.dumps({
        "architecture": "arm64", "os": "linux", "config": {},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer_bytes).hexdigest()]},
    }).encode()
    with tarfile.open(path, "w") as tar:
        layer_desc = _blob(tar, layer_bytes)
        config_desc = _blob(tar, config)
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **layer_desc}],
        }).encode()
        manifest_desc = _blob(tar, manifest)
        for name, data in (
            ("index.json", json.dumps({"schemaVersion": 2, "manifests": [
                {"mediaType": "application/vnd.oci.image.manifest.v1+json", **manifest_desc}]}).encode()),
            ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(manifest_desc["digest"])


def docker(*args: str) -> None:
    subprocess.run(["docker", *args], check=True, capture_output=True)


def measure(megabytes: int) -> tuple[float, float]:
    """Median seconds (ours, docker) to promote one tag to a candidate of that size."""
    name = f"bench/promote-{uuid.uuid4().hex[:8]}"
    repo = ImageReference(REGISTRY, name)
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "candidate.tar"
        digest = candidate_archive(archive, megabytes)
        push_oci_archive(ImageArchive(archive), repo, digest=digest)
    client = TagClient(REGISTRY, name)

    ours: list[float] = []
    for i in range(ROUNDS):
        start = time.perf_counter()
        manifest = client.get_manifest(digest)
        client.tag_digest(f"ours-{i}")
        client.put_tag(f"ours-{i}", manifest)
        if client.tag_digest(f"ours-{i}") != digest:
            raise SystemExit(f"ours moved ours-{i} to another digest")
        ours.append(time.perf_counter() - start)

    theirs: list[float] = []
    ref = f"{REGISTRY}/{name}"
    for i in range(ROUNDS):
        docker("image", "rm", "-f", f"{ref}@{digest}")  # a fresh runner has no local copy
        start = time.perf_counter()
        docker("pull", "--platform", "linux/arm64", f"{ref}@{digest}")
        docker("tag", f"{ref}@{digest}", f"{ref}:docker-{i}")
        docker("push", f"{ref}:docker-{i}")
        theirs.append(time.perf_counter() - start)
        docker("image", "rm", "-f", f"{ref}:docker-{i}")
        if client.tag_digest(f"docker-{i}") != digest:
            raise SystemExit(f"the docker route moved docker-{i} to another digest")
    docker("image", "rm", "-f", f"{ref}@{digest}")
    return statistics.median(ours), statistics.median(theirs)


def main() -> int:
    for megabytes in (4, 64):
        ours, theirs = measure(megabytes)
        print(
            f"{megabytes:>3} MB image, promote one tag (median of {ROUNDS}): ours {ours * 1000:.1f} ms, "
            f"docker pull/tag/push {theirs * 1000:.1f} ms, ratio {theirs / ours:.1f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

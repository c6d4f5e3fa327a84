"""The publish workflow's sequence, run locally with a real engine and registry.

1. candidate: a linux/arm64 image built by buildx FROM the local arm64 base,
   pushed with `docker push`; from then on only its digest is used;
2. gate: the lock entry records the gates (the coherence result stands for
   what the Spark job records: no sm_121 GPU here);
3. promote: `spark-images publish` (a real process) points the line tag and
   the immutable tag at that digest, records them in the lock and writes the
   lock pull request body; a failed gate first leaves everything untouched.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

pytestmark = [pytest.mark.engine, pytest.mark.registry, pytest.mark.slow]

ACCEPT = ", ".join(
    (
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    )
)


def resolve(host: str, name: str, ref: str) -> str | None:
    resp = requests.head(f"http://{host}/v2/{name}/manifests/{ref}", headers={"Accept": ACCEPT}, timeout=10)
    return None if resp.status_code == 404 else resp.headers["Docker-Content-Digest"]


@pytest.fixture
def candidate(local_registry: str, arm64_base: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(repository, digest) of a freshly built and pushed arm64 candidate."""
    name = f"publish-test/seq-{uuid.uuid4().hex[:10]}"
    ref = f"{local_registry}/{name}:candidate"
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(
        f"FROM {arm64_base}\n"
        "ARG NONCE\n"
        "RUN echo \"$NONCE\" > /etc/spark-images-candidate\n"
        "LABEL io.spark-images.vllm.commit=98dff2a81d747d1dba01a47f939f48c3526d4206\n"
    )
    meta = tmp_path / "meta.json"
    subprocess.run(
        ["docker", "buildx", "build", "--platform", "linux/arm64", "--build-arg", f"NONCE={name}",
         "--metadata-file", str(meta), "-t", ref, "--load", str(ctx)],
        check=True, capture_output=True,
    )
    try:
        subprocess.run(["docker", "push", ref], check=True, capture_output=True)
        built = json.loads(meta.read_text())["containerimage.digest"]
        pushed = resolve(local_registry, name, "candidate")
        assert pushed == built, "the registry must hold the digest the build reported"
        yield f"{local_registry}/{name}", built
    finally:
        subprocess.run(["docker", "image", "rm", "-f", ref], capture_output=True)


def spark_images(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spark_images.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_candidate_gate_promote(
    candidate: tuple[str, str], make_entry: Any, write_lock: Any, tmp_path: Path
) -> None:
    repository, digest = candidate
    host, name = repository.split("/", 1)
    lock = tmp_path / "images.lock.json"
    body = tmp_path / "lock-pr.md"
    immutable = "cu130-98dff2a81-20261201"

    # a candidate whose coherence gate was skipped (no Spark) is not promoted
    write_lock(lock, {"cu130": make_entry(repository, digest, coherence="skipped", reason="no sm_121 GPU")})
    before = lock.read_bytes()
    refused = spark_images("publish", "cu130", "--tag", "cu130", "--immutable", "--date", "20261201",
                           "--lock", str(lock), "--pr-body", str(body))
    assert refused.returncode == 1, refused.stderr
    assert "coherence gate did not pass" in refused.stderr and "Traceback" not in refused.stderr
    assert resolve(host, name, "cu130") is None and resolve(host, name, immutable) is None
    assert lock.read_bytes() == before and not body.exists()

    # the Spark job passed the gate for this very digest: promote
    write_lock(lock, {"cu130": make_entry(repository, digest)})
    dry = spark_images("publish", "cu130", "--tag", "cu130", "--immutable", "--date", "20261201",
                       "--lock", str(lock), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"would create {repository}:cu130 -> {digest}" in dry.stdout
    assert resolve(host, name, "cu130") is None

    done = spark_images("publish", "cu130", "--tag", "cu130", "--immutable", "--date", "20261201",
                        "--lock", str(lock), "--pr-body", str(body), "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["image"] == f"{repository}@{digest}"
    assert doc["media_type"] == "application/vnd.oci.image.index.v1+json"  # buildx pushed an index
    for tag in ("cu130", immutable):
        assert resolve(host, name, tag) == digest
    saved = json.loads(lock.read_text())["images"]["cu130"]
    assert saved["tags"] == ["cu130", immutable] and saved["digest"] == digest
    pr = body.read_text()
    assert f"{repository}@{digest}" in pr and "| coherence gate | passed |" in pr

    # promoting again is a no-op: same digest, tags unchanged
    again = spark_images("publish", "cu130", "--tag", "cu130", "--immutable", "--date", "20261201",
                         "--lock", str(lock), "--json")
    assert again.returncode == 0, again.stderr
    assert {s["action"] for s in json.loads(again.stdout)["steps"]} == {"unchanged"}

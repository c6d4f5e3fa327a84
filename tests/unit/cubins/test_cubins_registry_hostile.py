"""Registry answers that go wrong, from a small HTTP server on 127.0.0.1.

The server speaks just enough of the OCI distribution API (GET /v2/...)
to be a misbehaving registry: 401 with bearer or basic challenges, 404,
500, garbage JSON, a blob whose bytes do not match its digest, a server
that never answers. One well-behaved route (bearer token, an index with an
attestation manifest, gzip and zstd layers with whiteouts) checks the
happy path of the same code. No traffic leaves the loopback interface.
"""

from __future__ import annotations

import gzip
import json
import os
import time
from collections.abc import Callable, Iterator

import pytest
import zstandard

from spark_images.core.errors import SparkImagesError
from spark_images.readers import artifacts
from spark_images.registry.client import RegistryClient, RegistryError, parse_reference
from support.loopback import Loopback, QuietHandler
from support.oci_blobs import digest_of, layer_tar
from support.paths import ORACLE_BIN

Route = Callable[[QuietHandler], None]


class FakeRegistry:
    """Routes: path -> handler; records requests."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.hits: list[str] = []
        owner = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                owner.hits.append(self.path)
                path = self.path.split("?", 1)[0]
                route = owner.routes.get(path)
                if route is None:
                    self.answer(404)
                    return
                route(self)

        self.loopback = Loopback(Handler)
        self.host = self.loopback.host

    def close(self) -> None:
        self.loopback.close()


def reply(status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> Route:
    def route(h: QuietHandler) -> None:
        h.answer(status, body, headers=headers)

    return route


@pytest.fixture()
def fake() -> Iterator[FakeRegistry]:
    registry = FakeRegistry()
    yield registry
    registry.close()


def client(fake: FakeRegistry, **kw: object) -> RegistryClient:
    return RegistryClient(fake.host, "spark/img", backoff=0.01, **kw)  # type: ignore[arg-type]


def test_404_is_a_clear_error(fake: FakeRegistry) -> None:
    with pytest.raises(RegistryError, match="HTTP 404 not found"):
        client(fake).image_manifest("v1")


def test_500_is_retried_then_reported(fake: FakeRegistry) -> None:
    fake.routes["/v2/spark/img/manifests/v1"] = reply(500)
    with pytest.raises(RegistryError, match="HTTP 500"):
        client(fake, retries=2).image_manifest("v1")
    assert len(fake.hits) == 3


def test_a_transient_500_recovers(fake: FakeRegistry) -> None:
    layer = gzip.compress(layer_tar({"a.txt": b"hello"}))
    config = b"{}"
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest_of(config), "size": 2},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest_of(layer), "size": len(layer)}],
        }
    ).encode()
    calls = {"n": 0}

    def flaky(h: QuietHandler) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            reply(503)(h)
        else:
            reply(200, manifest, {"Content-Type": "application/vnd.oci.image.manifest.v1+json"})(h)

    fake.routes["/v2/spark/img/manifests/v1"] = flaky
    fake.routes[f"/v2/spark/img/blobs/{digest_of(layer)}"] = reply(200, layer)
    assert dict(artifacts.iter_files(f"{fake.host}/spark/img:v1", lambda p: True)) == {"a.txt": b"hello"}


def test_basic_challenge_without_credentials(fake: FakeRegistry) -> None:
    fake.routes["/v2/spark/img/manifests/v1"] = reply(401, headers={"WWW-Authenticate": 'Basic realm="x"'})
    with pytest.raises(RegistryError, match="basic authentication"):
        client(fake).image_manifest("v1")


def test_bearer_token_refused(fake: FakeRegistry) -> None:
    challenge = f'Bearer realm="http://{fake.host}/token",service="fake"'
    fake.routes["/v2/spark/img/manifests/v1"] = reply(401, headers={"WWW-Authenticate": challenge})
    fake.routes["/token"] = reply(401)
    with pytest.raises(RegistryError, match="token endpoint answered HTTP 401"):
        client(fake).image_manifest("v1")


@pytest.mark.parametrize("body", [b"<html>oops</html>", b"[1, 2]", b'{"layers": "nope", "config": {}}'])
def test_garbage_manifest(fake: FakeRegistry, body: bytes) -> None:
    fake.routes["/v2/spark/img/manifests/v1"] = reply(200, body, {"Content-Type": "application/json"})
    with pytest.raises(RegistryError):
        client(fake).image_manifest("v1")


def test_a_server_that_never_answers_times_out(fake: FakeRegistry) -> None:
    def hang(h: QuietHandler) -> None:
        time.sleep(5)

    fake.routes["/v2/spark/img/manifests/v1"] = hang
    start = time.monotonic()
    with pytest.raises(RegistryError, match="no answer"):
        client(fake, retries=1, timeout=(1, 0.5)).image_manifest("v1")
    assert time.monotonic() - start < 4


OCI_TYPES = {
    "index": "application/vnd.oci.image.index.v1+json",
    "manifest": "application/vnd.oci.image.manifest.v1+json",
    "config": "application/vnd.oci.image.config.v1+json",
    "layer": "application/vnd.oci.image.layer.v1.tar+gzip",
}
DOCKER_TYPES = {
    "index": "application/vnd.docker.distribution.manifest.list.v2+json",
    "manifest": "application/vnd.docker.distribution.manifest.v2+json",
    "config": "application/vnd.docker.container.image.v1+json",
    "layer": "application/vnd.docker.image.rootfs.diff.tar.gzip",
}


def _image(
    fake: FakeRegistry,
    layers: list[bytes],
    *,
    bearer: bool = False,
    corrupt: bool = False,
    types: dict[str, str] = OCI_TYPES,
) -> str:
    config = json.dumps({"architecture": "arm64", "os": "linux"}).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": types["manifest"],
            "config": {"mediaType": types["config"], "digest": digest_of(config), "size": len(config)},
            "layers": [{"mediaType": types["layer"], "digest": digest_of(b), "size": len(b)} for b in layers],
        }
    ).encode()
    attestation = b'{"schemaVersion": 2}'
    index = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": types["index"],
            "manifests": [
                {"mediaType": types["manifest"], "digest": digest_of(b"amd64"), "size": 5,
                 "platform": {"os": "linux", "architecture": "amd64"}},
                {"mediaType": types["manifest"], "digest": digest_of(attestation), "size": len(attestation),
                 "platform": {"os": "unknown", "architecture": "unknown"},
                 "annotations": {"vnd.docker.reference.type": "attestation-manifest"}},
                {"mediaType": types["manifest"], "digest": digest_of(manifest), "size": len(manifest),
                 "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
            ],
        }
    ).encode()
    token = "t0k3n"

    def guarded(route: Route) -> Route:
        if not bearer:
            return route

        def check(h: QuietHandler) -> None:
            if h.headers.get("Authorization") != f"Bearer {token}":
                challenge = f'Bearer realm="http://{fake.host}/token",service="fake",scope="repository:spark/img:pull"'
                reply(401, headers={"WWW-Authenticate": challenge})(h)
            else:
                route(h)

        return check

    fake.routes["/token"] = reply(200, json.dumps({"token": token}).encode())
    fake.routes["/v2/spark/img/manifests/v1"] = guarded(reply(200, index, {"Content-Type": types["index"]}))
    fake.routes[f"/v2/spark/img/manifests/{digest_of(manifest)}"] = guarded(
        reply(200, manifest, {"Content-Type": types["manifest"]})
    )
    for blob in layers:
        served = blob[:-10] + b"\0" * 10 if corrupt else blob
        fake.routes[f"/v2/spark/img/blobs/{digest_of(blob)}"] = guarded(reply(200, served))
    return f"{fake.host}/spark/img:v1"


def test_bearer_flow_index_whiteouts_gzip_and_zstd(fake: FakeRegistry) -> None:
    lib = (ORACLE_BIN / "lib/libsm120f.so").read_bytes()
    gone = (ORACLE_BIN / "lib/libsm90.so").read_bytes()
    bottom = gzip.compress(layer_tar({"opt/a/libgone.so": gone, "opt/b/libold.so": gone, "opt/keep/lib.so": lib}))
    top = zstandard.ZstdCompressor().compress(
        layer_tar({"opt/a/.wh.libgone.so": b"", "opt/b/.wh..wh..opq": b"", "opt/b/libnew.so": lib})
    )
    ref = _image(fake, [bottom, top], bearer=True)
    found = dict(artifacts.iter_files(ref, lambda p: p.endswith(".so")))
    assert sorted(found) == ["opt/b/libnew.so", "opt/keep/lib.so"]
    # the same through temporary files and mmap, as the scanner reads large members
    spooled = {}
    for member in artifacts.iter_members(ref, lambda p: p.endswith(".so"), spool_over=0):
        assert member.data is not None and not isinstance(member.data, bytes)
        spooled[member.path] = bytes(member.data[:])
    assert spooled == found
    assert "/token?" in "".join(fake.hits)
    assert not any(digest_of(b"amd64") in hit for hit in fake.hits)
    from spark_images.cubins import scan_target

    assert scan_target(ref).verdict == "native"


def test_blob_that_does_not_match_its_digest(fake: FakeRegistry) -> None:
    layer = gzip.compress(layer_tar({"x/lib.so": (ORACLE_BIN / "lib/libsm90.so").read_bytes()}))
    ref = _image(fake, [layer], corrupt=True)
    with pytest.raises(SparkImagesError, match=r"digest|unreadable"):
        list(artifacts.iter_files(ref, lambda p: True))


def test_layer_that_is_not_a_tar(fake: FakeRegistry) -> None:
    ref = _image(fake, [gzip.compress(b"this is not a tar archive" * 100)])
    with pytest.raises(SparkImagesError, match="unreadable"):
        list(artifacts.iter_files(ref, lambda p: True))


def test_cli_reports_registry_errors_in_one_line(fake: FakeRegistry) -> None:
    import subprocess
    import sys

    fake.routes["/v2/spark/img/manifests/v1"] = reply(200, b"garbage", {"Content-Type": "application/json"})
    proc = subprocess.run(
        [sys.executable, "-m", "spark_images.cli", "cubins", f"{fake.host}/spark/img:v1"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    proc = subprocess.run(
        [sys.executable, "-m", "spark_images.cli", "cubins", f"{fake.host}/spark/missing:v1"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2 and "404" in proc.stderr


def test_reference_parsing() -> None:
    ref = parse_reference("127.0.0.1:5000/spark/vllm@sha256:" + "a" * 64)
    assert (ref.host, ref.repository, ref.reference) == ("127.0.0.1:5000", "spark/vllm", "sha256:" + "a" * 64)
    assert parse_reference("ghcr.io/o/r").reference == "latest"
    with pytest.raises(SparkImagesError):
        parse_reference("ghcr.io/o/r@sha256:short")
    with pytest.raises(SparkImagesError):
        parse_reference("ghcr.io/O/R:tag")
    assert RegistryClient("ghcr.io", "o/r").scheme == "https"
    assert RegistryClient("localhost:5000", "o/r").scheme == "http"


def test_a_broken_blob_download_is_resumed_with_a_range(fake: FakeRegistry) -> None:
    lib = (ORACLE_BIN / "lib/libsm120f.so").read_bytes()
    # big enough that the first, broken answer delivers whole chunks before it stops
    layer = gzip.compress(layer_tar({"r/filler.bin": os.urandom(3 << 20), "r/lib.so": lib}), 1)
    ref = _image(fake, [layer])
    calls: list[str | None] = []

    def flaky_blob(h: QuietHandler) -> None:
        rng = h.headers.get("Range")
        calls.append(rng)
        if rng is None:  # first try: promise everything, send half, hang up
            h.send_response(200)
            h.send_header("Content-Length", str(len(layer)))
            h.end_headers()
            h.wfile.write(layer[: len(layer) // 2])
            h.wfile.flush()
            h.close_connection = True
            return
        start = int(rng.split("=")[1].rstrip("-"))
        h.answer(206, layer[start:], headers={"Content-Range": f"bytes {start}-{len(layer) - 1}/{len(layer)}"})

    fake.routes[f"/v2/spark/img/blobs/{digest_of(layer)}"] = flaky_blob
    assert dict(artifacts.iter_files(ref, lambda p: p.endswith(".so"))) == {"r/lib.so": lib}
    assert calls[0] is None and calls[1] is not None and calls[1].startswith("bytes=")


def test_docker_media_types(fake: FakeRegistry) -> None:
    lib = (ORACLE_BIN / "lib/libsm121a.so").read_bytes()
    ref = _image(fake, [gzip.compress(layer_tar({"d/lib.so": lib}))], types=DOCKER_TYPES)
    assert dict(artifacts.iter_files(ref, lambda p: True)) == {"d/lib.so": lib}

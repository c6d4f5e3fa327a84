"""`spark-images check` / `diff` against registries that lie and layers that are corrupt.

Corrupt images are pushed to the real loopback registry through the OCI
distribution API (blobs whose digest is right but whose bytes are not a
layer, a config that is not JSON); answers no real registry gives come from
a small HTTP server on 127.0.0.1. Every case must end with a clean error:
exit 2, a line naming the image or address, no traceback, bounded time/RSS.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator

import pytest
import requests
from harness import assert_clean_failure, run_cli

from support.loopback import Loopback, QuietHandler
from support.oci_blobs import OCI_MANIFEST, digest_of, layer_tar_gz

pytestmark = pytest.mark.processes  # every case runs the CLI as a process under a clock

NO_HISTORY = {"SPARK_IMAGES_VLLM_GIT_URL": "file:///nonexistent-vllm-history"}


def _push_blob(registry: str, repo: str, data: bytes) -> dict[str, object]:
    start = requests.post(f"http://{registry}/v2/{repo}/blobs/uploads/", timeout=30)
    assert start.status_code == 202, start.text
    location = start.headers["Location"]
    if location.startswith("/"):
        location = f"http://{registry}{location}"
    sep = "&" if "?" in location else "?"
    done = requests.put(f"{location}{sep}digest={digest_of(data)}", data=data,
                        headers={"Content-Type": "application/octet-stream"}, timeout=60)  # fmt: skip
    assert done.status_code == 201, done.text
    return {"digest": digest_of(data), "size": len(data)}


def push_image(registry: str, repo: str, tag: str, config: bytes, layers: list[bytes]) -> str:
    cfg = _push_blob(registry, repo, config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **cfg},
        "layers": [
            {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **_push_blob(registry, repo, data)}
            for data in layers
        ],
    }
    resp = requests.put(f"http://{registry}/v2/{repo}/manifests/{tag}", data=json.dumps(manifest),
                        headers={"Content-Type": OCI_MANIFEST}, timeout=30)  # fmt: skip
    assert resp.status_code == 201, resp.text
    return f"{registry}/{repo}:{tag}"


CONFIG = json.dumps({"architecture": "arm64", "os": "linux", "config": {"Env": ["A=1"]},
                     "rootfs": {"type": "layers", "diff_ids": []}}).encode()  # fmt: skip
METADATA = b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.30.0\n\n"


@pytest.mark.registry
def test_corrupt_layer_is_a_clean_error(local_registry: str) -> None:
    good = layer_tar_gz({"usr/lib/python3/dist-packages/vllm-0.30.0.dist-info/METADATA": METADATA})
    corrupt = gzip.compress(b"this is not a tar stream " * 200, mtime=0)
    ref = push_image(local_registry, "spark-images-test/check-hostile", "corrupt-layer", CONFIG, [good, corrupt])
    result = run_cli(["check", ref], env=NO_HISTORY)
    assert_clean_failure(result, rc=2, names=["spark-images-test/check-hostile", "layer"], max_lines=3)
    assert "unreadable" in result.stderr
    diff = run_cli(["diff", ref, ref, "--json"], env=NO_HISTORY)
    assert_clean_failure(diff, rc=2, names=["layer"])
    assert json.loads(diff.stdout)["exit_code"] == 2


@pytest.mark.registry
def test_config_that_is_not_json_is_a_clean_error(local_registry: str) -> None:
    layer = layer_tar_gz({"etc/hostname": b"x\n"})
    ref = push_image(local_registry, "spark-images-test/check-hostile", "bad-config", b"\x00not json", [layer])
    result = run_cli(["check", ref], env=NO_HISTORY)
    assert_clean_failure(result, rc=2, names=["spark-images-test/check-hostile"], max_lines=3)
    assert "config" in result.stderr


@pytest.mark.registry
def test_a_small_clean_image_is_checked(local_registry: str) -> None:
    """The same pushing code makes a readable image: the failures above are the layers' fault."""
    layer = layer_tar_gz({"usr/lib/python3/dist-packages/vllm-0.30.0.dist-info/METADATA": METADATA})
    ref = push_image(local_registry, "spark-images-test/check-hostile", "clean", CONFIG, [layer])
    result = run_cli(["check", ref, "--json"], env=NO_HISTORY)
    assert result.rc == 1, result.stderr
    doc = json.loads(result.stdout)
    assert doc["verdict"] == "broken" and doc["inventory"]["config"]["env"] == {"A": "1"}
    assert {r["subject"] for r in doc["reasons"]} >= {"torch", "vllm/_C*.so"}


Route = Callable[[QuietHandler], None]


def _answer(status: int, body: bytes, ctype: str = "application/json") -> Route:
    def route(h: QuietHandler) -> None:
        h.answer(status, body, ctype)

    return route


@pytest.fixture
def liar() -> Iterator[tuple[str, dict[str, Route]]]:
    routes: dict[str, Route] = {}

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            route = routes.get(self.path.split("?", 1)[0])
            (route or _answer(404, b"{}"))(self)

        do_HEAD = do_GET

    with Loopback(Handler) as server:
        yield server.host, routes


@pytest.mark.parametrize(
    ("case", "status", "body"),
    [
        ("garbage-manifest", 200, b"<html>not a manifest</html>"),
        ("server-error", 500, b"boom"),
        ("manifest-without-layers", 200, json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                                                      "config": {"digest": "sha256:" + "0" * 64, "size": 2}}).encode()),
    ],
)  # fmt: skip
def test_hostile_registry_is_a_clean_error(liar: tuple[str, dict[str, Route]], case: str, status: int, body: bytes) -> None:
    host, routes = liar
    routes["/v2/"] = _answer(200, b"{}")
    routes["/v2/evil/image/manifests/latest"] = _answer(status, body, OCI_MANIFEST)
    result = run_cli(["check", f"{host}/evil/image:latest"], env=NO_HISTORY)
    assert_clean_failure(result, rc=2, names=[host, "evil/image"], max_lines=3)


def test_blob_with_the_wrong_digest_is_a_clean_error(liar: tuple[str, dict[str, Route]]) -> None:
    host, routes = liar
    config = CONFIG
    layer = layer_tar_gz({"etc/hostname": b"x\n"})
    manifest = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest_of(config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest_of(layer), "size": len(layer)}],
    }  # fmt: skip
    routes["/v2/"] = _answer(200, b"{}")
    routes["/v2/evil/image/manifests/v1"] = _answer(200, json.dumps(manifest).encode(), OCI_MANIFEST)
    routes[f"/v2/evil/image/blobs/{digest_of(config)}"] = _answer(200, config, "application/octet-stream")
    tampered = bytearray(layer)
    tampered[-5] ^= 0xFF
    routes[f"/v2/evil/image/blobs/{digest_of(layer)}"] = _answer(200, bytes(tampered), "application/octet-stream")
    result = run_cli(["check", f"{host}/evil/image:v1"], env=NO_HISTORY)
    assert_clean_failure(result, rc=2, names=[host, "evil/image", digest_of(layer)[:19]], max_lines=3)


def test_missing_local_image_and_bad_gpu_are_usage_errors(tmp_path: object) -> None:
    gone = run_cli(["check", "docker://spark-images-test/no-such-image:0"], env=NO_HISTORY)
    assert_clean_failure(gone, rc=2, names=["no-such-image"])
    bad = run_cli(["check", str(tmp_path), "--gpu", "sm_x"], env=NO_HISTORY)
    assert_clean_failure(bad, rc=2, names=["--gpu"], max_lines=3)

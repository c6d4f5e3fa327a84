"""`RegistryClient.request` with bodies, and the loopback rule, against a small HTTP server on 127.0.0.1.

The server answers every PUT with one status from a script and records the
body length it received; no traffic leaves the loopback interface.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest

from spark_images.registry.client import RegistryClient, RegistryError, is_loopback
from spark_images.registry.reference import ImageReference
from support.loopback import Loopback, QuietHandler


class PutServer:
    """Answers PUTs with the next status of `script` (201 once it runs out); records body sizes."""

    def __init__(self, script: list[int]) -> None:
        self.script = list(script)
        self.bodies: list[int] = []
        owner = self

        class Handler(QuietHandler):
            timeout = 5  # a client that declares a body and never sends it cannot hold the thread

            def do_PUT(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                owner.bodies.append(len(self.rfile.read(length)))
                self.answer(owner.script.pop(0) if owner.script else 201)

        self.loopback = Loopback(Handler)
        self.host = self.loopback.host

    def close(self) -> None:
        self.loopback.close()


@pytest.fixture()
def put_server() -> Iterator[PutServer]:
    server = PutServer([500])
    yield server
    server.close()


def test_bytes_bodies_are_retried_after_a_5xx(put_server: PutServer) -> None:
    client = RegistryClient(put_server.host, "spark/img", backoff=0.01, timeout=(2, 2))
    resp = client.request("PUT", "/blobs/x", data=b"abc", ok=(201,))
    assert resp.status_code == 201
    assert put_server.bodies == [3, 3]


def test_a_stream_body_is_sent_once_never_replayed_empty(put_server: PutServer) -> None:
    # a consumed stream cannot be resent: a retry would declare 3 bytes and send none
    client = RegistryClient(put_server.host, "spark/img", backoff=0.01, timeout=(2, 2))
    with pytest.raises(RegistryError, match="HTTP 500"):
        client.request("PUT", "/blobs/x", data=io.BytesIO(b"abc"), headers={"Content-Length": "3"}, ok=(201,))
    assert put_server.bodies == [3]


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1:5000", True),
        ("localhost", True),
        ("[::1]:5000", True),
        ("[::1]", True),
        ("ghcr.io", False),
        ("registry.example:5000", False),
    ],
)
def test_loopback_hosts_speak_plain_http(host: str, loopback: bool) -> None:
    scheme = "http" if loopback else "https"
    assert is_loopback(host) is loopback
    assert RegistryClient(host, "a").scheme == scheme
    assert ImageReference(host, "a").api_base == f"{scheme}://{host}/v2/a"

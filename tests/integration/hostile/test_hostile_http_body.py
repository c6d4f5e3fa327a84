"""registry/http.py's body reader against a slow-drip server, in process.

The pump thread sits in recv() while the server sends one byte and then stays silent;
at the deadline the reader must shut the socket down so that recv() returns,
end the pump and close the response, instead of blocking in close() behind
the pump's read (the CLI cases in test_hostile_http.py see only the exit)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import requests

from spark_images.registry import http

pytestmark = pytest.mark.processes  # every case runs the CLI as a process under a clock


@pytest.fixture()
def drip_url() -> Iterator[str]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with contextlib.suppress(OSError):
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n\r\n")
                while not stop.is_set():  # a byte, then silence far longer than any deadline here
                    conn.sendall(b"x")
                    stop.wait(20)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}/blob"
    stop.set()
    thread.join(5)
    server.close()


def _pumps() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "bounded-http-body" and t.is_alive()}


@pytest.fixture()
def pumps_before() -> set[threading.Thread]:
    """Pumps other in-process tests of this session left: only this test's must be gone."""
    return _pumps()


@pytest.mark.parametrize("chunk", [64 * 1024, None], ids=["chunked", "as-it-arrives"])
def test_a_dripping_body_ends_at_the_deadline_and_frees_its_pump(
    drip_url: str, chunk: int | None, pumps_before: set[threading.Thread]
) -> None:
    deadline = http.Deadline(1.5)
    resp = http.send(requests.Session(), "GET", drip_url, deadline=deadline)
    start = time.monotonic()
    with pytest.raises(http.DeadlineExceeded, match="overall deadline"):
        for _ in http.iter_body(resp, deadline=deadline, url=drip_url, chunk=chunk):
            pass
    elapsed = time.monotonic() - start
    assert elapsed < deadline.seconds + 1.5, f"the reader held on {elapsed:.1f} s past its start"
    assert not _pumps() - pumps_before, "the pump thread is still blocked in recv()"


def test_a_reader_dropped_early_frees_its_pump(drip_url: str, pumps_before: set[threading.Thread]) -> None:
    deadline = http.Deadline(30)
    resp = http.send(requests.Session(), "GET", drip_url, deadline=deadline)
    body = http.iter_body(resp, deadline=deadline, url=drip_url, chunk=1)
    assert next(body) == b"x"
    start = time.monotonic()
    body.close()  # a consumer that has what it wants (an sdist member, an error excerpt)
    assert time.monotonic() - start < 2.0
    assert not _pumps() - pumps_before

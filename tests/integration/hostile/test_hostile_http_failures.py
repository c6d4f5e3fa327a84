"""The one mapping from transport errors to words (registry/http.py `failure`), on real sockets.

Each case makes the failure happen for real on loopback (a closed port, a
plain-HTTP server spoken to over TLS, a body cut short, a silent server, a
redirect loop, an oversized answer) and checks the kind, that the line names
the URL and carries a fix, and that the three clients (registry, PyPI,
OpenAI) wrap the same words in their own error types. A name that does not
resolve cannot be made on a machine without DNS of its own, so that case is
the exception requests raises for it, with urllib3's own message.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator

import pytest
import requests

from spark_images import pypi
from spark_images.coherence.client import OpenAIClient, ServerError
from spark_images.core.errors import EnvironmentProblem
from spark_images.registry import http
from spark_images.registry.client import RegistryClient
from spark_images.registry.manifests import RegistryError

pytestmark = pytest.mark.processes  # every case runs the CLI as a process under a clock

Serve = Callable[[socket.socket], None]


@contextlib.contextmanager
def _server(serve: Serve) -> Iterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    sock.settimeout(0.2)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            with contextlib.suppress(OSError):
                conn.settimeout(5)
                conn.recv(65536)
                serve(conn)
            conn.close()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        sock.close()


def _closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    sock.close()  # nothing listens there now: the connection is refused at once
    return port


def _cut_short(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 10)


def _silent(conn: socket.socket) -> None:
    threading.Event().wait(2)


def _plain(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")


def _loop(conn: socket.socket) -> None:
    # Connection: close, as the server closes: else the client may reuse the socket before
    # it sees the close, and a busy machine turns the loop into a ConnectionError
    conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: /again\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


def _huge(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 999999999\r\n\r\n" + b"x" * 100)


def _exchange(url: str, *, cap: int = 1 << 20, deadline_s: float = 5.0, read_s: float | None = None) -> None:
    deadline = http.Deadline(deadline_s)
    session = requests.Session()
    session.trust_env = False
    resp = http.send(session, "GET", url, deadline=deadline, timeout=deadline.timeout(read=read_s))
    http.read_body(resp, deadline=deadline, url=url, cap=cap)


def _caught(url: str, **kwargs: float) -> http.Failure:
    try:
        _exchange(url, **kwargs)  # type: ignore[arg-type]
    except http.TRANSPORT_ERRORS as exc:
        return http.failure(exc, url, reading=isinstance(exc, requests.exceptions.ChunkedEncodingError))
    raise AssertionError(f"{url}: no failure")


def _assert_line(failure: http.Failure, url: str) -> None:
    line = failure.line()
    assert line.startswith(url) and "\n" not in line and "(fix: " in line, line


def test_a_closed_port_is_refused_and_worth_a_retry() -> None:
    url = f"http://127.0.0.1:{_closed_port()}/v2/"
    failure = _caught(url)
    assert failure.kind == "refused" and failure.transient and not failure.connected, failure
    _assert_line(failure, url)


def test_tls_to_a_plain_http_server_is_a_tls_failure() -> None:
    with _server(_plain) as host:
        url = f"https://{host}/v2/"
        failure = _caught(url)
    assert failure.kind == "tls" and not failure.transient, failure
    assert "TLS" in failure.what and "plain HTTP" in failure.fix
    _assert_line(failure, url)


def test_a_body_cut_short_broke_off() -> None:
    with _server(_cut_short) as host:
        url = f"http://{host}/blob"
        failure = _caught(url)
    assert failure.kind == "broken" and failure.connected, failure
    _assert_line(failure, url)


def test_a_silent_server_timed_out_and_names_the_setting() -> None:
    with _server(_silent) as host:
        url = f"http://{host}/slow"
        failure = _caught(url, deadline_s=1.0)
    assert failure.timed_out and failure.kind == "timeout", failure
    assert "SPARK_IMAGES_HTTP_TIMEOUT" in failure.fix
    _assert_line(failure, url)


def test_an_answer_over_its_cap_is_too_large() -> None:
    with _server(_huge) as host:
        url = f"http://{host}/manifest"
        failure = _caught(url, cap=4096)
    assert failure.kind == "too-large" and not failure.transient, failure
    assert "999999999" in failure.what
    _assert_line(failure, url)


def test_a_redirect_loop_is_named() -> None:
    with _server(_loop) as host:
        url = f"http://{host}/start"
        failure = _caught(url)
    assert failure.kind == "redirects", failure
    _assert_line(failure, url)


def test_a_name_that_does_not_resolve_is_no_such_host() -> None:
    url = "https://registry.invalid/v2/"
    exc = requests.ConnectionError(
        "HTTPSConnectionPool(host='registry.invalid', port=443): Max retries exceeded with url: /v2/ "
        "(Caused by NameResolutionError(\"Failed to resolve 'registry.invalid' "
        "([Errno -2] Name or service not known)\"))"
    )
    failure = http.failure(exc, url)
    assert failure.kind == "dns" and "registry.invalid" in failure.what and not failure.transient
    _assert_line(failure, url)


def test_a_bad_status_is_one_line_with_its_fix() -> None:
    failure = http.status_failure("http://h/x", 404, "not found", "check the name")
    assert failure.line() == "http://h/x: HTTP 404 not found (fix: check the name)"
    assert failure.kind == "status" and not failure.transient


def test_the_three_clients_wrap_the_same_words() -> None:
    port = _closed_port()
    base = f"http://127.0.0.1:{port}"
    expected = "connection refused (fix: check that the server runs"

    registry = RegistryClient(f"127.0.0.1:{port}", "spark/vllm", retries=1, backoff=0.01)
    with pytest.raises(RegistryError) as reg:
        registry.get_manifest("v1")
    assert "127.0.0.1" in str(reg.value) and "no answer after 2 tries" in str(reg.value)
    assert expected in str(reg.value)

    with pytest.raises(EnvironmentProblem) as index:
        pypi.project_index("vllm", index=f"{base}/simple")
    assert str(index.value).startswith(f"{base}/simple/vllm/: ") and expected in str(index.value)

    client = OpenAIClient(base, "m", timeout_s=5)
    with pytest.raises(ServerError) as server:
        client.models()
    assert str(server.value).startswith(f"GET {base}/v1/models: ") and expected in str(server.value)
    assert not server.value.timed_out
    health = client.health_answer(2)
    assert (health.status, health.seen, health.connected) == (None, "connection refused", False)


def test_a_silent_openai_server_is_timed_out_for_the_gate() -> None:
    with _server(_silent) as host:
        client = OpenAIClient(f"http://{host}", "m", timeout_s=1)
        with pytest.raises(ServerError) as caught:
            client.complete("hello", 1)
        health = client.health_answer(1)
    assert caught.value.timed_out and f"POST http://{host}/v1/completions: " in str(caught.value)
    assert health.connected and health.seen == "no answer within 1 s"

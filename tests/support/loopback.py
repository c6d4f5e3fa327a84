"""One loopback HTTP server for the tests' own request handlers.

The real `http.server.ThreadingHTTPServer` on a free port, started in a
daemon thread: each test keeps its own handler (what it serves is the test),
and this is the one place that starts and stops the server. Its request
threads are daemonic, so a client that keeps a connection open never holds
up the stop, and it polls for the stop every 20 ms: serve_forever's default
of 0.5 s cost each test that stopped a server half a second of teardown.

`QuietHandler` is the handlers' common base: it logs nothing, and `answer`
sends one whole plain answer (status, headers, Content-Length, body). A
handler that means to misbehave (a wrong length, a stall, a drip) writes
its own bytes instead.
"""

from __future__ import annotations

import contextlib
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

POLL_S = 0.02


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing and answers in one call."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def answer(self, status: int, body: bytes = b"", content_type: str | None = None,
               headers: dict[str, str] | None = None) -> None:  # fmt: skip
        """`status`, then Content-Type (when given), `headers`, Content-Length and `body`."""
        self.send_response(status)
        if content_type is not None:
            self.send_header("Content-Type", content_type)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)


class Loopback:
    """A started server: `.port`, `.host` ("127.0.0.1:PORT"), `.url`; `close()` or `with`."""

    def __init__(
        self,
        handler: type[BaseHTTPRequestHandler] | Any,
        *,
        bind: str = "127.0.0.1",
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.server = ThreadingHTTPServer((bind, 0), handler)
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = int(self.server.server_address[1])
        self.host = f"127.0.0.1:{self.port}"
        self.url = f"{'https' if tls else 'http'}://{self.host}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": POLL_S},
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.server.shutdown()
            self.server.server_close()
        self._thread.join(5)

    def __enter__(self) -> Loopback:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""Misbehaving HTTP servers on 127.0.0.1 that stop by themselves.

`Hostile(route)` serves every request with `route(req)`, where `req` is a
`Req` with the request line and helpers to misbehave: answer, drip bytes,
send an endless body, hang, redirect to itself. Every helper stops when the
server's lifetime ends (default 90 s), and the server thread shuts itself
down then, so a case that goes wrong cannot leave a thread running.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

from support.loopback import Loopback, QuietHandler

LIFETIME_S = 90.0


class Req:
    def __init__(self, handler: BaseHTTPRequestHandler, server: Hostile) -> None:
        self.h = handler
        self.server = server
        self.method = handler.command
        self.path = handler.path.split("?", 1)[0]
        self.query = handler.path.partition("?")[2]
        self.headers = handler.headers
        length = int(handler.headers.get("Content-Length") or 0)
        self.body = handler.rfile.read(min(length, 1 << 20)) if length else b""

    @property
    def alive(self) -> bool:
        return time.monotonic() < self.server.stop_at

    def answer(self, status: int = 200, body: bytes | str | Any = b"", headers: dict[str, str] | None = None,
               content_type: str = "application/json", length: int | None = None) -> None:  # fmt: skip
        if not isinstance(body, bytes | str):
            body = json.dumps(body)
        data = body.encode("utf-8") if isinstance(body, str) else body
        self.h.send_response(status)
        self.h.send_header("Content-Type", content_type)
        self.h.send_header("Content-Length", str(len(data) if length is None else length))
        for key, value in (headers or {}).items():
            self.h.send_header(key, value)
        self.h.end_headers()
        if self.method != "HEAD":
            with contextlib.suppress(OSError):
                self.h.wfile.write(data)

    def head_only(self, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.h.send_response(status)
        for key, value in (headers or {}).items():
            self.h.send_header(key, value)
        self.h.end_headers()

    def endless(self, length: int | None = None, piece: bytes = b"{" * 65536) -> None:
        """200 and a body that never ends (optionally with a Content-Length that lies)."""
        self.head_only(200, {"Content-Length": str(length)} if length is not None else {"Content-Type": "application/json"})
        with contextlib.suppress(OSError):
            while self.alive:
                self.h.wfile.write(piece)

    def drip(self, data: bytes, every_s: float = 1.0, headers: dict[str, str] | None = None) -> None:
        """200 with the right Content-Length, then one byte per `every_s`."""
        self.head_only(200, {"Content-Length": str(len(data)), "Content-Type": "application/json", **(headers or {})})
        with contextlib.suppress(OSError):
            for i in range(len(data)):
                if not self.alive:
                    return
                self.h.wfile.write(data[i : i + 1])
                self.h.wfile.flush()
                time.sleep(every_s)

    def drip_headers(self, every_s: float = 1.0) -> None:
        """The status line, then the headers one byte per `every_s`: the headers never end in time."""
        with contextlib.suppress(OSError):
            self.h.wfile.write(b"HTTP/1.1 200 OK\r\n")
            self.h.wfile.flush()
            for byte in b"X-Slow: " + b"a" * 10000:
                if not self.alive:
                    return
                self.h.wfile.write(bytes([byte]))
                self.h.wfile.flush()
                time.sleep(every_s)

    def hang(self) -> None:
        """Read the request, answer nothing, keep the connection open."""
        while self.alive:
            time.sleep(0.2)

    def cut(self, status: int = 200, declared: int = 100000, sent: bytes = b'{"a": ') -> None:
        """Promise `declared` bytes, send a few, then close the connection."""
        self.head_only(status, {"Content-Length": str(declared), "Content-Type": "application/json"})
        with contextlib.suppress(OSError):
            self.h.wfile.write(sent)
            self.h.wfile.flush()
            self.h.connection.shutdown(socket.SHUT_RDWR)
        self.h.close_connection = True


Route = Callable[[Req], None]


class Hostile:
    """A threading HTTP server on an ephemeral loopback port, for at most `lifetime` seconds."""

    def __init__(self, route: Route, lifetime: float = LIFETIME_S) -> None:
        self.route = route
        self.stop_at = time.monotonic() + lifetime
        self.hits: list[str] = []
        owner = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                owner.hits.append(f"{self.command} {self.path}")
                try:
                    owner.route(Req(self, owner))
                except (OSError, ValueError):
                    self.close_connection = True

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = _any

        self.loopback = Loopback(Handler)
        self.port, self.host, self.url = self.loopback.port, self.loopback.host, self.loopback.url
        self.timer = threading.Timer(lifetime, self.close)
        self.timer.daemon = True
        self.timer.start()

    def close(self) -> None:
        self.stop_at = 0.0
        self.timer.cancel()
        self.loopback.close()

    def __enter__(self) -> Hostile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""Bounded HTTP: every read has a size cap and an overall deadline.

Shared by the registry client, the PyPI client and the OpenAI client of the
coherence gate. `requests` applies its timeout between bytes only, so a server
that sends one byte a second never trips it; here each call runs on a worker
thread that the caller waits for at most until the deadline, which bounds the
connect, the headers and the body alike. A body is pulled in chunks and
refused as soon as it passes its cap (or the Content-Length it declares is
already over it), so an endless body costs one chunk of memory, not the
machine's. 429 and 503 answers are retried after `Retry-After` (or a backoff)
only while that wait still fits in the deadline.

Every failure of a call is put in words in one place, `failure()`: a timeout,
a refused connection, a name that does not resolve, a TLS handshake, an
oversized or broken answer, a bad status. It gives a `Failure` (what happened,
the fix, whether a retry may help); callers wrap its line in their own error
type, directly or through `mapped()`, and never classify transport
exceptions themselves.

`SPARK_IMAGES_HTTP_TIMEOUT` (seconds) overrides the deadline of metadata calls
(manifests, tokens, index pages) for slow links; downloads get a deadline
that grows with their declared size.
"""

from __future__ import annotations

import contextlib
import email.utils
import math
import queue
import socket
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

import requests

from spark_images import defaults
from spark_images.core.inputs import short

KiB = 1024
MiB = 1024 * KiB
MANIFEST_CAP = 4 * MiB  # an index of every platform with attestations is ~10 KiB
TOKEN_CAP = 64 * KiB
INDEX_CAP = 8 * MiB  # PyPI simple pages (torch's is ~1 MiB)
ERROR_BODY_CAP = 4 * KiB
META_DEADLINE_S = 60.0
CONNECT_S = 10.0
MIN_RATE = 256 * KiB  # bytes/s a download may average before its deadline passes
RETRY_STATUSES = (429, 503)

T = TypeVar("T")


class HttpProblem(Exception):
    """One line naming the URL and what went wrong; callers rewrap it in their error type."""

    def __init__(self, url: str, message: str) -> None:
        super().__init__(f"{short_url(url)}: {message}")
        self.url = url
        self.message = message


class DeadlineExceeded(HttpProblem):
    pass


class TooLarge(HttpProblem):
    pass


def short_url(url: str, limit: int = 200) -> str:
    return short(url, limit)


# --- the one mapping from transport errors to words ---------------------------------

Kind = Literal[
    "dns", "refused", "tls", "no-connection", "connect-timeout", "timeout",
    "too-large", "broken", "redirects", "encoding", "bad-url", "status", "other",
]  # fmt: skip
_UNCONNECTED = frozenset({"dns", "refused", "tls", "no-connection", "connect-timeout", "encoding", "bad-url"})
_TRANSIENT = frozenset({"refused", "no-connection", "connect-timeout", "timeout", "broken"})
_DNS_WORDS = ("name or service not known", "nodename nor servname", "failed to resolve",
              "temporary failure in name resolution", "no address associated", "getaddrinfo failed")  # fmt: skip

TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (HttpProblem, requests.RequestException, UnicodeError)
"""What `send`, `iter_body` and `read_body` raise when the exchange itself fails."""


@dataclass(frozen=True)
class Failure:
    """One failed exchange in words: the URL, what happened, what to do, and its kind.

    `line()` is the one-line message ("URL: what (fix: ...)"); `detail()` is the
    same without the URL, for a caller that names the place its own way.
    """

    url: str
    what: str
    fix: str = ""
    kind: Kind = "other"
    cause: str = ""  # the exception class, for a caller that reports it

    @property
    def timed_out(self) -> bool:
        return self.kind in ("timeout", "connect-timeout")

    @property
    def connected(self) -> bool:
        """Something accepted the connection (the failure came after it)."""
        return self.kind not in _UNCONNECTED

    @property
    def transient(self) -> bool:
        """Another try may get a different answer."""
        return self.kind in _TRANSIENT

    def detail(self) -> str:
        return f"{self.what} (fix: {self.fix})" if self.fix else self.what

    def line(self) -> str:
        return f"{short_url(self.url)}: {self.detail()}"


def _host(url: str) -> str:
    try:
        return short(urlsplit(url).hostname or url, 100)
    except ValueError:
        return short(url, 100)


def failure(exc: BaseException, url: str, *, reading: bool = False) -> Failure:
    """The words for a transport error of a call to `url`; `reading`: it broke while the body came in."""
    cause = exc.__class__.__name__
    slow = f"a slow link or server: raise {defaults.Env.HTTP_TIMEOUT} (seconds)"
    if isinstance(exc, DeadlineExceeded):
        return Failure(url, exc.message, slow, "timeout", cause)
    if isinstance(exc, TooLarge):
        return Failure(url, exc.message, "check that the URL names what it should; the answer is refused unread", "too-large", cause)
    if isinstance(exc, HttpProblem):
        return Failure(url, exc.message, "", "other", cause)
    if isinstance(exc, UnicodeError):
        return Failure(url, "the request cannot be encoded (a header is not latin-1)", "use ASCII in credentials and headers", "encoding", cause)
    if isinstance(exc, requests.exceptions.SSLError):
        return Failure(url, f"the TLS handshake failed ({cause})",
                       "check the server's certificate (REQUESTS_CA_BUNDLE) or speak plain HTTP to a plain-HTTP server",
                       "tls", cause)  # fmt: skip
    if isinstance(exc, requests.ConnectTimeout):
        return Failure(url, f"no connection in time ({cause})", f"check the network and the address; {slow}", "connect-timeout", cause)
    if isinstance(exc, requests.Timeout):
        return Failure(url, f"no answer in time ({cause})", slow, "timeout", cause)
    if isinstance(exc, requests.TooManyRedirects):
        return Failure(url, "too many redirects", "check the URL; the server sends it round in a loop", "redirects", cause)
    if isinstance(exc, requests.exceptions.InvalidURL | requests.exceptions.MissingSchema | requests.exceptions.InvalidSchema):
        return Failure(url, f"not a URL that can be fetched ({cause})", "check the URL", "bad-url", cause)
    if reading or isinstance(exc, requests.exceptions.ChunkedEncodingError | requests.exceptions.ContentDecodingError):
        return Failure(url, f"the answer broke off ({cause})", "try again; check the network or proxy", "broken", cause)
    if isinstance(exc, requests.ConnectionError):
        text = str(exc).lower()
        if any(word in text for word in _DNS_WORDS):
            return Failure(url, f"no such host {_host(url)!r}", "check the host name", "dns", cause)
        if "refused" in text:
            return Failure(url, "connection refused", "check that the server runs and listens on that host and port", "refused", cause)
        return Failure(url, f"no connection ({cause})", "check the network and the address", "no-connection", cause)
    return Failure(url, f"the request failed ({cause})", "", "other", cause)


def status_failure(url: str, status: int, hint: str = "", fix: str = "") -> Failure:
    """The words for an answer with a status the caller did not expect."""
    return Failure(url, f"HTTP {status}" + (f" {hint}" if hint else ""), fix, "status", f"HTTP {status}")


@contextlib.contextmanager
def mapped(url: str, error: Callable[[Failure], BaseException], *, reading: bool = False) -> Iterator[None]:
    """Run the block; a transport error becomes `error(failure(...))`, its traceback dropped."""
    try:
        yield
    except TRANSPORT_ERRORS as exc:
        raise error(failure(exc, url, reading=reading)) from None


def meta_deadline_s() -> float:
    return defaults.http_deadline_s()


def download_deadline_s(size: int) -> float:
    """A download of `size` bytes must average MIN_RATE, plus the metadata allowance."""
    return meta_deadline_s() + max(0, size) / MIN_RATE


class Deadline:
    """An absolute end time on the monotonic clock."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def expired(self) -> bool:
        return self.left() <= 0

    def timeout(self, connect: float = CONNECT_S, read: float | None = None) -> tuple[float, float]:
        """requests' (connect, between-bytes) timeouts, never past the deadline."""
        left = max(0.01, self.left())
        return min(connect, left), min(read, left) if read is not None else left


def in_thread(fn: Callable[[], T], deadline: Deadline, url: str, what: str = "no answer") -> T:
    """fn() on a daemon thread, waited for until the deadline; DeadlineExceeded past it."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def work() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the waiting thread, re-raised there
            box["error"] = exc
        finally:
            done.set()
            if box.get("abandoned"):
                _close(box.get("value"))

    worker = threading.Thread(target=work, daemon=True, name="bounded-http")
    worker.start()
    if not done.wait(max(0.0, deadline.left())):
        box["abandoned"] = True
        raise DeadlineExceeded(url, f"{what} within {deadline.seconds:g} s (overall deadline)")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def _close(value: object) -> None:
    close = getattr(value, "close", None)
    if callable(close):
        with contextlib.suppress(Exception):  # closing an abandoned answer must not raise
            close()


def send(session: requests.Session, method: str, url: str, *, deadline: Deadline, **kwargs: Any) -> requests.Response:
    """The response with its headers read and its body not; bounded by the deadline."""
    kwargs.setdefault("timeout", deadline.timeout())
    kwargs["stream"] = True
    return in_thread(lambda: session.request(method, url, **kwargs), deadline, url)


def declared_length(resp: requests.Response) -> int | None:
    raw = resp.headers.get("Content-Length")
    if raw is None or not raw.strip().isdigit():
        return None
    return int(raw.strip())


def iter_body(
    resp: requests.Response,
    *,
    deadline: Deadline,
    url: str,
    cap: int | None = None,
    chunk: int | None = 1 * MiB,
) -> Generator[bytes, None, None]:
    """The body in chunks, pumped by a worker thread; stops at the cap and the deadline.

    `chunk=None` hands over each piece as it arrives (server-sent events are
    timed per piece). The response is closed when the iterator ends, is closed or is dropped.
    """
    if cap is not None:
        length = declared_length(resp)
        if length is not None and length > cap:
            resp.close()
            raise TooLarge(url, f"the answer declares {length} bytes, over the cap of {cap}")
    pipe: queue.Queue[object] = queue.Queue(maxsize=4)
    stop = threading.Event()
    end = object()

    def pump() -> None:
        try:
            for piece in resp.iter_content(chunk_size=chunk):
                while not stop.is_set():
                    try:
                        pipe.put(piece, timeout=0.5)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            pipe.put(end)
        except BaseException as exc:  # handed to the consumer
            if not stop.is_set():
                pipe.put(exc)

    worker = threading.Thread(target=pump, daemon=True, name="bounded-http-body")
    worker.start()
    total = 0
    finished = False
    try:
        while True:
            left = deadline.left()
            if left <= 0:
                raise DeadlineExceeded(url, f"the answer did not finish within {deadline.seconds:g} s (overall deadline)")
            try:
                item = pipe.get(timeout=left)
            except queue.Empty:
                raise DeadlineExceeded(
                    url, f"the answer did not finish within {deadline.seconds:g} s (overall deadline)"
                ) from None
            if item is end:
                finished = True
                return
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, bytes)
            total += len(item)
            if cap is not None and total > cap:
                raise TooLarge(url, f"the answer is over the cap of {cap} bytes")
            yield item
    finally:
        stop.set()
        if not finished and worker.is_alive():
            # the pump may sit in a read (a slow-drip server) holding the stream's lock: closing
            # from here would wait for it forever; shutting the socket down wakes it instead
            _abort(resp)
        worker.join(1.0)  # finished: it is returning; aborted: the shutdown ended its read
        if not worker.is_alive():  # else it is stuck on a socket we could not find: never block on it
            _close(resp)


def _abort(resp: requests.Response) -> None:
    """Shut the response's socket down (both ways) without touching its buffered stream."""
    conn = getattr(resp.raw, "_connection", None) or getattr(resp.raw, "connection", None)
    sock = getattr(conn, "sock", None)
    if sock is None:
        fp = getattr(resp.raw, "_fp", None)
        raw = getattr(getattr(fp, "fp", None), "raw", None)
        sock = getattr(raw, "_sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def read_body(resp: requests.Response, *, deadline: Deadline, url: str, cap: int) -> bytes:
    """The whole body, at most `cap` bytes, before the deadline."""
    return b"".join(iter_body(resp, deadline=deadline, url=url, cap=cap, chunk=64 * KiB))


def error_text(resp: requests.Response, deadline: Deadline, url: str) -> str:
    """A short, printable excerpt of an error body (best effort, bounded)."""
    try:
        budget = Deadline(min(2.0, max(0.0, deadline.left())))
        data = b""
        for piece in iter_body(resp, deadline=budget, url=url, chunk=1 * KiB):
            data += piece
            if len(data) >= ERROR_BODY_CAP:
                break
    except (HttpProblem, requests.RequestException, OSError):
        return ""
    finally:
        _close(resp)
    text = data[:300].decode("utf-8", "replace")
    return "".join(ch if ch.isprintable() else " " for ch in text).strip()


def retry_after_s(resp: requests.Response) -> float | None:
    """Seconds a 429/503 asks us to wait (delta-seconds or an HTTP date); None if absent or bad."""
    raw = (resp.headers.get("Retry-After") or "").strip()
    if not raw:
        return None
    if raw.isdigit():
        return float(int(raw[:12]))
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None:
        return None
    try:
        delta = when.timestamp() - time.time()
    except (OverflowError, OSError, ValueError):
        return None
    return max(0.0, delta) if math.isfinite(delta) else None


def wait_to_retry(resp: requests.Response, deadline: Deadline, attempt: int, backoff: float, url: str) -> None:
    """Sleep as a 429/503 asks (Retry-After, else backoff), or give up when that would pass the deadline."""
    asked = retry_after_s(resp)
    wait = asked if asked is not None else backoff * 2**attempt
    status = resp.status_code
    _close(resp)
    if wait >= deadline.left():
        detail = f"Retry-After {asked:g} s" if asked is not None else f"a retry in {wait:g} s"
        raise DeadlineExceeded(
            url, f"HTTP {status} after {attempt + 1} tries; {detail} would pass the {deadline.seconds:g} s deadline"
        )
    time.sleep(wait)

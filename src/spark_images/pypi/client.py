"""The PyPI client: the simple index, wheel downloads into the cache, and range reads.

Uses the simple API as JSON (`Accept: application/vnd.pypi.simple.v1+json`),
which carries each file's URL, size and sha256. Whole downloads land in
`~/.cache/spark-images/wheels` (or $SPARK_IMAGES_CACHE/wheels) and are
verified by size and sha256 before use, and again by size on every later use.
For reading a few small members, `HttpRangeFile` gives zipfile a seekable
file over HTTP range requests (the central directory, then only those
members); what it reads is checked against the declared size, the sha256 of
the whole file cannot be checked that way.

Index pages are read with a size cap and an overall deadline (`registry.http`),
and downloads stop at their declared size and hash as they stream. Which file
of an index page is the wheel is decided by `wheels`, which does no I/O.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_images import defaults
from spark_images.core import atomic
from spark_images.core.errors import EnvironmentProblem, UsageError
from spark_images.core.inputs import loads_json
from spark_images.pypi.wheels import WheelFile, normalize, parse_requirement, pick_wheel

if TYPE_CHECKING:
    import requests

    from spark_images.registry import http

# `requests` and the HTTP helpers (~0.2 s to import) are imported by the functions that go to
# the network: a `check` of a local tree imports this package for its names and wheel rules only

SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
TIMEOUT = (15, 120)  # connect, between bytes; the overall deadline is registry.http's
RETRIES = 3
Progress = Callable[[int, int], None]


def index_url() -> str:
    """The simple index every PyPI lookup uses: SPARK_IMAGES_PYPI_SIMPLE, else PyPI."""
    return defaults.pypi_simple()


def cache_root() -> Path:
    return defaults.download_cache()


def _session() -> requests.Session:
    import requests

    session = requests.Session()
    session.headers["User-Agent"] = "spark-images"
    return session


def project_index(name: str, *, index: str | None = None, what: str = "") -> dict[str, Any]:
    """The PEP 691 JSON page of a project (`files` is a list), read within a size cap and a deadline.

    UsageError when the project does not exist; EnvironmentProblem for every
    other failure, each one line naming the URL.
    """
    from spark_images.registry import http
    base = (index or index_url()).rstrip("/")
    url = f"{base}/{normalize(name)}/"
    label = f"{what}: " if what else ""
    deadline = http.Deadline(http.meta_deadline_s())
    session = _session()

    def problem(failure: http.Failure) -> EnvironmentProblem:
        return EnvironmentProblem(f"{label}{failure.line()}")

    attempt = 0
    while True:
        with http.mapped(url, problem):
            resp = http.send(session, "GET", url, deadline=deadline, headers={"Accept": SIMPLE_JSON},
                             timeout=deadline.timeout(*TIMEOUT))  # fmt: skip
        if resp.status_code in http.RETRY_STATUSES and attempt < RETRIES:
            with http.mapped(url, problem):
                http.wait_to_retry(resp, deadline, attempt, 0.5, url)
            attempt += 1
            continue
        break
    if resp.status_code == 404:
        resp.close()
        raise UsageError(f"{label}no project {name!r} on {base}")
    if resp.status_code != 200:
        resp.close()
        raise problem(http.status_failure(url, resp.status_code, fix=f"check the index ({defaults.Env.PYPI_SIMPLE})"))
    with http.mapped(url, problem, reading=True):
        body = http.read_body(resp, deadline=deadline, url=url, cap=http.INDEX_CAP)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise EnvironmentProblem(f"{label}{http.short_url(url)} did not answer simple-API JSON (not UTF-8)") from None
    doc = loads_json(text, file=f"{label}{http.short_url(url)}", what="simple-API answer", error=EnvironmentProblem)
    if not isinstance(doc, dict) or not isinstance(doc.get("files"), list):
        raise EnvironmentProblem(f"{label}{http.short_url(url)} did not answer simple-API JSON (no `files` list)")
    return doc


def resolve(requirement: str, *, index: str | None = None, arch: str = "aarch64") -> WheelFile:
    """`name==version` -> the wheel file; UsageError / EnvironmentProblem otherwise."""
    parsed = parse_requirement(requirement)
    if parsed is None:
        raise UsageError(f"{requirement}: not a requirement of the form NAME==VERSION")
    name, version = parsed
    base = (index or index_url()).rstrip("/")
    files = project_index(name, index=base, what=requirement)["files"]
    wheel = pick_wheel(files, name, version, arch)
    if wheel is None:
        raise UsageError(
            f"{requirement}: no linux {arch} wheel of version {version} on {base} "
            "(check the version; source-only releases cannot be inspected)"
        )
    return wheel


def stream(url: str, *, size: int | None = None, cap: int | None = None) -> Iterator[bytes]:
    """The bytes at URL in chunks: stops past `size` (or `cap`), within a deadline that grows with the size.

    EnvironmentProblem naming the URL on any failure. For callers outside this
    module (sdists of the audit), so that every PyPI download is bounded the same way.
    """
    from spark_images.registry import http
    limit = size if size is not None else cap
    deadline = http.Deadline(http.download_deadline_s(limit or 0))

    def problem(failure: http.Failure) -> EnvironmentProblem:
        if failure.kind == "too-large":
            return EnvironmentProblem(f"{http.short_url(url)}: more than the declared {limit} bytes")
        return EnvironmentProblem(failure.line())

    with http.mapped(url, problem):
        resp = http.send(_session(), "GET", url, deadline=deadline, timeout=deadline.timeout(*TIMEOUT))
    if resp.status_code != 200:
        resp.close()
        raise problem(http.status_failure(url, resp.status_code))
    with http.mapped(url, problem, reading=True):
        yield from http.iter_body(resp, deadline=deadline, url=url, cap=limit)


def cached_path(wheel: WheelFile) -> Path:
    return cache_root() / "wheels" / wheel.filename


def cached(wheel: WheelFile) -> Path | None:
    """The cached wheel when present and of the declared size (sha256 was checked on download)."""
    path = cached_path(wheel)
    ok = path.with_name(path.name + ".sha256")
    if (
        path.is_file()
        and ok.is_file()
        and path.stat().st_size == wheel.size
        and ok.read_text(encoding="ascii").strip() == wheel.sha256
    ):
        return path
    return None


def download(wheel: WheelFile, progress: Progress | None = None) -> Path:
    """Download into the cache, hashing as it streams and stopping at the declared size."""
    from spark_images.registry import http
    hit = cached(wheel)
    if hit is not None:
        return hit
    path = cached_path(wheel)
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    got = 0
    fd, tmp = tempfile.mkstemp(prefix=f".{wheel.filename}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in stream(wheel.url, size=wheel.size):
                out.write(chunk)
                digest.update(chunk)
                got += len(chunk)
                if progress:
                    progress(got, wheel.size)
        if got != wheel.size:
            raise EnvironmentProblem(f"{wheel.filename}: got {got} bytes, the index says {wheel.size} ({http.short_url(wheel.url)})")
        if digest.hexdigest() != wheel.sha256:
            raise EnvironmentProblem(
                f"{wheel.filename}: sha256 mismatch (download corrupted or index changed) ({http.short_url(wheel.url)})"
            )
        os.replace(tmp, path)
        atomic.write_text(path.with_name(path.name + ".sha256"), wheel.sha256 + "\n")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


class RangeReadError(OSError):
    """A range read that failed: an OSError (zipfile expects one) whose filename is the URL."""

    def __init__(self, url: str, message: str) -> None:
        from spark_images.registry import http
        super().__init__(errno.EIO, message, http.short_url(url))


class HttpRangeFile(io.RawIOBase):
    """A read-only, seekable file over HTTP range requests (for zipfile).

    Reads are rounded up to `block` bytes so zipfile's many small header
    reads cost few requests. Every answer must be 206 with a Content-Range
    whose total equals the declared size.
    """

    def __init__(self, url: str, size: int, *, block: int = 1 << 20, retries: int = 3) -> None:
        super().__init__()
        self.url = url
        self.size = size
        self.block = block
        self.retries = retries
        self.pos = 0
        self.http = _session()
        self._cache_start = 0
        self._cache = b""
        self.bytes_fetched = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def _error(self, failure: http.Failure) -> RangeReadError:
        return RangeReadError(self.url, f"range read: {failure.detail()}")

    def _fetch(self, start: int, end: int) -> bytes:
        from spark_images.registry import http
        header = {"Range": f"bytes={start}-{end - 1}"}
        deadline = http.Deadline(http.download_deadline_s(end - start))
        for attempt in range(self.retries + 1):
            try:
                resp = http.send(self.http, "GET", self.url, deadline=deadline, headers=header,
                                 timeout=deadline.timeout(*TIMEOUT))  # fmt: skip
            except http.TRANSPORT_ERRORS as exc:
                failure = http.failure(exc, self.url)
                if not failure.transient or attempt == self.retries or deadline.left() < 0.5 * 2**attempt:
                    raise RangeReadError(self.url, f"range read: {failure.detail()}") from None
                time.sleep(0.5 * 2**attempt)
                continue
            if resp.status_code in http.RETRY_STATUSES and attempt < self.retries:
                with http.mapped(self.url, self._error):
                    http.wait_to_retry(resp, deadline, attempt, 0.5, self.url)
                continue
            if resp.status_code >= 500 and attempt < self.retries:
                resp.close()
                time.sleep(min(0.5 * 2**attempt, max(0.0, deadline.left())))
                continue
            if resp.status_code != 206:
                resp.close()
                raise RangeReadError(self.url, f"range read answered HTTP {resp.status_code}, expected 206")
            total = resp.headers.get("Content-Range", "").rpartition("/")[2]
            if total != str(self.size):
                resp.close()
                raise RangeReadError(self.url, f"server size {total[:40]!r} differs from the declared {self.size}")
            with http.mapped(self.url, self._error, reading=True):
                data = http.read_body(resp, deadline=deadline, url=self.url, cap=end - start)
            if len(data) != end - start:
                raise RangeReadError(self.url, f"short range answer ({len(data)} of {end - start} bytes)")
            self.bytes_fetched += len(data)
            return data
        raise RangeReadError(self.url, "range read failed")

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), self.size - self.pos)
        if want <= 0:
            return 0
        cache_end = self._cache_start + len(self._cache)
        if not (self._cache_start <= self.pos and self.pos + want <= cache_end):
            start = self.pos
            end = min(self.size, start + max(want, self.block))
            self._cache = self._fetch(start, end)
            self._cache_start = start
        off = self.pos - self._cache_start
        buffer[:want] = self._cache[off : off + want]
        self.pos += want
        return want

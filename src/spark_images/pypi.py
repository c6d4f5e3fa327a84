"""PyPI: turn `name==version` into a linux aarch64 wheel, downloaded or read by range.

Uses the simple API as JSON (`Accept: application/vnd.pypi.simple.v1+json`),
which carries each file's URL, size and sha256. Whole downloads land in
`~/.cache/spark-images/wheels` (or $SPARK_IMAGES_CACHE/wheels) and are
verified by size and sha256 before use, and again by size on every later use.
For reading a few small members, `HttpRangeFile` gives zipfile a seekable
file over HTTP range requests (the central directory, then only those
members); what it reads is checked against the declared size, the sha256 of
the whole file cannot be checked that way.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from spark_images import atomic
from spark_images.errors import EnvironmentProblem, UsageError

INDEX_URL = "https://pypi.org/simple"


def index_url() -> str:
    """The simple index every PyPI lookup uses: SPARK_IMAGES_PYPI_SIMPLE, else PyPI."""
    return os.environ.get("SPARK_IMAGES_PYPI_SIMPLE", INDEX_URL).rstrip("/")
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
TIMEOUT = (15, 120)
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9.+!_-]+)\s*$")

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class WheelFile:
    filename: str
    url: str
    size: int
    sha256: str


def parse_requirement(text: str) -> tuple[str, str] | None:
    """'vllm==0.33.0' -> ('vllm', '0.33.0'); None if it is not that shape."""
    match = _REQUIREMENT.match(text)
    return (match.group(1), match.group(2)) if match else None


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pick_wheel(files: list[dict[str, Any]], name: str, version: str, arch: str = "aarch64") -> WheelFile | None:
    """The linux `arch` wheel of exactly `version` among a simple-API file list (pure)."""
    wanted = normalize(name)
    found: list[WheelFile] = []
    for item in files:
        if not isinstance(item, dict):
            continue  # a hostile or broken index: skip what is not a file record
        filename = str(item.get("filename", ""))
        if not filename.endswith(".whl") or item.get("yanked"):
            continue
        parts = filename[:-4].split("-")
        if len(parts) < 5:
            continue
        dist, ver, platform = parts[0], parts[1], parts[-1]
        if normalize(dist) != wanted or ver != version:
            continue
        if "linux" not in platform or not platform.endswith(arch):
            continue
        hashes = item.get("hashes")
        sha256 = hashes.get("sha256") if isinstance(hashes, dict) else None
        size, url = item.get("size"), item.get("url")
        if not isinstance(size, int) or not isinstance(sha256, str) or not isinstance(url, str):
            continue
        found.append(WheelFile(filename, url, size, sha256))
    # prefer the newest manylinux tag when several builds exist
    found.sort(key=lambda w: w.filename, reverse=True)
    return found[0] if found else None


def cache_root() -> Path:
    base = os.environ.get("SPARK_IMAGES_CACHE")
    return Path(base) if base else Path.home() / ".cache" / "spark-images"


def _session() -> requests.Session:
    session = requests.Session()
    session.headers["User-Agent"] = "spark-images (cubin inspector)"
    return session


def resolve(requirement: str, *, index: str | None = None, arch: str = "aarch64") -> WheelFile:
    """`name==version` -> the wheel file; UsageError / EnvironmentProblem otherwise."""
    parsed = parse_requirement(requirement)
    if parsed is None:
        raise UsageError(f"{requirement}: not a requirement of the form NAME==VERSION")
    name, version = parsed
    base = (index or index_url()).rstrip("/")
    url = f"{base}/{normalize(name)}/"
    try:
        resp = _session().get(url, headers={"Accept": SIMPLE_JSON}, timeout=TIMEOUT)
    except requests.RequestException as exc:
        raise EnvironmentProblem(f"{requirement}: cannot reach {url} ({exc.__class__.__name__})") from exc
    if resp.status_code == 404:
        raise UsageError(f"{requirement}: no project {name!r} on {base}")
    if resp.status_code != 200:
        raise EnvironmentProblem(f"{requirement}: {url} answered HTTP {resp.status_code}")
    try:
        files = resp.json()["files"]
        if not isinstance(files, list):
            raise TypeError("files is not a list")
    except (ValueError, KeyError, TypeError) as exc:
        raise EnvironmentProblem(f"{requirement}: {url} did not answer simple-API JSON") from exc
    wheel = pick_wheel(files, name, version, arch)
    if wheel is None:
        raise UsageError(
            f"{requirement}: no linux {arch} wheel of version {version} on {base} "
            "(check the version; source-only releases cannot be inspected)"
        )
    return wheel


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
    """Download into the cache, verifying size and sha256; returns the path."""
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
            try:
                with _session().get(wheel.url, stream=True, timeout=TIMEOUT) as resp:
                    if resp.status_code != 200:
                        raise EnvironmentProblem(f"{wheel.url}: HTTP {resp.status_code}")
                    for chunk in resp.iter_content(1 << 20):
                        out.write(chunk)
                        digest.update(chunk)
                        got += len(chunk)
                        if progress:
                            progress(got, wheel.size)
            except requests.RequestException as exc:
                raise EnvironmentProblem(f"{wheel.filename}: download failed ({exc.__class__.__name__})") from exc
        if got != wheel.size:
            raise EnvironmentProblem(f"{wheel.filename}: got {got} bytes, the index says {wheel.size}")
        if digest.hexdigest() != wheel.sha256:
            raise EnvironmentProblem(f"{wheel.filename}: sha256 mismatch (download corrupted or index changed)")
        os.replace(tmp, path)
        atomic.write_text(path.with_name(path.name + ".sha256"), wheel.sha256 + "\n")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


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

    def _fetch(self, start: int, end: int) -> bytes:
        header = {"Range": f"bytes={start}-{end - 1}"}
        for attempt in range(self.retries + 1):
            try:
                resp = self.http.get(self.url, headers=header, timeout=TIMEOUT)
            except requests.RequestException as exc:
                if attempt == self.retries:
                    raise OSError(f"range read of {self.url} failed ({exc.__class__.__name__})") from exc
                time.sleep(0.5 * 2**attempt)
                continue
            if resp.status_code >= 500 and attempt < self.retries:
                time.sleep(0.5 * 2**attempt)
                continue
            if resp.status_code != 206:
                raise OSError(f"range read of {self.url}: HTTP {resp.status_code}, expected 206")
            total = resp.headers.get("Content-Range", "").rpartition("/")[2]
            if total != str(self.size):
                raise OSError(f"{self.url}: server size {total!r} differs from the declared {self.size}")
            if len(resp.content) != end - start:
                raise OSError(f"{self.url}: short range answer ({len(resp.content)} of {end - start} bytes)")
            self.bytes_fetched += len(resp.content)
            return resp.content
        raise OSError(f"range read of {self.url} failed")

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

"""vLLM's releases on PyPI: the version list and each release's commit.

PyPI is the authoritative list of releases (a clone's tags are only a cache
of their commits). Each release sdist records its commit in
`vllm/_version.py`; it is read from the .tar.gz stream (one member, the
download stops there). Every read goes through the one PyPI client
(`pypi.project_index`, `pypi.stream`, over `registry.http`: a size cap and an
overall deadline), since an index can be hostile or slow. A file on PyPI can
never be replaced, so what its sdist says is cached per version and index for
good: the commit, that it records none, or that it has no `vllm/_version.py`
(the sdists before ~0.2 have none; were that not kept, every run would spend
its lookups on them again). The version list is cached for an hour. Cache:
$XDG_CACHE_HOME/spark-images/pypi/ (next to the history clone). The PyPI
client (and `requests` with it) is imported only when the index is asked.
"""

from __future__ import annotations

import calendar
import contextlib
import hashlib
import io
import json
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

from spark_images import defaults
from spark_images.audit._problems import problem
from spark_images.audit.releases import parse_version_file
from spark_images.core import atomic
from spark_images.core.errors import EnvironmentProblem, SparkImagesError, UsageError

LIST_LIMIT = 16 * 1024 * 1024  # vllm's page is ~130 KB
SDIST_LIMIT = 512 * 1024 * 1024  # vLLM sdists are 9-60 MB; a stream past this is refused
VERSION_FILE_LIMIT = 64 * 1024
LIST_MAX_AGE_S = 3600.0
LOOKUPS_PER_RUN = 8  # sdists read per run; the rest stay unchecked (and are read on later runs)


class NoVersionFile(UsageError):
    """The sdist has no `vllm/_version.py`: a fact about an immutable file, cached for good."""

    @staticmethod
    def words(version: str) -> str:
        return f"vllm-{version}.tar.gz has no vllm/_version.py"


class _ChunkFile(io.RawIOBase):
    """A bounded body iterator (`pypi.stream`) as a file for tarfile."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        super().__init__()
        self._chunks = chunks
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._buf:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._buf = chunk
        n = min(len(buffer), len(self._buf))
        buffer[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


def _renamed(exc: SparkImagesError) -> SparkImagesError:
    """The PyPI client's error with each line split into the audit's `WHERE: message` problems."""
    lines = [p if p.file else problem(p.message, p.fix) for p in exc.problems]
    return type(exc)(*lines)


def fetch_project(base: str) -> dict[str, Any]:
    """The PEP 691 JSON page of `vllm` on the index at `base`, through the one PyPI client
    (`pypi.project_index`: a size cap, an overall deadline, 429 retries, strict JSON)."""
    from spark_images import pypi

    try:
        return pypi.project_index("vllm", index=base)
    except SparkImagesError as exc:
        raise _renamed(exc) from None


def versions_of(doc: dict[str, Any]) -> list[str]:
    """The versions a PEP 691 page lists: its `versions` (PEP 700), else those of its files."""
    listed = doc.get("versions")
    if isinstance(listed, list):
        return [v for v in listed if isinstance(v, str) and 0 < len(v) <= 64]
    found: list[str] = []
    for entry in doc.get("files") or []:
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name.startswith("vllm-"):
            continue
        rest = name[len("vllm-"):]
        version = rest[: -len(".tar.gz")] if rest.endswith(".tar.gz") else rest.split("-")[0] if name.endswith(".whl") else ""
        if version and len(version) <= 64:
            found.append(version)
    return list(dict.fromkeys(found))


def sdist_urls(doc: dict[str, Any], page_url: str) -> dict[str, str]:
    """version -> absolute sdist URL (PEP 691 URLs may be relative to the page);
    a declared size rides along as `#size=N` so the download deadline can use it."""
    out: dict[str, str] = {}
    for entry in doc.get("files") or []:
        if not isinstance(entry, dict) or entry.get("yanked") not in (None, False, ""):
            continue
        name, url = entry.get("filename"), entry.get("url")
        if isinstance(name, str) and isinstance(url, str) and name.startswith("vllm-") and name.endswith(".tar.gz"):
            full = urljoin(page_url, url).split("#", 1)[0]
            size = entry.get("size")
            if isinstance(size, int) and not isinstance(size, bool) and 0 < size < 1 << 40:
                full += f"#size={size}"
            if urlsplit(full).scheme in ("http", "https") and len(full) <= 2000:
                out[name[len("vllm-"): -len(".tar.gz")]] = full
    return out


def read_sdist_commit(url: str, version: str) -> str | None:
    """The commit recorded in the sdist's `vllm/_version.py`; None when it records none.

    Streamed through the one PyPI client (`pypi.stream`), which stops at the
    size the index declares (or SDIST_LIMIT when it declares none) within a
    deadline that grows with that size; the download stops at the member."""
    from spark_images import pypi
    from spark_images.registry.http import short_url

    bare, _, frag = url.partition("#size=")
    if urlsplit(bare).scheme not in ("http", "https"):
        raise EnvironmentProblem(problem(f"{bare[:200]}: not an http(s) URL"))
    size = min(int(frag), SDIST_LIMIT) if frag.isdigit() else None  # a declared size bounds the stream
    where = f"vllm-{version}.tar.gz from {short_url(bare)}"
    chunks = pypi.stream(bare, size=size) if size is not None else pypi.stream(bare, cap=SDIST_LIMIT)
    text = None
    try:
        body = _ChunkFile(chunks)
        with tarfile.open(fileobj=io.BufferedReader(body), mode="r|gz") as archive:
            for member in archive:
                if member.isfile() and member.name.endswith("/vllm/_version.py") and member.name.count("/") == 2:
                    if member.size > VERSION_FILE_LIMIT:
                        raise EnvironmentProblem(problem(f"{where}: vllm/_version.py is {member.size} bytes"))
                    handle = archive.extractfile(member)
                    text = handle.read(VERSION_FILE_LIMIT).decode("utf-8", "replace") if handle else ""
                    break
    except EnvironmentProblem as exc:
        if any(p.file for p in exc.problems):
            raise
        message = exc.message
        raise EnvironmentProblem(problem(f"cannot read {where}: {message.removeprefix(short_url(bare) + ': ')}")) from None
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise EnvironmentProblem(problem(f"cannot read {where}: {exc.__class__.__name__}: {str(exc)[:200]}")) from None
    finally:
        chunks.close()  # ends the stream (and its connection) where the member was found
    if text is None:
        raise NoVersionFile(problem(NoVersionFile.words(version)))
    return parse_version_file(text)[1]


def upload_times(doc: dict[str, Any]) -> dict[str, int]:
    """version -> when its first file was uploaded (PEP 700 `upload-time`, seconds since
    the epoch); a version whose files carry no upload time is left out."""
    out: dict[str, int] = {}
    for entry in doc.get("files") or []:
        if not isinstance(entry, dict):
            continue
        name, stamp = entry.get("filename"), entry.get("upload-time")
        if not (isinstance(name, str) and name.startswith("vllm-") and isinstance(stamp, str)):
            continue
        rest = name[len("vllm-"):]
        version = rest[: -len(".tar.gz")] if rest.endswith(".tar.gz") else rest.split("-")[0] if name.endswith(".whl") else ""
        when = _timestamp(stamp)
        if version and when is not None:
            out[version] = min(when, out.get(version, when))
    return out


def _timestamp(stamp: str) -> int | None:
    """`2026-05-28T07:30:26.123456Z` (PEP 700's ISO 8601 in UTC) as seconds since the epoch."""
    head = stamp[:19]
    try:
        parsed = time.strptime(head, "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return None
    tail = stamp[19:]
    if tail and not (tail.endswith("Z") or tail.endswith("+00:00")):
        return None
    return calendar.timegm(parsed)


# -- the catalog: versions + cached commits ----------------------------------------
def _cache_file(base: str) -> Path:
    from spark_images.audit.git import cache_root

    return cache_root() / "pypi" / f"vllm-{hashlib.sha256(base.encode()).hexdigest()[:16]}.json"


def _read_cache(path: Path) -> dict[str, Any]:
    from spark_images.core.inputs import load_json

    try:
        doc = load_json(path, what="release cache", limit=LIST_LIMIT)
    except SparkImagesError:
        return {}  # missing or damaged: it is only a cache
    return doc if isinstance(doc, dict) else {}


def _strings(value: object) -> set[str]:
    """The strings of a cached JSON list (anything else in a damaged cache is dropped)."""
    return {v for v in value if isinstance(v, str)} if isinstance(value, list) else set()


@dataclass
class Catalog:
    """PyPI's vLLM releases. `versions` is None when the index could not be asked (`why`)."""

    base: str
    versions: list[str] | None
    why: str = ""
    urls: dict[str, str] = field(default_factory=dict)
    commits: dict[str, str | None] = field(default_factory=dict)
    uploaded: dict[str, int] = field(default_factory=dict)  # version -> first upload (epoch seconds)
    no_version_file: set[str] = field(default_factory=set)  # versions whose sdist has no vllm/_version.py
    lookups: int = 0
    _dirty: bool = False

    def commit(self, version: str) -> tuple[str | None, str]:
        """(commit prefix, why none) of a release, from the cache or its sdist."""
        if version in self.no_version_file:
            return None, NoVersionFile.words(version)
        if version in self.commits:
            found = self.commits[version]
            return found, "" if found else f"vllm-{version}.tar.gz records no commit"
        url = self.urls.get(version)
        if url is None:
            return None, f"no sdist vllm-{version}.tar.gz on {self.base}"
        if self.lookups >= LOOKUPS_PER_RUN:
            return None, f"not looked up in this run (at most {LOOKUPS_PER_RUN} sdists are read per run)"
        self.lookups += 1
        try:
            found = read_sdist_commit(url, version)
        except SparkImagesError as exc:
            if isinstance(exc, NoVersionFile):  # kept; a failure of the index or the network is asked again
                self.no_version_file.add(version)
                self._dirty = True
            return None, exc.message
        self.commits[version] = found
        self._dirty = True
        return found, "" if found else f"vllm-{version}.tar.gz records no commit"

    def save(self) -> None:
        if not self._dirty or self.versions is None:
            return
        path = _cache_file(self.base)
        doc = _read_cache(path)
        known = _strings(doc.get("no_version_file"))
        doc.update({"index": self.base, "versions": self.versions, "urls": self.urls, "uploaded": self.uploaded,
                    "commits": {**(doc.get("commits") or {}), **{k: v or "" for k, v in self.commits.items()}},
                    "no_version_file": sorted(known | self.no_version_file)})
        doc.setdefault("listed_at", time.time())
        with contextlib.suppress(OSError):  # a cache that cannot be written only costs a lookup next time
            atomic.write_text(path, json.dumps(doc, sort_keys=True))
        self._dirty = False


def load_catalog(base: str | None = None, *, max_age_s: float = LIST_MAX_AGE_S) -> Catalog:
    """The release list (cached for `max_age_s`) and the cached commits; never raises."""
    base = (base or defaults.pypi_simple()).rstrip("/")
    path = _cache_file(base)
    cached = _read_cache(path)
    commits = {str(k): (v if isinstance(v, str) and v else None) for k, v in (cached.get("commits") or {}).items()}
    unrecorded = _strings(cached.get("no_version_file"))
    listed_at = cached.get("listed_at")
    fresh = isinstance(listed_at, (int, float)) and time.time() - listed_at < max_age_s
    if fresh and isinstance(cached.get("versions"), list) and isinstance(cached.get("urls"), dict):
        uploaded = {str(k): int(v) for k, v in (cached.get("uploaded") or {}).items() if isinstance(v, int)}
        return Catalog(base, [str(v) for v in cached["versions"]], urls=dict(cached["urls"]), commits=commits,
                       uploaded=uploaded, no_version_file=unrecorded)
    try:
        doc = fetch_project(base)
    except SparkImagesError as exc:
        why = exc.message
        where = exc.problems[0].file if exc.problems else base
        return Catalog(base, None, why=f"{where}: {why}", commits=commits, no_version_file=unrecorded)
    catalog = Catalog(base, versions_of(doc), urls=sdist_urls(doc, f"{base}/vllm/"), commits=commits,
                      uploaded=upload_times(doc), no_version_file=unrecorded)
    catalog._dirty = True
    path_doc = {"index": base, "listed_at": time.time(), "versions": catalog.versions, "urls": catalog.urls,
                "uploaded": catalog.uploaded,
                "commits": {k: v or "" for k, v in commits.items()}, "no_version_file": sorted(unrecorded)}
    with contextlib.suppress(OSError):
        atomic.write_text(path, json.dumps(path_doc, sort_keys=True))
    catalog._dirty = False
    return catalog


def sdist_commit(version: str) -> str:
    """Commit (hex prefix) of vLLM `version`, from its sdist on the package index (cached)."""
    base = defaults.pypi_simple()
    try:
        doc = fetch_project(base)
    except (EnvironmentProblem, UsageError) as exc:  # UsageError: the index has no `vllm` project
        why = exc.message
        raise EnvironmentProblem(problem(f"cannot reach the package index {base} to resolve vLLM {version}: {why}")) from None
    url = sdist_urls(doc, f"{base}/vllm/").get(version)
    if url is None:
        raise UsageError(problem(f"vLLM {version}: no release tag in the history and no sdist vllm-{version}.tar.gz on {base}"))
    cached = _read_cache(_cache_file(base)).get("commits") or {}
    hit = cached.get(version)
    commit = hit if isinstance(hit, str) and hit else read_sdist_commit(url, version)
    if commit is None:
        raise UsageError(
            problem(
                f"vllm-{version}.tar.gz: vllm/_version.py records no commit (built before setuptools-scm wrote "
                "__commit_id__)",
                "give the commit SHA instead",
            )
        )
    return commit

"""OCI distribution API client: auth, manifests, blobs (the documents: `registry.manifests`).

`RegistryClient(host, repository)` speaks plain HTTP to loopback hosts
(127.0.0.1, localhost, ::1) and HTTPS to every other host. `request()` is
the public shared layer (anonymous bearer-token flow from `WWW-Authenticate`,
retries with backoff on 5xx, connection errors and timeouts, 429/503 after
their Retry-After) that the push
side (`registry.push`, `registry.tags`) builds its uploads on; manifest
writes and digest lookups (`put_manifest`, `manifest_digest`) live here so
both share them. Blobs are streamed in chunks and their sha256 is checked
against the digest when the stream ends, so memory stays bounded whatever
the layer size. Every read goes through `registry.http`: a size cap
(manifests, tokens) and one overall deadline per call, so neither an endless
body nor a server that drips one byte a second can hold the command.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import requests

from spark_images import defaults
from spark_images.core.inputs import loads_json
from spark_images.registry import http
from spark_images.registry.manifests import (
    ACCEPT,
    INDEX_TYPES,
    MANIFEST_TYPES,
    Descriptor,
    ImageManifest,
    RegistryError,
    index_problems,
    media_type_problem,
    pick_platform,
)
from spark_images.registry.reference import ImageReference, is_loopback

TIMEOUT = (10, 60)  # connect, read between bytes; the overall deadline is registry.http's
CHUNK = 1 << 20


def parse_reference(text: str) -> ImageReference:
    """`HOST/REPO:TAG` or `HOST/REPO@sha256:HEX` (tag defaults to latest); pure."""
    return ImageReference.parse(text)


def _parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, rest = header[:8192].strip().partition(" ")
    params = dict(re.findall(r'(\w+)="([^"]*)"', rest))
    return scheme.lower(), params


# RFC 6750 b64token, plus the dots of a JWT: anything else cannot go in a header
_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


_STATUS_WORDS = {  # (what, fix) for an answer the call did not expect
    401: ("not authorized", f"a private repository? set {defaults.Env.REGISTRY_USER}/PASSWORD"),
    403: ("forbidden", "check the credentials' rights on this repository"),
    404: ("not found", "check the repository name, tag or digest"),
    429: ("too many requests", "try again later"),
}


class RegistryClient:
    """One repository on one registry; every HTTP call goes through `request`."""

    def __init__(
        self,
        host: str,
        repository: str,
        *,
        insecure_http: bool | None = None,
        retries: int = 4,
        backoff: float = 0.5,
        timeout: tuple[float, float] = TIMEOUT,
        session: requests.Session | None = None,
    ) -> None:
        self.host = host
        self.repository = repository
        self.insecure_http = is_loopback(host) if insecure_http is None else insecure_http
        self.scheme = "http" if self.insecure_http else "https"
        self.retries = retries
        self.backoff = backoff
        self.timeout = timeout
        self.http = session or requests.Session()
        self.http.headers.setdefault("User-Agent", "spark-images")
        self._token: str | None = None
        self._basic: tuple[str, str] | None = None
        self._basic = defaults.registry_credentials()

    @classmethod
    def for_reference(cls, ref: ImageReference, **kwargs: Any) -> RegistryClient:
        return cls(ref.host, ref.repository, **kwargs)

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://{self.host}/v2/{self.repository}"

    def _where(self, path: str) -> str:
        what = path.lstrip("/") if not path.startswith("http") else path
        return f"{self.host}/{self.repository}" + (f" ({what})" if what else "")

    def _fetch_token(self, params: dict[str, str], actions: str, deadline: http.Deadline) -> None:
        realm = params.get("realm")
        if not realm:
            raise RegistryError(f"{self.host}: bearer challenge without a realm")
        if not realm.startswith(("https://", "http://")):
            raise RegistryError(f"{self.host}: bearer challenge realm {http.short_url(realm)!r} is not an http(s) URL")
        query = {"service": params.get("service", ""), "scope": f"repository:{self.repository}:{actions}"}
        url = http.short_url(realm)
        where = f"{self.host}: token endpoint"

        def problem(failure: http.Failure) -> RegistryError:
            return RegistryError(f"{where} {failure.line()}")

        with http.mapped(realm, problem):
            resp = http.send(self.http, "GET", realm, deadline=deadline, params=query, auth=self._basic,
                             timeout=deadline.timeout(*self.timeout))  # fmt: skip
        if resp.status_code != 200:
            resp.close()
            raise RegistryError(
                f"{where} answered HTTP {resp.status_code} at {url} "
                f"(fix: a private repository? set {defaults.Env.REGISTRY_USER}/PASSWORD)"
            )
        with http.mapped(realm, problem, reading=True):
            body = http.read_body(resp, deadline=deadline, url=realm, cap=http.TOKEN_CAP)
        try:
            doc = loads_json(body.decode("utf-8"), file=f"{where} {url}", what="token answer", error=RegistryError)
        except UnicodeDecodeError:
            raise RegistryError(f"{where} did not answer JSON (not UTF-8) at {url}") from None
        token = (doc.get("token") or doc.get("access_token")) if isinstance(doc, dict) else None
        if not isinstance(token, str) or not token:
            raise RegistryError(f"{where} answered no token at {url}")
        if _TOKEN.fullmatch(token) is None:
            raise RegistryError(f"{where} {url} answered a token with characters an HTTP header cannot carry")
        self._token = token

    def request(
        self,
        method: str,
        path: str,
        *,
        headers: dict[str, str] | None = None,
        stream: bool = False,
        data: Any = None,
        params: dict[str, str] | None = None,
        actions: str = "pull",
        ok: tuple[int, ...] = (200,),
        deadline: http.Deadline | None = None,
        cap: int = http.MANIFEST_CAP,
    ) -> requests.Response:
        """One API call relative to /v2/REPO (or an absolute URL), with auth and retries.

        Public: the push and tag modules build their calls on it. Answers 401 once
        per call by fetching an anonymous (or SPARK_IMAGES_REGISTRY_USER) bearer token
        for `actions`; retries 5xx, connection errors and timeouts with exponential
        backoff and 429/503 after their Retry-After, all within one overall
        deadline (`deadline`, else the metadata deadline); raises RegistryError for
        any status not in `ok`. Without `stream` the body is read here, at most
        `cap` bytes, so `resp.content` is bounded; with it the caller reads the
        body through `http.iter_body`. A `data` that is not bytes or str (a
        stream) cannot be sent twice, so such a call is tried once: the caller
        retries with a fresh stream (and upload session).
        """
        url = path if path.startswith(("http://", "https://")) else self.base_url + path
        where = self._where(path)
        deadline = deadline or http.Deadline(http.meta_deadline_s())
        retries = self.retries if data is None or isinstance(data, bytes | str) else 0
        authed = False
        attempt = 0

        def problem(failure: http.Failure) -> RegistryError:
            return RegistryError(f"{where}: {failure.detail()}")

        while True:
            hdrs = dict(headers or {})
            if self._token:
                hdrs["Authorization"] = f"Bearer {self._token}"
            try:
                resp = http.send(self.http, method, url, deadline=deadline, headers=hdrs, data=data, params=params,
                                 timeout=deadline.timeout(*self.timeout),
                                 auth=self._basic if not self._token else None, allow_redirects=True)  # fmt: skip
            except http.TRANSPORT_ERRORS as exc:
                failure = http.failure(exc, url)
                if not failure.transient or isinstance(exc, http.HttpProblem):
                    raise problem(failure) from None
                if attempt < retries and deadline.left() > self.backoff * 2**attempt:
                    time.sleep(self.backoff * 2**attempt)
                    attempt += 1
                    continue
                raise RegistryError(f"{where}: no answer after {attempt + 1} tries: {failure.detail()}") from None
            if resp.status_code == 401 and not authed:
                challenge = resp.headers.get("WWW-Authenticate", "")
                resp.close()
                scheme, params_ = _parse_challenge(challenge)
                if scheme == "bearer":
                    self._fetch_token(params_, actions, deadline)
                    authed = True
                    continue
                raise RegistryError(
                    f"{where}: registry asks for {scheme[:40] or 'unknown'} authentication "
                    "(set SPARK_IMAGES_REGISTRY_USER/PASSWORD)"
                )
            if resp.status_code in http.RETRY_STATUSES and resp.status_code not in ok and attempt < retries:
                with http.mapped(url, problem):
                    http.wait_to_retry(resp, deadline, attempt, self.backoff, url)
                attempt += 1
                continue
            if resp.status_code >= 500 and resp.status_code not in ok and attempt < retries:
                resp.close()
                if deadline.left() <= self.backoff * 2**attempt:
                    raise RegistryError(f"{where}: HTTP {resp.status_code} after {attempt + 1} tries (deadline)")
                time.sleep(self.backoff * 2**attempt)
                attempt += 1
                continue
            if resp.status_code not in ok:
                status = resp.status_code
                resp.close()
                hint, fix = _STATUS_WORDS.get(status, ("", ""))
                raise problem(http.status_failure(url, status, hint, fix))
            if not stream:
                try:
                    with http.mapped(url, problem, reading=True):
                        body = b"" if method == "HEAD" else http.read_body(resp, deadline=deadline, url=url, cap=cap)
                finally:
                    resp.close()
                resp._content = body  # what `resp.content` hands out: read once, within the cap
                resp._content_consumed = True
            return resp

    # --- manifests -------------------------------------------------------------------

    def get_manifest(self, reference: str) -> tuple[str, str, bytes]:
        """(media type, digest, raw body) of a manifest or index; digest verified, size capped."""
        path = f"/manifests/{reference}"
        resp = self.request("GET", path, headers={"Accept": ACCEPT})
        body = resp.content
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if reference.startswith("sha256:") and digest != reference:
            raise RegistryError(f"{self._where('')}: manifest {reference} has digest {digest}")
        doc = self._json(body, path)
        problem = media_type_problem(resp.headers.get("Content-Type", ""), doc.get("mediaType"))
        if problem:
            raise RegistryError(f"{self._where(path)}: {problem}")
        return resp.headers["Content-Type"].split(";", 1)[0].strip().lower(), digest, body

    def _json(self, body: bytes, path: str) -> dict[str, Any]:
        where = self._where(path)
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise RegistryError(f"{where}: answer is not UTF-8 JSON") from None
        doc = loads_json(text, file=where, what="answer", error=RegistryError)
        if not isinstance(doc, dict):
            raise RegistryError(f"{where}: answer is not a JSON object")
        return doc

    def image_manifest(self, reference: str, os_name: str = "linux", arch: str = "arm64") -> ImageManifest:
        """The os/arch image manifest for a tag or digest (through an index if there is one)."""
        media, digest, body = self.get_manifest(reference)
        doc = self._json(body, f"/manifests/{reference}")
        if media in INDEX_TYPES or "manifests" in doc:
            where = f"{self.host}/{self.repository}:{reference}"
            problems = index_problems(doc, where)
            if problems:
                raise RegistryError(*problems[:5])
            chosen = pick_platform(doc, os_name, arch)
            if chosen is None:
                raise RegistryError(f"{where}: the index has no {os_name}/{arch} image")
            desc = Descriptor.from_json(chosen, f"{where} index")
            media, digest, body = self.get_manifest(desc.digest)
            doc = self._json(body, f"/manifests/{desc.digest}")
        if media not in MANIFEST_TYPES and "layers" not in doc:
            raise RegistryError(f"{self.host}/{self.repository}:{reference}: unsupported manifest type {media[:80]!r}")
        where = f"{self.host}/{self.repository}@{digest}"
        config = Descriptor.from_json(doc.get("config"), where)
        layers_doc = doc.get("layers")
        if not isinstance(layers_doc, list):
            raise RegistryError(f"{where}: manifest has no layer list")
        layers = tuple(Descriptor.from_json(layer, where) for layer in layers_doc)
        return ImageManifest(digest=digest, media_type=media, config=config, layers=layers)

    def manifest_digest(self, reference: str) -> str | None:
        """The digest a tag or digest resolves to (HEAD), or None when there is no such manifest."""
        path = f"/manifests/{reference}"
        resp = self.request("HEAD", path, headers={"Accept": ACCEPT}, ok=(200, 404))
        if resp.status_code == 404:
            return None
        digest = resp.headers.get("Docker-Content-Digest", "")
        if not digest:
            raise RegistryError(f"{self._where(path)}: the registry sent no Docker-Content-Digest")
        return digest

    def put_manifest(self, reference: str, body: bytes, media_type: str, digest: str) -> None:
        """PUT a manifest's exact bytes under a tag or digest; the registry must keep `digest`."""
        path = f"/manifests/{reference}"
        resp = self.request(
            "PUT", path, data=body, headers={"Content-Type": media_type}, actions="pull,push", ok=(200, 201)
        )
        answered = resp.headers.get("Docker-Content-Digest")
        if answered and answered != digest:
            raise RegistryError(
                f"{self._where(path)}: the registry stored it as {answered}, not {digest}: it rewrote the manifest"
            )

    # --- blobs ---------------------------------------------------------------------

    def blob_chunks(
        self, desc: Descriptor, progress: Callable[[int], None] | None = None
    ) -> Iterator[bytes]:
        """The blob's bytes in chunks; stops past the declared size, checks sha256 at the end.

        A download that breaks off is resumed with a Range request (up to
        `retries` times); the digest covers the whole blob either way. The whole
        download, resumes included, has one deadline that grows with its size.
        """
        digest = hashlib.sha256()
        got = 0
        resumes = 0
        deadline = http.Deadline(http.download_deadline_s(desc.size))
        path = f"/blobs/{desc.digest}"
        where = f"{self._where(path)}"
        while True:
            headers = {"Range": f"bytes={got}-"} if got else None
            resp = self.request("GET", path, stream=True, headers=headers, ok=(200, 206), deadline=deadline)
            skip = got if (got and resp.status_code == 200) else 0  # server ignored the range
            try:
                for chunk in http.iter_body(resp, deadline=deadline, url=resp.url or path,
                                            cap=desc.size - got + skip, chunk=CHUNK):  # fmt: skip
                    if skip:
                        drop = min(skip, len(chunk))
                        chunk, skip = chunk[drop:], skip - drop
                        if not chunk:
                            continue
                    digest.update(chunk)
                    got += len(chunk)
                    if progress:
                        progress(len(chunk))
                    yield chunk
            except http.TooLarge:
                raise RegistryError(f"{where}: more than the declared {desc.size} bytes") from None
            except http.HttpProblem as exc:
                raise RegistryError(f"{where}: {http.failure(exc, path).detail()}") from None
            except requests.RequestException as exc:
                failure = http.failure(exc, path, reading=True)
                if resumes >= self.retries or deadline.expired():
                    raise RegistryError(f"{where}: download broke off {resumes + 1} times: {failure.detail()}") from None
                resumes += 1
                time.sleep(min(self.backoff * 2 ** (resumes - 1), max(0.0, deadline.left())))
                continue
            finally:
                resp.close()
            break
        if got != desc.size:
            raise RegistryError(f"{where}: got {got} bytes, the manifest says {desc.size}")
        if "sha256:" + digest.hexdigest() != desc.digest:
            raise RegistryError(f"{where}: content does not match its digest")

    def get_blob(self, desc: Descriptor, limit: int = 64 << 20) -> bytes:
        """A small blob (config) in memory, verified."""
        if desc.size > limit:
            raise RegistryError(f"blob {desc.digest} is {desc.size} bytes, over the {limit} in-memory limit")
        return b"".join(self.blob_chunks(desc))

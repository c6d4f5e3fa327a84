"""OCI distribution API client: auth, manifests, index selection, blobs.

`RegistryClient(host, repository)` speaks plain HTTP to loopback hosts
(127.0.0.1, localhost, ::1) and HTTPS to every other host. `request()` is
the public shared layer (anonymous bearer-token flow from `WWW-Authenticate`,
retries with backoff on 5xx, connection errors and timeouts) that the push
side (`registry.push`, `registry.tags`) builds its uploads on; manifest
writes and digest lookups (`put_manifest`, `manifest_digest`) live here so
both share them. Blobs are streamed in chunks and their sha256 is checked
against the digest when the stream ends, so memory stays bounded whatever
the layer size.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import requests

from spark_images.errors import EnvironmentProblem, UsageError

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
ACCEPT = ", ".join((*INDEX_TYPES, *MANIFEST_TYPES))
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
TIMEOUT = (10, 60)  # connect, read (between bytes)
CHUNK = 1 << 20
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_REPO = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")


class RegistryError(EnvironmentProblem):
    """The registry could not give what was asked (exit 2)."""


@dataclass(frozen=True)
class ImageRef:
    host: str
    repository: str
    reference: str  # a tag or a sha256 digest

    def __str__(self) -> str:
        sep = "@" if self.reference.startswith("sha256:") else ":"
        return f"{self.host}/{self.repository}{sep}{self.reference}"


def looks_like_reference(text: str) -> bool:
    """HOST/REPO[:TAG|@sha256:...] where HOST has a dot, a port, or is localhost."""
    host, sep, rest = text.partition("/")
    return bool(sep and rest) and ("." in host or ":" in host or host == "localhost")


def parse_reference(text: str) -> ImageRef:
    """`HOST/REPO:TAG` or `HOST/REPO@sha256:HEX` (tag defaults to latest); pure."""
    if not looks_like_reference(text):
        raise UsageError(f"{text}: not a registry reference (HOST/REPO:TAG or HOST/REPO@sha256:...)")
    host, _, rest = text.partition("/")
    if "@" in rest:
        repo, _, ref = rest.partition("@")
        repo = repo.rsplit(":", 1)[0] if ":" in repo.rsplit("/", 1)[-1] else repo
        if not _DIGEST.match(ref):
            raise UsageError(f"{text}: {ref!r} is not a sha256 digest (sha256: + 64 hex)")
    else:
        last = rest.rsplit("/", 1)[-1]
        repo, ref = (rest.rsplit(":", 1) if ":" in last else (rest, "latest"))
        if not _TAG.match(ref):
            raise UsageError(f"{text}: {ref!r} is not a valid tag")
    if not _REPO.match(repo):
        raise UsageError(f"{text}: {repo!r} is not a valid repository name")
    return ImageRef(host=host, repository=repo, reference=ref)


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int

    @classmethod
    def from_json(cls, doc: Any, where: str) -> Descriptor:
        if not isinstance(doc, dict):
            raise RegistryError(f"{where}: a descriptor is not an object")
        digest, size = doc.get("digest"), doc.get("size")
        if not isinstance(digest, str) or not _DIGEST.match(digest):
            raise RegistryError(f"{where}: descriptor digest {digest!r} is not sha256:<64 hex>")
        if not isinstance(size, int) or size < 0:
            raise RegistryError(f"{where}: descriptor size {size!r} is not a byte count")
        return cls(str(doc.get("mediaType", "")), digest, size)


@dataclass(frozen=True)
class ImageManifest:
    """One platform's image: its manifest digest, config and layers (bottom first)."""

    digest: str
    media_type: str
    config: Descriptor
    layers: tuple[Descriptor, ...]


def _is_attestation(desc: dict[str, Any]) -> bool:
    annotations = desc.get("annotations") or {}
    platform = desc.get("platform") or {}
    return (
        annotations.get("vnd.docker.reference.type") == "attestation-manifest"
        or (platform.get("os") == "unknown" and platform.get("architecture") == "unknown")
    )


def pick_platform(index: dict[str, Any], os_name: str = "linux", arch: str = "arm64") -> dict[str, Any] | None:
    """The index entry for os/arch (variant v8 or none), attestations skipped; pure."""
    candidates = []
    for desc in index.get("manifests") or []:
        if not isinstance(desc, dict) or _is_attestation(desc):
            continue
        platform = desc.get("platform") or {}
        if (
            platform.get("os") == os_name
            and platform.get("architecture") == arch
            and (arch != "arm64" or platform.get("variant") in (None, "", "v8"))
        ):
            candidates.append(desc)
    return candidates[0] if candidates else None


def is_loopback(host: str) -> bool:
    """HOST[:PORT] (IPv6 in brackets) names this machine: such registries speak plain HTTP."""
    hostname = host.split("]")[0] + "]" if host.startswith("[") else host.rsplit(":", 1)[0]
    return hostname in LOOPBACK


def _parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, rest = header.strip().partition(" ")
    params = dict(re.findall(r'(\w+)="([^"]*)"', rest))
    return scheme.lower(), params


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
        user = os.environ.get("SPARK_IMAGES_REGISTRY_USER")
        if user:
            self._basic = (user, os.environ.get("SPARK_IMAGES_REGISTRY_PASSWORD", ""))

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://{self.host}/v2/{self.repository}"

    def _where(self, path: str) -> str:
        what = path.lstrip("/") if not path.startswith("http") else path
        return f"{self.host}/{self.repository}" + (f" ({what})" if what else "")

    def _fetch_token(self, params: dict[str, str], actions: str) -> None:
        realm = params.get("realm")
        if not realm:
            raise RegistryError(f"{self.host}: bearer challenge without a realm")
        query = {"service": params.get("service", ""), "scope": f"repository:{self.repository}:{actions}"}
        try:
            resp = self.http.get(realm, params=query, auth=self._basic, timeout=self.timeout)
        except requests.RequestException as exc:
            raise RegistryError(f"{self.host}: token endpoint {realm} unreachable ({exc.__class__.__name__})") from exc
        if resp.status_code != 200:
            raise RegistryError(
                f"{self.host}: token endpoint answered HTTP {resp.status_code} "
                "(private repository? set SPARK_IMAGES_REGISTRY_USER/PASSWORD)"
            )
        try:
            doc = resp.json()
            token = doc.get("token") or doc.get("access_token")
        except (ValueError, AttributeError) as exc:
            raise RegistryError(f"{self.host}: token endpoint did not answer JSON") from exc
        if not isinstance(token, str) or not token:
            raise RegistryError(f"{self.host}: token endpoint answered no token")
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
    ) -> requests.Response:
        """One API call relative to /v2/REPO (or an absolute URL), with auth and retries.

        Public: the push and tag modules build their calls on it. Answers 401 once
        per call by fetching an anonymous (or SPARK_IMAGES_REGISTRY_USER) bearer token
        for `actions`; retries 5xx, connection errors and timeouts with exponential
        backoff; raises RegistryError for any status not in `ok`. A `data` that is
        not bytes or str (a stream) cannot be sent twice, so such a call is tried
        once: the caller retries with a fresh stream (and upload session).
        """
        url = path if path.startswith(("http://", "https://")) else self.base_url + path
        retries = self.retries if data is None or isinstance(data, bytes | str) else 0
        authed = False
        attempt = 0
        while True:
            hdrs = dict(headers or {})
            if self._token:
                hdrs["Authorization"] = f"Bearer {self._token}"
            try:
                resp = self.http.request(
                    method,
                    url,
                    headers=hdrs,
                    stream=stream,
                    data=data,
                    params=params,
                    timeout=self.timeout,
                    auth=self._basic if not self._token else None,
                    allow_redirects=True,
                )
            except (requests.ConnectionError, requests.Timeout) as exc:
                if attempt < retries:
                    time.sleep(self.backoff * 2**attempt)
                    attempt += 1
                    continue
                raise RegistryError(
                    f"{self._where(path)}: no answer after {attempt + 1} tries ({exc.__class__.__name__})"
                ) from exc
            except requests.RequestException as exc:
                raise RegistryError(f"{self._where(path)}: request failed ({exc.__class__.__name__})") from exc
            if resp.status_code == 401 and not authed:
                challenge = resp.headers.get("WWW-Authenticate", "")
                resp.close()
                scheme, params_ = _parse_challenge(challenge)
                if scheme == "bearer":
                    self._fetch_token(params_, actions)
                    authed = True
                    continue
                raise RegistryError(
                    f"{self._where(path)}: registry asks for {scheme or 'unknown'} authentication "
                    "(set SPARK_IMAGES_REGISTRY_USER/PASSWORD)"
                )
            if resp.status_code >= 500 and attempt < retries:
                resp.close()
                time.sleep(self.backoff * 2**attempt)
                attempt += 1
                continue
            if resp.status_code not in ok:
                status = resp.status_code
                resp.close()
                hint = {
                    401: "not authorized (private repository? set SPARK_IMAGES_REGISTRY_USER/PASSWORD)",
                    403: "forbidden",
                    404: "not found (check the repository name, tag or digest)",
                }.get(status, "")
                raise RegistryError(f"{self._where(path)}: HTTP {status}{' ' + hint if hint else ''}")
            return resp

    # --- manifests -------------------------------------------------------------------

    def get_manifest(self, reference: str) -> tuple[str, str, bytes]:
        """(media type, digest, raw body) of a manifest or index; digest verified."""
        resp = self.request("GET", f"/manifests/{reference}", headers={"Accept": ACCEPT})
        body = resp.content
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if reference.startswith("sha256:") and digest != reference:
            raise RegistryError(f"{self._where('')}: manifest {reference} has digest {digest}")
        media = resp.headers.get("Content-Type", "").split(";")[0].strip()
        try:
            doc = json.loads(body)
        except ValueError as exc:
            raise RegistryError(f"{self._where('/manifests/' + reference)}: answer is not JSON") from exc
        if not isinstance(doc, dict):
            raise RegistryError(f"{self._where('/manifests/' + reference)}: answer is not a JSON object")
        media = str(doc.get("mediaType") or media)
        return media, digest, body

    def image_manifest(self, reference: str, os_name: str = "linux", arch: str = "arm64") -> ImageManifest:
        """The os/arch image manifest for a tag or digest (through an index if there is one)."""
        media, digest, body = self.get_manifest(reference)
        doc = json.loads(body)
        if media in INDEX_TYPES or "manifests" in doc:
            chosen = pick_platform(doc, os_name, arch)
            if chosen is None:
                raise RegistryError(
                    f"{self.host}/{self.repository}:{reference}: the index has no {os_name}/{arch} image"
                )
            desc = Descriptor.from_json(chosen, f"{self.repository} index")
            media, digest, body = self.get_manifest(desc.digest)
            doc = json.loads(body)
        if media not in MANIFEST_TYPES and "layers" not in doc:
            raise RegistryError(f"{self.host}/{self.repository}:{reference}: unsupported manifest type {media!r}")
        where = f"{self.repository}@{digest}"
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
        """The blob's bytes in chunks; RegistryError at the end when size or sha256 differ.

        A download that breaks off is resumed with a Range request (up to
        `retries` times); the digest covers the whole blob either way.
        """
        digest = hashlib.sha256()
        got = 0
        resumes = 0
        while True:
            headers = {"Range": f"bytes={got}-"} if got else None
            resp = self.request("GET", f"/blobs/{desc.digest}", stream=True, headers=headers, ok=(200, 206))
            skip = got if (got and resp.status_code == 200) else 0  # server ignored the range
            try:
                for chunk in resp.iter_content(CHUNK):
                    if skip:
                        drop = min(skip, len(chunk))
                        chunk, skip = chunk[drop:], skip - drop
                        if not chunk:
                            continue
                    digest.update(chunk)
                    got += len(chunk)
                    if got > desc.size:
                        raise RegistryError(f"blob {desc.digest}: more than the declared {desc.size} bytes")
                    if progress:
                        progress(len(chunk))
                    yield chunk
            except requests.RequestException as exc:
                if resumes >= self.retries:
                    raise RegistryError(
                        f"blob {desc.digest}: download broke off {resumes + 1} times ({exc.__class__.__name__})"
                    ) from exc
                resumes += 1
                time.sleep(self.backoff * 2 ** (resumes - 1))
                continue
            finally:
                resp.close()
            break
        if got != desc.size:
            raise RegistryError(f"blob {desc.digest}: got {got} bytes, the manifest says {desc.size}")
        if "sha256:" + digest.hexdigest() != desc.digest:
            raise RegistryError(f"blob {desc.digest}: content does not match its digest")

    def get_blob(self, desc: Descriptor, limit: int = 64 << 20) -> bytes:
        """A small blob (config) in memory, verified."""
        if desc.size > limit:
            raise RegistryError(f"blob {desc.digest} is {desc.size} bytes, over the {limit} in-memory limit")
        return b"".join(self.blob_chunks(desc))

"""Push an OCI image archive to a registry, byte for byte (OCI distribution API).

The archive's manifest is uploaded exactly as written, so the registry's
digest is the build's digest: blobs go up with `POST /v2/NAME/blobs/uploads/`
then `PUT LOCATION?digest=` (skipped when `HEAD` finds them), and the
manifest with `PUT /v2/NAME/manifests/<digest>` (and once per tag). The
digest the registry answers with (`Docker-Content-Digest`) is checked.

Requests go through `registry.client.RegistryClient` (plain HTTP to
loopback registries, HTTPS elsewhere, bearer tokens for `pull,push`,
retries); the registry's own answers, not ours, decide success.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import IO, Any, Protocol

import requests

from spark_images.core.errors import EnvironmentProblem, UsageError
from spark_images.registry import http
from spark_images.registry.client import RegistryClient
from spark_images.registry.manifests import INDEX_TYPES, MANIFEST_TYPES, RegistryError
from spark_images.registry.reference import ImageReference

UPLOAD_TRIES = 3

Progress = Callable[[str], None]


class OciArchive(Protocol):
    """What a push reads of an OCI archive (readers.images.ImageArchive, the one reader, is
    one: the caller opens it, so the registry room never imports the readers)."""

    where: str

    def index(self) -> Any: ...

    def document(self, digest: str) -> bytes: ...

    def blob(self, digest: str) -> tuple[IO[bytes], int]: ...


@dataclass(frozen=True)
class PushResult:
    repository: str
    digest: str
    tags: tuple[str, ...]
    uploaded: tuple[str, ...]
    present: tuple[str, ...]

    @property
    def reference(self) -> str:
        return f"{self.repository}@{self.digest}"


def _manifest_descriptor(index: dict[str, Any], digest: str | None) -> dict[str, Any]:
    manifests = [m for m in index.get("manifests", []) if isinstance(m, dict)]
    if digest is not None:
        manifests = [m for m in manifests if m.get("digest") == digest]
    if len(manifests) != 1:
        raise UsageError(
            f"the OCI archive's index.json names {len(manifests)} matching manifests; expected one"
        )
    return manifests[0]


def _client(repo: ImageReference, session: requests.Session | None) -> RegistryClient:
    return RegistryClient(repo.host, repo.repository, session=session)


def _upload_blob(c: RegistryClient, digest: str, open_blob: Callable[[], tuple[IO[bytes], int]]) -> bool:
    """Upload one blob unless present; True when it was uploaded.

    The body is a stream out of the archive, which cannot be replayed: a
    failed PUT is retried here with a fresh stream and a fresh upload session.
    """
    if c.request("HEAD", f"/blobs/{digest}", actions="pull,push", ok=(200, 404)).status_code == 200:
        return False
    for attempt in range(UPLOAD_TRIES):
        start = c.request("POST", "/blobs/uploads/", actions="pull,push", ok=(201, 202))
        location = start.headers.get("Location", "")
        if not location:
            raise EnvironmentProblem(f"registry {c.host} gave no upload location for {digest}")
        if location.startswith("/"):
            location = f"{c.scheme}://{c.host}{location}"
        sep = "&" if "?" in location else "?"
        data, size = open_blob()
        try:
            c.request(
                "PUT",
                f"{location}{sep}digest={digest}",
                data=data,
                headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
                actions="pull,push",
                ok=(201, 204),
                deadline=http.Deadline(http.download_deadline_s(size)),
            )
            return True
        except RegistryError:
            if attempt + 1 == UPLOAD_TRIES:
                raise
        finally:
            data.close()
    return True


def _blob_digests(manifest: dict[str, Any]) -> Iterable[str]:
    yield str(manifest["config"]["digest"])
    for layer in manifest.get("layers", []):
        yield str(layer["digest"])


def push_oci_archive(
    oci: OciArchive,
    target: ImageReference,
    tags: Iterable[str] = (),
    digest: str | None = None,
    on_progress: Progress | None = None,
    session: requests.Session | None = None,
) -> PushResult:
    """Upload the single manifest of an OCI archive (or the one `digest` names)."""
    say = on_progress or (lambda _line: None)
    c = _client(target, session)
    archive = oci.where
    index = oci.index()
    if not isinstance(index, dict):
        raise UsageError(f"{archive}: index.json is not a JSON object")
    desc = _manifest_descriptor(index, digest)
    want = str(desc["digest"])
    body = oci.document(want)
    media_type = str(desc.get("mediaType") or json.loads(body).get("mediaType", ""))
    if media_type in INDEX_TYPES:
        raise UsageError(f"{archive}: {want} is an index; push a single-platform build")
    if media_type not in MANIFEST_TYPES:
        raise UsageError(f"{archive}: {want} has unknown media type {media_type!r}")
    manifest = json.loads(body)
    uploaded: list[str] = []
    present: list[str] = []
    for blob in _blob_digests(manifest):
        if _upload_blob(c, blob, functools.partial(oci.blob, blob)):
            uploaded.append(blob)
            say(f"pushed blob {blob}")
        else:
            present.append(blob)
    tag_list = tuple(tags)
    for ref in (want, *tag_list):
        c.put_manifest(ref, body, media_type, want)
    say(f"pushed {target}@{want}")
    return PushResult(str(target), want, tag_list, tuple(uploaded), tuple(present))


def registry_digest(target: ImageReference, ref: str, session: requests.Session | None = None) -> str:
    """The digest the registry reports for a tag or digest (HEAD on the manifest)."""
    digest = _client(target, session).manifest_digest(ref)
    if digest is None:
        raise RegistryError(f"{target}: the registry has no manifest {ref}")
    return digest

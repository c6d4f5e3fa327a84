"""Point a tag at a manifest that is already in the registry (OCI distribution API).

Promotion never rebuilds and never re-encodes: the manifest is fetched by
digest with its exact bytes and media type, checked against the digest, and
PUT under the new tag, so the tag resolves to the very same digest. The
registry's answer (`Docker-Content-Digest`) is checked too.

HTTP goes through `RegistryClient.request` (registry.client): bearer-token
challenges, retries with backoff, plain HTTP for loopback hosts (or with
`insecure_http`), one-line errors.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import requests

from spark_images.core.errors import EnvironmentProblem, Finding
from spark_images.registry.client import RegistryClient
from spark_images.registry.manifests import ACCEPT, media_type_problem


@dataclass(frozen=True)
class Manifest:
    """A manifest exactly as the registry stores it."""

    digest: str
    media_type: str
    body: bytes


class TagClient:
    """Manifest reads and tag writes on one repository, sharing one token."""

    def __init__(
        self,
        host: str,
        name: str,
        *,
        insecure_http: bool | None = None,
        session: requests.Session | None = None,
    ) -> None:
        self.client = RegistryClient(host, name, insecure_http=insecure_http, session=session)
        self.where = f"{host}/{name}"

    def get_manifest(self, digest: str) -> Manifest:
        """GET the manifest by digest; Finding when the registry does not have it."""
        resp = self.client.request("GET", f"/manifests/{digest}", headers={"Accept": ACCEPT}, ok=(200, 404))
        if resp.status_code == 404:
            raise Finding(f"{self.where}@{digest}: the registry has no such manifest (fix: push the candidate first)")
        body = resp.content
        actual = "sha256:" + hashlib.sha256(body).hexdigest()
        if actual != digest:
            raise EnvironmentProblem(f"{self.where}@{digest}: the registry answered a manifest whose digest is {actual}")
        try:
            declared = json.loads(body).get("mediaType")
        except (ValueError, AttributeError):
            raise EnvironmentProblem(f"{self.where}@{digest}: the manifest is not a JSON object") from None
        problem = media_type_problem(resp.headers.get("Content-Type", ""), declared)
        if problem:
            raise EnvironmentProblem(f"{self.where}@{digest}: {problem}")
        media_type = resp.headers["Content-Type"].split(";", 1)[0].strip().lower()
        return Manifest(digest=digest, media_type=media_type, body=body)

    def tag_digest(self, tag: str) -> str | None:
        """The digest `tag` resolves to now, or None when the tag does not exist."""
        return self.client.manifest_digest(tag)

    def put_tag(self, tag: str, manifest: Manifest) -> None:
        """PUT the manifest's exact bytes under `tag`; the registry must keep the digest."""
        self.client.put_manifest(tag, manifest.body, manifest.media_type, manifest.digest)

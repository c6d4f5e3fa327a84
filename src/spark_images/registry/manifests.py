"""The OCI image documents, as plain data: media types, descriptors, index selection (pure).

What a registry and an image archive on disk share: both hold an index (or
a single manifest) whose linux/arm64 entry names the config and the layers.
`registry.client` fetches these documents; `readers.images` reads them from
an archive; neither parses them its own way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spark_images.core.errors import EnvironmentProblem
from spark_images.registry.reference import is_digest

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
ACCEPT = ", ".join((*INDEX_TYPES, *MANIFEST_TYPES))


def media_type_problem(content_type: str, declared: object) -> str | None:
    """Why a manifest answer is not one we asked for, or None.

    The registry's Content-Type must be one of the types of ACCEPT (a manifest served as
    text/plain, or HTML, is not a manifest whatever its body says), and a body that declares
    its mediaType must declare the same one.
    """
    served = content_type.split(";", 1)[0].strip().lower()
    if served not in (*INDEX_TYPES, *MANIFEST_TYPES):
        return f"answered Content-Type {served[:80]!r}, not a manifest or index type ({ACCEPT})"
    if declared not in (None, "") and declared != served:
        return f"answered Content-Type {served!r} for a manifest that declares mediaType {str(declared)[:80]!r}"
    return None

class RegistryError(EnvironmentProblem):
    """The registry could not give what was asked (exit 2)."""



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
        if not isinstance(digest, str) or not is_digest(digest):
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


def is_attestation(desc: dict[str, Any]) -> bool:
    annotations = desc.get("annotations")
    platform = desc.get("platform")
    annotations = annotations if isinstance(annotations, dict) else {}
    platform = platform if isinstance(platform, dict) else {}
    return (
        annotations.get("vnd.docker.reference.type") == "attestation-manifest"
        or (platform.get("os") == "unknown" and platform.get("architecture") == "unknown")
    )


def index_problems(index: dict[str, Any], where: str) -> list[str]:
    """Why an index cannot be read (shape, not content); empty when it can. Pure."""
    manifests = index.get("manifests")
    if not isinstance(manifests, list):
        return [f"{where}: the index's `manifests` is not a list"]
    lines = []
    for n, desc in enumerate(manifests):
        if not isinstance(desc, dict):
            lines.append(f"{where}: manifests[{n}] is not an object")
        elif "platform" in desc and not isinstance(desc["platform"], dict):
            lines.append(f"{where}: manifests[{n}].platform is a {type(desc['platform']).__name__}, not an object")
        elif "annotations" in desc and not isinstance(desc["annotations"], dict):
            lines.append(f"{where}: manifests[{n}].annotations is not an object")
    return lines


def pick_platform(index: dict[str, Any], os_name: str = "linux", arch: str = "arm64") -> dict[str, Any] | None:
    """The index entry for os/arch (variant v8 or none), attestations skipped; pure."""
    candidates = []
    manifests = index.get("manifests")
    for desc in manifests if isinstance(manifests, list) else []:
        if not isinstance(desc, dict) or is_attestation(desc):
            continue
        platform = desc.get("platform")
        if not isinstance(platform, dict):
            continue
        if (
            platform.get("os") == os_name
            and platform.get("architecture") == arch
            and (arch != "arm64" or platform.get("variant") in (None, "", "v8"))
        ):
            candidates.append(desc)
    return candidates[0] if candidates else None

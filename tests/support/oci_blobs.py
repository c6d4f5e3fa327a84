"""The bytes of OCI image parts, built with the stdlib as image builders write them.

One place for the helpers that the cubins, hostile and registry tests all need:
a blob's digest, a layer tar (PAX, as BuildKit writes; a str value is a hard
link), the same gzipped with no timestamp, and an image archive of such layers.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def layer_tar(files: dict[str, bytes] | dict[str, bytes | str]) -> bytes:
    """A tar layer of `files` (path -> bytes); a str value is a hard link to that path."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            if isinstance(data, str):
                info.type, info.linkname = tarfile.LNKTYPE, data
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def layer_tar_gz(files: dict[str, bytes]) -> bytes:
    """`layer_tar`, gzipped with no timestamp (a layer blob, or an sdist)."""
    return gzip.compress(layer_tar(files), mtime=0)


def image_archive(path: Path, layers: list[dict[str, bytes | str]], *, oci: bool = False) -> Path:
    """A docker-save archive at `path` of gzip layers (bottom first), or with `oci` an OCI layout
    with a config; a str value in a layer is a hard link."""
    blobs = [gzip.compress(layer_tar(files)) for files in layers]
    if oci:
        kind = "application/vnd.oci.image"
        config = json.dumps({"architecture": "arm64", "os": "linux", "config": {}}).encode()
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": {"mediaType": f"{kind}.config.v1+json", "digest": digest_of(config), "size": len(config)},
            "layers": [{"mediaType": f"{kind}.layer.v1.tar+gzip", "digest": digest_of(b), "size": len(b)} for b in blobs],
        }).encode()  # fmt: skip
        index = json.dumps({"schemaVersion": 2, "manifests": [
            {"mediaType": OCI_MANIFEST, "digest": digest_of(manifest), "size": len(manifest)}]}).encode()  # fmt: skip
        members = {"oci-layout": b'{"imageLayoutVersion": "1.0.0"}', "index.json": index}
        for blob in (config, manifest, *blobs):
            members[f"blobs/sha256/{digest_of(blob)[7:]}"] = blob
    else:
        names = [f"blobs/sha256/{digest_of(b)[7:]}" for b in blobs]
        members = {"manifest.json": json.dumps([{"Layers": names}]).encode(), **dict(zip(names, blobs, strict=True))}
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path

"""The bytes of OCI image parts, built with the stdlib as image builders write them.

One place for the helpers that the cubins, hostile and registry tests all need:
a blob's digest, a layer tar (PAX, as BuildKit writes; a str value is a hard
link) and the same gzipped with no timestamp.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile

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

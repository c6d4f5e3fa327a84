"""Open any target as a stream of (path, bytes): the only place that knows zip, tar layers, whiteouts.

Targets
- a directory: every regular file below it (symlinks are not followed), paths
  relative to it with `/` separators;
- a single file (`.so`, `.cubin`, anything): one member named by its basename;
- a `.whl`: members inflated from the zip as a stream, nothing unpacked;
- an image archive (a tar holding an OCI image layout, as
  `docker buildx build --output type=oci,dest=FILE` writes, or a
  `docker save` archive): the linux/arm64 image it holds, read in place;
- `NAME==VERSION`: the linux aarch64 wheel from PyPI (whole download cached in
  ~/.cache/spark-images/wheels and sha256-verified; when the wanted members are
  a small part of the wheel they are read over HTTP range requests instead);
- `docker://NAME`: a local image through the engine (`docker save`);
- `HOST/REPO:TAG` or `HOST/REPO@sha256:...`: a registry image over the OCI
  distribution API (linux/arm64 picked from an index), no daemon needed.

Images yield the file system a container would see (see `readers.layers`).
Image paths have no leading `/` (`usr/lib/python3/dist-packages/...`).
The readers themselves live in `spark_images.readers` (files and wheels,
layers, image sources); this module picks one and keeps the public API.

Public API (stable; the audit and the build line rely on it):
    iter_files(target, want) -> Iterator[tuple[str, bytes]]
    iter_members(target, want) -> Iterator[Member]   (also reports unreadable members)
    read_one(target, path_suffix) -> bytes | None
    target_kind(target) -> str
    image_digest(target) -> str | None
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from spark_images import pypi
from spark_images.core.errors import UsageError
from spark_images.readers import files, images
from spark_images.readers.common import MAX_MEMBER, QUIET, Member, Progress, Sieve, Want

KIND_DIR = "directory"
KIND_FILE = "file"
KIND_WHEEL = "wheel"
KIND_OCI_ARCHIVE = "oci-archive"
KIND_REQUIREMENT = "requirement"
KIND_DOCKER = "docker"
KIND_REGISTRY = "registry"

__all__ = [
    "KIND_DIR", "KIND_DOCKER", "KIND_FILE", "KIND_OCI_ARCHIVE", "KIND_REGISTRY", "KIND_REQUIREMENT",
    "KIND_WHEEL", "MAX_MEMBER", "Member", "Progress", "Sieve", "Want", "image_digest", "iter_files",
    "iter_members", "read_one", "target_kind",
]


def _is_tar(path: Path) -> bool:
    """A ustar header (magic and checksum) at the start of the file: an image archive candidate."""
    try:
        with path.open("rb") as fh:
            head = fh.read(512)
    except OSError:
        return False
    if len(head) < 512 or head[257:262] != b"ustar":
        return False
    text = head[148:156].replace(b"\0", b" ").strip()
    try:
        stored = int(text, 8)
    except ValueError:
        return False
    return stored == sum(head[:148]) + 256 + sum(head[156:])


def target_kind(target: str) -> str:
    """Which kind of target a string names (a stat, and 512 bytes of a file); UsageError if none."""
    # the pure name check, not the client: a local path must not wait for `requests` to import
    from spark_images.registry.reference import names_registry

    if target.startswith("docker://"):
        if not target[len("docker://") :]:
            raise UsageError("docker://: name a local image, e.g. docker://spark-vllm:cu130")
        return KIND_DOCKER
    path = Path(target)
    if path.is_dir():
        return KIND_DIR
    if path.is_file():
        if path.suffix == ".whl":
            return KIND_WHEEL
        return KIND_OCI_ARCHIVE if _is_tar(path) else KIND_FILE
    if pypi.parse_requirement(target):
        return KIND_REQUIREMENT
    if names_registry(target):
        return KIND_REGISTRY
    raise UsageError(
        f"{target}: not an existing file or directory, a NAME==VERSION requirement, "
        "docker://IMAGE or HOST/REPO:TAG (fix: check the spelling)"
    )


def iter_members(
    target: str,
    want: Want,
    *,
    progress: Progress | None = None,
    spool_over: int | None = None,
    sieve: Sieve | None = None,
) -> Iterator[Member]:
    """Every wanted member of `target`, with bytes or an error; raises for an unopenable target.

    `spool_over`: members larger than this many bytes come as a read-only
    `mmap` (of the file itself, or of a temporary copy of a zip or layer
    member) instead of bytes, so that a parser that touches only headers
    keeps memory low. The mmap is closed when the iteration moves on; do not
    keep it (or views of it) past that. `sieve`: image layers show such members
    to it first, and may give its summary instead of the bytes (`readers.common.Sieve`);
    the other targets give the bytes.
    """
    prog = progress or QUIET
    kind = target_kind(target)
    if kind == KIND_DIR:
        yield from files.dir_members(Path(target), want, spool_over)
    elif kind == KIND_FILE:
        yield from files.file_member(Path(target), want, spool_over)
    elif kind == KIND_WHEEL:
        yield from files.wheel_members(Path(target), want, spool_over)
    elif kind == KIND_OCI_ARCHIVE:
        yield from images.archive_members(Path(target), want, prog, spool_over, sieve=sieve)
    elif kind == KIND_REQUIREMENT:
        yield from files.requirement_members(target, want, prog, spool_over)
    elif kind == KIND_DOCKER:
        yield from images.docker_members(target[len("docker://") :], want, prog, spool_over, sieve)
    else:
        yield from images.registry_members(target, want, prog, spool_over, sieve)


def iter_files(target: str, want: Want, *, progress: Progress | None = None) -> Iterator[tuple[str, bytes]]:
    """(path inside target, bytes) for each readable member whose path satisfies `want`.

    Works for directories, single files, .whl files, image archives, NAME==VERSION
    requirements, docker://IMAGE and registry references; image layers are merged
    with whiteouts. Unreadable members are skipped here (use `iter_members` to see them).
    Raises UsageError / EnvironmentProblem when the target itself cannot be opened.
    """
    for member in iter_members(target, want, progress=progress):
        if member.data is not None:
            yield member.path, bytes(member.data)


def read_one(target: str, path_suffix: str) -> bytes | None:
    """Bytes of the first member whose path ends with `path_suffix` (e.g. 'vllm/_version.py')."""
    suffix = path_suffix.lstrip("/")

    def want(path: str) -> bool:
        return path == suffix or path.endswith("/" + suffix)

    for _path, data in iter_files(target, want):
        return data
    return None


def archive_config(target: str) -> tuple[dict[str, Any], str | None]:
    """(image config JSON, manifest digest or None for docker-save) of an image archive on disk."""
    archive = images.ImageArchive(Path(target))
    return archive.config(), archive.image()[0]


def image_digest(target: str) -> str | None:
    """The linux/arm64 manifest digest of a registry reference or an OCI archive (None for other kinds)."""
    kind = target_kind(target)
    if kind == KIND_REGISTRY:
        return images.registry_digest(target)
    if kind == KIND_OCI_ARCHIVE:
        return images.archive_digest(Path(target))
    return None

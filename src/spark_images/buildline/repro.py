"""What differs between two builds of one plan: OCI archives compared file by file.

`listing(archive)` reads an OCI image-layout tarball (as `buildx --output
type=oci` writes it): the config and, per layer, every entry with its type,
mode, owner, mtime, size, link target and content sha256. `differences(a, b)`
(pure) names each layer file and config field that differs.

It reads through the one archive reader and layer stream the inspectors use,
but asks for each layer's own entries (`layer_entries`: mode, owner, mtime and
content digest, where irreproducible builds usually differ), not the merged
file system.
"""

from __future__ import annotations

import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_images.core.errors import UsageError
from spark_images.readers.common import QUIET
from spark_images.readers.images import ImageArchive
from spark_images.readers.layers import layer_entries
from spark_images.readers.streams import Opener

MAX_LINES = 200


@dataclass(frozen=True)
class Entry:
    kind: str
    mode: int
    uid: int
    gid: int
    mtime: int
    size: int
    link: str
    sha256: str


@dataclass(frozen=True)
class Listing:
    digest: str
    config: dict[str, Any]
    layers: tuple[tuple[str, dict[str, Entry]], ...]  # (layer digest, path -> entry)


def _kind(info: tarfile.TarInfo) -> str:
    if info.isdir():
        return "dir"
    if info.issym():
        return "symlink"
    if info.islnk():
        return "hardlink"
    return "file" if info.isfile() else "other"


def _layer_path(name: str) -> str:
    """A tar member's path without its `./` prefix; the dots of `.bashrc` stay."""
    while name.startswith("./"):
        name = name[2:]
    return name.lstrip("/")


def _entry(info: tarfile.TarInfo, content: str) -> Entry:
    return Entry(
        kind=_kind(info), mode=info.mode, uid=info.uid, gid=info.gid, mtime=int(info.mtime),
        size=info.size, link=info.linkname, sha256=content,
    )  # fmt: skip


def _layer_entries(digest: str, opener: Opener, where: str) -> dict[str, Entry]:
    return {_layer_path(info.name): _entry(info, content) for info, content in layer_entries(digest, opener, where)}


def listing(archive: Path) -> Listing:
    """Read the linux/arm64 image of an OCI archive into a Listing (UsageError when it cannot be read).

    Through the one archive reader (`readers.images.ImageArchive`: digests checked as
    blobs stream) and the one layer stream (`readers.layers.layer_entries`: caps on
    decompression and headers), the same ones `check` and `cubins` use.
    """
    try:
        image = ImageArchive(archive)
        digest, _layers = image.image()
        if digest is None:
            raise UsageError(f"{archive}: a docker-save archive has no manifest digest to compare")
        config = image.config()
        layers = tuple((d, _layer_entries(d, opener, str(archive))) for d, opener in image.layers(QUIET))
    except UsageError as exc:
        why = str(exc).removeprefix(f"{archive}: ")
        raise UsageError(f"{archive}: not a readable OCI image archive ({why})") from exc
    return Listing(digest, config, layers)


def _entry_diff(a: Entry, b: Entry) -> str:
    parts = []
    for name in ("kind", "mode", "uid", "gid", "mtime", "size", "link", "sha256"):
        va, vb = getattr(a, name), getattr(b, name)
        if va != vb:
            if name == "sha256":
                parts.append("content")
            elif name == "mode":
                parts.append(f"mode {va:o} != {vb:o}")
            else:
                parts.append(f"{name} {va} != {vb}")
    return ", ".join(parts)


def _config_diff(a: Any, b: Any, path: str, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            _config_diff(a.get(key), b.get(key), f"{path}.{key}" if path else key, out)
    elif a != b:
        out.append(f"config {path}: {json.dumps(a)[:80]} != {json.dumps(b)[:80]}")


def differences(a: Listing, b: Listing) -> list[str]:
    """One line per differing layer file or config field (pure)."""
    out: list[str] = []
    _config_diff(
        {k: v for k, v in a.config.items() if k != "rootfs"},
        {k: v for k, v in b.config.items() if k != "rootfs"},
        "",
        out,
    )
    if len(a.layers) != len(b.layers):
        out.append(f"layer count {len(a.layers)} != {len(b.layers)}")
    for n, ((da, ea), (db, eb)) in enumerate(zip(a.layers, b.layers, strict=False), start=1):
        if da == db:
            continue
        for path in sorted(set(ea) | set(eb)):
            if path not in eb:
                out.append(f"layer {n}: {path}: only in the first build")
            elif path not in ea:
                out.append(f"layer {n}: {path}: only in the second build")
            elif ea[path] != eb[path]:
                out.append(f"layer {n}: {path}: {_entry_diff(ea[path], eb[path])}")
        if not any(line.startswith(f"layer {n}:") for line in out):
            out.append(f"layer {n}: same files, different archive bytes ({da} != {db}: order or compression)")
    if len(out) > MAX_LINES:
        out = [*out[:MAX_LINES], f"... and {len(out) - MAX_LINES} more"]
    return out

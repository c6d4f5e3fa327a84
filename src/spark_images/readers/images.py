"""Where image layers come from: an image archive on disk, the engine, or a registry.

One archive reader serves both archive formats a build leaves behind:
- an OCI image layout in a tar (`buildx --output type=oci,dest=FILE`):
  `index.json` -> (image index ->) linux/arm64 image manifest -> layer blobs;
- a `docker save` / `type=docker` archive: `manifest.json` lists the layers.
`docker://NAME` is `docker save` into a temporary archive, then that reader.
Layer blobs are read in place from the archive (no copy) and checked
against their digests as they stream.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from spark_images.core.errors import UsageError
from spark_images.readers.common import READ_CHUNK, Member, Progress, Sieve, Want
from spark_images.readers.digests import SideDigests
from spark_images.readers.layers import read_layers
from spark_images.readers.streams import Opener, verified

# a layer blob is read (and hashed, in its own thread) 8 MiB at a time: every chunk waits for the
# GIL once, and at 1 MiB those waits behind the parsing thread were 2000 per 2 GB archive
LAYER_READ = 8 << 20
# index.json, manifests and manifest.json are a few KiB; anything far larger is not one
MAX_JSON = 4 << 20
_MAX_NESTING = 4


def _file_chunks(path: Path, offset: int, size: int, progress: Progress) -> Iterator[bytes]:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        yield from _fd_chunks(fd, offset, size, progress, str(path), LAYER_READ)
    finally:
        os.close(fd)


def _fd_chunks(fd: int, offset: int, size: int, progress: Progress, where: str, read: int = READ_CHUNK) -> Iterator[bytes]:
    """`size` bytes of an open file from `offset`, `read` at a time: through a descriptor of its
    own (so closing the archive's never pulls the file from under a reader thread), read at
    offsets (so none share a position)."""
    own = os.dup(fd)
    try:
        left = size
        while left > 0:
            chunk = os.pread(own, min(read, left), offset)
            if not chunk:
                raise UsageError(f"{where}: archive ends inside a layer")
            offset += len(chunk)
            left -= len(chunk)
            progress.advance(len(chunk))
            yield chunk
    finally:
        os.close(own)


def _reused_chunks(fd: int, offset: int, size: int, progress: Progress, where: str) -> Iterator[memoryview]:
    """`_fd_chunks` for the inflater: LAYER_READ bytes at a time into one buffer read again and
    again, each chunk a view of it valid until the next is asked for (zstd and ISA-L take in
    all of one before they ask; a stored layer's chunks are copied out, `streams.Decompressed`).
    One pread per 8 MiB, not per 1 MiB: each one is a wait for the GIL behind the walk; and no
    fresh pages for each, as an 8 MiB bytes object would be."""
    own = os.dup(fd)
    buf = bytearray(min(LAYER_READ, size))
    view = memoryview(buf)
    try:
        left = size
        while left > 0:
            got = os.preadv(own, [view[: min(len(buf), left)]], offset)
            if not got:
                raise UsageError(f"{where}: archive ends inside a layer")
            offset += got
            left -= got
            progress.advance(got)
            yield view[:got]
    finally:
        os.close(own)


class ImageArchive:
    """An OCI-layout or docker-save tar on disk, opened for its linux/arm64 image."""

    def __init__(self, path: Path, where: str | None = None) -> None:
        self.path = path
        self.where = where or str(path)
        try:
            with tarfile.open(path, "r:") as tar:
                self.members = {_norm(m.name): m for m in tar.getmembers() if m.isfile()}
        except (tarfile.TarError, OSError, ValueError, EOFError) as exc:
            raise UsageError(f"{self.where}: not a readable image archive ({exc})") from exc

    _config_name: str = ""  # set by image(): the config blob's member name
    _config_digest: str = ""
    _image: tuple[str | None, list[tuple[str, str]]] | None = None

    def _read(self, name: str) -> bytes:
        member = self.members.get(name)
        if member is None:
            raise UsageError(f"{self.where}: {name} is missing from the archive")
        if member.size > MAX_JSON:
            raise UsageError(f"{self.where}: {name} is {member.size} bytes, too large for image metadata")
        with self.path.open("rb") as fh:
            fh.seek(member.offset_data)
            return fh.read(member.size)

    def _json(self, name: str, digest: str = "") -> Any:
        raw = self._read(name)
        if digest and "sha256:" + hashlib.sha256(raw).hexdigest() != digest:
            raise UsageError(f"{self.where}: {name} does not match its digest {digest} (corrupt archive)")
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise UsageError(f"{self.where}: {name} is not valid JSON ({str(exc)[:120]})") from exc

    @staticmethod
    def _blob_name(digest: object) -> str:
        algo, _, hexd = str(digest).partition(":")
        return f"blobs/{algo}/{hexd}"

    def _pick(self, index: Any, name: str) -> dict[str, Any]:
        from spark_images.registry.manifests import index_problems, is_attestation, pick_platform

        if not isinstance(index, dict):
            raise UsageError(f"{self.where}: {name} is not a JSON object")
        problems = index_problems(index, f"{self.where}: {name}")
        if problems:
            raise UsageError(*problems[:5])
        chosen = pick_platform(index)
        if chosen is not None:
            return chosen
        images = [d for d in index["manifests"] if not is_attestation(d)]
        if any(isinstance(d.get("platform"), dict) for d in images) or len(images) != 1:
            raise UsageError(f"{self.where}: {name} has no single linux/arm64 image ({len(images)} listed)")
        return images[0]

    def image(self) -> tuple[str | None, list[tuple[str, str]]]:
        """(manifest digest or None for docker-save format, [(layer digest, member name)], bottom first).

        Read once: `config()`, `layers()` and the callers that want the digest share it."""
        if self._image is None:
            self._image = self._read_image()
        return self._image

    def _read_image(self) -> tuple[str | None, list[tuple[str, str]]]:
        if "manifest.json" in self.members:
            return None, self._docker_layers()
        if "index.json" not in self.members:
            raise UsageError(
                f"{self.where}: a tar archive without index.json or manifest.json, not an image archive "
                "(fix: give the file buildx --output type=oci,dest=FILE or docker save wrote)"
            )
        doc: Any = self._json("index.json")
        name = "index.json"
        for _ in range(_MAX_NESTING):
            desc = self._pick(doc, name)
            digest = desc.get("digest")
            name = self._blob_name(digest)
            doc = self._json(name, str(digest))
            if isinstance(doc, dict) and "manifests" in doc:
                continue
            if not isinstance(doc, dict) or not isinstance(doc.get("layers"), list):
                raise UsageError(f"{self.where}: {name} is neither an image index nor an image manifest")
            config = doc.get("config")
            cdigest = config.get("digest") if isinstance(config, dict) else None
            if isinstance(cdigest, str) and ":" in cdigest:
                self._config_name, self._config_digest = self._blob_name(cdigest), cdigest
            layers = []
            for n, layer in enumerate(doc["layers"]):
                ldigest = layer.get("digest") if isinstance(layer, dict) else None
                if not isinstance(ldigest, str) or ":" not in ldigest:
                    raise UsageError(f"{self.where}: {name}: layers[{n}] has no digest")
                layers.append((ldigest, self._blob_name(ldigest)))
            return str(digest), layers
        raise UsageError(f"{self.where}: image indexes nested more than {_MAX_NESTING} deep")

    def config(self) -> dict[str, Any]:
        """The image config (env, entrypoint, labels, history), digest-checked where the
        archive names its digest; both archive formats."""
        self.image()
        if not self._config_name:
            raise UsageError(f"{self.where}: the image manifest names no config")
        doc = self._json(self._config_name, self._config_digest)
        if not isinstance(doc, dict):
            raise UsageError(f"{self.where}: the image config {self._config_name} is not a JSON object")
        return doc

    def _docker_layers(self) -> list[tuple[str, str]]:
        manifest = self._json("manifest.json")
        if not isinstance(manifest, list) or not manifest or not isinstance(manifest[0], dict):
            raise UsageError(f"{self.where}: manifest.json has no image")
        config = manifest[0].get("Config")
        if isinstance(config, str) and config:
            self._config_name = _norm(config)
            self._config_digest = _digest_from_name(self._config_name)
        out = []
        for layer_name in manifest[0].get("Layers") or []:
            name = _norm(str(layer_name))
            out.append((_digest_from_name(name) or name, name))
        return out

    # --- the archive's documents and blobs as they are, for a byte-exact push ---------

    def index(self) -> Any:
        """index.json as parsed JSON (size-limited like every metadata document)."""
        return self._json("index.json")

    def document(self, digest: str) -> bytes:
        """A manifest or config blob's bytes, size-limited and checked against its digest."""
        name = self._blob_name(digest)
        raw = self._read(name)
        if "sha256:" + hashlib.sha256(raw).hexdigest() != digest:
            raise UsageError(f"{self.where}: {name} does not match its digest {digest} (corrupt archive)")
        return raw

    def blob(self, digest: str) -> tuple[IO[bytes], int]:
        """A fresh stream over one blob of any size, and that size (the caller closes it)."""
        member = self.members.get(self._blob_name(digest))
        if member is None:
            raise UsageError(f"{self.where}: blob {digest} is missing from the archive")
        return _Window(self.path, member.offset_data, member.size), member.size

    def _layer_blobs(self) -> list[tuple[str, int, int]]:
        """(digest, offset, size) of each layer blob of the image, bottom first."""
        _digest, layers = self.image()
        blobs = []
        for digest, name in layers:
            member = self.members.get(name)
            if member is None:
                raise UsageError(f"{self.where}: layer {digest} is missing from the archive")
            blobs.append((digest, member.offset_data, member.size))
        return blobs

    def layers(self, progress: Progress) -> list[tuple[str, Opener]]:
        blobs = self._layer_blobs()
        out: list[tuple[str, Opener]] = []
        for digest, offset, size in blobs:

            def opener(d: str = digest, at: int = offset, n: int = size) -> Iterable[bytes]:
                return verified(_file_chunks(self.path, at, n, progress), d, self.where)

            out.append((digest, opener))
        progress.start(f"{self.where}: reading {len(out)} layers", sum(size for _d, _o, size in blobs))
        return out

    @contextlib.contextmanager
    def walk_layers(self, progress: Progress) -> Iterator[list[tuple[str, Opener]]]:
        """The layers as `layers()` gives them, for `read_layers`: read from one open file, their
        digests hashed beside the walk, top first as it reads them (`digests.SideDigests`)."""
        blobs = self._layer_blobs()
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise UsageError(f"{self.where}: cannot be read ({exc.strerror})") from exc
        try:
            with SideDigests(fd, reversed(blobs), self.where) as side:
                out: list[tuple[str, Opener]] = []
                for digest, offset, size in blobs:

                    def opener(d: str = digest, at: int = offset, n: int = size) -> Iterable[bytes]:
                        return side.checked(_reused_chunks(fd, at, n, progress, self.where), d)

                    out.append((digest, opener))
                progress.start(f"{self.where}: reading {len(out)} layers", sum(size for _d, _o, size in blobs))
                yield out
        finally:
            os.close(fd)


class _Window(io.RawIOBase):
    """`size` bytes of a file from `offset`: one archive member, streamed without tarfile.

    `__len__` and `tell` let an HTTP client send it with a Content-Length."""

    def __init__(self, path: Path, offset: int, size: int) -> None:
        super().__init__()
        self._fh = path.open("rb")
        self._fh.seek(offset)
        self._size = self._left = size

    def __len__(self) -> int:
        return self._size

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._size - self._left

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), self._left)
        if want <= 0:
            return 0
        got = self._fh.readinto(memoryview(buffer)[:want]) or 0
        self._left -= got
        return got

    def close(self) -> None:
        self._fh.close()
        super().close()


def _norm(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name.strip("/")


def _digest_from_name(name: str) -> str:
    parts = name.split("/")
    if len(parts) >= 3 and parts[-3] == "blobs" and len(parts[-1]) == 64:
        return f"{parts[-2]}:{parts[-1]}"
    return ""


def archive_members(
    path: Path, want: Want, progress: Progress, spool_over: int | None = None, where: str | None = None,
    sieve: Sieve | None = None,
) -> Iterator[Member]:  # fmt: skip
    archive = ImageArchive(path, where)
    with archive.walk_layers(progress) as layers:
        yield from read_layers(layers, want, archive.where, spool_over, local=True, sieve=sieve)
    progress.finish()


def archive_digest(path: Path) -> str | None:
    """The linux/arm64 image manifest digest an OCI archive holds (None for docker-save format)."""
    return ImageArchive(path).image()[0]


def docker_members(
    name: str, want: Want, progress: Progress, spool_over: int | None = None, sieve: Sieve | None = None
) -> Iterator[Member]:  # fmt: skip
    from spark_images.engine import images

    where = f"docker://{name}"
    with tempfile.TemporaryDirectory(prefix="spark-images-save-") as tmp:
        archive = Path(tmp) / "image.tar"
        progress.note(f"{where}: docker save")
        images.save_image(name, archive)
        yield from archive_members(archive, want, progress, spool_over, where, sieve)


def registry_members(
    target: str, want: Want, progress: Progress, spool_over: int | None = None, sieve: Sieve | None = None
) -> Iterator[Member]:  # fmt: skip
    from spark_images.registry.client import RegistryClient, parse_reference

    ref = parse_reference(target)
    client = RegistryClient(ref.host, ref.repository)
    manifest = client.image_manifest(ref.reference)
    total = sum(layer.size for layer in manifest.layers)
    progress.start(f"{target}: downloading {len(manifest.layers)} layers", total)
    layers: list[tuple[str, Opener]] = []
    for desc in manifest.layers:

        def opener(d: object = desc) -> Iterable[bytes]:
            return client.blob_chunks(d, progress.advance)  # type: ignore[arg-type]

        layers.append((desc.digest, opener))
    yield from read_layers(layers, want, target, spool_over, sieve=sieve)
    progress.finish()


def registry_digest(target: str) -> str:
    from spark_images.registry.client import RegistryClient, parse_reference

    ref = parse_reference(target)
    return RegistryClient(ref.host, ref.repository).image_manifest(ref.reference).digest

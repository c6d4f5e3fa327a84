"""Open any target as a stream of (path, bytes): the only place that knows zip, tar layers, whiteouts.

Targets
- a directory: every regular file below it (symlinks are not followed), paths
  relative to it with `/` separators;
- a single file (`.so`, `.cubin`, anything): one member named by its basename;
- a `.whl`: members read from the zip, nothing unpacked to disk;
- `NAME==VERSION`: the linux aarch64 wheel from PyPI (whole download cached in
  ~/.cache/spark-images/wheels and sha256-verified; when the wanted members are
  a small part of the wheel they are read over HTTP range requests instead);
- `docker://NAME`: a local image through the engine (`docker save`);
- `HOST/REPO:TAG` or `HOST/REPO@sha256:...`: a registry image over the OCI
  distribution API (linux/arm64 picked from an index), no daemon needed.

Images yield the file system a container would see: layers are read from the
top one down, so a path is yielded once (its topmost version) and files that
a later layer deleted (`.wh.NAME`) or hid (`.wh..wh..opq`) never appear.
Image paths have no leading `/` (`usr/lib/python3/dist-packages/...`).

Public API (stable; the audit relies on it):
    iter_files(target, want) -> Iterator[tuple[str, bytes]]
    iter_members(target, want) -> Iterator[Member]   (also reports unreadable members)
    read_one(target, path_suffix) -> bytes | None
    target_kind(target) -> str
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import mmap
import os
import queue
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from spark_images import pypi
from spark_images.errors import UsageError

Want = Callable[[str], bool]
READ_CHUNK = 1 << 20
# a wanted member above this size is reported unreadable instead of read into memory
MAX_MEMBER = 4 << 30
# range-read a wheel when the wanted members are at most this share of it
RANGE_SHARE = 0.3

KIND_DIR = "directory"
KIND_FILE = "file"
KIND_WHEEL = "wheel"
KIND_REQUIREMENT = "requirement"
KIND_DOCKER = "docker"
KIND_REGISTRY = "registry"


@dataclass(frozen=True)
class Member:
    """One wanted file of a target: its bytes, or why they could not be read."""

    path: str
    data: bytes | mmap.mmap | None  # mmap only when iter_members was asked to spool
    error: str = ""


class Progress:
    """Byte progress on stderr; silent unless enabled (TTY or --progress)."""

    def __init__(self, enabled: bool | None = None, stream: io.TextIOBase | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.label = ""
        self.total = 0
        self.done = 0
        self._last = 0.0

    def start(self, label: str, total: int) -> None:
        self.label, self.total, self.done = label, total, 0
        self._emit(force=True)

    def advance(self, n: int) -> None:
        self.done += n
        self._emit()

    def finish(self) -> None:
        self._emit(force=True)
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()

    def _emit(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.5:
            return
        self._last = now
        mib = self.done / (1 << 20)
        total = f" / {self.total / (1 << 20):.0f} MiB" if self.total else " MiB"
        self.stream.write(f"\r{self.label}: {mib:.0f}{total}")
        self.stream.flush()


_QUIET = Progress(enabled=False)


def target_kind(target: str) -> str:
    """Which kind of target a string names (no I/O beyond a stat); UsageError if none."""
    from spark_images.registry.client import looks_like_reference

    if target.startswith("docker://"):
        if not target[len("docker://") :]:
            raise UsageError("docker://: name a local image, e.g. docker://spark-vllm:cu130")
        return KIND_DOCKER
    path = Path(target)
    if path.is_dir():
        return KIND_DIR
    if path.is_file():
        return KIND_WHEEL if path.suffix == ".whl" else KIND_FILE
    if pypi.parse_requirement(target):
        return KIND_REQUIREMENT
    if looks_like_reference(target):
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
) -> Iterator[Member]:
    """Every wanted member of `target`, with bytes or an error; raises for an unopenable target.

    `spool_over`: members of files, directories and image layers larger than
    this many bytes come as a read-only `mmap` (of the file itself, or of a
    temporary copy of a layer member) instead of bytes, so that a parser that
    touches only headers keeps memory low. The mmap is closed when the
    iteration moves on; do not keep it (or views of it) past that.
    """
    prog = progress or _QUIET
    kind = target_kind(target)
    if kind == KIND_DIR:
        yield from _dir_members(Path(target), want, spool_over)
    elif kind == KIND_FILE:
        yield from _file_member(Path(target), want, spool_over)
    elif kind == KIND_WHEEL:
        yield from _wheel_members(Path(target), want)
    elif kind == KIND_REQUIREMENT:
        yield from _requirement_members(target, want, prog)
    elif kind == KIND_DOCKER:
        yield from _docker_members(target[len("docker://") :], want, prog, spool_over)
    else:
        yield from _registry_members(target, want, prog, spool_over)


def iter_files(target: str, want: Want, *, progress: Progress | None = None) -> Iterator[tuple[str, bytes]]:
    """(path inside target, bytes) for each readable member whose path satisfies `want`.

    Works for directories, single files, .whl files, NAME==VERSION requirements,
    docker://IMAGE and registry references; image layers are merged with whiteouts.
    Unreadable members are skipped here (use `iter_members` to see them).
    Raises UsageError / EnvironmentProblem when the target itself cannot be opened.
    """
    for member in iter_members(target, want, progress=progress):
        if member.data is not None:
            yield member.path, member.data


def read_one(target: str, path_suffix: str) -> bytes | None:
    """Bytes of the first member whose path ends with `path_suffix` (e.g. 'vllm/_version.py')."""
    suffix = path_suffix.lstrip("/")

    def want(path: str) -> bool:
        return path == suffix or path.endswith("/" + suffix)

    for _path, data in iter_files(target, want):
        return data
    return None


# --- directories, files, wheels ------------------------------------------------------


def _close_quietly(data: object) -> None:
    if isinstance(data, mmap.mmap):
        with contextlib.suppress(BufferError):  # a view still alive: the GC closes it later
            data.close()


def _read_file(path: Path, rel: str, spool_over: int | None = None) -> Member:
    try:
        size = path.stat().st_size
        if spool_over is not None and size > spool_over:
            with path.open("rb") as fh:
                return Member(rel, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ))
        if size > MAX_MEMBER:
            return Member(rel, None, f"{size} bytes is over the {MAX_MEMBER} byte limit")
        return Member(rel, path.read_bytes())
    except (OSError, ValueError) as exc:
        return Member(rel, None, f"cannot read ({getattr(exc, 'strerror', None) or exc})")


def _yield_and_close(member: Member) -> Iterator[Member]:
    try:
        yield member
    finally:
        _close_quietly(member.data)


def _dir_members(root: Path, want: Want, spool_over: int | None = None) -> Iterator[Member]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        base = Path(dirpath)
        for name in sorted(filenames):
            full = base / name
            rel = full.relative_to(root).as_posix()
            if full.is_symlink() or not full.is_file() or not want(rel):
                continue
            yield from _yield_and_close(_read_file(full, rel, spool_over))


def _file_member(path: Path, want: Want, spool_over: int | None = None) -> Iterator[Member]:
    if want(path.name):
        yield from _yield_and_close(_read_file(path, path.name, spool_over))


def _zip_members(archive: zipfile.ZipFile, want: Want, label: str) -> Iterator[Member]:
    for info in archive.infolist():
        if info.is_dir() or not want(info.filename):
            continue
        if info.file_size > MAX_MEMBER:
            yield Member(info.filename, None, f"{info.file_size} bytes is over the {MAX_MEMBER} byte limit")
            continue
        try:
            with archive.open(info) as fh:
                data = fh.read(info.file_size + 1)
            if len(data) != info.file_size:
                raise zipfile.BadZipFile(f"size {len(data)} differs from the declared {info.file_size}")
            yield Member(info.filename, data)
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError, ValueError) as exc:
            yield Member(info.filename, None, f"unreadable zip member in {label} ({exc})")


def _open_zip(source: Path | BinaryIO, label: str) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(source)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise UsageError(f"{label}: not a readable zip/wheel ({exc})") from exc


def _wheel_members(path: Path, want: Want) -> Iterator[Member]:
    with _open_zip(path, str(path)) as archive:
        yield from _zip_members(archive, want, str(path))


def _requirement_members(target: str, want: Want, progress: Progress) -> Iterator[Member]:
    wheel = pypi.resolve(target)
    local = pypi.cached(wheel)
    if local is None:
        remote = pypi.HttpRangeFile(wheel.url, wheel.size)
        try:
            archive = _open_zip(io.BufferedReader(remote, buffer_size=1 << 16), wheel.url)
        except UsageError:
            archive = None
        if archive is not None:
            wanted = sum(i.compress_size for i in archive.infolist() if not i.is_dir() and want(i.filename))
            if wanted <= RANGE_SHARE * wheel.size:
                with archive:
                    yield from _zip_members(archive, want, wheel.filename)
                return
            archive.close()
        progress.start(f"downloading {wheel.filename}", wheel.size)
        last = 0

        def report(done: int, _total: int) -> None:
            nonlocal last
            progress.advance(done - last)
            last = done

        local = pypi.download(wheel, report)
        progress.finish()
    yield from _wheel_members(local, want)


# --- image layers ----------------------------------------------------------------------


class _ChunkStream(io.RawIOBase):
    """A raw stream over an iterator of byte chunks."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        super().__init__()
        self._iter = iter(chunks)
        self._buf = b""
        self._pos = 0
        self._eof = False

    def readable(self) -> bool:
        return True

    def push_back(self, data: bytes) -> None:
        self._buf = data + self._buf[self._pos :]
        self._pos = 0

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            parts = [self._buf[self._pos :], *self._iter]
            self._buf, self._pos, self._eof = b"", 0, True
            return b"".join(parts)
        if self._pos >= len(self._buf):
            if self._eof:
                return b""
            try:
                self._buf, self._pos = next(self._iter), 0
            except StopIteration:
                self._eof = True
                return b""
        out = self._buf[self._pos : self._pos + n]
        self._pos += len(out)
        return out

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def drain(self) -> None:
        """Read to the end, so that a verifying chunk source checks its digest."""
        while self.read(READ_CHUNK):
            pass


class _Decompressed:
    """Plain, gzip (possibly multi-member) or zstd, detected by magic.

    Output is produced at most OUT_CHUNK bytes at a time, so a highly
    compressible layer never inflates into memory all at once.
    """

    OUT_CHUNK = 1 << 20

    def __init__(self, raw: _ChunkStream) -> None:
        self.raw = raw
        head = b""
        while len(head) < 4:
            more = raw.read(4 - len(head))
            if not more:
                break
            head += more
        raw.push_back(head)
        self._buf = b""
        self._pos = 0
        self._gz: zlib._Decompress | None = None  # type: ignore[name-defined]
        self._zstd: BinaryIO | None = None
        self._gz_input = b""
        if head[:2] == b"\x1f\x8b":
            self._gz = zlib.decompressobj(31)
            self.mode = "gzip"
        elif head == b"\x28\xb5\x2f\xfd":
            import zstandard

            self._zstd = zstandard.ZstdDecompressor().stream_reader(  # type: ignore[assignment]
                raw, read_size=READ_CHUNK, read_across_frames=True
            )
            self.mode = "zstd"
        else:
            self.mode = "plain"

    def _next_chunk(self) -> bytes:
        if self._zstd is not None:
            return self._zstd.read(self.OUT_CHUNK)
        if self._gz is None:
            return self.raw.read(self.OUT_CHUNK)
        while True:
            data = self._gz.unconsumed_tail or self._gz_input or self.raw.read(READ_CHUNK)
            self._gz_input = b""
            if not data:
                if not self._gz.eof:
                    raise zlib.error("gzip stream ends early")
                return b""
            out = self._gz.decompress(data, self.OUT_CHUNK)
            if self._gz.eof and self._gz.unused_data:
                # another gzip member follows (or trailing bytes, which the next member rejects)
                self._gz_input = self._gz.unused_data
                self._gz = zlib.decompressobj(31)
            if out:
                return out

    def read(self, n: int) -> bytes:
        parts: list[bytes] = []
        while n > 0:
            if self._pos >= len(self._buf):
                self._buf, self._pos = self._next_chunk(), 0
                if not self._buf:
                    break
            piece = self._buf[self._pos : self._pos + n]
            self._pos += len(piece)
            n -= len(piece)
            parts.append(piece)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def skip(self, n: int) -> int:
        """Discard n bytes; returns how many were really there."""
        left = n
        while left > 0:
            if self._pos >= len(self._buf):
                self._buf, self._pos = self._next_chunk(), 0
                if not self._buf:
                    break
            take = min(left, len(self._buf) - self._pos)
            self._pos += take
            left -= take
        return n - left


class LayerError(ValueError):
    """A layer is not a readable tar stream."""


@dataclass(frozen=True)
class _TarEntry:
    name: str
    type: bytes
    size: int
    linkname: str


def _parse_octal(field: bytes) -> int:
    if field and field[0] & 0x80:  # base-256 (GNU) for large sizes
        value = int.from_bytes(field[1:], "big")
        return value
    text = field.replace(b"\0", b" ").strip()
    return int(text, 8) if text else 0


def _pax_records(data: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            break
        length = int(data[pos:space])
        if length <= 0:
            break
        record = data[space + 1 : pos + length - 1]
        key, _, value = record.partition(b"=")
        out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
        pos += length
    return out


def _spool(stream: _Decompressed, size: int, spool_dir: Path, name: str) -> mmap.mmap:
    """Copy `size` bytes of the stream to a temporary file and map it read-only."""
    fd, tmp = tempfile.mkstemp(dir=spool_dir, suffix=".member")
    try:
        with os.fdopen(fd, "w+b") as fh:
            left = size
            while left > 0:
                chunk = stream.read(min(READ_CHUNK, left))
                if not chunk:
                    raise LayerError(f"tar stream ends inside {name}")
                fh.write(chunk)
                left -= len(chunk)
            fh.flush()
            return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    finally:
        os.unlink(tmp)  # the mapping keeps the data until it is closed


def _iter_tar(
    stream: _Decompressed, want: Want, spool_over: int | None = None, spool_dir: Path | None = None
) -> Iterator[tuple[_TarEntry, bytes | mmap.mmap | None]]:
    """Entries of a tar stream; data read only for regular files that `want` their name."""
    long_name: str | None = None
    long_link: str | None = None
    pax: dict[str, str] = {}
    while True:
        header = stream.read(512)
        if len(header) == 0 or header == b"\0" * 512:
            return
        if len(header) < 512:
            raise LayerError("tar stream ends inside a header")
        stored = _parse_octal(header[148:156]) if header[148:156].strip(b"\0 ") else -1
        computed = sum(header[:148]) + 256 + sum(header[156:])
        if stored != computed:
            raise LayerError("tar header checksum mismatch (not a tar layer, or corrupt)")
        try:
            size = _parse_octal(header[124:136])
        except ValueError as exc:
            raise LayerError("tar header has an unreadable size") from exc
        typeflag = header[156:157]
        name = header[0:100].split(b"\0", 1)[0].decode("utf-8", "replace")
        if header[257:262] == b"ustar":
            prefix = header[345:500].split(b"\0", 1)[0].decode("utf-8", "replace")
            if prefix:
                name = f"{prefix}/{name}"
        linkname = header[157:257].split(b"\0", 1)[0].decode("utf-8", "replace")
        padded = (size + 511) // 512 * 512
        if typeflag in (b"x", b"g", b"L", b"K"):
            if size > 16 << 20:
                raise LayerError("tar extended header is implausibly large")
            body = stream.read(padded)[:size]
            if len(body) < size:
                raise LayerError("tar stream ends inside an extended header")
            if typeflag == b"x":
                pax = _pax_records(body)
            elif typeflag == b"L":
                long_name = body.split(b"\0", 1)[0].decode("utf-8", "replace")
            elif typeflag == b"K":
                long_link = body.split(b"\0", 1)[0].decode("utf-8", "replace")
            continue
        name = pax.get("path", long_name or name)
        linkname = pax.get("linkpath", long_link or linkname)
        if "size" in pax:
            size = int(pax["size"])
            padded = (size + 511) // 512 * 512
        pax, long_name, long_link = {}, None, None
        entry = _TarEntry(_norm(name), typeflag, size, linkname)
        data: bytes | mmap.mmap | None = None
        is_file = typeflag in (b"0", b"\0", b"7")
        spool = spool_over is not None and spool_dir is not None and size > spool_over
        if is_file and want(entry.name) and (spool or size <= MAX_MEMBER):
            if spool:
                data = _spool(stream, size, spool_dir, entry.name)  # type: ignore[arg-type]
            else:
                data = stream.read(size)
                if len(data) < size:
                    raise LayerError(f"tar stream ends inside {entry.name}")
            if stream.skip(padded - size) < padded - size:
                raise LayerError(f"tar stream ends inside {entry.name}")
        elif padded and stream.skip(padded) < padded:
            raise LayerError(f"tar stream ends inside {entry.name}")
        yield entry, data


def _norm(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name.strip("/")


class _Overlay:
    """Whiteout bookkeeping while layers are read from the top down."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.hidden_trees: set[str] = set()

    def visible(self, path: str) -> bool:
        if path in self.seen:
            return False
        parts = path.split("/")
        return not any("/".join(parts[:i]) in self.hidden_trees for i in range(1, len(parts) + 1))


def _layer_members(
    stream: _Decompressed,
    overlay: _Overlay,
    want: Want,
    label: str,
    spool_over: int | None = None,
    spool_dir: Path | None = None,
) -> Iterator[Member]:
    new_seen: set[str] = set()
    new_hidden: set[str] = set()
    for entry, data in _iter_tar(stream, want, spool_over, spool_dir):
        parent, _, base = entry.name.rpartition("/")
        if base == ".wh..wh..opq":
            if parent:
                new_hidden.add(parent)
            continue
        if base.startswith(".wh."):
            new_hidden.add(f"{parent}/{base[4:]}" if parent else base[4:])
            continue
        if not entry.name or not overlay.visible(entry.name):
            _close_quietly(data)
            continue
        if entry.type == b"5":  # directories merge with lower layers
            continue
        new_seen.add(entry.name)
        new_hidden.add(entry.name)  # a non-directory replaces a lower directory of that name
        if entry.type in (b"0", b"\0", b"7") and want(entry.name):
            if data is None:
                yield Member(entry.name, None, f"{entry.size} bytes is over the {MAX_MEMBER} byte limit")
            else:
                yield from _yield_and_close(Member(entry.name, data))
        elif entry.type == b"1" and want(entry.name):
            yield Member(entry.name, None, f"hard link to {entry.linkname} in {label} is not followed")
    overlay.seen |= new_seen
    overlay.hidden_trees |= new_hidden


def _read_layers(
    layers: list[tuple[str, Callable[[], Iterable[bytes]]]],
    want: Want,
    where: str,
    spool_over: int | None = None,
) -> Iterator[Member]:
    """Merge layers (given bottom first) into the visible files, reading top first."""
    overlay = _Overlay()
    with tempfile.TemporaryDirectory(prefix="spark-images-spool-") as tmp:
        for digest, open_chunks in reversed(layers):
            yield from _read_layer(digest, open_chunks, overlay, want, where, spool_over, Path(tmp))


def _read_layer(
    digest: str,
    open_chunks: Callable[[], Iterable[bytes]],
    overlay: _Overlay,
    want: Want,
    where: str,
    spool_over: int | None,
    spool_dir: Path,
) -> Iterator[Member]:
    raw = _ChunkStream(_prefetch(open_chunks()))
    try:
        stream = _Decompressed(raw)
        yield from _layer_members(stream, overlay, want, f"layer {digest}", spool_over, spool_dir)
        raw.drain()
    except (LayerError, zlib.error, ValueError) as exc:
        raise UsageError(f"{where}: layer {digest} is unreadable ({exc})") from exc
    except Exception as exc:
        if exc.__class__.__name__ == "ZstdError":
            raise UsageError(f"{where}: layer {digest} is unreadable ({exc})") from exc
        raise


def _prefetch(chunks: Iterable[bytes], depth: int = 8) -> Iterator[bytes]:
    """Run a chunk source (download, digest) in a thread, `depth` chunks ahead.

    Socket reads, sha256 and zlib all release the GIL, so fetching and
    hashing one chunk overlaps with decompressing and parsing the previous
    one; the bounded queue keeps memory at `depth` chunks. An error in the
    source is raised in the consumer; closing the consumer stops the source.
    """
    box: queue.Queue[tuple[str, object]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for chunk in chunks:
                while not stop.is_set():
                    try:
                        box.put(("chunk", chunk), timeout=0.2)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            box.put(("end", None))
        except BaseException as exc:  # handed to the consumer, which re-raises it
            box.put(("error", exc))

    worker = threading.Thread(target=produce, name="layer-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            kind, value = box.get()
            if kind == "chunk":
                yield value  # type: ignore[misc]
            elif kind == "end":
                return
            else:
                raise value  # type: ignore[misc]
    finally:
        stop.set()
        with contextlib.suppress(queue.Empty):
            while True:
                box.get_nowait()
        worker.join(timeout=5)


def _verified(chunks: Iterable[bytes], digest: str, where: str) -> Iterator[bytes]:
    algo, _, hexd = digest.partition(":")
    hasher = hashlib.sha256() if algo == "sha256" else None
    for chunk in chunks:
        if hasher is not None:
            hasher.update(chunk)
        yield chunk
    if hasher is not None and hasher.hexdigest() != hexd:
        raise UsageError(f"{where}: layer {digest} does not match its digest (corrupt archive)")


def _file_chunks(path: Path, offset: int, size: int, progress: Progress) -> Iterator[bytes]:
    with path.open("rb") as fh:
        fh.seek(offset)
        left = size
        while left > 0:
            chunk = fh.read(min(READ_CHUNK, left))
            if not chunk:
                raise UsageError(f"{path}: archive ends inside a layer")
            left -= len(chunk)
            progress.advance(len(chunk))
            yield chunk


def _docker_members(
    name: str, want: Want, progress: Progress, spool_over: int | None = None
) -> Iterator[Member]:
    from spark_images.engine import images

    where = f"docker://{name}"
    with tempfile.TemporaryDirectory(prefix="spark-images-save-") as tmp:
        archive = Path(tmp) / "image.tar"
        if progress.enabled:
            progress.stream.write(f"{where}: docker save\n")
        images.save_image(name, archive)
        try:
            with tarfile.open(archive, "r:") as tar:
                members = {m.name.lstrip("./"): m for m in tar.getmembers() if m.isfile()}
                manifest_member = members.get("manifest.json")
                handle = tar.extractfile(manifest_member) if manifest_member else None
                if handle is None:
                    raise UsageError(f"{where}: docker save wrote no manifest.json")
                manifest = json.loads(handle.read())
        except (tarfile.TarError, ValueError) as exc:
            raise UsageError(f"{where}: the saved archive is unreadable ({exc})") from exc
        if not isinstance(manifest, list) or not manifest or not isinstance(manifest[0], dict):
            raise UsageError(f"{where}: manifest.json has no image")
        layers: list[tuple[str, Callable[[], Iterable[bytes]]]] = []
        total = 0
        for layer_name in manifest[0].get("Layers") or []:
            member = members.get(str(layer_name).lstrip("./"))
            if member is None:
                raise UsageError(f"{where}: layer {layer_name} missing from the saved archive")
            digest = _digest_from_name(str(layer_name))
            total += member.size

            def opener(m: tarfile.TarInfo = member, d: str = digest) -> Iterable[bytes]:
                chunks = _file_chunks(archive, m.offset_data, m.size, progress)
                return _verified(chunks, d, where) if d else chunks

            layers.append((digest or str(layer_name), opener))
        progress.start(f"{where}: reading layers", total)
        yield from _read_layers(layers, want, where, spool_over)
        progress.finish()


def _digest_from_name(name: str) -> str:
    parts = name.split("/")
    if len(parts) >= 3 and parts[-3] == "blobs" and len(parts[-1]) == 64:
        return f"{parts[-2]}:{parts[-1]}"
    return ""


def _registry_members(
    target: str, want: Want, progress: Progress, spool_over: int | None = None
) -> Iterator[Member]:
    from spark_images.registry.client import RegistryClient, parse_reference

    ref = parse_reference(target)
    client = RegistryClient(ref.host, ref.repository)
    manifest = client.image_manifest(ref.reference)
    total = sum(layer.size for layer in manifest.layers)
    progress.start(f"{target}: downloading {len(manifest.layers)} layers", total)
    layers: list[tuple[str, Callable[[], Iterable[bytes]]]] = []
    for desc in manifest.layers:

        def opener(d: object = desc) -> Iterable[bytes]:
            return client.blob_chunks(d, progress.advance)  # type: ignore[arg-type]

        layers.append((desc.digest, opener))
    yield from _read_layers(layers, want, target, spool_over)
    progress.finish()


def image_digest(target: str) -> str | None:
    """The linux/arm64 manifest digest of a registry reference (None for other kinds)."""
    if target_kind(target) != KIND_REGISTRY:
        return None
    from spark_images.registry.client import RegistryClient, parse_reference

    ref = parse_reference(target)
    return RegistryClient(ref.host, ref.repository).image_manifest(ref.reference).digest


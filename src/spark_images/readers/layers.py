"""One layer reader: stdlib `tarfile` streaming over a gzip/zstd/plain layer, plus whiteouts.

Layers are read from the top one down, so a path is yielded once (its
topmost version) and files that a later layer deleted (`.wh.NAME`) or hid
(`.wh..wh..opq`) never appear. A hard link is resolved within its layer when
the file it points to was wanted and kept (small budget), else reported.

Every layer is bounded: decompression stops with `exceeds` past a ratio or
an absolute size, extended tar headers have a size cap, and a corrupt header
anywhere in the stream is an error, never a silent end of the layer.
"""

from __future__ import annotations

import hashlib
import io
import mmap
import tarfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import BinaryIO

from spark_images.errors import UsageError
from spark_images.readers.common import (
    MAX_MEMBER,
    READ_CHUNK,
    Data,
    Member,
    Readable,
    ShortRead,
    Want,
    close_quietly,
    exceeds_size,
    mib,
    read_exact,
    release_pages,
    run_ahead,
)

Opener = Callable[[], Iterable[bytes]]
# decompressed / compressed bytes of a whole layer; gzip tops out near 1030:1, zstd does not
LAYER_RATIO = 200
LAYER_RATIO_FLOOR = 256 << 20
LAYER_MAX = 64 << 30
# pax / GNU long-name headers are a few hundred bytes in real layers
MAX_EXTENDED = 1 << 20
# what a layer may keep of its wanted files so that later hard links to them can be answered
KEEP_BYTES = 32 << 20
KEEP_MAPPED = 1 << 30


class LayerError(ValueError):
    """A layer is not a readable tar stream (or is over a cap)."""


class ChunkStream(io.RawIOBase):
    """A raw stream over an iterator of byte chunks; counts what it handed out."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        super().__init__()
        self._iter = iter(chunks)
        self._buf = b""
        self._pos = 0
        self._eof = False
        self.consumed = 0

    def readable(self) -> bool:
        return True

    def push_back(self, data: bytes) -> None:
        self._buf = data + self._buf[self._pos :]
        self._pos = 0
        self.consumed -= len(data)

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            parts = [self._buf[self._pos :], *self._iter]
            self._buf, self._pos, self._eof = b"", 0, True
            out = b"".join(parts)
        else:
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
        self.consumed += len(out)
        return out

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def drain(self) -> None:
        """Read to the end, so that a verifying chunk source checks its digest."""
        while self.read(READ_CHUNK):
            pass


class Decompressed:
    """Plain, gzip (possibly multi-member) or zstd, detected by magic, as a readable stream.

    Output comes at most OUT_CHUNK bytes at a time, and past LAYER_RATIO_FLOOR
    bytes the output may not outgrow the input by more than LAYER_RATIO.
    """

    OUT_CHUNK = 1 << 20

    def __init__(self, raw: ChunkStream) -> None:
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
        self.produced = 0
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

    def _inflate(self) -> bytes:
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

    def _next_chunk(self) -> bytes:
        out = self._inflate()
        self.produced += len(out)
        if self.produced > LAYER_MAX:
            raise LayerError(f"exceeds {mib(LAYER_MAX)} decompressed")
        ratio_seen = self.mode != "plain" and self.produced > LAYER_RATIO_FLOOR
        if ratio_seen and self.produced > LAYER_RATIO * max(self.raw.consumed, 1):
            raise LayerError(
                f"exceeds {LAYER_RATIO}:1 compression ({mib(self.produced)} from {mib(self.raw.consumed)})"
            )
        return out

    def chunks(self) -> Iterator[bytes]:
        """The decompressed bytes, chunk by chunk, then the rest of the raw stream is drained."""
        while chunk := self._next_chunk():
            yield chunk
        self.raw.drain()

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = 1 << 62
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


_EXTENDED = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)


class _TarInfo(tarfile.TarInfo):
    """tarfile's own header parser with two guards a hostile layer needs.

    In stream mode tarfile ends the archive silently at a corrupt header after
    the first one; that would drop the rest of a layer without a word, so such
    a header raises here. Extended headers are read whole into memory by
    tarfile, so their size is capped first.
    """

    @classmethod
    def fromtarfile(cls, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        try:
            return super().fromtarfile(tarfile_)
        except (tarfile.InvalidHeaderError, tarfile.TruncatedHeaderError) as exc:
            raise tarfile.SubsequentHeaderError(f"{exc} at byte {tarfile_.offset}") from None

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _EXTENDED and self.size > MAX_EXTENDED:
            raise tarfile.SubsequentHeaderError(f"extended header {self.name!r:.80} of {self.size} bytes exceeds {MAX_EXTENDED}")
        return super()._proc_member(tarfile_)  # type: ignore[misc]


def _norm(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name.strip("/")


class Overlay:
    """Whiteout bookkeeping while layers are read from the top down."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.hidden_trees: set[str] = set()

    def visible(self, path: str) -> bool:
        if path in self.seen:
            return False
        parts = path.split("/")
        return not any("/".join(parts[:i]) in self.hidden_trees for i in range(1, len(parts) + 1))


class _Kept:
    """Wanted files of one layer, kept (within a budget) for hard links that name them later."""

    def __init__(self) -> None:
        self.data: dict[str, Data] = {}
        self.bytes = 0
        self.mapped = 0

    def offer(self, name: str, data: Data) -> bool:
        """Keep `data` if the budget allows; True when kept (then this object closes it)."""
        size = len(data)
        if isinstance(data, bytes):
            if self.bytes + size > KEEP_BYTES:
                return False
            self.bytes += size
        else:
            if self.mapped + size > KEEP_MAPPED:
                return False
            self.mapped += size
        self.data[name] = data
        return True

    def close(self) -> None:
        for data in self.data.values():
            close_quietly(data)
        self.data.clear()


def layer_members(
    stream: Readable, overlay: Overlay, want: Want, label: str, spool_over: int | None = None
) -> Iterator[Member]:
    """The visible wanted members of one layer; updates `overlay` when the layer ends."""
    new_seen: set[str] = set()
    new_hidden: set[str] = set()
    kept = _Kept()
    try:
        tar = tarfile.open(fileobj=stream, mode="r|", tarinfo=_TarInfo)  # noqa: SIM115 (the stream is ours; nothing to close)
    except tarfile.ReadError as exc:
        if str(exc) == "empty file":
            return
        raise LayerError(str(exc)) from exc
    try:
        while (info := tar.next()) is not None:
            tar.members.clear()  # stream mode keeps every header otherwise: memory grows with the layer
            name = _norm(info.name)
            parent, _, base = name.rpartition("/")
            if base == ".wh..wh..opq":
                if parent:
                    new_hidden.add(parent)
                continue
            if base.startswith(".wh."):
                new_hidden.add(f"{parent}/{base[4:]}" if parent else base[4:])
                continue
            if not name or info.isdir():  # directories merge with lower layers
                continue
            visible = overlay.visible(name)
            if visible:
                new_seen.add(name)
                new_hidden.add(name)  # a non-directory replaces a lower directory of that name
            wanted = want(name)
            if info.isreg() and wanted and visible:
                member = _regular(tar, info, name, spool_over)
                keep = member.data is not None and kept.offer(name, member.data)
                try:
                    yield member
                finally:
                    if not keep:
                        close_quietly(member.data)
                    elif isinstance(member.data, mmap.mmap):
                        release_pages(member.data)  # kept for a hard link: keep it off the RSS meanwhile
            elif info.islnk() and wanted and visible:
                target = _norm(info.linkname)
                data = kept.data.get(target)
                if data is not None:
                    yield Member(name, data)
                else:
                    yield Member(name, None, f"hard link to {target} in {label}: that file was not kept (not wanted, or over the keep budget)")
    except tarfile.TarError as exc:
        raise LayerError(str(exc)) from exc
    finally:
        kept.close()
    overlay.seen |= new_seen
    overlay.hidden_trees |= new_hidden


def _regular(tar: tarfile.TarFile, info: tarfile.TarInfo, name: str, spool_over: int | None) -> Member:
    if info.size > MAX_MEMBER:
        return Member(name, None, exceeds_size(info.size))
    handle = tar.extractfile(info)
    if handle is None:
        return Member(name, None, "not a regular file")
    try:
        return Member(name, read_exact(handle, info.size, name, spool_over))
    except ShortRead as exc:
        raise LayerError(f"tar stream ends inside {name} ({exc})") from exc


def read_layers(layers: list[tuple[str, Opener]], want: Want, where: str, spool_over: int | None = None) -> Iterator[Member]:
    """Merge layers (given bottom first) into the visible files, reading top first."""
    overlay = Overlay()
    for digest, open_chunks in reversed(layers):
        yield from _read_layer(digest, open_chunks, overlay, want, where, spool_over)


def _inflated(open_chunks: Opener) -> Iterator[bytes]:
    """Download (8 chunks ahead, in its own thread), digest check and decompression of one layer."""
    yield from Decompressed(ChunkStream(run_ahead(open_chunks(), depth=8))).chunks()


def _read_layer(
    digest: str, open_chunks: Opener, overlay: Overlay, want: Want, where: str, spool_over: int | None
) -> Iterator[Member]:
    # zlib, zstd, sha256 and sockets release the GIL: decompression runs in a thread ahead of
    # the tar parsing, spooling and scanning done here, so the two overlap
    stream = ChunkStream(run_ahead(_inflated(open_chunks), depth=8))
    try:
        yield from layer_members(stream, overlay, want, f"layer {digest}", spool_over)
        stream.drain()
    except (LayerError, zlib.error, ValueError, EOFError) as exc:
        raise UsageError(f"{where}: layer {digest} is unreadable ({exc})") from exc
    except Exception as exc:
        if exc.__class__.__name__ == "ZstdError":
            raise UsageError(f"{where}: layer {digest} is unreadable ({exc})") from exc
        raise


def verified(chunks: Iterable[bytes], digest: str, where: str) -> Iterator[bytes]:
    algo, _, hexd = digest.partition(":")
    hasher = hashlib.sha256() if algo == "sha256" else None
    for chunk in chunks:
        if hasher is not None:
            hasher.update(chunk)
        yield chunk
    if hasher is not None and hasher.hexdigest() != hexd:
        raise UsageError(f"{where}: layer {digest} does not match its digest (corrupt archive)")

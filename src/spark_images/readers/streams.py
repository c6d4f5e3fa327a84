"""Byte streams under the layer reader: chunk iterators, forward-only seeking, decompression.

A layer arrives as an iterator of byte chunks (a registry download or a
slice of an archive on disk, its digest checked as it streams). `Decompressed`
inflates gzip (multi-member too) or zstd, detected by magic, with a ratio and
an absolute cap; `ForwardStream` gives the layer's tar walk a seekable file
that never goes back. Download and inflation each run in a thread ahead of
the parser (`run_ahead`).
"""

from __future__ import annotations

import hashlib
import io
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import BinaryIO

# ISA-L's inflate, zlib's API: 2.4x less CPU than zlib on layer bytes (0.40 against 1.0 s
# for 300 MiB of shared libraries), and inflation is the largest share of an image scan
from isal import isal_zlib

from spark_images.core.errors import UsageError
from spark_images.readers.common import READ_CHUNK, mib, run_ahead
from spark_images.readers.digests import ALGORITHMS

Opener = Callable[[], Iterable[bytes]]
# decompressed / compressed bytes of a whole layer; gzip tops out near 1030:1, zstd does not
LAYER_RATIO = 200
LAYER_RATIO_FLOOR = 256 << 20
LAYER_MAX = 64 << 30
# zstd asks its source for this much at a time: the 8 MiB an archive on disk is read in
ZSTD_READ = 8 << 20
# what a broken gzip stream raises: ISA-L's own error, and zlib's for an early end
INFLATE_ERRORS = (isal_zlib.error, zlib.error)


class LayerError(ValueError):
    """A layer is not a readable tar stream (or is over a cap)."""


class ChunkStream(io.RawIOBase):
    """A raw stream over an iterator of byte chunks; counts what it handed out.

    A chunk may be a view of a buffer its source reads into again for the next one
    (`images._reused_chunks`): `read(n)` hands out pieces of it, which the caller uses up
    before it reads again, and `read(-1)` copies each chunk as it comes."""

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
            # each chunk copied as it comes: a source may hand out views of one reused buffer
            parts = [bytes(self._buf[self._pos :]), *map(bytes, self._iter)]
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


class ForwardStream(io.RawIOBase):
    """A forward-only seekable stream over decompressed chunks, for the layer walk (and `tarfile` in "r:" mode).

    tarfile's stream mode ("r|") reads in 10 KiB blocks and re-slices its
    buffer on every read, and skips a member's data by reading it block by
    block: on a multi-GB layer that Python work, not inflation, was most of
    the time. Here skipping drops whole chunks, a read slices at most two, and
    `views` hands out the chunks themselves. A seek backwards is refused: a
    layer is read once, as it streams.
    """

    def __init__(self, chunks: Iterable[bytes]) -> None:
        super().__init__()
        self._iter = iter(chunks)
        self._buf = b""
        self._pos = 0
        self._start = 0  # stream offset of self._buf[0]
        self._eof = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._start + self._pos

    def _next(self) -> bool:
        if self._eof:
            return False
        try:
            chunk = next(self._iter)
        except StopIteration:
            self._eof = True
            return False
        self._start += len(self._buf)
        self._buf, self._pos = chunk, 0
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = offset + (self.tell() if whence == io.SEEK_CUR else 0)
        if whence not in (io.SEEK_SET, io.SEEK_CUR) or target < self.tell():
            raise io.UnsupportedOperation("a layer stream only seeks forward")
        while target > self._start + len(self._buf):
            if not self._next():
                self._pos = len(self._buf)  # past the end: reads give b"", as on a file
                return self.tell()
        self._pos = target - self._start
        return target

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            parts = [self._buf[self._pos :]]
            while self._next():
                parts.append(self._buf)
            self._pos = len(self._buf)
            return b"".join(parts)
        end = self._pos + n
        if end <= len(self._buf):
            out = self._buf if (self._pos == 0 and end == len(self._buf)) else self._buf[self._pos : end]
            self._pos = end
            return out
        # across chunks: views of each piece, copied once by the join
        return b"".join(self.views(n))

    def views(self, n: int) -> Iterator[memoryview]:
        """The next `n` bytes (fewer at the end of the stream) as views of the chunks
        themselves, nothing copied; each view stays valid after the stream moves on."""
        while n > 0:
            if self._pos >= len(self._buf) and not self._next():
                return
            take = min(n, len(self._buf) - self._pos)
            yield memoryview(self._buf)[self._pos : self._pos + take]
            self._pos += take
            n -= take

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def drain(self) -> None:
        """Read to the end, so that a verifying chunk source checks its digest."""
        while self._next():
            pass
        self._pos = len(self._buf)


class Decompressed:
    """Plain, gzip (possibly multi-member) or zstd, detected by magic, as a readable stream.

    Output comes at most OUT_CHUNK bytes at a time, and past LAYER_RATIO_FLOOR
    bytes the output may not outgrow the input by more than LAYER_RATIO.
    """

    # 8 MiB per call: inflate then runs ~30 ms per release of the GIL, against up to one
    # switch interval of waiting to get it back while the parser thread holds it
    OUT_CHUNK = 8 << 20

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
        self._gz: isal_zlib.Decompress | None = None
        self._zstd: BinaryIO | None = None
        self._gz_input = b""
        if head[:2] == b"\x1f\x8b":
            self._gz = isal_zlib.decompressobj(31)
            self.mode = "gzip"
        elif head == b"\x28\xb5\x2f\xfd":
            import zstandard

            self._zstd = zstandard.ZstdDecompressor().stream_reader(  # type: ignore[assignment]
                raw, read_size=ZSTD_READ, read_across_frames=True
            )
            self.mode = "zstd"
        else:
            self.mode = "plain"

    def _inflate(self) -> bytes:
        if self._zstd is not None:
            return self._zstd.read(self.OUT_CHUNK)
        if self._gz is None:
            stored = self.raw.read(self.OUT_CHUNK)  # a view of a reused read buffer: copied out
            return stored if isinstance(stored, bytes) else bytes(stored)
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
                self._gz = isal_zlib.decompressobj(31)
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


def inflated(open_chunks: Opener, ahead: bool = True) -> Iterator[bytes]:
    """Download (8 chunks ahead, in its own thread), digest check and decompression of one layer.

    `ahead=False` for a file on disk: its reads come from the page cache at memory speed, so
    they run in the inflating thread itself. A thread of their own cost more than the reads:
    each chunk was allocated in one thread and freed in another, so the allocator kept handing
    out fresh pages to be zeroed (pread was 0.43 s of kernel time per 2 GB gather, 0.11 s in one
    thread with its memory reused)."""
    source = open_chunks()
    if ahead:
        # chunks held in a queue must own their bytes: a source may hand out views of one
        # reused buffer (`images._reused_chunks`); bytes(...) of a bytes object is that object
        source = run_ahead(map(_owned, source), depth=8)
    yield from Decompressed(ChunkStream(source)).chunks()


def _owned(chunk: bytes | memoryview) -> bytes:
    return chunk if isinstance(chunk, bytes) else bytes(chunk)


def verified(chunks: Iterable[bytes], digest: str, where: str) -> Iterator[bytes]:
    algo, _, hexd = digest.partition(":")
    hasher = hashlib.new(algo) if algo in ALGORITHMS else None
    for chunk in chunks:
        if hasher is not None:
            hasher.update(chunk)
        yield chunk
    if hasher is not None and hasher.hexdigest() != hexd:
        raise UsageError(f"{where}: layer {digest} does not match its digest (corrupt archive)")

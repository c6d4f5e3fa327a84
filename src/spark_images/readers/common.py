"""What every reader shares: the `Member` record, progress, caps and spooling.

Caps make every read bounded by construction: a member is refused before it
is inflated when its declared size is over `MAX_MEMBER` or its declared
compression ratio is over `MAX_RATIO`, and a member whose bytes run past its
declared size is cut off at one byte more and reported. Members above a
caller's `spool_over` go to anonymous shared memory (memfd; an unlinked
temporary file past MEMORY_SPOOL) that is mapped read-only, so a parser that
touches headers only keeps its resident memory low.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

T = TypeVar("T")

Want = Callable[[str], bool]
Data = bytes | mmap.mmap
READ_CHUNK = 1 << 20
# download, hashing and inflation run in threads beside the parsing thread; each gives up the
# GIL inside C and must wait for it back, for up to one switch interval (default 5 ms) while the
# parser runs Python. A 0.5 ms interval keeps them busy: the CLI sets it (measured on a 2.3 GB
# image: 13.5 s -> 11.0 s to read every wanted file, the plain download and gunzip being 11.2 s)
READER_SWITCH_INTERVAL = 0.0005
# a wanted member above this size is reported unreadable instead of read
MAX_MEMBER = 4 << 30
# declared uncompressed / compressed size: real .so members of vLLM wheels stay below 50,
# deflate cannot exceed about 1030; checked once a member is past RATIO_FLOOR bytes
MAX_RATIO = 200
RATIO_FLOOR = 16 << 20


def mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB" if n >= 1 << 20 else f"{n} bytes"


def exceeds_size(size: int, cap: int = MAX_MEMBER) -> str:
    return f"exceeds {mib(cap)} ({mib(size)} declared)"


def over_ratio(size: int, stored: int, cap: int = MAX_RATIO) -> bool:
    return size > RATIO_FLOOR and size > cap * max(stored, 1)


def exceeds_ratio(size: int, stored: int, cap: int = MAX_RATIO) -> str:
    return f"exceeds {cap}:1 compression ({mib(size)} from {mib(stored)} declared)"


@dataclass(frozen=True)
class Member:
    """One wanted file of a target: its bytes, or why they could not be read."""

    path: str
    data: Data | None  # mmap only when iter_members was asked to spool
    error: str = ""


class Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


class ShortRead(ValueError):
    """A stream ended before (or ran past) its declared size."""


# a spooled member up to this size goes to anonymous shared memory (memfd), larger ones to an
# unlinked file on disk: writing 1.1 GiB of libraries to a disk file was 2.5 s of a 15 s image
# scan (journal and writeback), against ~0.3 s into memory; the mapping is shared, so dropping
# its pages from the process (`release_pages`) keeps the bytes
MEMORY_SPOOL = 2 << 30
SPOOL_READ = 8 << 20


def _scratch(size: int) -> int:
    """A file descriptor to spool `size` bytes into: memfd when small enough, else a temporary file."""
    memfd = getattr(os, "memfd_create", None)
    if memfd is not None and size <= MEMORY_SPOOL:
        with contextlib.suppress(OSError):
            return int(memfd("spark-images-member", os.MFD_CLOEXEC))
    fd, tmp = tempfile.mkstemp(prefix="spark-images-", suffix=".member")
    os.unlink(tmp)  # gone from the file system at once, even if this process dies
    return fd


def spool(source: Readable, size: int, name: str, framed: bool = False) -> mmap.mmap:
    """Copy exactly `size` bytes of `source` to anonymous memory or an unlinked temporary file, and map it.

    Reads at most one byte more than declared, so a lying size costs nothing
    extra; the mapping holds the data until it is closed. `framed`: the
    source goes on past the member (a tar stream, where the size field is the
    frame), so nothing past `size` is read.
    """
    fd = _scratch(size)
    with os.fdopen(fd, "w+b", buffering=0) as fh:
        left = size
        views = getattr(source, "views", None)  # a layer stream hands out its chunks uncopied
        while left > 0:
            pieces = views(min(SPOOL_READ, left)) if views is not None else [memoryview(source.read(min(SPOOL_READ, left)))]
            got = 0
            for view in pieces:
                got += len(view)
                while view:
                    view = view[fh.write(view) :]
            if not got:
                raise ShortRead(f"{name}: data ends {left} bytes before its declared size {size}")
            left -= got
        if not framed and source.read(1):
            raise ShortRead(f"{name}: data runs past its declared size {size}")
        if size == 0:
            raise ShortRead(f"{name}: empty")  # mmap cannot map an empty file; callers read it instead
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)


def read_exact(source: Readable, size: int, name: str, spool_over: int | None, framed: bool = False) -> Data:
    """`size` bytes of `source`, spooled and mapped above `spool_over`; ShortRead on a size lie.

    `framed`: see `spool`."""
    if spool_over is not None and size > spool_over and size > 0:
        return spool(source, size, name, framed)
    data = source.read(size if framed else size + 1)
    if len(data) > size:
        raise ShortRead(f"data runs past its declared size {size}")
    if len(data) < size:
        raise ShortRead(f"size {len(data)} differs from the declared {size}")
    return data


def release_pages(data: mmap.mmap) -> None:
    """Drop a read-only mapping's resident pages (they stay in the page cache)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        data.madvise(mmap.MADV_DONTNEED)


def close_quietly(data: object) -> None:
    if isinstance(data, mmap.mmap):
        with contextlib.suppress(BufferError):  # a view still alive: the GC closes it later
            data.close()


def yield_and_close(member: Member) -> Iterator[Member]:
    try:
        yield member
    finally:
        close_quietly(member.data)


def run_ahead(items: Iterable[T], depth: int = 1, drop: Callable[[T], None] = lambda _item: None) -> Iterator[T]:
    """Produce `items` in a thread, up to `depth` ahead of the consumer.

    Inflating, hashing, reading and writing files all release the GIL, so the
    next item is made while the consumer parses this one. The bounded queue
    keeps memory at `depth` items; an error in the producer is raised in the
    consumer; closing the consumer stops the producer and `drop`s what it made.
    """
    box: queue.Queue[tuple[str, object]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        source = iter(items)
        try:
            for item in source:
                while not stop.is_set():
                    try:
                        box.put(("item", item), timeout=0.2)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    drop(item)
                    return
            box.put(("end", None))
        except BaseException as exc:  # handed to the consumer, which re-raises it
            box.put(("error", exc))
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    worker = threading.Thread(target=produce, name="read-ahead", daemon=True)
    worker.start()
    interrupted = False
    try:
        while True:
            kind, value = box.get()
            if kind == "item":
                yield value  # type: ignore[misc]
            elif kind == "end":
                return
            else:
                raise value  # type: ignore[misc]
    except KeyboardInterrupt:
        interrupted = True  # the producer may sit in a slow read: the user should not wait for it
        raise
    finally:
        stop.set()
        with contextlib.suppress(queue.Empty):
            while True:
                kind, value = box.get_nowait()
                if kind == "item":
                    drop(value)  # type: ignore[arg-type]
        worker.join(timeout=0 if interrupted else 60)  # a daemon: an abandoned one ends with the process


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

    def note(self, line: str) -> None:
        if self.enabled:
            self.stream.write(line + "\n")
            self.stream.flush()

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
        done = self.done / (1 << 20)
        total = f" / {self.total / (1 << 20):.0f} MiB" if self.total else " MiB"
        self.stream.write(f"\r{self.label}: {done:.0f}{total}")
        self.stream.flush()


QUIET = Progress(enabled=False)

"""What every reader shares: the `Member` record, progress, caps and spooling.

Caps make every read bounded by construction: a member is refused before it
is inflated when its declared size is over `MAX_MEMBER` or its declared
compression ratio is over `MAX_RATIO`, and a member whose bytes run past its
declared size is cut off at one byte more and reported. Members above a
caller's `spool_over` go to private anonymous memory (an unlinked temporary
file, mapped read-only, past MEMORY_SPOOL), so that a multi-GB member is
never one Python bytes object and never copied again once it is there.
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
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from spark_images.core import buffers
from spark_images.core.pieces import Pieces

T = TypeVar("T")

Want = Callable[[str], bool]
Data = bytes | mmap.mmap | Pieces  # Pieces: only for a sieve that `takes_pieces`
READ_CHUNK = 1 << 20
# download, hashing and inflation run in threads beside the parsing thread; each gives up the
# GIL inside C and must wait for it back, for up to one switch interval (default 5 ms) while the
# parser runs Python. A 0.5 ms interval keeps them busy: the CLI sets it (measured on a 2.3 GB
# image: 13.5 s -> 11.0 s to read every wanted file, the plain download and gunzip being 11.2 s)
READER_SWITCH_INTERVAL = 0.0005


def tune_process_for_reading() -> None:
    """Set what a process that reads layers runs best with, before its threads start: the short
    switch interval above, and malloc keeping freed chunks for reuse (`buffers.keep_freed_memory`).
    The CLI calls it first; the benchmarks call it too, so that they time what users run."""
    sys.setswitchinterval(READER_SWITCH_INTERVAL)
    buffers.keep_freed_memory()


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
    """One wanted file of a target: its bytes, or why they could not be read, or what a `Sieve`
    made of them (then `data` is None and `error` empty: the bytes went by and were not kept)."""

    path: str
    data: Data | None  # mmap only when iter_members was asked to spool
    error: str = ""
    summary: object | None = None


class SieveRun(Protocol):
    """One member's bytes as they stream by, in order (see `Sieve`)."""

    def needs_bytes(self, view: memoryview) -> bool:
        """The next piece; True once the member must be kept whole after all."""
        ...

    def summary(self, views: Sequence[memoryview], size: int) -> object | None:
        """What the consumer needs of the member, from all of its pieces; None: keep it whole."""
        ...

    def takes_pieces(self) -> bool:
        """Whether the consumer, once it needs the bytes, reads them from the member's pieces as
        they were inflated (`core.pieces.Pieces`, not copied), rather than from one buffer."""
        ...


class Sieve(Protocol):
    """A consumer that may answer for a big member from its bytes as they stream by.

    A layer reader would copy a spooled member into memory (`spool`) only for its
    consumer to search it and find nothing: the libraries without device code are
    2.5 GiB of the real cu130 image. With a sieve, such a member's pieces are
    shown to it as they are read, held uncopied; when it never asks for the bytes,
    the member comes with the sieve's `summary` and no data, and the pieces are
    dropped. A reader that cannot sieve (a directory, a wheel) ignores it: the
    consumer then gets the bytes, as without one.
    """

    def sifts(self, path: str) -> bool:
        """Whether the consumer may take this member's summary for its bytes."""
        ...

    def start(self) -> SieveRun:
        """A run over one member's pieces."""
        ...


class Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


class ShortRead(ValueError):
    """A stream ended before (or ran past) its declared size."""


# a spooled member up to this size goes to private anonymous memory (huge pages where the kernel
# allows them), larger ones to an unlinked file on disk. Writing 1.1 GiB of libraries to a disk
# file was 2.5 s of a 15 s image scan (journal and writeback), to a memfd ~1.3 s (one shared-memory
# page allocated and zeroed per 4 KiB), to 2 MiB anonymous pages ~0.3 s. The bytes are in memory
# in every case but the disk file; only the process's RSS accounting differs.
MEMORY_SPOOL = 2 << 30
SPOOL_READ = 8 << 20


class AnonymousMap(mmap.mmap):
    """A spooled member in private anonymous memory.

    Nothing backs it but itself, so its pages must never be dropped
    (`keep_pages`): MADV_DONTNEED on it would read back as zeros, where on a
    file or shared mapping it only unmaps pages that the kernel keeps.
    """

    keep_pages = True


class ArenaMap(mmap.mmap):
    """A spooled member in a region of a `SpoolArena`: a read-only shared mapping of its memfd.

    Closing it hands the region back for the next member; a close refused
    because a view is still alive (BufferError) keeps the region taken. Its
    pages are the arena's to reuse, so they are never dropped (`keep_pages`).
    """

    keep_pages = True
    _arena: SpoolArena | None = None
    _region: tuple[int, int] = (0, 0)

    def close(self) -> None:
        super().close()
        arena, self._arena = self._arena, None
        if arena is not None:
            arena.give_back(self._region)


class SpoolArena:
    """Memory reused by the spooled members of one walk, one memfd whose pages are written once.

    Fresh memory costs a page fault and a zeroed page per 4 KiB on first touch,
    or a compaction stall for a huge page: 0.2-1.5 s per 448 MiB here, the largest
    share of the parsing thread in an image scan. Pages this arena already holds
    are written again (by pwrite, without the GIL) and mapped read-only with
    MAP_POPULATE, so no page is zeroed twice. A region returns to the free list only
    when its mapping is closed, so no view of an earlier member can see a later one;
    members kept for hard links hold their regions until they are closed too. Past
    `limit` bytes (or without memfd) a member gets fresh anonymous memory instead.
    """

    def __init__(self, limit: int = MEMORY_SPOOL + (1 << 30)) -> None:
        self.limit = limit
        self.size = 0
        self.free: list[tuple[int, int]] = []  # (offset, length) of holes, in offset order
        try:
            self.fd: int | None = os.memfd_create("spark-images-spool", os.MFD_CLOEXEC)
        except (AttributeError, OSError):
            self.fd = None

    def __enter__(self) -> SpoolArena:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Drop the arena's own handle; mappings still open keep their pages until they close."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def reserve(self, size: int) -> tuple[int, int] | None:
        """A region of the arena for `size` bytes, (offset, length), or None where it cannot give one.

        The caller writes it through the arena's descriptor (`write`), then maps it (`mapped`),
        or hands it back (`give_back`)."""
        if self.fd is None or size <= 0:
            return None
        length = -(-size // mmap.ALLOCATIONGRANULARITY) * mmap.ALLOCATIONGRANULARITY
        offset = self._first_fit(length)
        if offset is None:
            if self.size + length > self.limit:
                return None
            offset = self.size
            os.ftruncate(self.fd, self.size + length)
            self.size += length
        return offset, length

    def write(self, at: int, view: memoryview) -> None:
        """`view` into the arena at byte `at`, by pwrite: the copy runs in the kernel without the GIL,
        where a slice assignment into a mapping held it (and its page faults) from the thread
        inflating the layers beside the walk."""
        assert self.fd is not None
        while view:
            done = os.pwritev(self.fd, [view], at)
            if done <= 0:  # a full memory file system answers ENOSPC; nothing written would loop
                raise OSError(f"the spool took no bytes at offset {at}")
            view, at = view[done:], at + done

    def mapped(self, region: tuple[int, int], size: int) -> ArenaMap:
        """The first `size` bytes of a written region, mapped read-only in one call (pages the arena
        already holds are not zeroed again); closing the mapping hands the region back."""
        offset, _length = region
        # mapped plain, then populated by a foreign call: mmap's own MAP_POPULATE (and its
        # madvise) fill the page tables with the GIL held, and the inflating thread, which needs
        # the GIL between chunks, stood still for them (~0.5 s a gather of the real cu130 archive)
        flags = mmap.MAP_SHARED | (0 if _POPULATE_BY_CALL else _MAP_POPULATE)
        data = ArenaMap(self.fd, size, flags=flags, prot=mmap.PROT_READ, offset=offset)  # type: ignore[arg-type]
        data._arena, data._region = self, region
        if _POPULATE_BY_CALL:
            buffers.populate(data)
        return data

    def _first_fit(self, length: int) -> int | None:
        for i, (offset, hole) in enumerate(self.free):
            if hole >= length:
                if hole == length:
                    del self.free[i]
                else:
                    self.free[i] = (offset + length, hole - length)
                return offset
        if self.free and sum(self.free[-1]) == self.size and self.free[-1][0] + length <= self.limit:
            # a hole at the end, too short: grown by what it lacks, so a member larger than the
            # last one freed reuses all of its pages and only the difference is fresh
            offset, _hole = self.free.pop()
            os.ftruncate(self.fd, offset + length)  # type: ignore[arg-type]
            self.size = offset + length
            return offset
        return None

    def give_back(self, region: tuple[int, int]) -> None:
        """A closed member's region, free again (merged with the holes beside it)."""
        offset, length = region
        holes = sorted([*self.free, (offset, length)])
        merged: list[tuple[int, int]] = []
        for at, hole in holes:
            if merged and merged[-1][0] + merged[-1][1] == at:
                merged[-1] = (merged[-1][0], merged[-1][1] + hole)
            else:
                merged.append((at, hole))
        self.free = merged


_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0x8000 if sys.platform == "linux" else 0)
# where the kernel has MADV_POPULATE_READ (Linux 5.14), else MAP_POPULATE as before
_POPULATE_BY_CALL = buffers.can_populate()


def _anonymous(size: int) -> mmap.mmap:
    data = AnonymousMap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(OSError, ValueError, AttributeError):  # no THP here: 4 KiB pages
        data.madvise(mmap.MADV_HUGEPAGE)
    return data


def _views_of(source: Readable, size: int, name: str) -> Iterator[memoryview]:
    """`size` bytes of `source` in pieces: a layer stream's own chunks uncopied, else reads."""
    left = size
    views = getattr(source, "views", None)  # a layer stream hands out its chunks uncopied
    while left > 0:
        pieces = views(min(SPOOL_READ, left)) if views is not None else [memoryview(source.read(min(SPOOL_READ, left)))]
        got = 0
        for view in pieces:
            got += len(view)
            yield view
        if not got:
            raise ShortRead(f"{name}: data ends {left} bytes before its declared size {size}")
        left -= got


def spool(
    source: Readable, size: int, name: str, framed: bool = False, arena: SpoolArena | None = None
) -> mmap.mmap:
    """Copy exactly `size` bytes of `source` into memory (an `arena`'s, else fresh anonymous memory)
    or an unlinked temporary file, mapped.

    Reads at most one byte more than declared, so a lying size costs nothing
    extra; the mapping holds the data until it is closed. `framed`: the
    source goes on past the member (a tar stream, where the size field is the
    frame), so nothing past `size` is read.
    """
    if size == 0:
        raise ShortRead(f"{name}: empty")  # mmap cannot map an empty file; callers read it instead

    def runs_past() -> bool:
        return not framed and bool(source.read(1))

    return spool_views(_views_of(source, size, name), size, name, arena, runs_past)


def spool_views(
    views: Iterable[memoryview], size: int, name: str, arena: SpoolArena | None = None,
    runs_past: Callable[[], bool] = lambda: False,
) -> mmap.mmap:  # fmt: skip
    """`spool` of a member given as its pieces (which must add up to `size`; ShortRead otherwise)."""
    region = arena.reserve(size) if arena is not None and size <= MEMORY_SPOOL else None
    at = 0

    def counted(put: Callable[[memoryview], None]) -> None:
        nonlocal at
        for view in views:
            if at + len(view) > size:  # only an unframed source can run past (by its one extra byte)
                raise ShortRead(f"{name}: data runs past its declared size {size}")
            put(view)
            at += len(view)
        if at < size:
            raise ShortRead(f"{name}: data ends {size - at} bytes before its declared size {size}")
        if runs_past():
            raise ShortRead(f"{name}: data runs past its declared size {size}")

    if region is not None or size <= MEMORY_SPOOL:
        # into the arena's region by pwrite, else into fresh anonymous memory
        anonymous = _anonymous(size) if region is None else None

        def put(view: memoryview) -> None:
            if anonymous is not None:
                anonymous[at : at + len(view)] = view
            else:
                arena.write(region[0] + at, view)  # type: ignore[union-attr, index]

        try:
            counted(put)
            return anonymous if anonymous is not None else arena.mapped(region, size)  # type: ignore[union-attr, arg-type]
        except BaseException:
            if anonymous is not None:
                anonymous.close()
            else:
                arena.give_back(region)  # type: ignore[union-attr, arg-type]
            raise
    fd, tmp = tempfile.mkstemp(prefix="spark-images-", suffix=".member")
    os.unlink(tmp)  # gone from the file system at once, even if this process dies
    with os.fdopen(fd, "w+b", buffering=0) as fh:

        def write(view: memoryview) -> None:
            while view:
                view = view[fh.write(view) :]

        counted(write)
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)


def read_exact(
    source: Readable, size: int, name: str, spool_over: int | None, framed: bool = False,
    arena: SpoolArena | None = None,
) -> Data:  # fmt: skip
    """`size` bytes of `source`, spooled and mapped above `spool_over`; ShortRead on a size lie.

    `framed`, `arena`: see `spool`."""
    if spool_over is not None and size > spool_over and size > 0:
        return spool(source, size, name, framed, arena)
    data = source.read(size if framed else size + 1)
    if len(data) > size:
        raise ShortRead(f"data runs past its declared size {size}")
    if len(data) < size:
        raise ShortRead(f"size {len(data)} differs from the declared {size}")
    return data


def release_pages(data: mmap.mmap) -> None:
    """Drop a file mapping's resident pages (they stay in the page cache); anonymous memory keeps them."""
    if getattr(data, "keep_pages", False):
        return
    with contextlib.suppress(OSError, ValueError, AttributeError):
        data.madvise(mmap.MADV_DONTNEED)


def close_quietly(data: object) -> None:
    if isinstance(data, Pieces):
        data.close()
    elif isinstance(data, mmap.mmap):
        with contextlib.suppress(BufferError):  # a view still alive: the GC closes it later
            data.close()


def yield_and_close(member: Member) -> Iterator[Member]:
    try:
        yield member
    finally:
        close_quietly(member.data)


def run_ahead(
    items: Iterable[T],
    depth: int = 1,
    drop: Callable[[T], None] = lambda _item: None,
    *,
    weigh: Callable[[T], int] | None = None,
    budget: int = 0,
) -> Iterator[T]:
    """Produce `items` in a thread, up to `depth` ahead of the consumer (or `budget` by `weigh`).

    Inflating, hashing, reading and writing files all release the GIL, so the
    next item is made while the consumer parses this one. The bounded queue
    keeps memory at `depth` items; with `weigh`, at `budget` units instead
    (bytes of chunks), one item always allowed. An error in the producer is
    raised in the consumer; closing the consumer stops the producer and
    `drop`s what it made.
    """
    box: queue.Queue[tuple[str, object]] = queue.Queue(maxsize=0 if weigh is not None else depth)
    stop = threading.Event()
    gauge = threading.Condition()
    level = 0  # units made and not yet taken (with `weigh`)

    def room(weight: int) -> bool:
        """Wait until `weight` more units fit (or the consumer has gone); False when it has."""
        nonlocal level
        with gauge:
            while level > 0 and level + weight > budget and not stop.is_set():
                gauge.wait(0.2)
            level += weight
        return not stop.is_set()

    def produce() -> None:
        source = iter(items)
        try:
            for item in source:
                if weigh is not None:
                    if room(weigh(item)):
                        box.put(("item", item))
                else:
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
                if weigh is not None:
                    with gauge:
                        level -= weigh(value)  # type: ignore[arg-type]
                        gauge.notify()
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
        with gauge:
            gauge.notify_all()
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

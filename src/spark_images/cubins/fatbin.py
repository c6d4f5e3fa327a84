"""Fatbin and cubin parsing: bytes in, entries out (pure, no I/O).

Layout facts (see the project's fatbin-format reference): a host shared
object keeps device code in `.nv_fatbin` (and `__nv_relfatbin` for `-rdc`),
each translation unit one fatbin container (magic 0xBA55ED50, 16-byte header)
of entries with 64-byte-or-longer headers naming kind, SM number, a/f variant
flags and compression. Bare `.cubin` files are EM_CUDA ELF objects whose SM
sits in e_flags. Headers locate and name the entries; a cubin counts only
once its payload has been read as an EM_CUDA ELF whose own SM agrees
(`verify_cubin`). Every decompression is capped per entry (`ENTRY_MAX`,
`ENTRY_RATIO`) and per file (`Budget`), reported as `exceeds N`.

Nothing here raises on hostile bytes: problems come back as strings so the
caller can report an `unreadable` entry instead of a traceback.
"""

from __future__ import annotations

import contextlib
import mmap
import re
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from spark_images.core.pieces import Pieces
from spark_images.cubins import elf
from spark_images.cubins.cubin import CubinInfo, cubin_info
from spark_images.cubins.search import Searcher

FATBIN_MAGIC = b"\x50\xed\x55\xba"
FATBIN_HEADER_SIZE = 0x10
# what the search looks for: the magic, version 1 and the 16-byte header size, the three fields
# `_container_header` demands, so no hit is lost; 8 bytes let memmem skip further on each miss
# (3.3 GB/s on incompressible bytes against 1.7-3 GB/s for the 4-byte magic alone)
_CONTAINER_START = FATBIN_MAGIC + b"\x01\x00\x10\x00"
ENTRY_MIN_HEADER = 0x40
ENTRY_MAX_HEADER = 0x1000
ENTRY_MARKER = 0x0101
FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")
# fatbins found by magic outside those sections (CUPTI keeps its own in .rodata-like data):
# reported apart, never counted in a library's verdict
EMBEDDED = "embedded"

KIND_PTX = 1
KIND_CUBIN = 2
KIND_LTOIR = 8
_KIND_NAMES = {KIND_PTX: "ptx", KIND_CUBIN: "cubin", KIND_LTOIR: "ltoir"}

FLAG_LZ4 = 0x2000
FLAG_ZSTD = 0x8000
FLAG_ARCH_SPECIFIC = 0x100000
FLAG_FAMILY = 0x200000

# Caps on one entry's decompressed payload. Real vLLM 0.11-0.33 entries reach 65 MB and a
# ratio of 97:1; zeros or a crafted frame go far beyond, so past these it is not a cubin.
ENTRY_MAX = 256 << 20
ENTRY_RATIO = 512
_RATIO_FLOOR = 1 << 20
# all decompression for one file (verification and kernel listing) together
FILE_BUDGET = 4 << 30
# magic search in windows of this size, releasing mapped pages behind it
_WINDOW = 64 << 20


class PayloadError(ValueError):
    """A payload cannot be decompressed or parsed."""


@dataclass(frozen=True)
class Entry:
    """One fatbin entry: a cubin, PTX or LTO-IR for one target."""

    kind: str  # "cubin" | "ptx" | "ltoir" | "kind<N>"
    sm: int  # 120 for sm_120 / compute_120
    variant: str  # "" plain, "a" arch-specific, "f" family
    compression: str  # "none" | "zstd" | "lz4"
    flags: int
    version: int  # cubin: ELF ABI version; PTX: ISA major*100+minor
    payload_offset: int  # into the buffer the fatbin was parsed from
    stored_size: int  # bytes to slice (exact compressed size when compressed)
    uncompressed_size: int

    @property
    def target(self) -> str:
        prefix = {"cubin": "sm", "ptx": "compute", "ltoir": "lto"}.get(self.kind, self.kind)
        return f"{prefix}_{self.sm}{self.variant}"


@dataclass(frozen=True)
class Fatbin:
    """One fatbin container (usually one translation unit)."""

    offset: int
    size: int
    section: str  # ".nv_fatbin", "__nv_relfatbin", "scan" (found by magic), "file"
    entries: tuple[Entry, ...]
    problem: str = ""


@dataclass(frozen=True)
class BinaryScan:
    """Everything device-related found in one file."""

    kind: str  # "elf" (host object), "cubin" (bare), "fatbin" (bare), "none"
    fatbins: tuple[Fatbin, ...] = ()
    cubin: CubinInfo | None = None
    problems: tuple[str, ...] = field(default_factory=tuple)
    # the section table was not trusted, so the file was searched by magic instead
    warnings: tuple[str, ...] = field(default_factory=tuple)


def _variant_from_flags(flags: int) -> str:
    if flags & FLAG_FAMILY:
        return "f"
    if flags & FLAG_ARCH_SPECIFIC:
        return "a"
    return ""


# an entry header's fields: kind, marker, header size, padded payload size, compressed size,
# (options), version low and high, SM, (8 bytes), flags, (8 bytes), uncompressed size
_ENTRY_HEADER = struct.Struct("<HHIQI4xHHI8xQ8xQ")
# a container header (magic, version, header size, entries size) and its first entry's first fields
_CONTAINER_HEADER = struct.Struct("<4sHHQHHI")
# what the parsers read from: one buffer, or a file's pieces read by slices (`core.pieces`)
Source = memoryview | Pieces
# what a file's scan is given: its bytes, a mapping of them, or its pieces
Buffer = bytes | mmap.mmap | Pieces


def _parse_entry(buf: Source, pos: int, end: int) -> tuple[Entry, int] | str:
    """Entry at `pos`; returns (entry, next_pos) or a problem string."""
    if pos + ENTRY_MIN_HEADER > end:
        return f"entry header at {pos:#x} runs past the container end {end:#x}"
    kind_no, marker, hsize, padded, compressed, ver_lo, ver_hi, sm, flags, uncompressed = _ENTRY_HEADER.unpack(
        buf[pos : pos + ENTRY_MIN_HEADER]
    )
    if marker != ENTRY_MARKER:
        return f"entry at {pos:#x} has marker {marker:#06x}, expected 0x0101"
    if not ENTRY_MIN_HEADER <= hsize <= ENTRY_MAX_HEADER:
        return f"entry at {pos:#x} has implausible header size {hsize:#x}"
    payload = pos + hsize
    nxt = payload + padded
    if nxt > end:
        return f"entry at {pos:#x} declares {padded} payload bytes past the container end"
    if flags & FLAG_ZSTD:
        compression = "zstd"
    elif flags & FLAG_LZ4:
        compression = "lz4"
    else:
        compression = "none"
    stored = compressed if compression != "none" and 0 < compressed <= padded else padded
    kind = _KIND_NAMES.get(kind_no, f"kind{kind_no}")
    version = ver_lo if kind == "cubin" else ver_hi * 100 + ver_lo
    entry = Entry(
        kind=kind,
        sm=sm,
        variant=_variant_from_flags(flags),
        compression=compression,
        flags=flags,
        version=version,
        payload_offset=payload,
        stored_size=stored,
        uncompressed_size=uncompressed,
    )
    return entry, nxt


def _container_header(buf: Source, pos: int) -> int | None:
    """Declared entries size when `pos` holds a consistent container header."""
    if pos + FATBIN_HEADER_SIZE + ENTRY_MIN_HEADER > len(buf):
        return None
    magic, version, hsize, total, kind_no, marker, ehsize = _CONTAINER_HEADER.unpack(buf[pos : pos + _CONTAINER_HEADER.size])
    if magic != FATBIN_MAGIC or version != 1 or hsize != FATBIN_HEADER_SIZE or total == 0:
        return None
    # the first entry must look like one: known kind, the 0x0101 marker, a sane header size
    if kind_no not in _KIND_NAMES or marker != ENTRY_MARKER:
        return None
    if not ENTRY_MIN_HEADER <= ehsize <= ENTRY_MAX_HEADER:
        return None
    return int(total)


def parse_fatbin(buf: Source, pos: int, section: str, limit: int) -> Fatbin | None:
    """The container at `pos` (None when the header is not consistent)."""
    total = _container_header(buf, pos)
    if total is None:
        return None
    start = pos + FATBIN_HEADER_SIZE
    end = start + total
    problem = ""
    if end > limit:
        problem = (
            f"fatbin at {pos:#x} declares {total} bytes of entries but only "
            f"{max(limit - start, 0)} remain"
        )
        end = limit
    entries: list[Entry] = []
    cur = start
    while cur < end:
        if cur + ENTRY_MIN_HEADER > end and not any(buf[cur:end]):
            break  # zero padding at the tail
        got = _parse_entry(buf, cur, end)
        if isinstance(got, str):
            if not any(buf[cur : min(end, cur + ENTRY_MIN_HEADER)]):
                break  # zero padding at the tail
            problem = problem or got
            break
        entry, cur = got
        entries.append(entry)
    return Fatbin(offset=pos, size=end - pos, section=section, entries=tuple(entries), problem=problem)


def release(buf: object, start: int, stop: int) -> None:
    """Drop the pages of a read-only mapping between start and stop from this process.

    They stay in the page cache; the hint only keeps a whole-file search from
    growing resident memory to the size of the file. A no-op for bytes and for
    a mapping marked `keep_pages` (anonymous memory, which has no file behind it).
    """
    if not isinstance(buf, mmap.mmap) or getattr(buf, "keep_pages", False):
        return  # bytes, or anonymous memory (readers.common.AnonymousMap): nothing to read them back from
    page = mmap.PAGESIZE
    lo = start // page * page
    hi = min(stop, len(buf))
    if hi <= lo:
        return
    with contextlib.suppress(OSError, ValueError, AttributeError):
        buf.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


def iter_fatbins(buf: Source, start: int, stop: int, section: str, search: Searcher | None = None) -> Iterator[Fatbin]:
    """Every consistent container in buf[start:stop], found by magic.

    `search`: a Searcher over `buf`'s whole underlying object (scan_binary makes one per file)."""
    if search is None:
        if isinstance(buf, Pieces):
            with Searcher(buf) as own:
                yield from iter_fatbins(buf, start, stop, section, own)
            return
        # search the underlying object (bytes or mmap) directly: no copy, and with an
        # mmap only the pages around each hit are touched (and released window by window)
        source = buf.obj
        whole = isinstance(source, bytes | mmap.mmap) and buf.nbytes == len(source)
        with Searcher(source if whole else bytes(buf)) as own:  # type: ignore[arg-type]
            yield from iter_fatbins(buf, start, stop, section, own)
        return
    raw = search.data
    pos = start
    searched = start
    while pos < stop:
        window = min(stop, pos + _WINDOW)
        hit = search.find(_CONTAINER_START, pos, min(stop, window + len(_CONTAINER_START) - 1))
        if hit < 0:
            release(raw, searched, window)
            searched = pos = window
            continue
        fatbin = parse_fatbin(buf, hit, section, stop)
        if fatbin is None:
            pos = hit + 1
            continue
        yield fatbin
        pos = max(hit + fatbin.size, hit + 1)
        if pos - searched > _WINDOW:
            release(raw, searched, pos)
            searched = pos


class Budget:
    """How many decompressed bytes one file may still cost, and what its cubins parsed to.

    Each cubin entry of the file is decompressed and parsed at most once
    (`parsed_cubin`): the link-stub probe, the proof of the runnable ones and
    the kernel listing read the same entries, and in a big library that was
    tens of thousands of parses done twice.
    """

    def __init__(self, limit: int = FILE_BUDGET) -> None:
        self.limit = limit
        self.left = limit
        self.parsed: dict[int, CubinInfo | Exception] = {}

    def take(self, n: int, what: str) -> None:
        if n > self.left:
            raise PayloadError(f"{what}: exceeds {self.limit >> 20} MiB decompressed for this file")
        self.left -= n


def parsed_cubin(buf: Buffer | memoryview, entry: Entry, budget: Budget | None) -> CubinInfo:
    """`cubin_info` of a cubin entry's payload, remembered in `budget` by payload offset.

    Raises PayloadError (it does not decompress) or elf.ElfError / struct.error (not a cubin),
    the same exception again on a second call."""
    known = budget.parsed.get(entry.payload_offset) if budget is not None else None
    if known is None:
        try:
            with _payload(buf, entry, budget) as payload:
                known = cubin_info(payload)
        except (PayloadError, elf.ElfError, struct.error) as exc:
            known = exc
        if budget is not None:
            budget.parsed[entry.payload_offset] = known
    if isinstance(known, Exception):
        raise known
    return known


def _stored(buf: Buffer | memoryview, entry: Entry) -> memoryview:
    end = entry.payload_offset + entry.stored_size
    if end > len(buf):
        raise PayloadError(f"payload of {entry.target} runs past the end of the data")
    if isinstance(buf, Pieces):
        return memoryview(buf[entry.payload_offset : end])  # joined only where it crosses a seam
    return memoryview(buf)[entry.payload_offset : end]


def _declared_size(raw: memoryview, entry: Entry, budget: Budget | None) -> int:
    """The entry's uncompressed size once it is within the caps (taken from `budget`)."""
    size = entry.uncompressed_size
    what = f"{entry.target} ({entry.compression})"
    if size <= 0:
        raise PayloadError(f"{what}: the header gives no uncompressed size")
    if size > ENTRY_MAX:
        raise PayloadError(f"{what}: exceeds {ENTRY_MAX >> 20} MiB uncompressed (header declares {size} bytes)")
    if size > _RATIO_FLOOR and size > ENTRY_RATIO * max(len(raw), 1):
        raise PayloadError(f"{what}: exceeds {ENTRY_RATIO}:1 compression ({size} bytes from {len(raw)})")
    if budget is not None:
        budget.take(size, what)
    return size


class _Scratch(threading.local):
    """One zstd context and one output buffer per thread, reused by every proof.

    A big library holds hundreds of zstd cubins (libtorch_cuda: 450, 1 GB out of
    56 MB); a fresh context and a fresh output each time cost an allocation of
    the context's window and page faults on every new buffer. Buffers above
    `KEEP` are not kept, so an idle scanner holds at most that much. A buffer is
    anonymous memory, not a bytearray: a bytearray is zeroed when it is made, with
    the GIL held (0.2 s a gather of the real cu130 archive, while the inflating
    thread waited), where a mapping's pages are zeroed as zstd first writes them,
    without it.
    """

    KEEP = 64 << 20

    def __init__(self) -> None:
        self.zstd: Any = None
        self.buffer = _fresh(0)

    def output(self, size: int) -> mmap.mmap:
        if len(self.buffer) >= size:
            return self.buffer
        if size > self.KEEP:
            return _fresh(size)
        # grown at least twofold: cubins come in every size, and growing to each larger one
        # zeroed a fresh buffer (290 MB of fresh pages over the cu130 image's proofs)
        self.buffer = _fresh(max(size, min(2 * len(self.buffer), self.KEEP)))
        return self.buffer


def _fresh(size: int) -> mmap.mmap:
    """`size` bytes of private anonymous memory (one page at least: mmap cannot map none)."""
    return mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


_scratch = _Scratch()


@contextlib.contextmanager
def _payload(buf: Buffer | memoryview, entry: Entry, budget: Budget | None) -> Iterator[memoryview | bytes]:
    """The entry's payload within the caps, valid inside the block; PayloadError when it cannot be.

    Stored plain, it is a view of `buf`; zstd is inflated into this thread's
    scratch buffer, so nothing of it may outlive the block."""
    raw = _stored(buf, entry)
    if entry.compression == "none":
        yield raw
        return
    size = _declared_size(raw, entry, budget)
    what = f"{entry.target} ({entry.compression})"
    if entry.compression == "zstd":
        if _scratch.zstd is None:
            import zstandard

            _scratch.zstd = zstandard.ZstdDecompressor()
        # one byte past the declared size is room enough to see a frame that claims more
        with memoryview(_scratch.output(size + 1))[: size + 1] as view:
            try:
                got = _scratch.zstd.stream_reader(raw).readinto(view)
            except Exception as exc:  # zstandard raises its own error types
                raise PayloadError(f"{what}: payload is corrupt ({exc})") from exc
            _check_length(what, got, size)
            with view[:size] as payload:
                yield payload
        return
    try:
        import lz4.block

        out = lz4.block.decompress(bytes(raw), uncompressed_size=size)
    except Exception as exc:  # lz4 raises its own error types
        raise PayloadError(f"{what}: payload is corrupt ({exc})") from exc
    _check_length(what, len(out), size)
    yield out


def _check_length(what: str, got: int, size: int) -> None:
    if got != size:
        raise PayloadError(f"{what}: decompresses to {got}{'+' if got > size else ''} bytes, the header says {size}")


def decompress_payload(
    buf: Buffer | memoryview, entry: Entry, budget: Budget | None = None
) -> bytes:
    """The entry's payload, decompressed within the caps, as bytes of its own; PayloadError when it cannot be."""
    with _payload(buf, entry, budget) as payload:
        return bytes(payload)


def verify_cubin(
    buf: Buffer | memoryview, entry: Entry, budget: Budget | None = None
) -> CubinInfo:
    """The cubin inside a cubin entry, proven to be what the header says; PayloadError if not.

    The payload must decompress, be an EM_CUDA ELF, and carry in its own ELF
    header the SM the fatbin header names. A variant the ELF shows (`a` from
    e_flags or `.nv.compat`, `f` from the ptxas command line) must match too:
    an arch-specific sm_120a cubin relabelled as family sm_120f would otherwise
    look as if it ran on sm_121.
    """
    try:
        info = parsed_cubin(buf, entry, budget)
    except (elf.ElfError, struct.error) as exc:
        raise PayloadError(f"{entry.target}: payload is not a readable cubin ({exc})") from exc
    if info.sm != entry.sm:
        raise PayloadError(
            f"{entry.target}: the fatbin header says sm_{entry.sm} but the cubin's ELF header says {info.target}"
        )
    if info.variant and info.variant != entry.variant:
        raise PayloadError(f"{entry.target}: the fatbin header says {entry.target} but the cubin is {info.target}")
    return info


_PTX_ENTRY = re.compile(rb"\.entry\s+([A-Za-z_$%][\w$%]*)")


def entry_kernels(
    buf: Buffer | memoryview, entry: Entry, budget: Budget | None = None
) -> tuple[str, ...]:
    """Kernel names in one entry (cubin `.text.*`, PTX `.entry`); () for LTO-IR."""
    if entry.kind == "ptx":
        payload = decompress_payload(buf, entry, budget)
        return tuple(sorted({m.decode("ascii", "replace") for m in _PTX_ENTRY.findall(payload)}))
    if entry.kind != "cubin":
        return ()
    try:
        return parsed_cubin(buf, entry, budget).kernels
    except (elf.ElfError, struct.error) as exc:
        raise PayloadError(f"{entry.target}: cubin payload is not a readable ELF ({exc})") from exc


STUB_PROBE_LIMIT = 64 << 10


def is_link_stub(buf: Buffer | memoryview, fatbin: Fatbin, budget: Budget | None = None) -> bool:
    """A fatbin with nothing to launch: only small cubins, none holding a kernel (`.text.*`).

    CUDA 13 `nvcc -shared` adds such a device-link fatbin per library, listing
    the same targets as the real code; units without any __global__ function
    look the same. Counting them would make libraries look worse (or better)
    than the code that can actually run.
    """
    entries = fatbin.entries
    if not entries:
        return False
    # the headers first: one PTX or big cubin decides without decompressing anything
    for entry in entries:
        if entry.kind != "cubin":
            return False
        size = entry.uncompressed_size if entry.compression != "none" else entry.stored_size
        if size > STUB_PROBE_LIMIT:
            return False
    for entry in entries:
        try:
            if entry_kernels(buf, entry, budget):
                return False
        except PayloadError:
            return False
    return True


def scan_binary(data: Buffer) -> BinaryScan:
    """Find the device code in one file's bytes; never raises on bad input."""
    with Searcher(data) as search:
        return _scan_binary(data, search)


def _scan_binary(data: Buffer, search: Searcher) -> BinaryScan:
    view = data if isinstance(data, Pieces) else memoryview(data)
    if not elf.is_elf(data):
        if data[:4] == FATBIN_MAGIC:
            fatbins = tuple(iter_fatbins(view, 0, len(data), "file", search))
            return BinaryScan(kind="fatbin", fatbins=fatbins, problems=_fatbin_problems(fatbins))
        return BinaryScan(kind="none")
    try:
        hdr = elf.read_header(data)
    except (elf.ElfError, struct.error) as exc:
        return BinaryScan(kind="none", problems=(str(exc),))
    if hdr.machine == elf.EM_CUDA:
        try:
            return BinaryScan(kind="cubin", cubin=cubin_info(bytes(data) if isinstance(data, Pieces) else data))
        except (elf.ElfError, struct.error) as exc:
            return BinaryScan(kind="cubin", problems=(f"unreadable cubin: {exc}",))
    problems: list[str] = []
    secs, warnings = _trusted_sections(data, hdr)
    if secs:
        found: list[Fatbin] = []
        spans = sorted((sec.offset, sec.offset + sec.size) for sec in secs
                       if sec.name in FATBIN_SECTIONS and sec.type != elf.SHT_NOBITS)  # fmt: skip
        for sec in secs:
            if sec.name in FATBIN_SECTIONS and sec.type != elf.SHT_NOBITS:
                found.extend(iter_fatbins(view, sec.offset, sec.offset + sec.size, sec.name, search))
        # the rest of the file, searched by magic: a fatbin anywhere else is seen too
        for lo, hi in _gaps(spans, len(data)):
            found.extend(iter_fatbins(view, lo, hi, EMBEDDED, search))
        fatbins = tuple(found)
    else:
        # no section headers (stripped, or untrusted): accept consistent magic hits only
        fatbins = tuple(iter_fatbins(view, 0, len(data), "scan", search))
    problems.extend(_fatbin_problems(fatbins))
    return BinaryScan(kind="elf", fatbins=fatbins, problems=tuple(problems), warnings=warnings)


def _trusted_sections(data: Buffer | elf.Sliceable, hdr: elf.ElfHeader) -> tuple[list[elf.Section] | None, tuple[str, ...]]:
    """A host library's sections, or None (and the warning) where its table cannot be trusted."""
    try:
        secs = elf.sections(data, hdr)
        for sec in secs:
            stop = sec.offset + sec.size
            if sec.name in FATBIN_SECTIONS and sec.type != elf.SHT_NOBITS and stop > len(data):
                raise elf.ElfError(f"section {sec.name} ends at {stop}, past the end of the file ({len(data)} bytes)")
    except (elf.ElfError, struct.error) as exc:
        # a table that lies could hide device code: never read that as "no GPU code"
        return None, (f"section table cannot be trusted ({exc}); searched the whole file for fatbins instead",)
    return secs, ()


def magic_free_scan(data: Buffer | elf.Sliceable, hdr: elf.ElfHeader) -> BinaryScan:
    """`scan_binary` of a host ELF library (not EM_CUDA; `hdr` read) in which the container magic
    occurs nowhere: no fatbin can be found by any search, so what it says rests on the section
    table alone, read from the few places of `data` it names (header, table, name table)."""
    _secs, warnings = _trusted_sections(data, hdr)
    return BinaryScan(kind="elf", warnings=warnings)


def _gaps(spans: list[tuple[int, int]], size: int) -> Iterator[tuple[int, int]]:
    """The parts of [0, size) outside the sorted `spans`."""
    pos = 0
    for lo, hi in spans:
        if lo > pos:
            yield pos, lo
        pos = max(pos, hi)
    if pos < size:
        yield pos, size


def _fatbin_problems(fatbins: tuple[Fatbin, ...]) -> tuple[str, ...]:
    # an embedded hit that runs past its region is listed with its problem, not an unreadable file
    return tuple(f.problem for f in fatbins if f.problem and f.section != EMBEDDED)

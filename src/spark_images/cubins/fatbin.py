"""Fatbin and cubin parsing: bytes in, entries out (pure, no I/O).

Layout facts (see the project's fatbin-format reference): a host shared
object keeps device code in `.nv_fatbin` (and `__nv_relfatbin` for `-rdc`),
each translation unit one fatbin container (magic 0xBA55ED50, 16-byte header)
of entries with 64-byte-or-longer headers naming kind, SM number, a/f variant
flags and compression. Bare `.cubin` files are EM_CUDA ELF objects whose SM
sits in e_flags. Detection reads cleartext headers only; payloads are
decompressed (zstd or raw LZ4 blocks) only to list kernel names.

Nothing here raises on hostile bytes: problems come back as strings so the
caller can report an `unreadable` entry instead of a traceback.
"""

from __future__ import annotations

import mmap
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

from spark_images.cubins import elf

FATBIN_MAGIC = b"\x50\xed\x55\xba"
FATBIN_HEADER_SIZE = 0x10
ENTRY_MIN_HEADER = 0x40
ENTRY_MAX_HEADER = 0x1000
ENTRY_MARKER = 0x0101
FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")

KIND_PTX = 1
KIND_CUBIN = 2
KIND_LTOIR = 8
_KIND_NAMES = {KIND_PTX: "ptx", KIND_CUBIN: "cubin", KIND_LTOIR: "ltoir"}

FLAG_LZ4 = 0x2000
FLAG_ZSTD = 0x8000
FLAG_ARCH_SPECIFIC = 0x100000
FLAG_FAMILY = 0x200000

# A decompressed payload larger than this is a lie in the header, not a cubin.
MAX_UNCOMPRESSED = 1 << 31


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
class CubinInfo:
    """What a cubin's own ELF says about itself."""

    sm: int
    variant: str
    abi_version: int
    kernels: tuple[str, ...]
    tool: str  # "ptxas", "nvlink" or ""

    @property
    def target(self) -> str:
        return f"sm_{self.sm}{self.variant}"


@dataclass(frozen=True)
class BinaryScan:
    """Everything device-related found in one file."""

    kind: str  # "elf" (host object), "cubin" (bare), "fatbin" (bare), "none"
    fatbins: tuple[Fatbin, ...] = ()
    cubin: CubinInfo | None = None
    problems: tuple[str, ...] = field(default_factory=tuple)


def _variant_from_flags(flags: int) -> str:
    if flags & FLAG_FAMILY:
        return "f"
    if flags & FLAG_ARCH_SPECIFIC:
        return "a"
    return ""


def _parse_entry(buf: memoryview, pos: int, end: int) -> tuple[Entry, int] | str:
    """Entry at `pos`; returns (entry, next_pos) or a problem string."""
    if pos + ENTRY_MIN_HEADER > end:
        return f"entry header at {pos:#x} runs past the container end {end:#x}"
    kind_no, marker, hsize = struct.unpack_from("<HHI", buf, pos)
    padded = struct.unpack_from("<Q", buf, pos + 0x08)[0]
    compressed, _options = struct.unpack_from("<II", buf, pos + 0x10)
    ver_lo, ver_hi, sm = struct.unpack_from("<HHI", buf, pos + 0x18)
    flags = struct.unpack_from("<Q", buf, pos + 0x28)[0]
    uncompressed = struct.unpack_from("<Q", buf, pos + 0x38)[0]
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


def _container_header(buf: memoryview, pos: int) -> int | None:
    """Declared entries size when `pos` holds a consistent container header."""
    if pos + FATBIN_HEADER_SIZE + ENTRY_MIN_HEADER > len(buf):
        return None
    magic, version, hsize, total = struct.unpack_from("<4sHHQ", buf, pos)
    if magic != FATBIN_MAGIC or version != 1 or hsize != FATBIN_HEADER_SIZE or total == 0:
        return None
    # the first entry must look like one: known kind, the 0x0101 marker, a sane header size
    kind_no, marker, ehsize = struct.unpack_from("<HHI", buf, pos + FATBIN_HEADER_SIZE)
    if kind_no not in _KIND_NAMES or marker != ENTRY_MARKER:
        return None
    if not ENTRY_MIN_HEADER <= ehsize <= ENTRY_MAX_HEADER:
        return None
    return int(total)


def parse_fatbin(buf: memoryview, pos: int, section: str, limit: int) -> Fatbin | None:
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


def iter_fatbins(buf: memoryview, start: int, stop: int, section: str) -> Iterator[Fatbin]:
    """Every consistent container in buf[start:stop], found by magic."""
    # search the underlying object (bytes or mmap) directly: no copy, and with an
    # mmap only the pages around each hit are touched
    source = buf.obj
    whole = isinstance(source, bytes | mmap.mmap) and buf.nbytes == len(source)
    raw: bytes | mmap.mmap = source if whole else bytes(buf)  # type: ignore[assignment]
    pos = start
    while True:
        hit = raw.find(FATBIN_MAGIC, pos, stop)
        if hit < 0:
            return
        fatbin = parse_fatbin(buf, hit, section, stop)
        if fatbin is None:
            pos = hit + 1
            continue
        yield fatbin
        pos = max(hit + fatbin.size, hit + 1)


def _cuda_variant(data: bytes | memoryview, hdr: elf.ElfHeader, secs: list[elf.Section]) -> str:
    if hdr.abi_version == 7:
        return "a" if hdr.flags & 0x800 else ""
    by_name = {s.name: s for s in secs}
    tkinfo = by_name.get(".note.nv.tkinfo")
    if tkinfo is not None:
        text = bytes(elf.section_bytes(data, tkinfo))
        match = re.search(rb"-arch[ =]+sm_(\d+)([af]?)", text)
        if match and match.group(2) == b"f":
            return "f"
    compat = by_name.get(".nv.compat")
    if compat is not None and _compat_attr(bytes(elf.section_bytes(data, compat)), 0x09) == 1:
        return "a"
    if hdr.flags & 0x8:  # CUDA 12.9 marks 'a' here on ABI 8
        return "a"
    return ""


def _compat_attr(blob: bytes, wanted: int) -> int | None:
    """Value of one attribute in `.nv.compat` (nv.info-style records)."""
    pos = 0
    while pos + 4 <= len(blob):
        fmt, attr = blob[pos], blob[pos + 1]
        if fmt == 4:
            size = struct.unpack_from("<H", blob, pos + 2)[0]
            value = None
            step = 4 + size
        elif fmt in (1, 2, 3):
            value = blob[pos + 2] if fmt == 2 else struct.unpack_from("<H", blob, pos + 2)[0]
            step = 4
        else:
            return None
        if attr == wanted and value is not None:
            return int(value)
        pos += step
    return None


def cubin_info(data: bytes | memoryview | mmap.mmap) -> CubinInfo:
    """SM, variant, kernels and producing tool of a cubin; raises elf.ElfError."""
    hdr = elf.read_header(data)
    if hdr.machine != elf.EM_CUDA:
        raise elf.ElfError(f"ELF machine {hdr.machine} is not EM_CUDA (190)")
    secs = elf.sections(data, hdr)
    if hdr.abi_version == 7:
        sm = hdr.flags & 0xFF
    elif hdr.abi_version == 8:
        sm = (hdr.flags >> 8) & 0xFF
    else:
        raise elf.ElfError(f"cubin ELF ABI version {hdr.abi_version} is unknown (expected 7 or 8)")
    kernels = tuple(sorted(s.name[len(".text.") :] for s in secs if s.name.startswith(".text.")))
    tool = ""
    for s in secs:
        if s.name == ".note.nv.tkinfo":
            blob = bytes(elf.section_bytes(data, s))
            tool = "nvlink" if b"nvlink" in blob else "ptxas" if b"ptxas" in blob else ""
    return CubinInfo(
        sm=sm,
        variant=_cuda_variant(data, hdr, secs),
        abi_version=hdr.abi_version,
        kernels=kernels,
        tool=tool,
    )


def decompress_payload(buf: bytes | memoryview | mmap.mmap, entry: Entry) -> bytes:
    """The entry's payload, decompressed; PayloadError when it cannot be."""
    end = entry.payload_offset + entry.stored_size
    if end > len(buf):
        raise PayloadError(f"payload of {entry.target} runs past the end of the data")
    raw = bytes(memoryview(buf)[entry.payload_offset : end])
    if entry.compression == "none":
        return raw
    if not 0 < entry.uncompressed_size <= MAX_UNCOMPRESSED:
        raise PayloadError(
            f"{entry.target}: implausible uncompressed size {entry.uncompressed_size}"
        )
    try:
        if entry.compression == "zstd":
            import zstandard

            out = zstandard.ZstdDecompressor().decompress(
                raw, max_output_size=entry.uncompressed_size
            )
        else:
            import lz4.block

            out = lz4.block.decompress(raw, uncompressed_size=entry.uncompressed_size)
    except Exception as exc:  # both libraries raise their own error types
        raise PayloadError(f"{entry.target}: {entry.compression} payload is corrupt ({exc})") from exc
    return bytes(out)


_PTX_ENTRY = re.compile(rb"\.entry\s+([A-Za-z_$%][\w$%]*)")


def entry_kernels(buf: bytes | memoryview | mmap.mmap, entry: Entry) -> tuple[str, ...]:
    """Kernel names in one entry (cubin `.text.*`, PTX `.entry`); () for LTO-IR."""
    if entry.kind not in ("cubin", "ptx"):
        return ()
    payload = decompress_payload(buf, entry)
    if entry.kind == "ptx":
        return tuple(sorted({m.decode("ascii", "replace") for m in _PTX_ENTRY.findall(payload)}))
    try:
        return cubin_info(payload).kernels
    except (elf.ElfError, struct.error) as exc:
        raise PayloadError(f"{entry.target}: cubin payload is not a readable ELF ({exc})") from exc


STUB_PROBE_LIMIT = 64 << 10


def is_link_stub(buf: bytes | memoryview | mmap.mmap, fatbin: Fatbin) -> bool:
    """A fatbin with nothing to launch: only small cubins, none holding a kernel (`.text.*`).

    CUDA 13 `nvcc -shared` adds such a device-link fatbin per library, listing
    the same targets as the real code; units without any __global__ function
    look the same. Counting them would make libraries look worse (or better)
    than the code that can actually run.
    """
    if not fatbin.entries:
        return False
    for entry in fatbin.entries:
        if entry.kind != "cubin":
            return False
        size = entry.uncompressed_size if entry.compression != "none" else entry.stored_size
        if size > STUB_PROBE_LIMIT:
            return False
        try:
            if entry_kernels(buf, entry):
                return False
        except PayloadError:
            return False
    return True


Buffer = bytes | mmap.mmap


def scan_binary(data: Buffer) -> BinaryScan:
    """Find the device code in one file's bytes; never raises on bad input."""
    view = memoryview(data)
    if not elf.is_elf(data):
        if data[:4] == FATBIN_MAGIC:
            fatbins = tuple(iter_fatbins(view, 0, len(data), "file"))
            return BinaryScan(kind="fatbin", fatbins=fatbins, problems=_fatbin_problems(fatbins))
        return BinaryScan(kind="none")
    try:
        hdr = elf.read_header(data)
    except (elf.ElfError, struct.error) as exc:
        return BinaryScan(kind="none", problems=(str(exc),))
    if hdr.machine == elf.EM_CUDA:
        try:
            return BinaryScan(kind="cubin", cubin=cubin_info(data))
        except (elf.ElfError, struct.error) as exc:
            return BinaryScan(kind="cubin", problems=(f"unreadable cubin: {exc}",))
    problems: list[str] = []
    try:
        secs = elf.sections(data, hdr)
    except (elf.ElfError, struct.error) as exc:
        problems.append(f"section headers unreadable ({exc}); searched the whole file by magic")
        secs = []
    if secs:
        found: list[Fatbin] = []
        for sec in secs:
            if sec.name not in FATBIN_SECTIONS:
                continue
            stop = sec.offset + sec.size
            if stop > len(data):
                problems.append(
                    f"section {sec.name} ends at {stop}, past the end of the file ({len(data)} bytes)"
                )
                stop = len(data)
            found.extend(iter_fatbins(view, sec.offset, stop, sec.name))
        fatbins = tuple(found)
    else:
        # no section headers (stripped, or unreadable): accept consistent magic hits only
        fatbins = tuple(iter_fatbins(view, 0, len(data), "scan"))
    problems.extend(_fatbin_problems(fatbins))
    return BinaryScan(kind="elf", fatbins=fatbins, problems=tuple(problems))


def _fatbin_problems(fatbins: tuple[Fatbin, ...]) -> tuple[str, ...]:
    return tuple(f.problem for f in fatbins if f.problem)

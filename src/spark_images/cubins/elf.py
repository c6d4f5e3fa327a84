"""Just enough ELF64 to find sections by name (pure, bounds-checked).

Used for host shared objects (to find `.nv_fatbin` / `__nv_relfatbin`) and for
device cubins (EM_CUDA, to read `.text.*`, `.nv.compat`, `.note.nv.tkinfo`).
Every offset read from the file is checked against the buffer, so a truncated
or lying file raises `ElfError`, never IndexError or a silent wrong answer.
"""

from __future__ import annotations

import re
import struct
from itertools import accumulate, count
from operator import add, itemgetter
from typing import NamedTuple, Protocol

ELF_MAGIC = b"\x7fELF"
EM_CUDA = 190
_MAX_SECTIONS = 1 << 20


class ElfError(ValueError):
    """The bytes are not a readable ELF64 little-endian file."""


class Sliceable(Protocol):
    """What `sections` reads of a file: its length and slices of it (bytes, a mapping, or pieces)."""

    def __len__(self) -> int: ...

    def __getitem__(self, key: slice, /) -> bytes | memoryview: ...


class Section(NamedTuple):
    # a tuple, not a frozen dataclass: a flashinfer-cubin wheel has ~13k cubins of dozens of
    # sections each, and a frozen dataclass's __init__ was a tenth of a whole image check
    name: str
    type: int
    offset: int
    size: int


class ElfHeader(NamedTuple):
    # a tuple, like Section: every cubin of a scan reads one (20k in a vLLM image)
    osabi: int
    abi_version: int
    machine: int
    flags: int
    shoff: int
    shentsize: int
    shnum: int
    shstrndx: int


def is_elf(data: bytes | memoryview) -> bool:
    return bytes(data[:4]) == ELF_MAGIC


# e_ident (magic, class, data, version, osabi, abiversion, padding), then e_type, e_machine,
# e_version, e_entry, e_phoff, e_shoff, e_flags, e_ehsize, e_phentsize, e_phnum, e_shentsize,
# e_shnum, e_shstrndx: the whole 64-byte ELF64 header in one unpack
_EHDR = struct.Struct("<4sBBxBB7x2xH4x8x8xQI6xHHH")


def read_header(data: bytes | memoryview | Sliceable) -> ElfHeader:
    if len(data) < 64:
        raise ElfError("not an ELF file (bad magic or shorter than an ELF header)")
    magic, cls, encoding, osabi, abi, machine, shoff, flags, shentsize, shnum, shstrndx = _EHDR.unpack(data[:64])
    if magic != ELF_MAGIC:
        raise ElfError("not an ELF file (bad magic or shorter than an ELF header)")
    if cls != 2 or encoding != 1:
        raise ElfError("not a 64-bit little-endian ELF file")
    return ElfHeader(osabi, abi, machine, flags, shoff, shentsize, shnum, shstrndx)


_SHDR = struct.Struct("<II16xQQ")  # sh_name, sh_type, (sh_flags, sh_addr), sh_offset, sh_size
_SHDR64 = struct.Struct("<II16xQQ24x")  # the same, padded to the 64-byte entry
_FIRST = itemgetter(0)


def sections(
    data: bytes | memoryview | Sliceable, header: ElfHeader | None = None, names: re.Pattern[bytes] | None = None
) -> list[Section]:
    """All sections with names; [] when the section header table is stripped.

    `names`: keep only the sections whose whole name is group 1 of a match. One
    pass of the pattern over the name table finds where each wanted name starts
    (inside a shared suffix too: ".text.k" in ".rela.text.k"), so no other name
    is decoded: a cubin has dozens of sections and a flashinfer wheel 13k cubins,
    and the inspector needs three kinds. Matches do not overlap, so the pattern
    must be one whose names cannot start inside each other.
    """
    hdr = header or read_header(data)
    if hdr.shoff == 0 or hdr.shnum == 0:
        return []
    if hdr.shentsize < 64:
        raise ElfError(f"section header entry size {hdr.shentsize} is smaller than 64")
    shnum = hdr.shnum
    if shnum > _MAX_SECTIONS:
        raise ElfError(f"section count {shnum} is implausible")
    end = hdr.shoff + shnum * hdr.shentsize
    if end > len(data):
        raise ElfError(
            f"section header table ends at {end}, past the end of the file ({len(data)} bytes)"
        )
    # name, type, offset, size of each entry (flags and addr skipped), from one copy of the table
    table = bytes(data[hdr.shoff : end])
    if hdr.shentsize == 64:
        raw = list(_SHDR64.iter_unpack(table))
    else:
        raw = [_SHDR.unpack_from(table, i * hdr.shentsize) for i in range(shnum)]
    if hdr.shstrndx >= shnum:
        raise ElfError(f"section name table index {hdr.shstrndx} out of range")
    _, _, str_off, str_size = raw[hdr.shstrndx]
    if str_off + str_size > len(data):
        raise ElfError("section name table lies past the end of the file")
    strtab = bytes(data[str_off : str_off + str_size])
    limit = len(strtab)
    worst = max(map(_FIRST, raw)) if raw else 0
    if worst and worst >= limit:
        # a name pointing outside the table: the table cannot be trusted to find anything
        raise ElfError(f"section name offset {worst} is outside the {limit}-byte name table")
    if names is not None:
        found = {m.start(): m.group(1) for m in names.finditer(strtab)}
        return [Section(found[off].decode("utf-8", "replace"), kind, at, size) for off, kind, at, size in raw if off in found]
    # every name that starts a string of the table, found in one split; an offset into the
    # middle of a string (a shared suffix: ".text.k" inside ".rela.text.k") is cut out on demand
    parts = strtab.split(b"\0")
    offsets = map(add, accumulate(map(len, parts), initial=0), count())  # string i starts at len(0..i-1) + i
    starts = dict(zip(offsets, parts, strict=False))  # offsets has one more: the end of the table
    return [
        Section((starts[off] if off in starts else _name_inside(strtab, off)).decode("utf-8", "replace"), kind, at, size)
        for off, kind, at, size in raw
    ]


def _name_inside(strtab: bytes, offset: int) -> bytes:
    end = strtab.find(b"\0", offset)
    return strtab[offset : end if end >= 0 else None]


SHT_NOBITS = 8


def section_bytes(data: bytes | memoryview, section: Section) -> memoryview:
    """The section's contents; ElfError when they lie past the end of the file."""
    if section.type == SHT_NOBITS:
        return memoryview(b"")
    end = section.offset + section.size
    if end > len(data):
        raise ElfError(
            f"section {section.name} ends at {end}, past the end of the file ({len(data)} bytes)"
        )
    return memoryview(data)[section.offset : end]

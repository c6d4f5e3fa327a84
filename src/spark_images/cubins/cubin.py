"""What a cubin's own ELF says about itself: SM, variant, kernels, producing tool (pure).

Facts (see the project's fatbin-format reference): `e_machine` is EM_CUDA
(190); ELF ABI 8 keeps the SM in bits 8-15 of `e_flags`, ABI 7 in the low
byte with 'a' as 0x800; CUDA 12.9 marks 'a' on ABI 8 with 0x8, CUDA 13 only
in `.nv.compat` attribute 0x09, and 'f' shows only in the ptxas command line
kept in `.note.nv.tkinfo`. This is the evidence a verdict rests on: the
fatbin entry header alone proves nothing.
"""

from __future__ import annotations

import mmap
import re
import struct
from dataclasses import dataclass

from spark_images.cubins import elf


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


# the sections a verdict reads: kernels (.text.NAME), the producing tool, the 'a' attribute
_WANTED_SECTIONS = re.compile(rb"(\.(?:text\.[^\0]*|note\.nv\.tkinfo(?![^\0])|nv\.compat(?![^\0])))")


_ARCH_FLAG = re.compile(rb"-arch[ =]+sm_(\d+)([af]?)")


def _cuda_variant(hdr: elf.ElfHeader, tkinfo: bytes | None, compat: bytes | None) -> str:
    if hdr.abi_version == 7:
        return "a" if hdr.flags & 0x800 else ""
    if tkinfo is not None:
        match = _ARCH_FLAG.search(tkinfo)
        if match and match.group(2) == b"f":
            return "f"
    if compat is not None and _compat_attr(compat, 0x09) == 1:
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
    secs = elf.sections(data, hdr, _WANTED_SECTIONS)
    if hdr.abi_version == 7:
        sm = hdr.flags & 0xFF
    elif hdr.abi_version == 8:
        sm = (hdr.flags >> 8) & 0xFF
    else:
        raise elf.ElfError(f"cubin ELF ABI version {hdr.abi_version} is unknown (expected 7 or 8)")
    kernels: list[str] = []
    tkinfo: bytes | None = None
    compat_section: elf.Section | None = None
    for sec in secs:  # the last of each name counts, as a by-name lookup would have it
        name = sec.name
        if name[:6] == ".text.":
            kernels.append(name[6:])
        elif name == ".note.nv.tkinfo":
            tkinfo = bytes(elf.section_bytes(data, sec))
        elif name == ".nv.compat":
            compat_section = sec
    compat = None if compat_section is None else bytes(elf.section_bytes(data, compat_section))
    tool = "" if tkinfo is None else "nvlink" if b"nvlink" in tkinfo else "ptxas" if b"ptxas" in tkinfo else ""
    kernels.sort()
    return CubinInfo(
        sm=sm,
        variant=_cuda_variant(hdr, tkinfo, compat),
        abi_version=hdr.abi_version,
        kernels=tuple(kernels),
        tool=tool,
    )

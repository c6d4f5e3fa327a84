"""The cubin scan's sieve: which big libraries it needs the bytes of (pure, no I/O).

A host ELF library in which the fatbin container magic occurs nowhere holds
no device code that any search could find: `fatbin.scan_binary` would search
it whole, find no hit, and answer from its ELF header and section table alone
(a table that cannot be trusted makes a warning). 2.5 GiB of the real cu130
image are such libraries (libtriton, libtorch_cpu, the MLIR and LLVM
builds). `HostLibrarySieve` is shown each one's pieces as a layer reader
streams them, searches every piece and every seam between two for the magic,
and answers with that same `BinaryScan` from the three places of the file
that the section table names, so the reader need not copy the library into
memory at all. A magic seen, a file that is not a host ELF library, or a
header that cannot be read asks for the bytes: the sieve can only ever spare
the reading of a file in which there is nothing to find. A host library then
comes as the pieces it was inflated in (`core.pieces.Pieces`), which the scan
reads by slices and searches seam by seam (`takes_pieces`): copying the 46
libraries with device code of the real cu130 image (3.47 GiB) into one buffer
each was 14% of the walk's thread. Anything else is spooled whole, as before.
Layers read from a file on disk are sifted; a download is not (the held
chunks would raise the registry check's peak RSS).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

from spark_images.core.pieces import Pieces
from spark_images.cubins import elf
from spark_images.cubins.fatbin import _CONTAINER_START, BinaryScan, magic_free_scan
from spark_images.cubins.search import holds

_SEAM = len(_CONTAINER_START) - 1  # a magic across two pieces has at most this much in each
_HEAD = 64  # an ELF64 header


class _Run:
    """One library's pieces: asks for the bytes as soon as they could matter (`needs_bytes`)."""

    def __init__(self) -> None:
        self.head = b""
        self.header: elf.ElfHeader | None = None
        self.tail = b""

    def needs_bytes(self, view: memoryview) -> bool:
        if self.header is None:
            self.head += bytes(view[: _HEAD - len(self.head)])
            if len(self.head) == _HEAD and not self._host_library():
                return True
        seam = self.tail + bytes(view[:_SEAM])
        if _CONTAINER_START in seam or holds(view, _CONTAINER_START):
            return True
        self.tail = (self.tail + bytes(view[-_SEAM:]))[-_SEAM:]
        return False

    def _host_library(self) -> bool:
        if not elf.is_elf(self.head):
            return False  # a bare fatbin, or no ELF at all: the scan decides from the bytes
        try:
            header = elf.read_header(self.head)
        except (elf.ElfError, struct.error):
            return False  # its problem is the scan's to report
        if header.machine == elf.EM_CUDA:
            return False  # a bare cubin: its payload is what the scan reads
        self.header = header
        return True

    def summary(self, views: Sequence[memoryview], size: int) -> BinaryScan | None:
        if self.header is None:
            return None  # shorter than an ELF header: never one
        with Pieces(views) as pieces:
            return magic_free_scan(pieces, self.header)

    def takes_pieces(self) -> bool:
        # a host ELF library's scan reads slices and searches (`fatbin.scan_binary` of `Pieces`);
        # anything else (a bare cubin or fatbin, no ELF at all) is read from one buffer
        return self.header is not None


class HostLibrarySieve:
    """`readers.common.Sieve` for the cubin scan: members whose path `sifts` says (the candidates no
    other reader of the pass needs whole) may come as their `BinaryScan` instead of their bytes."""

    def __init__(self, sifts: Callable[[str], bool]) -> None:
        self._sifts = sifts

    def sifts(self, path: str) -> bool:
        return self._sifts(path)

    def start(self) -> _Run:
        return _Run()

"""The fatbin magic search over a whole library: libc `memmem`, with `find` as the fallback (pure, no I/O).

The search runs over every host byte of every big library (a fatbin hidden
outside `.nv_fatbin` must still be seen), so its speed is the scan's. On
incompressible bytes (packed data, compressed payloads) CPython's `find`
for a 4-byte needle runs at ~1.3 GB/s; glibc's `memmem` at ~3 GB/s (and
faster still on machine code), and a foreign call through ctypes gives up
the GIL, so the layer's decompression and hashing threads run meanwhile.
Where libc has no `memmem` (or the buffer's address cannot be had), the
buffer's own `find` answers, with the same result.
"""

from __future__ import annotations

import mmap

from spark_images.core.buffers import MEMMEM, Exported, find_bounds
from spark_images.core.pieces import Pieces


class Searcher:
    """`find(needle, start, stop)` over one bytes or mmap object (or a file's `Pieces`), as
    `bytes.find` answers it.

    Holds the buffer exported for its lifetime (an mmap cannot be closed
    meanwhile, so the address stays valid); use it as a context manager.
    """

    def __init__(self, data: bytes | mmap.mmap | Pieces) -> None:
        self.data = data
        self._held: Exported | None = None
        self._base = 0
        if MEMMEM is None or len(data) == 0 or isinstance(data, Pieces):
            return
        held = Exported(data)
        if not held.address:
            held.close()
            return
        self._held, self._base = held, held.address

    def __enter__(self) -> Searcher:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._held is not None:
            self._held.close()
            self._held = None

    def find(self, needle: bytes, start: int, stop: int) -> int:
        start, stop = find_bounds(len(self.data), start, stop)
        if stop - start < len(needle):
            return -1
        if not needle:
            return start
        if self._held is None:  # set only where memmem exists (a file's pieces search themselves)
            return self.data.find(needle, start, stop)
        hit = MEMMEM(self._base + start, stop - start, needle, len(needle))
        return -1 if hit is None else int(hit) - self._base


def holds(piece: memoryview, needle: bytes) -> bool:
    """Whether `needle` occurs in one contiguous piece of bytes (memmem, GIL given up, where libc
    has it; the bytes' own search otherwise)."""
    if len(piece) < len(needle):
        return False
    if MEMMEM is not None:
        held = Exported(piece)  # type: ignore[arg-type]
        try:
            if held.address:
                return MEMMEM(held.address, len(piece), needle, len(needle)) is not None
        finally:
            held.close()
    return needle in bytes(piece)

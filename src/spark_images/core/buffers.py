"""The address of a buffer's bytes, for the few libc calls that run on them without the GIL.

A foreign call through `ctypes.CDLL` gives up the GIL for its length, where
the same work through a Python method holds it: `mmap.mmap(..., MAP_POPULATE)`
and `mmap.madvise` keep every other thread of the process waiting while the
kernel fills the page tables. `exported` hands out the address of a read-only
buffer (bytes or a mapping) for as long as it is held; `populate` fills a
mapping's page tables with `madvise(MADV_POPULATE_READ)` in such a call.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap


class _Py_buffer(ctypes.Structure):  # CPython's own name for it
    """CPython's buffer view (Include/pybuffer.h), enough to learn a read-only buffer's address."""

    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),  # a new reference, dropped by PyBuffer_Release
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


# Function objects of our own, from prototypes: `ctypes.pythonapi.NAME` is one object per
# process, whose argtypes any other importer (or a second copy of this module) may replace
_GET_BUFFER = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(_Py_buffer), ctypes.c_int)(
    ("PyObject_GetBuffer", ctypes.pythonapi)
)
_RELEASE_BUFFER = ctypes.PYFUNCTYPE(None, ctypes.POINTER(_Py_buffer))(("PyBuffer_Release", ctypes.pythonapi))


class Exported:
    """A buffer's bytes held exported: `address` stays valid until `close` (an mmap cannot be
    closed meanwhile). `address` is 0 where the object exports no single block of its length."""

    def __init__(self, data: bytes | mmap.mmap) -> None:
        self._view: _Py_buffer | None = None
        self.address = 0
        if len(data) == 0:
            return
        view = _Py_buffer()
        if _GET_BUFFER(data, ctypes.byref(view), 0) != 0:
            return
        self._view = view
        if view.buf and view.len == len(data):
            self.address = int(view.buf)

    def close(self) -> None:
        if self._view is not None:
            _RELEASE_BUFFER(ctypes.byref(self._view))
            self._view = None


def _libc(name: str, restype: type, *argtypes: type) -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    fn.restype = restype
    fn.argtypes = list(argtypes)
    return fn


def find_bounds(size: int, start: int, stop: int) -> tuple[int, int]:
    """`find`'s bounds as `bytes.find` takes them (CPython's ADJUST_INDICES): negative ones count
    from the end, the stop is cut at the size, a start past it stays (mmap.find answers an empty
    needle there with the size, bytes.find with -1)."""
    start = max(start + size, 0) if start < 0 else start
    stop = max(stop + size, 0) if stop < 0 else min(stop, size)
    return start, stop


MEMMEM = _libc("memmem", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t)
_MADVISE = _libc("madvise", ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
MADV_POPULATE_READ = 22  # Linux 5.14; older kernels answer EINVAL


def populate(data: mmap.mmap) -> bool:
    """Fault a mapping's pages in now, without the GIL; False where the kernel (or libc) cannot,
    and the pages then fault in as they are touched, as any mapping's do."""
    if _MADVISE is None or len(data) == 0:
        return False
    with contextlib.closing(Exported(data)) as held:
        return held.address != 0 and _MADVISE(held.address, len(data), MADV_POPULATE_READ) == 0


@functools.cache
def can_populate() -> bool:
    """Whether `populate` works here (Linux 5.14 or later, glibc), tried once on one page."""
    try:
        probe = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, ValueError, AttributeError):
        return False
    with probe:
        return populate(probe)


_MALLOPT = _libc("mallopt", ctypes.c_int, ctypes.c_int, ctypes.c_int)
# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
# Inflation makes one 8 MiB bytes object per chunk. glibc maps and unmaps each one (or trims the
# heap top after it), so every chunk's pages fault in and are zeroed afresh: 84% of the page faults
# of a check of the real cu130 archive (perf). Served from one heap that keeps what is freed, the
# same pages are reused: faults ~650k -> ~300k, system CPU -0.5 to -1.2 s, check.gather 9.10-10.16 s
# -> 8.60-9.40 s, peak RSS +0.2 GB there and +0-8 MiB on the registry check (benchmarks/RESULTS.md)
KEEP_FREED = ((M_MMAP_THRESHOLD, 32 << 20), (M_TRIM_THRESHOLD, 1 << 30), (M_ARENA_MAX, 1))


def keep_freed_memory() -> bool:
    """Let malloc keep and reuse freed memory (see KEEP_FREED); call before threads start.
    False where libc has no mallopt (not glibc): allocation then stays as it was."""
    if _MALLOPT is None:
        return False
    return all(_MALLOPT(param, value) == 1 for param, value in KEEP_FREED)

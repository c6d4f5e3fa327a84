"""The digest of a byte range of an open file; run as a script, the side hasher of `digests`.

Standard library only, and nothing of this package: `digests` starts this file as
`python -I -S blob_hash.py FD`, isolated from the environment, and feeds it jobs.

The script hashes through read-only mappings of the file (`map_range`), the
walk's own process by reads (`hash_range`). A read copies every byte out of the
page cache once more: 0.2 s of the hasher's 2.4 s of CPU on the 3.6 GiB cu130
archive, and the scan beside it ran 0.15 s faster without that copy (median of six
pairs, 9.43 -> 9.29 s). A
mapping has one hazard a read has not: a file cut short while it is hashed
kills the process that touches the lost pages (SIGBUS). Here that is the
child, which `digests` treats as a child that died: it hashes the rest itself,
by reads, and a blob past the end is refused there.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import sys
from typing import TextIO

READ = 1 << 20
# the range is mapped this much at a time, so the child holds at most one window of the file
MAP_WINDOW = 64 << 20
# `readers.common` has its twin; this script imports nothing of the package
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def hash_range(fd: int, algo: str, offset: int, size: int, hasher: hashlib._Hash | None = None) -> str:
    """The hex digest of `size` bytes of `fd` from `offset`, or "short" when the file ends first.

    `hasher`: bytes before `offset` already hashed into it."""
    hasher = hashlib.new(algo) if hasher is None else hasher
    buf = bytearray(READ)
    view = memoryview(buf)
    while size > 0:
        n = os.preadv(fd, [view[: min(len(buf), size)]], offset)
        if n <= 0:
            return "short"
        hasher.update(view[:n])
        offset += n
        size -= n
    return hasher.hexdigest()


def map_range(fd: int, algo: str, offset: int, size: int, window: int = MAP_WINDOW) -> str:
    """`hash_range`'s answer, hashed through read-only mappings of the file instead of reads.

    Only for a process that may die: a file cut short under a mapping raises SIGBUS on
    the lost pages (see the module's docstring). A file that cannot be mapped is read.
    One answer differs: an empty range that starts past the end is "short" here, where a
    read finds nothing to read and gives the empty digest."""
    if offset + size > os.fstat(fd).st_size:
        return "short"
    hasher = hashlib.new(algo)
    end = offset + size
    while offset < end:
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        length = min(window, end - start)
        try:
            with (
                mmap.mmap(fd, length, flags=mmap.MAP_SHARED | _MAP_POPULATE, prot=mmap.PROT_READ, offset=start) as m,
                memoryview(m) as view,
            ):
                hasher.update(view[offset - start :])
        except (OSError, ValueError):  # not a mappable file: read the rest
            return hash_range(fd, algo, offset, end - offset, hasher)
        offset = start + length
    return hasher.hexdigest()


def lower_priority() -> None:
    """Run only on a core nobody else wants: SCHED_IDLE where Linux has it, else nice 19.

    The walk's inflating thread is the stage's bound; at normal priority this child took
    a core from it for the first ~2.5 s of the cu130 archive (three busy threads on two
    cores). `digests` lets the child go when it gives no answer in time."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        with contextlib.suppress(OSError):
            os.nice(19)


def serve(fd: int, jobs: TextIO, answers: TextIO) -> None:
    """One job per line, `[algorithm, offset, size]`, answered in order, one digest per line."""
    for line in jobs:
        algo, offset, size = json.loads(line)
        answers.write(map_range(fd, algo, offset, size) + "\n")
        answers.flush()


if __name__ == "__main__":
    lower_priority()
    serve(int(sys.argv[1]), sys.stdin, sys.stdout)

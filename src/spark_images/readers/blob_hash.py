"""The digest of a byte range of an open file; run as a script, the side hasher of `digests`.

Standard library only, and nothing of this package: `digests` starts this file as
`python -I -S blob_hash.py FD`, isolated from the environment, and feeds it jobs.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import TextIO

READ = 1 << 20


def hash_range(fd: int, algo: str, offset: int, size: int) -> str:
    """The hex digest of `size` bytes of `fd` from `offset`, or "short" when the file ends first."""
    hasher = hashlib.new(algo)
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


def serve(fd: int, jobs: TextIO, answers: TextIO) -> None:
    """One job per line, `[algorithm, offset, size]`, answered in order, one digest per line."""
    for line in jobs:
        algo, offset, size = json.loads(line)
        answers.write(hash_range(fd, algo, offset, size) + "\n")
        answers.flush()


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.stdin, sys.stdout)

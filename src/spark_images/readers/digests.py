"""Layer digests of an archive on disk, computed beside the walk instead of in line with it.

Hashing every layer blob costs more CPU than inflating it (sha256 at ~1.7 GB/s
of blob, ISA-L at ~2.2), and in line with the read it sat on the one chain that
feeds the tar walk: each 8 MiB chunk waited for its hash before it could be
inflated, and the hashing thread waited for the GIL beside the walk. A blob in
an archive on disk can be read twice from the page cache for a fraction of
that, so `SideDigests` hashes the blobs in a child process of its own (no GIL to
share, scheduled on the other core) while the walk reads the same bytes, and the
walk asks for each layer's digest when that layer ends, as `streams.verified`
does. Measured on the 2 GB archive of `benchmarks/at_limit.py`: `check.gather`
2.75 -> 2.30 s.

The child hashes at idle priority (`blob_hash.lower_priority`): it runs on a
core that the walk and its inflating thread leave free, and gives that core
back the moment either wants it. At normal priority it took a core from the
inflating thread, the stage's bound, for the first 2.5 s of the cu130 archive.
At idle priority one `check.gather` of that archive per process took 10.8-12.5 s
against 12.3-15.6 s (8 rounds each, in turn), and in one process 11.58 s
against 12.18 s (median of 6 rounds, better in 5). On a host so busy that an
idle child gets no core, the walk would wait on it for good; so while the walk
waits, the child must answer within ANSWER_GRACE_S plus the bytes still to hash
at ANSWER_FLOOR_RATE, or it is let go and the rest is hashed here.

Both readers read one open file (the child gets the same descriptor), so an
archive renamed or replaced during the check is still one file to both; only a
writer changing the file in place while it is being checked could show the two
readers different bytes. Small archives (below SIDE_OVER bytes of layers) and
hosts where no child can be started hash in this process instead, when the
digest is asked for.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from spark_images.core.errors import UsageError
from spark_images.readers import blob_hash
from spark_images.readers.blob_hash import hash_range

# below this many bytes of layers a child process costs more than it saves (~15 ms to start)
SIDE_OVER = 64 << 20
# the jobs go to the child in one write before any answer is read: past a pipe's 64 KiB both ends
# would wait on each other, so an image of more layers than an engine stacks (127) is hashed here
MAX_SIDE_JOBS = 500
ALGORITHMS = ("sha256", "sha512")
# while the walk waits on the child for a digest: this long, plus the bytes not yet hashed at
# this rate, before it is let go. An idle-priority child gets a whole core or next to none:
# with one it hashes at ~1.7 GB/s, three times this rate, so only a starved child misses it,
# and the walk then waits at most 1 s + ~3x what hashing here costs
ANSWER_GRACE_S = 1.0
ANSWER_FLOOR_RATE = 512 << 20
# the hasher, as a script of its own (standard library only): absent where the package is not files
_HASHER = Path(blob_hash.__file__)


class SideDigests:
    """The digests of blobs of one open file, hashed by a child process in the order given.

    `blobs`: (digest, offset, size) in the order the walk will finish them. `check(digest)`
    blocks until that blob is hashed and raises UsageError when it does not match.
    """

    def __init__(self, fd: int, blobs: Iterable[tuple[str, int, int]], where: str, side_over: int = SIDE_OVER) -> None:
        self.fd = fd
        self.where = where
        self.jobs = [(digest, at, size) for digest, at, size in blobs if digest.partition(":")[0] in ALGORITHMS]
        # a digest listed twice (an empty layer, repeated) is answered by its first job
        self.order = {digest: n for n, (digest, _at, _size) in reversed(list(enumerate(self.jobs)))}
        self.answers: list[str] = []
        self.lock = threading.Lock()  # answers are read in order, whichever thread asks
        self._pending = b""  # the child's output past the last whole answer
        self.child: subprocess.Popen[str] | None = None
        if len(self.jobs) <= MAX_SIDE_JOBS and sum(size for _d, _o, size in self.jobs) >= side_over:
            self.child = _start_child(fd, self.jobs)

    def __enter__(self) -> SideDigests:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        child, self.child = self.child, None
        self._pending = b""  # what a child let go had not finished saying is hashed here
        if child is not None:
            for stream in (child.stdin, child.stdout):
                with contextlib.suppress(OSError):
                    if stream is not None:
                        stream.close()
            if child.poll() is None:
                child.kill()
            child.wait()

    def checked(self, chunks: Iterable[bytes], digest: str) -> Iterator[bytes]:
        """`chunks` as they come, then the blob's digest checked (as `streams.verified`)."""
        yield from chunks
        self.check(digest)

    def check(self, digest: str) -> None:
        n = self.order.get(digest)
        if n is None:
            return  # an algorithm hashlib is not asked for here (ALGORITHMS)
        algo, _, want = digest.partition(":")
        with self.lock:
            got = self._answer(n)
        if got is None:  # no child, or it is gone: hash here
            _digest, offset, size = self.jobs[n]
            got = hash_range(self.fd, algo, offset, size)
        if got != want:
            raise UsageError(f"{self.where}: layer {digest} does not match its digest (corrupt archive)")

    def _answer(self, n: int) -> str | None:
        child = self.child
        if child is None or child.stdout is None:
            return self.answers[n] if n < len(self.answers) else None
        fd = child.stdout.fileno()  # read raw: `select` must see every byte the child wrote
        unhashed = sum(size for _d, _o, size in self.jobs[len(self.answers) : n + 1])
        deadline = time.monotonic() + ANSWER_GRACE_S + unhashed / ANSWER_FLOOR_RATE
        while len(self.answers) <= n:
            line, newline, rest = self._pending.partition(b"\n")
            if newline:
                self.answers.append(line.decode("ascii", "replace").strip())
                self._pending = rest
                continue
            left = deadline - time.monotonic()
            try:
                ready = select.select([fd], [], [], left)[0] if left > 0 else []
                more = os.read(fd, 4096) if ready else b""
            except (OSError, ValueError):
                more = b""
            if not more:  # ended early (killed, out of memory), or no core for it in time
                self.close()  # the rest is hashed here
                return None
            self._pending += more
        return self.answers[n]


def _start_child(fd: int, jobs: list[tuple[str, int, int]]) -> subprocess.Popen[str] | None:
    if not sys.executable or not _HASHER.is_file():
        return None
    try:
        child = subprocess.Popen(
            [sys.executable, "-I", "-S", str(_HASHER), str(fd)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            pass_fds=(fd,), text=True,
        )  # fmt: skip
    except OSError:
        return None
    stdin: IO[str] | None = child.stdin
    try:
        assert stdin is not None
        # at most MAX_SIDE_JOBS lines of ~40 bytes: within a pipe's buffer, so this write never blocks
        stdin.write("".join(json.dumps([d.partition(":")[0], at, size]) + "\n" for d, at, size in jobs))
        stdin.close()
    except OSError:
        child.kill()
        child.wait()
        return None
    return child

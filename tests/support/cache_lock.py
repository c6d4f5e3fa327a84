"""One lock per shared artefact of the test cache, across processes.

Session fixtures build things that outlive one pytest process and are shared
by all of them: the arm64 base and CUDA test base images, downloaded wheels,
unpacked wheel trees, the test CA, nvcc-compiled fixtures. Parallel workers
(pytest -n) and concurrent runs on one machine would otherwise build or
write the same thing at once. `cache_lock(name)` holds an exclusive
`flock` on TEST_CACHE/locks/NAME.lock: the first holder builds, the next
finds the result (each fixture probes again under the lock) and reuses it.
The kernel drops the lock when its holder exits, even if it is killed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

TEST_CACHE = Path(os.environ.get("SPARK_IMAGES_TEST_CACHE", Path.home() / ".cache" / "spark-images-test"))


@contextlib.contextmanager
def cache_lock(name: str) -> Iterator[None]:
    path = TEST_CACHE / "locks" / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file is closed
        yield


def tag_lock(tag: str) -> contextlib.AbstractContextManager[None]:
    """One builder and one pusher per tag, across workers and runs: two that build one tag
    at once lose the race at the end ("image ... already exists"), and two `docker push`es
    of one tag at once corrupt the loopback registry's tag link (every later HEAD of the
    tag answers 500 "invalid checksum digest format")."""
    return cache_lock("image-tag-" + hashlib.sha256(tag.encode()).hexdigest()[:16])

"""Freed memory kept for reuse: `keep_freed_memory` changes how malloc serves the inflater's chunks.

Each inflated chunk is an 8 MiB bytes object, freed as soon as it is consumed. Untuned, glibc
maps and unmaps each one (or trims the heap top after it), so every chunk faults its pages in
afresh; kept, the next chunk reuses the same pages. The count of minor page faults of the same
allocation pattern, in a fresh process each, tells the two apart by more than ten times.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from spark_images.core import buffers

# three threads (three malloc arenas untuned), each freeing 8 MiB chunks and a shorter last one,
# as the inflater does; 19 MiB freed at a heap's top is past glibc's dynamic trim threshold
CHURN = """
import resource, sys, threading
from spark_images.core.buffers import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
def churn():
    for _ in range(40):
        first, second, tail = bytes(8 << 20), bytes(8 << 20), bytes(3 << 20)
        del first, second, tail
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
threads = [threading.Thread(target=churn) for _ in range(3)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", CHURN, mode], capture_output=True, text=True,
                         check=True, timeout=120).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(buffers._MALLOPT is None, reason="libc has no mallopt (not glibc)")
def test_kept_memory_is_reused_instead_of_faulted_in_again() -> None:
    kept, kept_faults = _faults("keep")
    untuned, untuned_faults = _faults("plain")
    assert (kept, untuned) == ("True", "None")
    # 40 x 3 x 4864 pages: ~580k faults when every chunk is fresh memory
    assert untuned_faults > 200_000
    assert kept_faults * 10 < untuned_faults


def test_without_mallopt_allocation_is_left_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(buffers, "_MALLOPT", None)
    assert buffers.keep_freed_memory() is False

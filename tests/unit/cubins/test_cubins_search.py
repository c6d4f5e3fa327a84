"""The fatbin magic search (`cubins/search.py`) answers exactly as `bytes.find` does."""

from __future__ import annotations

import importlib.util
import mmap
import random
from pathlib import Path

import pytest

from spark_images.core import buffers
from spark_images.cubins import search
from spark_images.cubins.fatbin import _CONTAINER_START

NEEDLE = _CONTAINER_START


def _buffer(rng: random.Random, size: int, hits: list[int]) -> bytes:
    data = bytearray(rng.randbytes(size))
    for at in hits:
        data[at : at + len(NEEDLE)] = NEEDLE
    return bytes(data)


@pytest.mark.parametrize("through", ["memmem", "fallback"])
@pytest.mark.parametrize("seed", range(6))
def test_find_agrees_with_bytes_find_on_bytes_and_mmap(
    seed: int, through: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if through == "fallback":
        monkeypatch.setattr(search, "MEMMEM", None)  # as where libc has no memmem
    rng = random.Random(seed)
    size = rng.choice([64, 4096, 1 << 20])
    hits = [*sorted(rng.sample(range(0, size - len(NEEDLE)), 5)), 0, size - len(NEEDLE)]
    data = _buffer(rng, size, hits)
    path = tmp_path / "lib.so"
    path.write_bytes(data)
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        for buf in (data, mapped):
            with search.Searcher(buf) as searcher:
                # every window edge: before, on and after each planted needle, and past the end
                edges = sorted({0, size, size + 10, -3} | {h + d for h in hits for d in (-1, 0, 1, 7, 8, 9)})
                for start in edges:
                    for stop in (size, start + 8, start + 9, start + 100, start - 1):
                        assert searcher.find(NEEDLE, start, stop) == data.find(NEEDLE, start, stop), (start, stop)
                for start, stop in ((5, 4), (0, size), (size, size), (size + 10, size + 20), (-3, size)):
                    assert searcher.find(b"", start, stop) == data.find(b"", start, stop), (start, stop)


def test_memmem_is_what_answers_here() -> None:
    """On glibc the search is the foreign call, not the fallback: what the speed figures measured."""
    with search.Searcher(b"x" * 64 + NEEDLE) as searcher:
        assert searcher._held is not None
        assert searcher.find(NEEDLE, 0, 72) == 64


def test_a_second_copy_of_the_module_leaves_the_first_working() -> None:
    """ctypes.pythonapi's functions are shared by the whole process: a module that set argtypes
    on them (as a second copy of this one did, in a benchmark that loads old code beside new)
    made every call of the first copy fail with ArgumentError."""
    spec = importlib.util.spec_from_file_location("buffers_copy", buffers.__file__)
    assert spec is not None and spec.loader is not None
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    data = b"\0" * 100 + NEEDLE
    for module in (buffers, copy):
        held = module.Exported(data)
        assert held.address != 0
        held.close()
    with search.Searcher(data) as searcher:
        assert searcher.find(NEEDLE, 0, len(data)) == 100

"""Layers read from disk into one reused buffer: every consumer gets the bytes the file holds.

`images._reused_chunks` hands out views of one buffer that the next read overwrites, so
each consumer must be done with a chunk, or have copied it, before it asks for the next:
zstd and ISA-L take in all of a chunk first; a stored layer's chunks and `ChunkStream.read(-1)`
copy; the download path's queue (`inflated(ahead=True)`) holds owned bytes.
"""

from __future__ import annotations

import gzip
import mmap
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard

from spark_images.core import buffers
from spark_images.core.errors import UsageError
from spark_images.readers import images
from spark_images.readers.common import Progress
from spark_images.readers.streams import ChunkStream, inflated

READ = 4096  # small reads, so a layer of a few hundred KiB is read in many chunks


def _content(seed: int = 7, size: int = 300_000) -> bytes:
    rng = random.Random(seed)
    # half random, half repeats: compressible, and every chunk unlike the one before it
    return b"".join(rng.randbytes(997) + bytes([i % 251]) * 1003 for i in range(size // 2000))


def _layer_file(tmp_path: Path, payload: bytes, pad: int = 123) -> tuple[Path, int]:
    """`payload` inside a file with bytes before and after it, as a blob sits in an archive."""
    path = tmp_path / "archive.bin"
    path.write_bytes(b"\xaa" * pad + payload + b"\x55" * pad)
    return path, pad


def _opened(path: Path, offset: int, size: int) -> list[memoryview]:
    fd = os.open(path, os.O_RDONLY)
    try:
        return list(images._reused_chunks(fd, offset, size, Progress(enabled=False), "archive"))
    finally:
        os.close(fd)


def test_the_chunks_are_views_of_one_buffer_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(images, "LAYER_READ", READ)
    payload = _content()
    path, at = _layer_file(tmp_path, payload)
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = images._reused_chunks(fd, at, len(payload), Progress(enabled=False), "archive")
        first = next(chunks)
        held = bytes(first)
        assert held == payload[:READ]
        second = next(chunks)
        assert first.obj is second.obj, "one buffer for every chunk"
        assert bytes(first) == payload[READ : 2 * READ] != held, "the next read overwrote it"
        rest = b"".join(bytes(c) for c in chunks)
    finally:
        os.close(fd)
    assert held + payload[READ : 2 * READ] + rest == payload


def test_a_file_cut_short_inside_a_layer_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(images, "LAYER_READ", READ)
    path = tmp_path / "archive.bin"
    path.write_bytes(b"x" * (3 * READ + 5))
    with pytest.raises(UsageError, match="archive ends inside a layer"):
        _opened(path, READ, 4 * READ)


@pytest.mark.parametrize("form", ["stored", "gzip", "zstd", "zstd-frames"])
@pytest.mark.parametrize("ahead", [False, True])
def test_every_layer_form_inflates_to_its_content(
    form: str, ahead: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(images, "LAYER_READ", READ)
    content = _content(seed=hash(form) & 0xFFFF)
    if form == "stored":
        payload = content
    elif form == "gzip":
        # two gzip members, as some layer writers emit: the second starts inside a chunk
        payload = gzip.compress(content[:100_001], mtime=0) + gzip.compress(content[100_001:], mtime=0)
    elif form == "zstd":
        payload = zstandard.ZstdCompressor(level=3).compress(content)
    else:
        cut = len(content) // 3
        zc = zstandard.ZstdCompressor(level=1)
        payload = zc.compress(content[:cut]) + zc.compress(content[cut:])
    path, at = _layer_file(tmp_path, payload)
    fd = os.open(path, os.O_RDONLY)
    try:

        def opener() -> Iterator[memoryview]:
            return images._reused_chunks(fd, at, len(payload), Progress(enabled=False), "archive")

        # all held before any is joined, as the walk's queue holds chunks inflated ahead of it
        held = list(inflated(opener, ahead=ahead))  # type: ignore[arg-type]
        out = b"".join(held)
    finally:
        os.close(fd)
    assert out == content


def test_read_all_copies_each_chunk_as_it_comes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(images, "LAYER_READ", READ)
    payload = _content(seed=3)
    path, at = _layer_file(tmp_path, payload)
    fd = os.open(path, os.O_RDONLY)
    try:
        stream = ChunkStream(images._reused_chunks(fd, at, len(payload), Progress(enabled=False), "archive"))  # type: ignore[arg-type]
        head = bytes(stream.read(10))
        assert head + stream.read(-1) == payload
    finally:
        os.close(fd)


def test_populate_fills_a_shared_mapping_and_keeps_its_bytes() -> None:
    """The arena's members are memfd mappings populated by one foreign call (no GIL held)."""
    fd = os.memfd_create("populate-test", os.MFD_CLOEXEC)
    data = _content(seed=11, size=3 * mmap.PAGESIZE)
    try:
        os.write(fd, data)
        with mmap.mmap(fd, len(data), flags=mmap.MAP_SHARED, prot=mmap.PROT_READ) as view:
            assert buffers.populate(view) is buffers.can_populate()
            assert view[:] == data
    finally:
        os.close(fd)


def test_populate_needs_a_kernel_that_has_it() -> None:
    """MADV_POPULATE_READ came with Linux 5.14: on such a kernel it is what the arena uses."""
    major, minor = (int(part) for part in os.uname().release.split(".")[:2])
    assert buffers.can_populate() is ((major, minor) >= (5, 14))


def test_an_empty_buffer_exports_no_address() -> None:
    held = buffers.Exported(b"")
    assert held.address == 0
    held.close()
    with mmap.mmap(-1, mmap.PAGESIZE) as anon:
        held = buffers.Exported(anon)
        assert held.address != 0
        with pytest.raises(BufferError):
            anon.close()  # an exported mapping cannot be closed under the address
        held.close()

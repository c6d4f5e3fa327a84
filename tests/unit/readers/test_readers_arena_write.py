"""Spooled members written into the arena by pwrite and mapped read-only, and ARENA_OVER.

A walk with an arena spools every member past ARENA_OVER into it (not only
those past the caller's threshold): the copy runs in the kernel without the
GIL, into pages the arena reuses. Here: a member cannot be changed through its
mapping, a write the kernel refuses hands the region back, members either side
of ARENA_OVER come as a mapping or as bytes, a check says the same whichever
way its members come, and the proof buffer grows at least twofold.
"""

from __future__ import annotations

import io
import mmap
import os
from pathlib import Path

import pytest

from spark_images.check import collect
from spark_images.core.pieces import Pieces
from spark_images.cubins import fatbin
from spark_images.readers import artifacts, layers
from spark_images.readers.common import ArenaMap, SpoolArena, spool
from support.oci_blobs import image_archive
from support.paths import ORACLE_BIN

PAGE = mmap.ALLOCATIONGRANULARITY


def test_an_arena_member_is_read_only() -> None:
    """Written through the arena's descriptor, then mapped read-only: no reader can change a member."""
    with SpoolArena() as arena:
        data = spool(io.BytesIO(b"z" * PAGE), PAGE, "lib", arena=arena)
        with pytest.raises(TypeError):
            data[0:1] = b"x"
        data.close()


def test_members_past_arena_over_come_from_the_arena_whatever_the_callers_threshold(tmp_path: Path) -> None:
    files = {"lib/big.so": os.urandom(layers.ARENA_OVER + 1), "lib/small.so": os.urandom(layers.ARENA_OVER)}
    path = image_archive(tmp_path / "image.tar", [files])
    got = {m.path: m.data for m in artifacts.iter_members(str(path), lambda p: p.endswith(".so"), spool_over=64 << 20)}
    assert isinstance(got["lib/big.so"], ArenaMap) and isinstance(got["lib/small.so"], bytes)


def test_a_write_the_kernel_refuses_hands_the_region_back(monkeypatch: pytest.MonkeyPatch) -> None:
    with SpoolArena() as arena:
        monkeypatch.setattr(os, "pwritev", lambda *_args: 0)  # what a full memory file system leaves
        with pytest.raises(OSError, match="took no bytes"):
            spool(io.BytesIO(b"x" * PAGE), PAGE, "lib", arena=arena)
        assert arena.free == [(0, PAGE)]


def test_a_check_says_the_same_whether_members_come_as_mappings_or_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real nvcc libraries, host libraries, a hard link and a whiteout over two layers, through the
    whole check pass: the same libraries, verdicts and unreadable files either way (the libraries
    with device code come as their inflated pieces, the others spooled into the arena)."""
    lib121 = (ORACLE_BIN / "lib/libsm121a.so").read_bytes()
    lib90 = (ORACLE_BIN / "lib/libsm90.so").read_bytes()
    bottom = {"usr/lib/libsm121a.so": lib121, "usr/lib/libalias.so": "usr/lib/libsm121a.so",
              "usr/lib/libgone.so": lib90, "usr/lib/libhost.so": os.urandom(5 * PAGE)}  # fmt: skip
    top = {"usr/lib/.wh.libgone.so": b"", "opt/lib/libsm90.so": lib90, "opt/lib/libpad.so": os.urandom(3 * PAGE)}
    path = image_archive(tmp_path / "image.tar", [bottom, top], oci=True)
    spooled: list[str] = []
    pieced: list[str] = []
    real_read, real_spool, real_sifted = layers.read_exact, layers.spool_views, layers._sifted

    def noting(stream, size, name, spool_over, **kw):  # type: ignore[no-untyped-def]
        data = real_read(stream, size, name, spool_over, **kw)
        if isinstance(data, ArenaMap):
            spooled.append(name)
        return data

    def noting_sifted(views, size, name, arena):  # type: ignore[no-untyped-def]
        data = real_spool(views, size, name, arena)  # a member its sieve asked to keep whole
        spooled.append(name)
        return data

    def noting_pieced(stream, size, name, run, arena):  # type: ignore[no-untyped-def]
        member = real_sifted(stream, size, name, run, arena)
        if isinstance(member.data, Pieces):  # a host library with device code: read from its chunks
            pieced.append(name)
        return member

    monkeypatch.setattr(layers, "read_exact", noting)
    monkeypatch.setattr(layers, "spool_views", noting_sifted)
    monkeypatch.setattr(layers, "_sifted", noting_pieced)
    monkeypatch.setattr(layers, "ARENA_OVER", 1)
    mapped = collect.gather(str(path))
    assert sorted(spooled) == ["opt/lib/libpad.so", "usr/lib/libhost.so"]
    assert sorted(pieced) == ["opt/lib/libsm90.so", "usr/lib/libsm121a.so"]
    monkeypatch.setattr(layers, "ARENA_OVER", 1 << 40)
    spooled.clear()
    pieced.clear()
    as_bytes = collect.gather(str(path))
    assert spooled == [] and pieced == []
    assert [lib["path"] for lib in mapped.libraries] == ["opt/lib/libsm90.so", "usr/lib/libalias.so", "usr/lib/libsm121a.so"]
    assert (mapped.libraries, mapped.unreadable, mapped.files_seen) == (as_bytes.libraries, as_bytes.unreadable, as_bytes.files_seen)
    assert mapped.cubins is not None and as_bytes.cubins is not None
    assert mapped.cubins.to_json() == as_bytes.cubins.to_json()


def test_the_proof_buffer_grows_at_least_twofold() -> None:
    scratch = fatbin._Scratch()
    first = scratch.output(1000)
    assert len(first) == 1000
    grown = scratch.output(1001)
    assert len(grown) == 2000 and scratch.output(1500) is grown, "a slightly larger cubin reuses the doubled buffer"
    big = scratch.output(scratch.KEEP + 1)
    assert len(big) == scratch.KEEP + 1 and scratch.buffer is grown, "one past KEEP is not kept"

"""The spool arena: spooled members reuse one memfd's pages, and no member ever sees another's bytes."""

from __future__ import annotations

import io
import mmap
import os
from pathlib import Path

import pytest

from spark_images.readers import artifacts, layers
from spark_images.readers.common import ArenaMap, SpoolArena, spool
from support.oci_blobs import image_archive

PAGE = mmap.ALLOCATIONGRANULARITY


def test_a_closed_members_region_is_reused_and_a_held_one_is_not() -> None:
    with SpoolArena() as arena:
        first = spool(io.BytesIO(b"a" * 3 * PAGE), 3 * PAGE, "first", arena=arena)
        assert isinstance(first, ArenaMap) and arena.size == 3 * PAGE
        view = memoryview(first)
        with pytest.raises(BufferError):
            first.close()  # a view is alive: the region stays taken
        second = spool(io.BytesIO(b"b" * PAGE), PAGE, "second", arena=arena)
        assert arena.size == 4 * PAGE and bytes(view[:4]) == b"aaaa"  # grown, not reused
        view.release()
        first.close()
        third = spool(io.BytesIO(b"c" * 2 * PAGE + b"c"), 2 * PAGE + 1, "third", arena=arena)
        assert arena.size == 4 * PAGE, "the first member's closed region holds the third"
        assert third[:] == b"c" * (2 * PAGE + 1) and second[:] == b"b" * PAGE
        for data in (second, third):
            data.close()
        assert arena.free == [(0, 4 * PAGE)], "holes beside each other merge"


def test_a_hole_at_the_end_grows_by_what_it_lacks() -> None:
    """A member larger than the last one freed takes that region and only the difference is new;
    a hole with a taken region after it is never grown into it."""
    with SpoolArena(limit=6 * PAGE) as arena:
        low = spool(io.BytesIO(b"a" * PAGE), PAGE, "low", arena=arena)
        mid = spool(io.BytesIO(b"b" * 2 * PAGE), 2 * PAGE, "mid", arena=arena)
        mid.close()
        big = spool(io.BytesIO(b"c" * 3 * PAGE), 3 * PAGE, "big", arena=arena)
        assert arena.size == 4 * PAGE and arena.free == [], "the end hole of 2 pages grew by 1"
        assert big[:] == b"c" * 3 * PAGE and low[:] == b"a" * PAGE
        low.close()
        wide = spool(io.BytesIO(b"d" * 2 * PAGE), 2 * PAGE, "wide", arena=arena)
        assert arena.size == 6 * PAGE and arena.free == [(0, PAGE)], "the first hole is not at the end"
        assert big[:] == b"c" * 3 * PAGE and wide[:] == b"d" * 2 * PAGE
        wide.close()
        over = spool(io.BytesIO(b"e" * 3 * PAGE), 3 * PAGE, "over", arena=arena)
        assert not isinstance(over, ArenaMap) and arena.size == 6 * PAGE, "grown past its limit: fresh memory"
        for data in (big, over):
            data.close()


def test_past_its_limit_a_member_gets_fresh_memory(tmp_path: Path) -> None:
    with SpoolArena(limit=2 * PAGE) as arena:
        data = spool(io.BytesIO(b"x" * 3 * PAGE), 3 * PAGE, "big", arena=arena)
        assert not isinstance(data, ArenaMap) and data[:] == b"x" * 3 * PAGE and arena.size == 0


def test_a_short_member_hands_its_region_back() -> None:
    with SpoolArena() as arena:
        with pytest.raises(ValueError, match="before its declared size"):
            spool(io.BytesIO(b"x" * 10), 2 * PAGE, "short", arena=arena)
        assert arena.free == [(0, 2 * PAGE)]


def test_every_spooled_member_of_an_image_reads_as_itself(tmp_path: Path) -> None:
    """Members of several sizes over three layers, each one's bytes its own, checked as it is met,
    with hard links answered from members kept while later ones reuse the closed regions."""
    files = [{f"lib/{n}-{i}.so": os.urandom(size) for i, size in enumerate((3 * PAGE + 5, PAGE, 7 * PAGE, 2 * PAGE + 1))}
             for n in ("low", "mid", "top")]  # fmt: skip
    files[1]["lib/alias.so"] = "lib/mid-2.so"  # a hard link, answered from a kept member
    path = image_archive(tmp_path / "image.tar", files)
    expected = {k: v for f in files for k, v in f.items() if isinstance(v, bytes)}
    expected["lib/alias.so"] = expected["lib/mid-2.so"]
    seen = {}
    for member in artifacts.iter_members(str(path), lambda p: p.endswith(".so"), spool_over=0):
        assert member.data is not None, member.error
        assert isinstance(member.data, ArenaMap)
        seen[member.path] = bytes(member.data[:])
    assert seen == expected


def test_a_layer_keeps_its_newest_members_within_the_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Libraries kept for hard links stay under KEEP_MAPPED however many a layer holds: a newer one
    pushes the oldest out (a link to that one is reported), and one larger than the budget is not kept."""
    monkeypatch.setattr(layers, "KEEP_MAPPED", 5 * PAGE)
    libs = {f"lib/lib{i}.so": os.urandom(2 * PAGE) for i in range(4)}
    links = {"lib/new.so": "lib/lib3.so", "lib/old.so": "lib/lib0.so", "lib/big.so": "lib/huge.so"}
    path = image_archive(tmp_path / "image.tar", [{**libs, "lib/huge.so": os.urandom(6 * PAGE), **links}])
    got = {m.path: (bytes(m.data[:]) if m.data is not None else m.error)
           for m in artifacts.iter_members(str(path), lambda p: p.endswith(".so"), spool_over=0)}  # fmt: skip
    assert {k: got[k] for k in libs} == libs
    assert got["lib/new.so"] == libs["lib/lib3.so"], "the newest kept member answers its link"
    assert isinstance(got["lib/old.so"], str) and "hard link to lib/lib0.so" in got["lib/old.so"], "pushed out"
    assert isinstance(got["lib/big.so"], str) and "hard link to lib/huge.so" in got["lib/big.so"], "over the budget"


def test_kept_members_never_exceed_the_budget_and_those_pushed_out_are_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layers, "KEEP_MAPPED", 5 * PAGE)
    kept = layers._Kept()
    with SpoolArena() as arena:
        maps = []
        for i in range(5):
            maps.append(spool(io.BytesIO(bytes([i]) * 2 * PAGE), 2 * PAGE, f"m{i}", arena=arena))
            assert kept.offer(f"m{i}", maps[-1])
            assert kept.mapped <= 5 * PAGE and list(kept.data) == [f"m{j}" for j in range(max(0, i - 1), i + 1)]
        assert [m.closed for m in maps] == [True, True, True, False, False], "the oldest are closed as they go"
        assert arena.size == 3 * 2 * PAGE, "a pushed-out member's region holds a later one"
        kept.close()
        assert kept.data == {} and kept.mapped == 0 and all(m.closed for m in maps)

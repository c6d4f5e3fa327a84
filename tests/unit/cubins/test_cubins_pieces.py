"""A library read from its inflated pieces (`core.pieces.Pieces`) scans exactly as from one buffer.

The layer reader hands a host library with device code to the cubin scan as the
chunks it was inflated in, uncopied. Here: `find` and slices against `bytes` on
random cuts (pieces of one byte, needles across every seam), and the whole scan
(fatbins, proofs, kernel listings, problems) of real nvcc-compiled libraries and
of hostile variants of them (truncated, flipped bytes, lying sizes), cut at
random and at every container and entry boundary: the same answer either way.
"""

from __future__ import annotations

import itertools
import random
import struct

import pytest

from spark_images.core import pieces as pieces_module
from spark_images.core.pieces import Pieces
from spark_images.cubins import elf, scan_members
from spark_images.cubins import fatbin as fb
from spark_images.readers.artifacts import Member
from support.paths import ORACLE_BIN

NEEDLE = fb._CONTAINER_START
LIBRARIES = sorted(p.name for p in (ORACLE_BIN / "lib").glob("*.so"))


def _cut(data: bytes, cuts: list[int]) -> Pieces:
    bounds = [0, *sorted(c for c in set(cuts) if 0 < c < len(data)), len(data)]
    source = memoryview(data)
    return Pieces([source[a:b] for a, b in itertools.pairwise(bounds)])


def _random_cuts(rng: random.Random, size: int, count: int) -> list[int]:
    cuts = [rng.randrange(1, max(size, 2)) for _ in range(count)]
    return cuts + [c + 1 for c in cuts[: count // 3]]  # pieces of one byte too


@pytest.mark.parametrize("through", ["memmem", "fallback"])
@pytest.mark.parametrize("seed", range(8))
def test_find_agrees_with_bytes_find_across_seams(seed: int, through: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if through == "fallback":
        monkeypatch.setattr(pieces_module, "MEMMEM", None)  # as where libc has no memmem
    rng = random.Random(seed)
    size = rng.choice([16, 300, 5000])
    data = bytearray(rng.randbytes(size))
    seams = sorted(rng.sample(range(1, size), min(12, size - 1)))
    for seam in seams[::2]:  # a needle across each of these seams, at every split of it
        at = max(0, min(size - len(NEEDLE), seam - rng.randrange(1, len(NEEDLE))))
        data[at : at + len(NEEDLE)] = NEEDLE
    data = bytes(data)
    cut = _cut(data, seams + _random_cuts(rng, size, 4))
    assert len(cut) == len(data) and bytes(cut) == data
    for _ in range(300):
        start, stop = rng.randrange(-size - 3, size + 3), rng.randrange(-size - 3, size + 3)
        for needle in (NEEDLE, NEEDLE[:3], data[5:6], b""):
            assert cut.find(needle, start, stop) == data.find(needle, start, stop), (needle, start, stop)


@pytest.mark.parametrize("seed", range(4))
def test_slices_agree_and_one_inside_a_piece_is_not_copied(seed: int) -> None:
    rng = random.Random(seed)
    data = rng.randbytes(4000)
    cut = _cut(data, _random_cuts(rng, len(data), 20))
    for _ in range(500):
        start, stop = rng.randrange(-4100, 4100), rng.randrange(-4100, 4100)
        assert bytes(cut[start:stop]) == data[start:stop], (start, stop)
    first = cut.starts[1]
    inside = cut[0:first]
    assert isinstance(inside, memoryview) and inside.obj is data, "a slice inside one piece is a view of it"
    with pytest.raises(ValueError, match="contiguous"):
        cut[0:10:2]


def _boundaries(data: bytes) -> list[int]:
    """Every container and entry header start and payload start of the library, and around each."""
    out: list[int] = []
    for found in fb.scan_binary(data).fatbins:
        out.append(found.offset)
        for entry in found.entries:
            out.extend((entry.payload_offset, entry.payload_offset - fb.ENTRY_MIN_HEADER))
    hdr = elf.read_header(data) if elf.is_elf(data) else None
    if hdr is not None:
        out.extend((hdr.shoff, 64))
    return [b + d for b in out for d in (-9, -1, 0, 1, 7, 30)]


def _hostile(rng: random.Random, data: bytes) -> list[bytes]:
    """Truncations, flipped bytes in the fatbin headers and a lying entry size."""
    found = fb.scan_binary(data).fatbins
    variants = [data[: rng.randrange(64, len(data))] for _ in range(3)]
    flipped = bytearray(data)
    for _ in range(40):
        target = rng.choice(found) if found else None
        at = target.offset + rng.randrange(0, 200) if target is not None else rng.randrange(len(data))
        if at < len(flipped):
            flipped[at] ^= 1 << rng.randrange(8)
    variants.append(bytes(flipped))
    if found and found[0].entries:
        lying = bytearray(data)
        entry = found[0].entries[0]
        struct.pack_into("<Q", lying, entry.payload_offset - fb.ENTRY_MIN_HEADER + 0x38, 1 << 40)
        variants.append(bytes(lying))
    return variants


def _report(data: bytes | Pieces) -> dict[str, object]:
    return scan_members([Member("lib/x.so", data)], kernels=True).to_json()


@pytest.mark.parametrize("name", LIBRARIES)
def test_a_library_scans_the_same_from_its_pieces(name: str) -> None:
    data = (ORACLE_BIN / "lib" / name).read_bytes()
    rng = random.Random(name)
    for variant in [data, *_hostile(rng, data)]:
        whole = fb.scan_binary(variant)
        expected = _report(variant)
        for cuts in (_boundaries(variant), _random_cuts(rng, len(variant), 25)):
            assert fb.scan_binary(_cut(variant, cuts)) == whole
            assert _report(_cut(variant, cuts)) == expected


def test_the_pieces_a_search_held_are_let_go_on_close() -> None:
    grown = bytearray(b"x" * 100 + NEEDLE)
    with Pieces([memoryview(grown)[:50], memoryview(bytes(grown[50:]))]) as cut:
        assert cut.find(NEEDLE, 0, len(cut)) == 100 and len(cut[0:10]) == 10
    # a bytearray cannot grow while any view or export of it is alive
    grown.extend(b"more")
    assert len(grown) == 100 + len(NEEDLE) + 4 and len(cut) == 0

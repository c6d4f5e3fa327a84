"""The cubin scan's sieve: a big library with no fatbin magic anywhere comes as its scan, never copied.

The layer reader shows each big candidate's pieces to `HostLibrarySieve` as they
stream by; a host ELF library in which the container magic occurs nowhere comes
back as the `BinaryScan` the whole-file scan would give, read from its header,
section table and name table. Here: real host libraries (this Python's own
`_ctypes`, nvcc-compiled oracle libraries with their magic erased), lying section
tables, magics across every seam of the pieces, hard links, a member past the hold
limit, another reader wanting the bytes and a layer cut inside a sifted member: a
check says the same sifted or not, and what may hide device code is always read.
"""

from __future__ import annotations

import _ctypes
import gzip
import io
import itertools
import json
import random
import struct
import tarfile
from pathlib import Path

import pytest

from spark_images.check import collect
from spark_images.core.errors import UsageError
from spark_images.cubins import elf
from spark_images.cubins import fatbin as fb
from spark_images.cubins.sift import HostLibrarySieve, Pieces
from spark_images.readers import artifacts, layers
from spark_images.readers.streams import Decompressed
from support.oci_blobs import digest_of, image_archive, layer_tar
from support.paths import ORACLE_BIN

HOST = Path(_ctypes.__file__).read_bytes()  # a real host library: no device code, no magic
MAGIC = fb._CONTAINER_START


def _lib(name: str) -> bytes:
    return (ORACLE_BIN / "lib" / name).read_bytes()


def _erased(data: bytes) -> bytes:
    """The library with every container magic zeroed: its `.nv_fatbin` section then holds none."""
    return data.replace(MAGIC, bytes(len(MAGIC)))


def _section_grown(data: bytes, name: str, size: int) -> bytes:
    """The library with section `name`'s size set to `size` in its section table."""
    hdr = elf.read_header(data)
    index = next(i for i, sec in enumerate(elf.sections(data, hdr)) if sec.name == name)
    out = bytearray(data)
    struct.pack_into("<Q", out, hdr.shoff + index * hdr.shentsize + 32, size)
    return bytes(out)


def _table_past_end(data: bytes) -> bytes:
    out = bytearray(data)
    struct.pack_into("<Q", out, 0x28, len(data))  # e_shoff: the table would start at the end
    return bytes(out)


def _with_magic_at(data: bytes, at: int) -> bytes:
    return data[:at] + MAGIC + data[at + len(MAGIC) :]


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every member spooled (so sifted) and layers inflated 4099 bytes at a time: many seams."""
    monkeypatch.setattr(layers, "ARENA_OVER", 1)
    monkeypatch.setattr(Decompressed, "OUT_CHUNK", 4099)


def _members(path: Path) -> dict[str, artifacts.Member]:
    sieve = HostLibrarySieve(lambda p: p.endswith(".so"))
    want = lambda p: p.endswith(".so")  # noqa: E731
    out = {}
    for m in artifacts.iter_members(str(path), want, spool_over=1, sieve=sieve):
        out[m.path] = m if m.data is None else artifacts.Member(m.path, bytes(m.data), m.error, m.summary)
    return out


def test_a_library_without_the_magic_comes_as_its_scan_not_its_bytes(tmp_path: Path, small_pieces: None) -> None:
    real = _lib("libsm121a.so")
    files = {"lib/host.so": HOST, "lib/alias.so": "lib/host.so", "lib/real.so": real}
    got = _members(image_archive(tmp_path / "image.tar", [files]))
    host = got["lib/host.so"]
    assert host.data is None and host.error == "" and host.summary == fb.scan_binary(HOST)
    assert got["lib/alias.so"].summary == host.summary and got["lib/alias.so"].data is None
    assert got["lib/real.so"].data == real and got["lib/real.so"].summary is None  # a magic: read whole


@pytest.mark.parametrize("piece", [1, 2, 3, 5, 7, 8, 9, 4099])
def test_a_magic_across_any_seam_asks_for_the_bytes(piece: int) -> None:
    at = 2000
    data = _with_magic_at(HOST[:8192], at)
    for shift in range(piece + len(MAGIC)):  # every cut of the magic by pieces of this size
        run = HostLibrarySieve(lambda _p: True).start()
        cuts = [0, *range(at - len(MAGIC) - shift, at + 2 * len(MAGIC) + piece, piece), len(data)]
        asked = any(run.needs_bytes(memoryview(data)[lo:hi]) for lo, hi in itertools.pairwise(cuts))
        assert asked, (piece, shift)


def test_no_magic_in_any_piece_asks_for_nothing() -> None:
    run = HostLibrarySieve(lambda _p: True).start()
    views = [memoryview(HOST)[i : i + 7] for i in range(0, len(HOST), 7)]
    assert not any(run.needs_bytes(v) for v in views)
    assert run.summary(views, len(HOST)) == fb.scan_binary(HOST)


@pytest.mark.parametrize(
    "head",
    [b"\x00" * 64, b"\x7fELF" + b"\x01" * 60, _lib("libsm121a.so")[:18] + struct.pack("<H", elf.EM_CUDA) + bytes(44)],
    ids=["not-elf", "elf32", "bare-cubin"],
)
def test_what_is_not_a_host_library_asks_for_the_bytes(head: bytes) -> None:
    run = HostLibrarySieve(lambda _p: True).start()
    assert run.needs_bytes(memoryview(head + bytes(4096)))


def test_pieces_slice_as_the_bytes_do() -> None:
    rng = random.Random(7)
    data = bytes(rng.randrange(256) for _ in range(5000))
    cuts = sorted({0, len(data), *rng.sample(range(1, len(data)), 40)})
    pieces = Pieces([memoryview(data)[lo:hi] for lo, hi in itertools.pairwise(cuts)])
    assert len(pieces) == len(data)
    for _ in range(500):
        lo, hi = rng.randrange(-100, 5100), rng.randrange(-100, 5100)
        assert pieces[lo:hi] == data[lo:hi], (lo, hi)


def test_a_check_says_the_same_sifted_or_not(tmp_path: Path, small_pieces: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every kind of big candidate, over two layers with hard links: the same libraries, verdicts,
    warnings and unreadable files whether the sieve answers for the bytes or not."""
    real = _lib("libsm121a.so")
    erased = _erased(real)
    bottom = {
        "usr/lib/libhost.so": HOST,
        "usr/lib/liblying.so": _table_past_end(HOST),  # the table cannot be trusted: a warning
        "usr/lib/libempty_fatbin.so": erased,  # a .nv_fatbin section with no container in it
        "usr/lib/libfatbin_past_end.so": _section_grown(erased, ".nv_fatbin", len(erased) * 2),
        "usr/lib/libalias.so": "usr/lib/libhost.so",
        "usr/lib/liblying_alias.so": "usr/lib/liblying.so",
    }
    top = {
        "opt/lib/libsm121a.so": real,
        "opt/lib/libsm90.so": _lib("libsm90.so"),
        "opt/lib/libstripped.so": _lib("libstripped.so"),
        "opt/lib/libnoise.so": random.Random(3).randbytes(20000),
        "opt/lib/libshort.so": b"\x7fELF\x02\x01\x01",
        "opt/lib/k.cubin": (ORACLE_BIN / "cubins" / "k_sm121a.cubin").read_bytes(),
        "opt/lib/libmagic_late.so": _with_magic_at(HOST, len(HOST) - 100),
    }
    path = image_archive(tmp_path / "image.tar", [bottom, top], oci=True)
    with_sieve = collect.gather(str(path))
    sifted = [m.path for m in artifacts.iter_members(str(path), lambda p: p.endswith(".so"), spool_over=1,
                                                     sieve=HostLibrarySieve(lambda _p: True)) if m.summary is not None]  # fmt: skip
    monkeypatch.setattr(HostLibrarySieve, "sifts", lambda _self, _path: False)
    without = collect.gather(str(path))
    assert sorted(sifted) == [
        "usr/lib/libalias.so", "usr/lib/libempty_fatbin.so", "usr/lib/libfatbin_past_end.so", "usr/lib/libhost.so",
        "usr/lib/liblying.so", "usr/lib/liblying_alias.so",
    ]  # fmt: skip
    assert with_sieve.cubins is not None and without.cubins is not None
    assert with_sieve.cubins.to_json() == without.cubins.to_json()
    assert (with_sieve.libraries, with_sieve.unreadable, with_sieve.files_seen) == (without.libraries, without.unreadable, without.files_seen)
    warned = {w["path"] for w in with_sieve.cubins.to_json().get("warnings", [])}
    assert {"usr/lib/liblying.so", "usr/lib/liblying_alias.so", "usr/lib/libfatbin_past_end.so"} <= warned


def test_a_member_past_the_hold_limit_is_kept_whole(tmp_path: Path, small_pieces: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layers, "HOLD_MAX", 10000)
    got = _members(image_archive(tmp_path / "image.tar", [{"lib/host.so": HOST}]))
    assert got["lib/host.so"].data == HOST and got["lib/host.so"].summary is None


def test_a_library_another_reader_wants_comes_whole(tmp_path: Path, small_pieces: None) -> None:
    class Also:
        def __init__(self) -> None:
            self.got: dict[str, bytes] = {}

        def wants(self, path: str) -> bool:
            return path == "lib/host.so"

        def add(self, path: str, data: bytes) -> None:
            self.got[path] = bytes(data)

    also = Also()
    path = image_archive(tmp_path / "image.tar", [{"lib/host.so": HOST, "lib/other.so": HOST[::-1]}], oci=True)
    collect.gather(str(path), also=also)
    assert also.got == {"lib/host.so": HOST}


def test_a_layer_cut_inside_a_sifted_member_is_unreadable(tmp_path: Path, small_pieces: None) -> None:
    cut = gzip.compress(layer_tar({"lib/host.so": HOST})[: 512 + len(HOST) // 2])  # the header, half the library
    config = json.dumps({"architecture": "arm64", "os": "linux", "config": {}}).encode()
    names = {f"blobs/sha256/{digest_of(blob)[7:]}": blob for blob in (config, cut)}
    config_name, layer_name = names
    manifest = json.dumps([{"Config": config_name, "Layers": [layer_name]}]).encode()
    archive = tmp_path / "cut.tar"
    with tarfile.open(archive, "w") as tar:
        for name, data in {"manifest.json": manifest, **names}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(UsageError, match=r"unreadable.*ends inside lib/host\.so"):
        collect.gather(str(archive))


def test_a_downloaded_layer_is_spooled_not_sifted(small_pieces: None) -> None:
    """Held chunks of a download would be peak RSS the copy frees (the registry check's goal)."""
    shown: list[str] = []

    class Recording(HostLibrarySieve):
        def sifts(self, path: str) -> bool:
            shown.append(path)
            return True

    blob = gzip.compress(layer_tar({"lib/host.so": HOST}))
    members = layers.read_layers([("sha256:" + "0" * 64, lambda: [blob])], lambda _p: True, "test", 1, sieve=Recording(lambda _p: True))
    got = [(m.path, bytes(m.data or b""), m.summary) for m in members]  # read while the walk holds it
    assert got == [("lib/host.so", HOST, None)]
    assert shown == []

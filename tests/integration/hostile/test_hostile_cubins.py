"""`spark-images cubins` on crafted device code, zip bombs and image archives.

Every case is generated here from the nvcc-compiled oracle binaries
(tests/data/cubins/oracle/bin) and run through the CLI as a fresh subprocess
(`harness.run_cli`): exit code, one line naming the file, wall time and peak
RSS are all asserted. A verdict must come from the payload itself: a fatbin
entry header that claims sm_121a proves nothing.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import struct
import tarfile
import zlib
from pathlib import Path

import pytest
import zstandard
from harness import Result, assert_clean_failure, run_cli

from spark_images.cubins.fatbin import scan_binary
from support.fatbins import FLAG_A, FLAG_F, FLAG_LZ4, FLAG_ZSTD, entry, zstd_cubin
from support.fatbins import container as fatbin
from support.oci_blobs import digest_of, layer_tar
from support.paths import ORACLE_BIN

pytestmark = pytest.mark.processes  # every case runs the CLI as a process under a clock

ORACLE = ORACLE_BIN
WALL_S = 60.0
RSS_MB = 512.0


# --- building blocks ----------------------------------------------------------------------


def cubin(name: str) -> bytes:
    return (ORACLE / "cubins" / name).read_bytes()


def cli(*args: str, timeout: float = WALL_S) -> Result:
    return run_cli(["cubins", *args], timeout=timeout)


def assert_bounded(result: Result) -> None:
    context = f"rc={result.rc} wall={result.wall_s:.1f}s rss={result.max_rss_mb:.0f}MB\n{result.stderr[-2000:]}"
    assert not result.timed_out, context
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, context
    assert result.wall_s < WALL_S, context
    assert result.max_rss_mb < RSS_MB, context


def assert_not_native(result: Result, path: Path) -> dict:  # type: ignore[type-arg]
    """Exit 1, one stderr line naming the file, a JSON verdict that is not native."""
    assert_clean_failure(result, rc=1, names=[str(path)], wall_s=WALL_S, rss_mb=RSS_MB, max_lines=3)
    doc = json.loads(result.stdout)
    assert doc["verdict"] in ("missing", "jit-only", "no-gpu-code"), doc["verdict"]
    assert doc["summary"]["native"] == 0
    return doc


# --- forged payloads behind an honest-looking sm_121a header ------------------------------

RANDOM = os.urandom(12000)
FORGED_PAYLOADS = {
    "random": RANDOM,
    "zeros": bytes(12000),
    "elf-magic-then-junk": b"\x7fELF\x02\x01\x01" + RANDOM[:8000],
    "sm90-cubin": cubin("k_sm90.cubin"),
    "sm120-cubin": cubin("k_sm120.cubin"),
    "sm120f-cubin": cubin("k_sm120f.cubin"),
    "host-elf": (ORACLE / "lib" / "libsm90.so").read_bytes()[:12000],
    "empty": b"",
}
CLAIMS = {"sm_121a": (121, FLAG_A), "sm_121": (121, 0), "sm_121f": (121, FLAG_F)}
COMPRESSION = ["none", "zstd", "lz4"]


def _pack(payload: bytes, sm: int, flags: int, compression: str) -> bytes:
    if compression == "zstd":
        return zstd_cubin(payload, sm=sm, flags=flags)
    if compression == "lz4":
        import lz4.block

        packed = lz4.block.compress(payload, store_size=False)
        return entry(packed, sm=sm, flags=flags | FLAG_LZ4, compressed=len(packed), uncompressed=len(payload))
    return entry(payload, sm=sm, flags=flags)


# an empty payload has nothing to compress: it is forged uncompressed only
FORGERIES = [(payload, claim, compression) for payload in sorted(FORGED_PAYLOADS) for claim in sorted(CLAIMS)
             for compression in COMPRESSION if payload != "empty" or compression == "none"]  # fmt: skip


@pytest.mark.parametrize(("payload", "claim", "compression"), FORGERIES)
def test_a_header_claim_is_not_a_verdict(tmp_path: Path, payload: str, claim: str, compression: str) -> None:
    sm, flags = CLAIMS[claim]
    path = tmp_path / f"forged-{payload}-{claim}-{compression}.fatbin"
    path.write_bytes(fatbin(_pack(FORGED_PAYLOADS[payload], sm, flags, compression)))
    doc = assert_not_native(cli(str(path), "--json"), path)
    (lib,) = doc["libraries"]
    assert lib["unreadable"], "the forged entry must be named as unreadable"
    assert claim not in lib["sass"]


def _relabel_library(src: bytes, sm: int, flags: int) -> bytes:
    """A real library whose every cubin entry header is rewritten to claim `sm` + flags."""
    data = bytearray(src)
    for fb in scan_binary(src).fatbins:
        head = fb.offset + 0x10
        for e in fb.entries:
            hsize, padded = struct.unpack_from("<IQ", data, head + 4)
            this, head = head, head + hsize + padded
            if e.kind == "cubin":
                struct.pack_into("<I", data, this + 0x1C, sm)
                old = struct.unpack_from("<Q", data, this + 0x28)[0]
                struct.pack_into("<Q", data, this + 0x28, (old & ~(FLAG_A | FLAG_F)) | flags)
    relabelled = bytes(data)
    assert {e.sm for fb in scan_binary(relabelled).fatbins for e in fb.entries if e.kind == "cubin"} == {sm}
    return relabelled


@pytest.mark.parametrize(
    ("lib", "claim"),
    [
        ("libsm90.so", "sm_121a"),
        ("libsm90.so", "sm_121"),
        ("libsm120a.so", "sm_121a"),
        ("libsm120a.so", "sm_120f"),  # arch-specific 12.0 dressed up as the family
        ("libsm120a.so", "sm_120"),
        ("libzstd.so", "sm_121a"),  # compressed cubins relabelled
        ("librdc.so", "sm_121a"),
        ("liblz4.so", "sm_121f"),
    ],
)
def test_a_real_cubin_relabelled_is_not_native(tmp_path: Path, lib: str, claim: str) -> None:
    sm = int(claim[3:6])
    flags = FLAG_A if claim.endswith("a") else FLAG_F if claim.endswith("f") else 0
    path = tmp_path / f"relabelled-{claim}-{lib}"
    path.write_bytes(_relabel_library((ORACLE / "lib" / lib).read_bytes(), sm, flags))
    doc = assert_not_native(cli(str(path), "--json", "--kernels"), path)
    # their PTX still JITs (jit-only); the others have nothing left at all
    assert doc["verdict"] == ("jit-only" if lib in ("libzstd.so", "liblz4.so") else "missing")
    assert "sm_12" in json.dumps(doc["unreadable"])


def test_an_honest_library_stays_native() -> None:
    """The same checks pass real code: the verification is not a blanket refusal."""
    for lib in ("libsm121a.so", "libsm120f.so", "libsm120.so", "librdc.so"):
        result = cli(str(ORACLE / "lib" / lib), "--json", "--kernels", "--strict")
        assert_bounded(result)
        assert result.rc == 0, (lib, result.stderr)
        assert json.loads(result.stdout)["verdict"] == "native"


# --- section tables that lie ----------------------------------------------------------------


def _sections(data: bytes) -> tuple[int, int, int, int]:
    shoff = struct.unpack_from("<Q", data, 40)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 58)
    return shoff, shentsize, shnum, shstrndx


def _names_out_of_range(data: bytes, which: str) -> bytes:
    buf = bytearray(data)
    shoff, size, num, strndx = _sections(data)
    str_off = struct.unpack_from("<Q", data, shoff + strndx * size + 24)[0]
    for i in range(num):
        base = shoff + i * size
        name_off = struct.unpack_from("<I", data, base)[0]
        name = data[str_off + name_off : data.index(b"\0", str_off + name_off)]
        if which == "all" or name == b".nv_fatbin":
            struct.pack_into("<I", buf, base, 0xFFFFFF00 if which != "just-past" else 0x7FFFFFF)
        if which == "fatbin-offset-past-end" and name == b".nv_fatbin":
            struct.pack_into("<I", buf, base, name_off)
            struct.pack_into("<Q", buf, base + 24, len(data) + 4096)
    return bytes(buf)


@pytest.mark.parametrize("which", ["all", "fatbin", "just-past", "fatbin-offset-past-end"])
@pytest.mark.parametrize("lib", ["libsm121a.so", "libsm120f.so", "libmixed.so"])
def test_untrusted_section_tables_fall_back_to_the_magic_scan(tmp_path: Path, lib: str, which: str) -> None:
    path = tmp_path / f"names-{which}-{lib}"
    path.write_bytes(_names_out_of_range((ORACLE / "lib" / lib).read_bytes(), which))
    result = cli(str(path), "--json")
    assert_bounded(result)
    doc = json.loads(result.stdout)
    assert doc["verdict"] != "no-gpu-code", "a lying section table must not hide the fatbins"
    assert doc["verdict"] in ("native", "partial")
    assert result.rc == 0
    assert doc["warnings"] and all(w["path"] == path.name for w in doc["warnings"])
    assert any(path.name in line and "warning" in line for line in result.lines()), result.stderr


# --- zip bombs ------------------------------------------------------------------------------

BOMB_MIB = 4095  # 4 GiB less 1 MiB: fits the 32-bit zip fields, no ZIP64 needed


@pytest.fixture(scope="module")
def zero_deflate() -> tuple[bytes, int]:
    """(raw deflate stream of BOMB_MIB MiB of zeros, its CRC-32), built from one repeated block."""
    chunk = bytes(1 << 20)
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = comp.compress(chunk) + comp.flush(zlib.Z_FULL_FLUSH)  # a full flush resets the window
    final = zlib.compressobj(9, zlib.DEFLATED, -15).flush()
    assert zlib.decompress(block * 3 + final, -15) == chunk * 3
    crc = 0
    for _ in range(BOMB_MIB):
        crc = zlib.crc32(chunk, crc)
    return block * BOMB_MIB + final, crc


def raw_zip(path: Path, members: list[tuple[str, bytes, int, int, int]]) -> None:
    """A zip from (name, raw data, method, crc, declared uncompressed size) written by hand."""
    out = io.BytesIO()
    central = b""
    for name, data, method, crc, size in members:
        offset = out.tell()
        fields = struct.pack("<HHHHHIIIHH", 20, 0, method, 0, 0x21, crc, len(data), size, len(name), 0)
        out.write(b"PK\x03\x04" + fields + name.encode() + data)
        central += b"PK\x01\x02" + struct.pack("<H", 20) + fields + struct.pack("<HHHII", 0, 0, 0, 0, offset) + name.encode()
    start = out.tell()
    out.write(central)
    out.write(b"PK\x05\x06" + struct.pack("<HHHHIIH", 0, 0, len(members), len(members), len(central), start, 0))
    path.write_bytes(out.getvalue())


def _deflated(data: bytes) -> bytes:
    comp = zlib.compressobj(6, zlib.DEFLATED, -15)
    return comp.compress(data) + comp.flush()


@pytest.mark.parametrize(
    "declared", ["honest", "lies-small", "lies-one-mib", "many-members"]
)
def test_zip_bomb_members_stay_bounded(tmp_path: Path, zero_deflate: tuple[bytes, int], declared: str) -> None:
    stream, crc = zero_deflate
    size = {"honest": BOMB_MIB << 20, "lies-small": 4096, "lies-one-mib": 1 << 20}.get(declared, BOMB_MIB << 20)
    names = [f"bomb/lib{i}.so" for i in range(20 if declared == "many-members" else 1)]
    wheel = tmp_path / f"bomb_{declared.replace('-', '_')}-1.0-py3-none-linux_aarch64.whl"
    raw_zip(wheel, [(name, stream, 8, crc, size) for name in names])
    doc = assert_not_native(cli(str(wheel), "--json"), wheel)
    assert sorted(u["path"] for u in doc["unreadable"]) == sorted(names)
    if declared in ("honest", "many-members"):
        assert all("exceeds" in u["error"] for u in doc["unreadable"])


def test_a_bomb_beside_real_code(tmp_path: Path, zero_deflate: tuple[bytes, int]) -> None:
    stream, crc = zero_deflate
    good = (ORACLE / "lib" / "libsm121a.so").read_bytes()
    wheel = tmp_path / "mixed-1.0-py3-none-linux_aarch64.whl"
    raw_zip(wheel, [("m/libgood.so", _deflated(good), 8, zlib.crc32(good), len(good)),
                    ("m/libbomb.so", stream, 8, crc, BOMB_MIB << 20)])
    plain = cli(str(wheel), "--json")
    assert_bounded(plain)
    assert plain.rc == 0 and json.loads(plain.stdout)["verdict"] == "native"
    strict = cli(str(wheel), "--strict")
    assert_clean_failure(strict, rc=1, names=["m/libbomb.so"], wall_s=WALL_S, rss_mb=RSS_MB)
    assert "exceeds" in strict.stderr


# --- zstd entries that inflate to 2 GiB -----------------------------------------------------


@pytest.fixture(scope="module")
def zstd_2gib() -> bytes:
    comp = zstandard.ZstdCompressor(level=1).compressobj(size=2 << 30)
    zeros = bytes(16 << 20)
    parts = [comp.compress(zeros) for _ in range(128)]
    return b"".join(parts) + comp.flush()


@pytest.mark.parametrize(
    ("declared", "count"),
    [("honest", 1), ("honest", 64), ("lies-cubin-size", 1), ("lies-cubin-size", 64), ("under-cap", 8), ("zero", 4)],
)
@pytest.mark.parametrize("kernels", [False, True])
def test_zstd_entries_inflating_to_2gib(tmp_path: Path, zstd_2gib: bytes, declared: str, count: int, kernels: bool) -> None:
    size = {"honest": 2 << 30, "lies-cubin-size": 11952, "under-cap": 200 << 20, "zero": 0}[declared]
    entries = [
        entry(zstd_2gib, sm=121, flags=FLAG_A | FLAG_ZSTD, compressed=len(zstd_2gib), uncompressed=size)
        for _ in range(count)
    ]
    path = tmp_path / f"zstd-{declared}-{count}.fatbin"
    path.write_bytes(fatbin(*entries))
    args = [str(path), "--json", *(["--kernels"] if kernels else [])]
    doc = assert_not_native(cli(*args), path)
    (lib,) = doc["libraries"]
    assert len([p for p in lib["unreadable"] if "sm_121a" in p]) >= count
    if declared in ("honest", "under-cap"):
        assert "exceeds" in lib["unreadable"][0]


# --- image archives -------------------------------------------------------------------------


def oci_archive(path: Path, layers: list[bytes], *, index: bytes | None = None) -> None:
    config = json.dumps({"architecture": "arm64", "os": "linux"}).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest_of(config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest_of(b), "size": len(b)}
                   for b in layers],
    }).encode()
    top = index if index is not None else json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest_of(manifest),
         "size": len(manifest), "platform": {"os": "linux", "architecture": "arm64"}}]}).encode()
    with tarfile.open(path, "w") as tar:
        for name, data in [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", top),
                           *((f"blobs/sha256/{digest_of(b)[7:]}", b) for b in (config, manifest, *layers))]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def zstd_layer_bomb() -> bytes:
    """A zstd layer: a tar whose one member is 8 GiB of zeros (the frame is a few hundred KiB)."""
    head = tarfile.TarInfo("opt/zero.bin")
    head.size = 8 << 30
    comp = zstandard.ZstdCompressor(level=1).compressobj()
    parts = [comp.compress(head.tobuf(format=tarfile.PAX_FORMAT))]
    zeros = bytes(16 << 20)
    parts += [comp.compress(zeros) for _ in range(512)]
    return b"".join(parts) + comp.flush()


ARCHIVE_CASES = [
    "layer-bomb", "not-a-layer", "index-garbage", "index-no-arm64", "no-index", "cut", "digest-mismatch",
    "corrupt-second-header", "huge-pax-header",
]


def _pax_bomb() -> bytes:
    """A layer whose first header is a pax extended header claiming 2 GiB."""
    info = tarfile.TarInfo("././@PaxHeader")
    info.type = tarfile.XHDTYPE
    info.size = 2 << 30
    return gzip.compress(info.tobuf(format=tarfile.USTAR_FORMAT) + bytes(4096))


def _corrupt_second_header() -> bytes:
    raw = bytearray(layer_tar({"usr/lib/liba.so": b"a" * 1000, "usr/lib/libsm121a.so": (ORACLE / "lib" / "libsm121a.so").read_bytes()}))
    second = 512 + 1024  # the first header and its 1000 bytes of data (padded), then the next header
    raw[second + 148 : second + 156] = b"9999999\0"  # a checksum that cannot hold
    return gzip.compress(bytes(raw))


@pytest.mark.parametrize("case", ARCHIVE_CASES)
def test_hostile_image_archives(tmp_path: Path, case: str, zstd_layer_bomb: bytes) -> None:
    path = tmp_path / f"image-{case}.tar"
    lib = gzip.compress(layer_tar({"usr/lib/libsm121a.so": (ORACLE / "lib" / "libsm121a.so").read_bytes()}))
    if case == "layer-bomb":
        oci_archive(path, [lib, zstd_layer_bomb])
    elif case == "not-a-layer":
        oci_archive(path, [gzip.compress(b"not a tar " * 1000)])
    elif case == "index-garbage":
        oci_archive(path, [lib], index=b"{not json")
    elif case == "index-no-arm64":
        oci_archive(path, [lib], index=json.dumps({"schemaVersion": 2, "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest_of(b"x"), "size": 1,
             "platform": {"os": "linux", "architecture": "amd64"}}]}).encode())
    elif case == "corrupt-second-header":
        oci_archive(path, [_corrupt_second_header()])
    elif case == "huge-pax-header":
        oci_archive(path, [_pax_bomb()])
    elif case == "no-index":
        with tarfile.open(path, "w") as tar:
            info = tarfile.TarInfo("lib.so")
            info.size = 4
            tar.addfile(info, io.BytesIO(b"\x7fELF"))
    elif case == "cut":
        oci_archive(path, [lib])
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:  # a layer blob whose bytes are not what its name says
        oci_archive(path, [lib])
        raw = bytearray(path.read_bytes())
        at = raw.rfind(b"\x1f\x8b")  # the gzip layer
        raw[at + 40 : at + 48] = b"\xff" * 8
        path.write_bytes(bytes(raw))
    result = cli(str(path))
    assert_clean_failure(result, rc=2, names=[str(path)], wall_s=WALL_S, rss_mb=RSS_MB, max_lines=2)
    if case in ("layer-bomb", "huge-pax-header"):
        assert "exceeds" in result.stderr

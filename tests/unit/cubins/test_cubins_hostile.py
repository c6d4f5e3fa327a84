"""Hostile input: a clear error or an `unreadable` entry, never a traceback or a hang."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from spark_images.cubins import scan_target
from spark_images.cubins.fatbin import FATBIN_MAGIC, scan_binary
from support.paths import ORACLE_BIN


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spark_images.cli", "cubins", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_clean(proc: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in proc.stderr
    assert "internal error" not in proc.stderr
    assert proc.returncode in (0, 1, 2)


def fatbin_offsets(data: bytes) -> list[int]:
    return [fb.offset for fb in scan_binary(data).fatbins]


@pytest.mark.parametrize("cut", [3, 63, 0x2100, 0x4000, -200, -3000])
def test_truncated_elf(tmp_path: Path, cut: int) -> None:
    data = (ORACLE_BIN / "lib/libmixed.so").read_bytes()
    path = tmp_path / "libcut.so"
    path.write_bytes(data[:cut])
    scan_binary(path.read_bytes())  # must not raise
    proc = cli(str(path), "--json", "--kernels")
    assert_clean(proc)
    # exit 1 exactly when nothing left in the cut file runs natively (one stderr line names it)
    verdict = json.loads(proc.stdout)["verdict"]
    assert proc.returncode == (0 if verdict in ("native", "partial") else 1), proc.stderr
    if proc.returncode:
        assert str(path) in proc.stderr


def test_truncation_inside_a_fatbin_is_reported(tmp_path: Path) -> None:
    data = (ORACLE_BIN / "lib/libmixed.so").read_bytes()
    second = fatbin_offsets(data)[1]
    path = tmp_path / "libcut.so"
    path.write_bytes(data[: second + 4000])
    doc = scan_target(str(path)).to_json()
    assert doc["unreadable"], "a cut fatbin must be reported"
    assert "unreadable" in doc["libraries"][0]


@pytest.mark.parametrize(
    ("offset", "value"),
    [
        (40, struct.pack("<Q", 1 << 40)),  # e_shoff far past the end
        (58, struct.pack("<H", 8)),  # e_shentsize too small
        (62, struct.pack("<H", 9999)),  # e_shstrndx out of range
        (4, b"\x01"),  # 32-bit class
    ],
)
def test_corrupt_elf_header(tmp_path: Path, offset: int, value: bytes) -> None:
    data = bytearray((ORACLE_BIN / "lib/libsm120f.so").read_bytes())
    data[offset : offset + len(value)] = value
    path = tmp_path / "libcorrupt.so"
    path.write_bytes(bytes(data))
    scan = scan_binary(bytes(data))
    assert scan.problems or scan.fatbins
    assert_clean(cli(str(path), "--kernels"))


def test_fake_magic_in_host_data_is_not_device_code(tmp_path: Path) -> None:
    # a fatbin magic with a plausible container header, but inside .rodata
    fake = FATBIN_MAGIC + struct.pack("<HHQ", 1, 0x10, 64) + struct.pack("<HHI", 2, 0x0101, 0x40)
    src = tmp_path / "fake.c"
    array = ", ".join(str(b) for b in fake + bytes(64))
    src.write_text(f"const unsigned char fake_fatbin[] = {{{array}}};\nint f(void) {{ return fake_fatbin[3]; }}\n")
    lib = tmp_path / "libfake.so"
    try:
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no C compiler to build the host library")
    doc = scan_target(str(lib)).to_json()
    assert doc["verdict"] == "no-gpu-code"
    # the magic outside .nv_fatbin is listed apart (embedded), never counted as device code
    (entry,) = doc["libraries"]
    assert (entry["fatbins"], entry["native"], entry["jit_only"], entry["embedded"]) == (0, 0, 0, 1)
    assert entry["verdict"] == "no-gpu-code" and "listed apart, not counted" in entry["warnings"][0]


def test_magic_followed_by_garbage_is_ignored_without_section_headers() -> None:
    junk = b"\x7fELF" + bytes(60) + (FATBIN_MAGIC + b"\xff" * 60) * 50
    scan = scan_binary(junk)
    assert scan.fatbins == ()


def test_sizes_that_point_past_the_end(tmp_path: Path) -> None:
    data = bytearray((ORACLE_BIN / "lib/libsm120.so").read_bytes())
    first = fatbin_offsets(bytes(data))[0]
    data[first + 8 : first + 16] = struct.pack("<Q", 1 << 50)  # container size
    second_data = bytearray((ORACLE_BIN / "lib/libsm120.so").read_bytes())
    second_data[first + 16 + 8 : first + 16 + 16] = struct.pack("<Q", 1 << 40)  # entry payload size
    for i, blob in enumerate((data, second_data)):
        path = tmp_path / f"liblie{i}.so"
        path.write_bytes(bytes(blob))
        doc = scan_target(str(path)).to_json()
        assert doc["unreadable"], f"case {i}: a lying size must be reported"
        assert_clean(cli(str(path), "--kernels"))


def test_corrupt_compressed_payload_with_kernels(tmp_path: Path) -> None:
    data = bytearray((ORACLE_BIN / "lib/libzstd.so").read_bytes())
    scan = scan_binary(bytes(data))
    entry = scan.fatbins[-1].entries[0]
    assert entry.compression == "zstd"
    # break the zstd frame header (a flipped literal byte would still decompress)
    start = entry.payload_offset
    data[start : start + 8] = b"\xa5" * 8
    path = tmp_path / "libbad.so"
    path.write_bytes(bytes(data))
    doc = scan_target(str(path), kernels=True).to_json()
    (lib,) = doc["libraries"]
    assert any("zstd" in p for p in lib["unreadable"])
    # a cubin whose payload cannot be read proves nothing: only the PTX of that unit counts
    assert lib["verdict"] == "jit-only"
    assert "sm_120f" not in lib["sass"]


def test_zip_with_a_lying_size(tmp_path: Path) -> None:
    wheel = tmp_path / "liar-1.0-py3-none-linux_aarch64.whl"
    payload = (ORACLE_BIN / "lib/libsm120f.so").read_bytes()
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("liar/libok.so", payload)
        zf.writestr("liar/liblie.so", payload)
    raw = bytearray(wheel.read_bytes())
    # grow the declared size of liblie.so in its central directory record
    name = b"liar/liblie.so"
    cd = raw.rfind(b"PK\x01\x02", 0, raw.rfind(name))
    raw[cd + 24 : cd + 28] = struct.pack("<I", len(payload) + 4096)
    wheel.write_bytes(bytes(raw))
    doc = scan_target(str(wheel)).to_json()
    assert [lib["path"] for lib in doc["libraries"]] == ["liar/libok.so"]
    assert [u["path"] for u in doc["unreadable"]] == ["liar/liblie.so"]
    assert_clean(cli(str(wheel)))


def test_truncated_zip_is_a_clear_error(tmp_path: Path) -> None:
    wheel = tmp_path / "cut-1.0-py3-none-linux_aarch64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("cut/lib.so", (ORACLE_BIN / "lib/libsm90.so").read_bytes())
    wheel.write_bytes(wheel.read_bytes()[:5000])
    proc = cli(str(wheel))
    assert_clean(proc)
    assert proc.returncode == 2
    assert "zip" in proc.stderr

"""The target opener the audit shares: directories, files, wheels, target kinds."""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

import pytest

from spark_images.core.errors import UsageError
from spark_images.cubins.fatbin import cubin_info
from spark_images.cubins.scan import is_candidate
from spark_images.readers import artifacts
from support.paths import ORACLE_BIN


def test_target_kinds(tmp_path: Path) -> None:
    wheel = tmp_path / "x-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("x/__init__.py", "")
    assert artifacts.target_kind(str(tmp_path)) == artifacts.KIND_DIR
    assert artifacts.target_kind(str(wheel)) == artifacts.KIND_WHEEL
    assert artifacts.target_kind(str(ORACLE_BIN / "lib/libsm90.so")) == artifacts.KIND_FILE
    assert artifacts.target_kind("vllm==0.29.0") == artifacts.KIND_REQUIREMENT
    assert artifacts.target_kind("docker://spark-vllm:cu130") == artifacts.KIND_DOCKER
    assert artifacts.target_kind("127.0.0.1:5000/spark/vllm:cu130") == artifacts.KIND_REGISTRY
    assert artifacts.target_kind("ghcr.io/o/r@sha256:" + "0" * 64) == artifacts.KIND_REGISTRY
    for bad in ("no-such-file", "docker://", "vllm>=1"):
        with pytest.raises(UsageError):
            artifacts.target_kind(bad)


def test_directory_and_wheel_yield_the_same_members(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "_version.py").write_text("__version__ = '9.9.9'\n")
    (site / "vllm" / "_C.abi3.so").write_bytes((ORACLE_BIN / "lib/libsm120f.so").read_bytes())
    (site / "vllm" / "link.so").symlink_to(site / "vllm" / "_C.abi3.so")
    wheel = tmp_path / "vllm-9.9.9-cp38-abi3-linux_aarch64.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(site.rglob("*")):
            if path.is_file() and not path.is_symlink():
                zf.write(path, path.relative_to(site).as_posix())
    want = is_candidate
    from_dir = dict(artifacts.iter_files(str(site), want))
    from_wheel = dict(artifacts.iter_files(str(wheel), want))
    assert from_dir == from_wheel
    assert sorted(from_dir) == ["vllm/_C.abi3.so"]  # symlinks are not followed
    for target in (str(site), str(wheel)):
        assert artifacts.read_one(target, "vllm/_version.py") == b"__version__ = '9.9.9'\n"
        assert artifacts.read_one(target, "/vllm/_version.py") is not None
        assert artifacts.read_one(target, "_version.pyc") is None


def test_candidates() -> None:
    assert is_candidate("a/b/libfoo.so")
    assert is_candidate("usr/lib/libcudart.so.13.0.96")
    assert is_candidate("flashinfer_cubin/cubins/x/y.cubin")
    assert not is_candidate("a/b/foo.so.py")
    assert not is_candidate("filler/blob.bin")


def _cuda_elf(abi: int, flags: int) -> bytes:
    """A bare EM_CUDA ELF header (no sections): the fields cubin_info reads, per the reference."""
    head = bytearray(64)
    head[0:4] = b"\x7fELF"
    head[4], head[5], head[6] = 2, 1, 1
    head[7] = 0x33 if abi == 7 else 0x41
    head[8] = abi
    struct.pack_into("<HHI", head, 16, 2, 190, 1)
    struct.pack_into("<I", head, 48, flags)
    struct.pack_into("<H", head, 52, 64)
    return bytes(head)


def test_elf_abi_7_and_8_headers() -> None:
    # ABI 7 (CUDA <= 12.x, sm_90 and older): SM in the low byte, virtual SM in bits 16-23, 'a' = 0x800
    info = cubin_info(_cuda_elf(7, 0x5A0000 | 0x800 | 90))
    assert (info.sm, info.variant, info.abi_version) == (90, "a", 7)
    info = cubin_info(_cuda_elf(7, 0x500000 | 80))
    assert (info.sm, info.variant) == (80, "")
    # ABI 8: SM in bits 8-15; CUDA 12.9 marks 'a' with 0x8
    info = cubin_info(_cuda_elf(8, 0x06007808))
    assert (info.sm, info.variant) == (120, "a")
    with pytest.raises(ValueError):
        cubin_info(_cuda_elf(9, 0))


def test_mapped_members_give_the_same_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """Large files are mapped instead of read; force that for every file and compare."""
    from spark_images.cubins import scan, scan_target

    normal = scan_target(str(ORACLE_BIN), kernels=True).to_json()
    monkeypatch.setattr(scan, "SPOOL_OVER", 0)
    mapped = scan_target(str(ORACLE_BIN), kernels=True).to_json()
    assert mapped == normal


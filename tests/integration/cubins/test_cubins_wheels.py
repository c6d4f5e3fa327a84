"""Real vLLM aarch64 wheels from PyPI (cached under ~/.cache/spark-images/wheels).

Facts from the fatbin reference, checked against what the parser computes:
0.11.0 (CUDA 12.9, LZ4 payloads) has sm_120 and sm_120a cubins but no family
cubins; 0.29.0 (CUDA 13.0) has no sm_121 cubins at all, yet its main library
reaches sm_121 through sm_120 / sm_120f cubins.
"""

from __future__ import annotations

import zipfile

import pytest

from spark_images import pypi
from spark_images.cubins import scan_target
from spark_images.cubins import verdict as v
from spark_images.cubins.fatbin import cubin_info, decompress_payload, scan_binary
from spark_images.cubins.report import glob_matches
from spark_images.readers import artifacts

pytestmark = [pytest.mark.network, pytest.mark.slow]

OLD = "vllm==0.11.0"
NEW = "vllm==0.29.0"
SPARK_SASS = {"sm_121", "sm_121a", "sm_121f"}


@pytest.fixture(scope="module")
def old_report(pypi_reachable: None):  # type: ignore[no-untyped-def]
    return scan_target(OLD, required=("vllm/_C*.so",))


@pytest.fixture(scope="module")
def new_report(pypi_reachable: None):  # type: ignore[no-untyped-def]
    return scan_target(NEW, required=("vllm/_C*.so", "vllm/_moe_C*.so"))


def _all_sass(report) -> set[str]:  # type: ignore[no-untyped-def]
    return {t for lib in report.libraries for t in lib.targets("sass")}


def test_cuda_12_9_wheel_has_arch_specific_but_no_family_cubins(old_report) -> None:  # type: ignore[no-untyped-def]
    sass = _all_sass(old_report)
    assert {"sm_120", "sm_120a"} <= sass
    assert not any(t.endswith("f") for t in sass)
    assert not sass & SPARK_SASS
    assert old_report.verdict == v.rollup(old_report.counts)


def test_cuda_12_9_wheel_uses_lz4_and_elf_abi_7(old_report) -> None:  # type: ignore[no-untyped-def]
    wheel = pypi.cached(pypi.resolve(OLD))
    assert wheel is not None, "the scan should have cached the wheel"
    (main_lib,) = [lib.path for lib in old_report.libraries if glob_matches("vllm/_C*.so", lib.path)]
    with zipfile.ZipFile(wheel) as zf:
        data = zf.read(main_lib)
    entries = [e for fb in scan_binary(data).fatbins for e in fb.entries]
    assert "lz4" in {e.compression for e in entries}
    old_arch = [e for e in entries if e.kind == "cubin" and e.sm < 100]
    assert old_arch, "expected pre-Blackwell cubins in a CUDA 12.9 build"
    for entry in old_arch[:3]:
        info = cubin_info(decompress_payload(data, entry))
        assert (info.abi_version, info.sm) == (7, entry.sm)
    blackwell = next(e for e in entries if e.kind == "cubin" and e.sm == 120)
    info = cubin_info(decompress_payload(data, blackwell))
    assert (info.abi_version, info.sm) == (8, 120)
    assert info.kernels


def test_cuda_13_wheel_reaches_the_spark_through_sm120_family(new_report) -> None:  # type: ignore[no-untyped-def]
    assert not _all_sass(new_report) & SPARK_SASS
    main = [lib for lib in new_report.libraries if glob_matches("vllm/_C*.so", lib.path)]
    assert main, "the main vLLM library is missing from the report"
    for lib in main:
        assert lib.counts.native > 0
        assert {"sm_120", "sm_120f"} & set(lib.targets("sass"))
    # per-fatbin coverage shows gaps a per-library target list hides
    assert new_report.verdict == v.rollup(new_report.counts)
    assert new_report.counts.native > 0
    assert not any("vllm/_C" in line for line in new_report.missing_required)


def test_requirement_members_by_range_requests(pypi_reachable: None) -> None:
    wheel = pypi.resolve(NEW)
    remote = pypi.HttpRangeFile(wheel.url, wheel.size)
    import io

    with zipfile.ZipFile(io.BufferedReader(remote, buffer_size=1 << 16)) as zf:
        version_py = zf.read("vllm/_version.py")
    assert b"0.29.0" in version_py
    assert remote.bytes_fetched < wheel.size // 50
    cached = pypi.cached(wheel)
    if cached is not None:
        with zipfile.ZipFile(cached) as zf:
            assert zf.read("vllm/_version.py") == version_py
    assert artifacts.read_one(NEW, "vllm/_version.py") == version_py

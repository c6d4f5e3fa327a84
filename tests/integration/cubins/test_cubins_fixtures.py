"""Classification of libraries compiled by the local nvcc during the test session."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from spark_images.cli import main
from spark_images.cubins import scan_target
from spark_images.cubins.fatbin import scan_binary

pytestmark = pytest.mark.nvcc


def lib_json(target: Path, gpu: str = "sm_121", **kw: object) -> dict:  # type: ignore[type-arg]
    doc = scan_target(str(target), gpu, **kw).to_json()  # type: ignore[arg-type]
    (lib,) = doc["libraries"]
    return lib


@pytest.mark.parametrize(
    ("name", "verdict", "sass", "ptx"),
    [
        ("sm121a", "native", ["sm_121a"], []),
        ("sm120a", "missing", ["sm_120a"], []),
        ("sm120f", "native", ["sm_120f"], []),
        ("sm120", "native", ["sm_120"], []),
        ("ptx120", "jit-only", [], ["compute_120"]),
        ("sm90", "missing", ["sm_90"], []),
        ("zstd", "native", ["sm_120f"], ["compute_120"]),
        ("lz4", "jit-only", ["sm_120a"], ["compute_120"]),
        ("rdc", "native", ["sm_90", "sm_120f"], []),
        ("mixed", "partial", ["sm_90", "sm_120a", "sm_120f"], ["compute_120"]),
        ("stripped", "partial", ["sm_90", "sm_120a", "sm_120f"], ["compute_120"]),
    ],
)
def test_each_variant_is_classified_for_the_spark(
    fixture_bins: Path, name: str, verdict: str, sass: list[str], ptx: list[str]
) -> None:
    lib = lib_json(fixture_bins / "lib" / f"lib{name}.so")
    assert (lib["verdict"], lib["sass"], lib["ptx"]) == (verdict, sass, ptx)
    assert lib["native"] + lib["jit_only"] + lib["missing"] == lib["fatbins"]


def test_the_gpu_changes_the_answer(fixture_bins: Path) -> None:
    assert lib_json(fixture_bins / "lib/libsm120a.so", "sm_120")["verdict"] == "native"
    assert lib_json(fixture_bins / "lib/libsm121a.so", "sm_120")["verdict"] == "missing"
    assert lib_json(fixture_bins / "lib/libsm90.so", "sm_90")["verdict"] == "native"
    # sm_120f is a Blackwell-consumer family: no use on a datacenter Blackwell
    assert lib_json(fixture_bins / "lib/libsm120f.so", "sm_100")["verdict"] == "missing"


def test_compression_modes_are_read_from_the_flags(fixture_bins: Path) -> None:
    def modes(name: str) -> set[tuple[str, str]]:
        scan = scan_binary((fixture_bins / "lib" / name).read_bytes())
        return {(e.kind, e.compression) for fb in scan.fatbins for e in fb.entries}

    assert ("cubin", "zstd") in modes("libzstd.so")  # -Xfatbin=-compress-all
    assert ("ptx", "lz4") in modes("liblz4.so")  # --compress-mode=speed
    assert ("ptx", "zstd") in modes("libsm120.so") or ("cubin", "none") in modes("libsm120.so")
    assert ("ptx", "zstd") in modes("libptx120.so")  # the default compresses PTX


def test_the_device_link_stub_is_not_counted(fixture_bins: Path) -> None:
    lib = lib_json(fixture_bins / "lib/libsm120a.so")
    assert lib["link_stubs"] == 1
    assert lib["fatbins"] == 1


def test_section_headers_gone_still_finds_every_fatbin(fixture_bins: Path, headerless) -> None:  # type: ignore[no-untyped-def]
    src = fixture_bins / "lib/libmixed.so"
    bare = headerless(src)
    with_headers = scan_binary(src.read_bytes())
    without = scan_binary(bare.read_bytes())
    assert {fb.section for fb in without.fatbins} == {"scan"}
    assert [fb.entries for fb in without.fatbins] == [fb.entries for fb in with_headers.fatbins]
    assert lib_json(bare)["verdict"] == "partial"


def test_kernels_only_as_sm120a_are_named(fixture_bins: Path) -> None:
    lib = lib_json(fixture_bins / "lib/libmixed.so", kernels=True)
    assert lib["kernels"]["blockscaled_gemm_sm120a_only"] == ["sm_120a"]
    assert "sm_120f" in lib["kernels"]["saxpy_kernel"]
    assert "compute_120" in lib["kernels"]["saxpy_kernel"]
    assert lib["kernel_classes"]["missing"] == ["blockscaled_gemm_sm120a_only"]
    # per translation unit: the arch-specific unit is the gap
    units = sorted((u["class"], tuple(u["sass"])) for u in lib["units"])
    assert units == [("missing", ("sm_120a",)), ("native", ("sm_90", "sm_120a", "sm_120f"))]
    assert "saxpy_kernel" in lib["kernel_classes"]["native"]


def test_kernels_of_lz4_and_zstd_payloads(fixture_bins: Path) -> None:
    for name in ("liblz4.so", "libzstd.so", "librdc.so"):
        lib = lib_json(fixture_bins / "lib" / name, kernels=True)
        assert lib["kernels"], name
        assert "unreadable" not in lib, name


def test_bare_cubins_are_grouped_per_directory(fixture_bins: Path) -> None:
    doc = scan_target(str(fixture_bins), kernels=True).to_json()
    libs = {lib["path"]: lib for lib in doc["libraries"]}
    cubins = libs["cubins"]
    assert cubins["kind"] == "cubins"
    assert cubins["fatbins"] == 4
    assert cubins["sass"] == ["sm_90", "sm_120", "sm_120f", "sm_121a"]
    assert (cubins["native"], cubins["missing"]) == (3, 1)
    assert libs["fatbin/mixed.fatbin"]["verdict"] == "native"
    assert doc["verdict"] == "partial"


def test_json_contract(fixture_bins: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["cubins", str(fixture_bins / "lib"), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert {"target", "gpu", "verdict", "libraries"} <= doc.keys()
    assert doc["gpu"] == "sm_121"
    for lib in doc["libraries"]:
        assert {"path", "fatbins", "native", "jit_only", "missing", "sass", "ptx"} <= lib.keys()
        assert lib["sass"] == sorted(lib["sass"], key=lambda t: (int(t[3:6].rstrip("af")), t))
    verdicts = {lib["path"]: lib["verdict"] for lib in doc["libraries"]}
    assert verdicts["libsm121a.so"] == "native"
    assert verdicts["libsm90.so"] == "missing"


def _site(tmp_path: Path, main_lib: Path, moe_lib: Path) -> Path:
    site = tmp_path / "site-packages" / "vllm"
    site.mkdir(parents=True)
    shutil.copy(main_lib, site / "_C_stable_libtorch.abi3.so")
    shutil.copy(moe_lib, site / "_moe_C.abi3.so")
    return site.parent


def test_profile_required_libraries_set_the_exit_code(
    fixture_bins: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = Path(__file__).resolve().parents[3] / "profiles" / "cu130.yaml"
    if not profile.is_file():
        pytest.skip("profiles/cu130.yaml not in this tree")
    good = _site(tmp_path / "good", fixture_bins / "lib/libsm120f.so", fixture_bins / "lib/libsm121a.so")
    bad = _site(tmp_path / "bad", fixture_bins / "lib/libsm120f.so", fixture_bins / "lib/libsm120a.so")
    assert main(["cubins", str(good), "--profile", str(profile)]) == 0
    capsys.readouterr()
    assert main(["cubins", str(bad), "--profile", str(profile), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["missing_required"]) == 1
    assert "vllm/_moe_C.abi3.so" in doc["missing_required"][0]


def test_require_flag_and_the_pipeline_api(fixture_bins: Path, tmp_path: Path) -> None:
    site = _site(tmp_path, fixture_bins / "lib/libptx120.so", fixture_bins / "lib/libsm121a.so")
    report = scan_target(str(site), required=("vllm/_C*.so", "vllm/_moe_C*.so", "vllm/_flashmla*.so"))
    assert report.verdict == "partial"
    missing = report.missing_required
    assert any("_C_stable_libtorch" in line and "jit-only" in line for line in missing)
    assert any(line.startswith("vllm/_flashmla*.so: no such library") for line in missing)
    assert not any("_moe_C" in line for line in missing)
    from spark_images.cubins import record_section

    section = record_section(report)
    assert section["status"] == "failed" and section["verdict"] == "partial"


def test_required_bare_cubins_are_judged_one_by_one(fixture_bins: Path) -> None:
    report = scan_target(str(fixture_bins), required=("cubins/k_sm120f.cubin", "cubins/k_sm90.cubin"))
    assert report.missing_required == [
        "cubins/k_sm90.cubin: no native sm_121 code (verdict missing; required by cubins/k_sm90.cubin)"
    ]
    lone = scan_target(str(fixture_bins / "cubins" / "k_sm121a.cubin"), required=("k_sm121a.cubin",))
    assert lone.missing_required == []

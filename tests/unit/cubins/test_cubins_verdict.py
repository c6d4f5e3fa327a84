"""The which-code-runs-where rules, one row per fact of the fatbin reference."""

from __future__ import annotations

import pytest

from spark_images.cubins import verdict as v

SPARK = v.parse_gpu("sm_121")


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (("cubin", 121, ""), v.NATIVE),
        (("cubin", 121, "a"), v.NATIVE),
        (("cubin", 121, "f"), v.NATIVE),
        (("cubin", 120, "f"), v.NATIVE),
        (("cubin", 120, ""), v.NATIVE),
        (("cubin", 120, "a"), v.MISSING),
        (("cubin", 100, "f"), v.MISSING),
        (("cubin", 100, ""), v.MISSING),
        (("cubin", 110, ""), v.MISSING),
        (("cubin", 90, "a"), v.MISSING),
        (("cubin", 122, ""), v.MISSING),
        (("ptx", 80, ""), v.JIT_ONLY),
        (("ptx", 120, ""), v.JIT_ONLY),
        (("ptx", 121, ""), v.JIT_ONLY),
        (("ptx", 120, "f"), v.JIT_ONLY),
        (("ptx", 121, "f"), v.JIT_ONLY),
        (("ptx", 121, "a"), v.JIT_ONLY),
        (("ptx", 120, "a"), v.MISSING),
        (("ptx", 100, "f"), v.MISSING),
        (("ptx", 90, "a"), v.MISSING),
        (("ptx", 130, ""), v.MISSING),
        (("ltoir", 120, ""), v.MISSING),
    ],
)
def test_single_target_on_the_spark(target: tuple[str, int, str], expected: str) -> None:
    assert v.classify_targets([target], SPARK) == expected


def test_a_cubin_beats_ptx_and_ptx_beats_nothing() -> None:
    assert v.classify_targets([("ptx", 80, ""), ("cubin", 120, "f")], SPARK) == v.NATIVE
    assert v.classify_targets([("cubin", 120, "a"), ("ptx", 120, "")], SPARK) == v.JIT_ONLY
    assert v.classify_targets([], SPARK) == v.MISSING


@pytest.mark.parametrize(
    ("counts", "verdict"),
    [
        (v.Counts(), v.V_NO_GPU_CODE),
        (v.Counts(native=3), v.V_NATIVE),
        (v.Counts(native=3, missing=1), v.V_PARTIAL),
        (v.Counts(native=1, jit_only=1), v.V_PARTIAL),
        (v.Counts(jit_only=2, missing=1), v.V_JIT_ONLY),
        (v.Counts(missing=2), v.V_MISSING),
    ],
)
def test_rollup(counts: v.Counts, verdict: str) -> None:
    assert v.rollup(counts) == verdict


@pytest.mark.parametrize(("text", "sm"), [("sm_121", 121), ("121", 121), ("12.1", 121), ("SM_90", 90), ("sm_120a", 120)])
def test_gpu_names(text: str, sm: int) -> None:
    assert v.parse_gpu(text).sm == sm


@pytest.mark.parametrize("text", ["", "gfx90a", "sm_", "1", "banana"])
def test_bad_gpu_names(text: str) -> None:
    with pytest.raises(ValueError):
        v.parse_gpu(text)


def test_targets_sort_numerically() -> None:
    assert v.sort_targets(["sm_120f", "sm_90", "sm_120", "sm_120a", "sm_100f"]) == [
        "sm_90",
        "sm_100f",
        "sm_120",
        "sm_120a",
        "sm_120f",
    ]


def test_globs_match_site_packages_suffixes() -> None:
    from spark_images.cubins.report import glob_matches

    path = "usr/local/lib/python3.12/dist-packages/vllm/_C_stable_libtorch.abi3.so"
    assert glob_matches("vllm/_C*.so", path)
    assert not glob_matches("vllm/_moe_C*.so", path)
    assert not glob_matches("vllm/_C*.so", "othervllm/_C.so")  # whole segments
    assert not glob_matches("vllm/_C*.so", "_C.abi3.so")

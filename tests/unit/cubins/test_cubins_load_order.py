"""A unit's class rests on the cubin the driver would load: that one is proven, its siblings only if it fails.

Fatbins are built here from the nvcc-compiled oracle cubins (real EM_CUDA ELF files)
and from forged payloads; each test counts which payloads the scan decompressed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_images.cubins import fatbin as fb
from spark_images.cubins import scan_target
from spark_images.cubins import verdict as v
from spark_images.cubins.scan import load_order, unproven_entries
from support.fatbins import FLAG_A, FLAG_F, container, zstd_cubin
from support.paths import ORACLE_BIN

SPARK = v.parse_gpu("sm_121")


def cubin(name: str) -> bytes:
    return (ORACLE_BIN / "cubins" / name).read_bytes()


FORGED = b"\x7fELF\x02\x01\x01" + bytes(range(256)) * 40  # ELF magic, then no cubin


def proven(data: bytes) -> tuple[dict[tuple[int, int], str], int]:
    """`unproven_entries` of the file's fatbins, and how many payload bytes it decompressed."""
    scan = fb.scan_binary(data)
    budget = fb.Budget()
    out = unproven_entries(data, scan.fatbins, frozenset(), SPARK, budget)
    return out, budget.limit - budget.left


def test_the_driver_order_puts_the_exact_sm_first() -> None:
    def entry(sm: int, variant: str) -> fb.Entry:
        return fb.Entry("cubin", sm, variant, "none", 0, 8, 0, 0, 0)

    order = sorted([entry(120, ""), entry(120, "f"), entry(121, ""), entry(121, "a"), entry(121, "f")], key=load_order)
    assert [e.target for e in order] == ["sm_121a", "sm_121f", "sm_121", "sm_120f", "sm_120"]


def test_a_proven_best_cubin_leaves_its_runnable_siblings_unread() -> None:
    best = cubin("k_sm121a.cubin")
    data = container(
        zstd_cubin(FORGED, sm=120, flags=0),
        zstd_cubin(cubin("k_sm120f.cubin"), sm=120, flags=FLAG_F),
        zstd_cubin(best, sm=121, flags=FLAG_A),
    )
    rejected, inflated = proven(data)
    assert rejected == {}
    assert inflated == len(best)  # neither sm_120 sibling was decompressed, not even the forged one


def test_a_forged_best_cubin_is_rejected_and_the_next_one_decides(tmp_path: Path) -> None:
    honest = cubin("k_sm120f.cubin")
    data = container(zstd_cubin(honest, sm=120, flags=FLAG_F), zstd_cubin(FORGED, sm=121, flags=FLAG_A))
    rejected, inflated = proven(data)
    assert list(rejected) == [(0, 1)] and "sm_121a" in rejected[(0, 1)]
    assert inflated == len(FORGED) + len(honest)
    path = tmp_path / "forged-best.fatbin"
    path.write_bytes(data)
    doc = scan_target(str(path)).to_json()
    (lib,) = doc["libraries"]
    assert lib["verdict"] == "native"  # the sm_120f cubin is proven and runs on sm_121
    assert lib["sass"] == ["sm_120f"] and "sm_121a" in lib["unreadable"][0]


@pytest.mark.parametrize("claims", [((121, FLAG_A), (120, FLAG_F), (120, 0)), ((120, 0), (120, FLAG_F))])
def test_a_unit_of_forgeries_has_every_runnable_one_rejected(tmp_path: Path, claims: tuple[tuple[int, int], ...]) -> None:
    data = container(*(zstd_cubin(FORGED, sm=sm, flags=flags) for sm, flags in claims))
    rejected, _ = proven(data)
    assert sorted(rejected) == [(0, i) for i in range(len(claims))]
    path = tmp_path / "forged-all.fatbin"
    path.write_bytes(data)
    (lib,) = scan_target(str(path)).to_json()["libraries"]
    assert lib["verdict"] == "missing" and lib["sass"] == [] and len(lib["unreadable"]) == len(claims)


def test_at_one_sm_the_family_claim_is_read_before_the_plain_cubin() -> None:
    plain = cubin("k_sm120.cubin")
    data = container(zstd_cubin(plain, sm=120, flags=0), zstd_cubin(FORGED, sm=120, flags=FLAG_F))
    rejected, inflated = proven(data)
    assert list(rejected) == [(0, 1)]  # the family claim came first and failed; plain sm_120 decided
    assert inflated == len(FORGED) + len(plain)


def test_a_kernel_listing_proves_every_runnable_cubin(tmp_path: Path) -> None:
    """The listing reads every payload anyway, so a lying sibling is rejected, not listed."""
    data = container(zstd_cubin(FORGED, sm=120, flags=0), zstd_cubin(cubin("k_sm121a.cubin"), sm=121, flags=FLAG_A))
    path = tmp_path / "forged-sibling.fatbin"
    path.write_bytes(data)
    (quick,) = scan_target(str(path)).to_json()["libraries"]
    (listed,) = scan_target(str(path), kernels=True).to_json()["libraries"]
    assert "unreadable" not in quick and quick["sass"] == ["sm_120", "sm_121a"]
    assert listed["sass"] == ["sm_121a"] and "sm_120" in listed["unreadable"][0]
    assert all(targets == ["sm_121a"] for targets in listed["kernels"].values())

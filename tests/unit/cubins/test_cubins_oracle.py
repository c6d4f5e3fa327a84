"""The parser against NVIDIA's cuobjdump on the same binaries (tests/data/cubins/oracle).

The binaries in tests/data/cubins/oracle/bin were compiled by kernels/build.sh and listed with
`cuobjdump --list-elf --list-ptx` and `--dump-resource-usage` on a machine
with the CUDA 13.0 toolkit (oracle/README.md). cuobjdump drops the `f` of
family cubins and does not list `__nv_relfatbin` by default, so entry counts,
order, kinds and SM numbers are compared with it, `a` suffixes too, and the
`f` variants against the -gencode flags of build.sh.
"""

from __future__ import annotations

import re

import pytest

from spark_images.cubins.fatbin import cubin_info, entry_kernels, scan_binary
from support.paths import ORACLE

LISTINGS = ORACLE / "listings"

# what build.sh asked nvcc for (sass targets, ptx targets), per file
BUILD_FLAGS: dict[str, tuple[set[str], set[str]]] = {
    "lib/libsm121a.so": ({"sm_121a"}, set()),
    "lib/libsm120a.so": ({"sm_120a"}, set()),
    "lib/libsm120f.so": ({"sm_120f"}, set()),
    "lib/libsm120.so": ({"sm_120"}, set()),
    "lib/libptx120.so": (set(), {"compute_120"}),
    "lib/libsm90.so": ({"sm_90"}, set()),
    "lib/libmixed.so": ({"sm_90", "sm_120a", "sm_120f"}, {"compute_120"}),
    "lib/libstripped.so": ({"sm_90", "sm_120a", "sm_120f"}, {"compute_120"}),
    "lib/libzstd.so": ({"sm_120f"}, {"compute_120"}),
    "lib/liblz4.so": ({"sm_120a"}, {"compute_120"}),
    "lib/librdc.so": ({"sm_90", "sm_120f"}, set()),
    "fatbin/mixed.fatbin": ({"sm_90", "sm_120f"}, {"compute_120"}),
    "cubins/k_sm121a.cubin": ({"sm_121a"}, set()),
    "cubins/k_sm120f.cubin": ({"sm_120f"}, set()),
    "cubins/k_sm120.cubin": ({"sm_120"}, set()),
    "cubins/k_sm90.cubin": ({"sm_90"}, set()),
}

_LINE = re.compile(r"^(ELF|PTX) file\s+\d+: .*\.sm_(\d+)([af]?)\.(cubin|ptx)$")


def listing(rel: str) -> list[tuple[str, int, str]]:
    """(kind, sm, suffix) per entry, in cuobjdump's order."""
    text = (LISTINGS / f"{rel.replace('/', '_')}.list.txt").read_text()
    assert text.rstrip().endswith("rc=0"), f"cuobjdump failed on {rel}"
    out = []
    for line in text.splitlines():
        match = _LINE.match(line.strip())
        if match:
            kind = "cubin" if match.group(1) == "ELF" else "ptx"
            out.append((kind, int(match.group(2)), match.group(3)))
    return out


def resource_functions(rel: str) -> list[list[str]]:
    """Kernel names per ELF in cuobjdump --dump-resource-usage order."""
    blocks: list[list[str]] = []
    in_elf = False
    for line in (LISTINGS / f"{rel.replace('/', '_')}.res.txt").read_text().splitlines():
        if line.startswith("Fatbin "):
            in_elf = line.startswith("Fatbin elf code")
            if in_elf:
                blocks.append([])
        elif not blocks and line.startswith("Resource usage"):  # a bare cubin: one ELF
            in_elf = True
            blocks.append([])
        match = re.match(r"^ Function (\S+):$", line)
        if match and in_elf:
            blocks[-1].append(match.group(1))
    return blocks


def test_oracle_is_complete() -> None:
    versions = (ORACLE / "versions.txt").read_text()
    assert "cuobjdump" in versions and "release 13.0" in versions
    for rel in BUILD_FLAGS:
        assert (ORACLE / "bin" / rel).is_file(), rel
        assert listing(rel), f"empty oracle listing for {rel}"


@pytest.mark.parametrize("rel", sorted(k for k in BUILD_FLAGS if not k.startswith("cubins/")))
def test_fatbin_entries_match_cuobjdump(rel: str) -> None:
    data = (ORACLE / "bin" / rel).read_bytes()
    scan = scan_binary(data)
    assert scan.problems == ()
    listed = [e for fb in scan.fatbins if fb.section != "__nv_relfatbin" for e in fb.entries]
    ours = [
        (e.kind, e.sm, e.variant if (e.kind == "ptx" or e.variant == "a") else "") for e in listed
    ]
    assert ours == listing(rel)
    sass = {e.target for e in listed if e.kind == "cubin"}
    ptx = {e.target for e in listed if e.kind == "ptx"}
    assert (sass, ptx) == BUILD_FLAGS[rel]


@pytest.mark.parametrize("rel", sorted(k for k in BUILD_FLAGS if not k.startswith("cubins/")))
def test_kernel_names_match_cuobjdump(rel: str) -> None:
    data = (ORACLE / "bin" / rel).read_bytes()
    scan = scan_binary(data)
    cubins = [
        e for fb in scan.fatbins if fb.section != "__nv_relfatbin" for e in fb.entries if e.kind == "cubin"
    ]
    ours = [sorted(entry_kernels(data, e)) for e in cubins]
    assert ours == [sorted(block) for block in resource_functions(rel)]


@pytest.mark.parametrize("rel", sorted(k for k in BUILD_FLAGS if k.startswith("cubins/")))
def test_bare_cubins_match_cuobjdump(rel: str) -> None:
    data = (ORACLE / "bin" / rel).read_bytes()
    info = cubin_info(data)
    ((kind, sm, suffix),) = listing(rel)
    assert (kind, sm) == ("cubin", info.sm)
    assert suffix == ("a" if info.variant == "a" else "")
    assert {info.target} == BUILD_FLAGS[rel][0]
    assert info.abi_version == 8
    assert sorted(info.kernels) == sorted(resource_functions(rel)[0])


def test_relocatable_code_is_found_and_compressed() -> None:
    scan = scan_binary((ORACLE / "bin" / "lib/librdc.so").read_bytes())
    rel = [e for fb in scan.fatbins if fb.section == "__nv_relfatbin" for e in fb.entries]
    assert {e.target for e in rel} == {"sm_90", "sm_120f"}
    assert {e.compression for e in rel} == {"zstd"}


def test_stripped_library_has_the_same_entries_as_its_source() -> None:
    mixed = scan_binary((ORACLE / "bin" / "lib/libmixed.so").read_bytes())
    stripped = scan_binary((ORACLE / "bin" / "lib/libstripped.so").read_bytes())
    assert [fb.entries for fb in mixed.fatbins] != []
    assert [[e.target for e in fb.entries] for fb in stripped.fatbins] == [
        [e.target for e in fb.entries] for fb in mixed.fatbins
    ]


def test_a_single_cubin_as_the_target() -> None:
    from spark_images.cubins import scan_target

    doc = scan_target(str(ORACLE / "bin" / "cubins" / "k_sm120f.cubin")).to_json()
    (lib,) = doc["libraries"]
    assert (lib["path"], lib["kind"], lib["sass"], lib["verdict"]) == ("k_sm120f.cubin", "cubins", ["sm_120f"], "native")
    doc = scan_target(str(ORACLE / "bin" / "cubins" / "k_sm120f.cubin"), gpu="sm_100").to_json()
    assert doc["verdict"] == "missing"

"""Scan a target for device code: artifacts in, CubinReport out.

The I/O edge of the cubin inspector: it pulls candidate files out of the
target through `spark_images.artifacts` one at a time (memory holds one file
at a time) and hands their bytes to the pure parser and classifier.
"""

from __future__ import annotations

import posixpath
import re
import struct
from collections.abc import Sequence

from spark_images import artifacts
from spark_images.cubins import elf
from spark_images.cubins import verdict as v
from spark_images.cubins.fatbin import (
    Buffer,
    Fatbin,
    PayloadError,
    entry_kernels,
    is_link_stub,
    scan_binary,
)
from spark_images.cubins.report import CubinReport, Library, Unit, library_from_scan
from spark_images.errors import UsageError

_SHARED_OBJECT = re.compile(r"\.so(\.\d+)*$")
# files above this size are mapped (or spooled from a layer and mapped), not read:
# the parser touches only headers, so memory stays low on multi-GB libraries
SPOOL_OVER = 64 << 20


def is_candidate(path: str) -> bool:
    """Files that can hold device code: shared objects, bare cubins and fatbins."""
    name = posixpath.basename(path)
    return bool(_SHARED_OBJECT.search(name)) or name.endswith((".cubin", ".fatbin"))


def _add_kernels(lib: Library, data: Buffer, scan_fatbins: Sequence[Fatbin]) -> None:
    lib.add_kernels((), "")  # listed (possibly empty) even when no entry can be read
    for fb in scan_fatbins:
        for entry in fb.entries:
            try:
                lib.add_kernels(entry_kernels(data, entry), entry.target)
            except PayloadError as exc:
                lib.problems.append(f"{fb.section}@{fb.offset:#x}: {exc}")


def scan_target(
    target: str,
    gpu: str = "sm_121",
    required: Sequence[str] = (),
    *,
    kernels: bool = False,
    progress: artifacts.Progress | None = None,
) -> CubinReport:
    """Find and classify every fatbin and cubin in `target` for `gpu`.

    `required`: site-packages-relative globs (a profile's verify.native_libraries);
    the report's `missing_required` lists those without native code.
    Raises UsageError / EnvironmentProblem when the target cannot be opened.
    """
    try:
        the_gpu = v.parse_gpu(gpu)
    except ValueError as exc:
        raise UsageError(f"--gpu {gpu}: {exc}") from exc
    single_file = artifacts.target_kind(target) == artifacts.KIND_FILE
    want = (lambda _p: True) if single_file else is_candidate
    libraries: list[Library] = []
    cubin_dirs: dict[str, Library] = {}
    scanned: list[str] = []
    unreadable: list[dict[str, str]] = []
    for member in artifacts.iter_members(target, want, progress=progress, spool_over=SPOOL_OVER):
        scanned.append(member.path)
        if member.data is None:
            unreadable.append({"path": member.path, "error": member.error})
            continue
        result = scan_binary(member.data)
        if result.kind == "cubin":
            # grouped per directory; a lone cubin given as the target stands for itself
            directory = posixpath.dirname(member.path) or member.path
            lib = cubin_dirs.setdefault(directory, Library(path=directory, kind="cubins"))
            name = posixpath.basename(member.path)
            if result.cubin is None:
                lib.problems.extend(f"{name}: {p}" for p in result.problems)
                unreadable.append({"path": member.path, "error": "; ".join(result.problems)})
                continue
            info = result.cubin
            cls = v.classify_targets([("cubin", info.sm, info.variant)], the_gpu)
            lib.units.append(Unit(name=name, cls=cls, sass=(info.target,), ptx=()))
            if kernels:
                lib.add_kernels(info.kernels, info.target)
            continue
        if not result.fatbins and not result.problems:
            if single_file and not member.data.startswith(b"\x7fELF"):
                # named explicitly, so say it could not be read as a library
                unreadable.append({"path": member.path, "error": "not an ELF file (no library or cubin)"})
            continue  # a host library without device code
        stubs = frozenset(fb.offset for fb in result.fatbins if is_link_stub(member.data, fb))
        lib = library_from_scan(member.path, result, the_gpu, stubs)
        if result.problems:
            unreadable.append({"path": member.path, "error": "; ".join(result.problems)})
        if kernels:
            try:
                _add_kernels(lib, member.data, result.fatbins)
            except (elf.ElfError, struct.error) as exc:
                lib.problems.append(f"kernel listing failed ({exc})")
        libraries.append(lib)
    libraries.extend(cubin_dirs.values())
    libraries.sort(key=lambda lib: lib.path)
    return CubinReport(
        target=target,
        gpu=the_gpu,
        libraries=libraries,
        scanned=scanned,
        required=tuple(required),
        unreadable=unreadable,
    )

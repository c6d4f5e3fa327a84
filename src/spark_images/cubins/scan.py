"""Scan a target for device code: artifacts in, CubinReport out.

The I/O edge of the cubin inspector: it pulls candidate files out of the
target through `spark_images.readers.artifacts` one at a time (memory holds one file
at a time) and hands their bytes to the pure parser and classifier.
"""

from __future__ import annotations

import posixpath
import re
import struct
from collections.abc import Iterable, Sequence

from spark_images import defaults
from spark_images.core.errors import UsageError
from spark_images.cubins import elf
from spark_images.cubins import verdict as v
from spark_images.cubins.fatbin import (
    EMBEDDED,
    BinaryScan,
    Budget,
    Buffer,
    Entry,
    Fatbin,
    PayloadError,
    entry_kernels,
    is_link_stub,
    scan_binary,
    verify_cubin,
)
from spark_images.cubins.report import CubinReport, Library, Unit, library_from_scan
from spark_images.cubins.sift import HostLibrarySieve
from spark_images.readers import artifacts

_SHARED_OBJECT = re.compile(r"\.so(\.\d+)*$")
# files above this size are mapped (or inflated from a zip or layer into a temporary
# file and mapped), not read: the parser touches headers and the payloads it must
# prove, so memory stays low on multi-GB libraries
SPOOL_OVER = 16 << 20


def is_candidate(path: str) -> bool:
    """Files that can hold device code: shared objects, bare cubins and fatbins."""
    name = posixpath.basename(path)
    return bool(_SHARED_OBJECT.search(name)) or name.endswith((".cubin", ".fatbin"))


def _add_kernels(
    lib: Library, data: Buffer, scan_fatbins: Sequence[Fatbin], budget: Budget, rejected: dict[tuple[int, int], str]
) -> None:
    lib.add_kernels((), "")  # listed (possibly empty) even when no entry can be read
    for fb in scan_fatbins:
        for i, entry in enumerate(fb.entries):
            if (fb.offset, i) in rejected:
                continue  # already reported, and its kernels cannot be believed
            try:
                lib.add_kernels(entry_kernels(data, entry, budget), entry.target)
            except PayloadError as exc:
                lib.problems.append(f"{fb.section}@{fb.offset:#x}: {exc}")


_VARIANT_RANK = {"a": 0, "f": 1, "": 2}


def load_order(entry: Entry) -> tuple[int, int]:
    """Sort key of the runnable cubins of one unit, the one the driver loads first: the highest SM
    (an exact match before a lower minor of the family), then arch-specific, family, plain."""
    return (-entry.sm, _VARIANT_RANK.get(entry.variant, len(_VARIANT_RANK)))


def unproven_entries(
    data: Buffer, fatbins: Sequence[Fatbin], stubs: frozenset[int], gpu: v.Gpu, budget: Budget, *, every: bool = False
) -> dict[tuple[int, int], str]:
    """(fatbin offset, entry index) -> reason, for each cubin read because the unit's class rested
    on it, whose header says it runs on `gpu` but whose payload does not prove it (`verify_cubin`).

    A unit is native once one runnable cubin is proven, so what the verdict needs is the one the
    driver would load (`load_order`): its runnable siblings are read only while the better ones
    fail their proof, and a unit whose cubins all lie has every one of them rejected. A sibling left
    unread is listed among the unit's targets, as the cubins that cannot run here are, but decides
    nothing. `every`: prove each runnable cubin (a kernel listing reads every payload anyway, and
    must not list the kernels of one that lies). In the real cu130 image 490 of the 4006 zstd
    cubins that run on sm_121 are left unread (0.66 of the 3.64 GB the proofs inflated): each an
    sm_120 or sm_120f sibling of an sm_121 cubin in cuDNN, cuSOLVER and libtorch_cuda."""
    out: dict[tuple[int, int], str] = {}
    for fb in fatbins:
        if fb.offset in stubs:
            continue
        runnable = [
            (i, entry) for i, entry in enumerate(fb.entries)
            if entry.kind == "cubin" and v.runs_natively(entry.sm, entry.variant, gpu)
        ]  # fmt: skip
        runnable.sort(key=lambda item: load_order(item[1]))
        for i, entry in runnable:
            try:
                verify_cubin(data, entry, budget)
            except PayloadError as exc:
                out[(fb.offset, i)] = str(exc)
                continue
            if not every:
                break
    return out


def scan_target(
    target: str,
    gpu: str = defaults.GPU,
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
    sieve = None if single_file else HostLibrarySieve(is_candidate)
    members = artifacts.iter_members(target, want, progress=progress, spool_over=SPOOL_OVER, sieve=sieve)
    return _scan(members, the_gpu, required, target=target, kernels=kernels, single_file=single_file)


def scan_members(
    members: Iterable[artifacts.Member],
    gpu: str = defaults.GPU,
    required: Sequence[str] = (),
    *,
    target: str = "",
    kernels: bool = False,
) -> CubinReport:
    """Classify the device code in members another reader already has (no second read).

    For a caller that walks a target for more than device code (`check`, the
    build line): it hands over the candidates (`is_candidate`) as it meets
    them; each member's data is used before the next one is pulled, so a
    spooled member's mapping may be dropped by the iterator once it moves on.
    A member may come as the summary of a `HostLibrarySieve` instead of its bytes.
    """
    try:
        the_gpu = v.parse_gpu(gpu)
    except ValueError as exc:
        raise UsageError(f"--gpu {gpu}: {exc}") from exc
    return _scan(members, the_gpu, required, target=target, kernels=kernels, single_file=False)


def _scan(
    members: Iterable[artifacts.Member],
    the_gpu: v.Gpu,
    required: Sequence[str],
    *,
    target: str,
    kernels: bool,
    single_file: bool,
) -> CubinReport:
    libraries: list[Library] = []
    cubin_dirs: dict[str, Library] = {}
    scanned: list[str] = []
    unreadable: list[dict[str, str]] = []
    warnings: list[dict[str, str]] = []
    for member in members:
        scanned.append(member.path)
        sifted = member.summary if isinstance(member.summary, BinaryScan) else None  # no bytes kept, none needed
        if member.data is None and sifted is None:
            unreadable.append({"path": member.path, "error": member.error})
            continue
        result = sifted or scan_binary(member.data)  # type: ignore[arg-type]
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
        if not result.fatbins and not result.problems and not result.warnings:
            if single_file and member.data[:4] != b"\x7fELF":
                # named explicitly, so say it could not be read as a library
                unreadable.append({"path": member.path, "error": "not an ELF file (no library or cubin)"})
            continue  # a host library without device code
        counted = [fb for fb in result.fatbins if fb.section != EMBEDDED]  # embedded ones are listed apart
        budget = Budget()
        stubs = frozenset(fb.offset for fb in counted if is_link_stub(member.data, fb, budget))
        rejected = unproven_entries(member.data, counted, stubs, the_gpu, budget, every=kernels)
        lib = library_from_scan(member.path, result, the_gpu, stubs, rejected)
        if result.problems or rejected:
            reasons = [*result.problems, *rejected.values()]
            more = f"; {len(reasons) - 3} more" if len(reasons) > 3 else ""
            unreadable.append({"path": member.path, "error": "; ".join(reasons[:3]) + more})
        warnings.extend({"path": member.path, "warning": w} for w in result.warnings)
        if kernels:
            try:
                _add_kernels(lib, member.data, counted, budget, rejected)
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
        warnings=warnings,
    )

"""`spark-images cubins TARGET`: which GPUs can run the device code in a target.

Exit codes (also in --help):
- 1 when nothing in the target runs natively on the GPU (verdict `missing`,
  `jit-only` or `no-gpu-code`), when a library named by --require / --profile
  has no native code, or under --strict when any library is not `native` (or a
  candidate file is unreadable);
- 0 otherwise: `partial` is a pass unless --require or --strict says more;
- 2 for usage/environment errors.
Each reason for exit 1 is one line on stderr naming the target and the file.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from spark_images import defaults
from spark_images.cli._common import add_json_flag, emit, target, warn
from spark_images.core.errors import EXIT_FINDING, EXIT_OK
from spark_images.cubins import CubinReport, scan_target
from spark_images.cubins import verdict as v
from spark_images.readers.artifacts import Progress


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser(
        "cubins",
        help="list the GPU code a .so/.cubin, directory, wheel, requirement or image carries",
        description=(
            "Classify every fatbin for a GPU: native (a cubin runs), jit_only (only PTX), "
            "missing. TARGET: a .so or .cubin, a directory, a .whl, NAME==VERSION (PyPI, "
            "linux aarch64 wheel), an OCI or docker-save image archive (.tar), docker://IMAGE, "
            "or HOST/REPO:TAG / HOST/REPO@sha256:... A cubin counts as native only when its "
            "payload is an EM_CUDA ELF whose own header names the SM. Exit 1 when nothing runs "
            "natively (missing, jit-only, no-gpu-code), when a --require/--profile library has no "
            "native code, or under --strict when any library is not native; partial exits 0 "
            "otherwise; 2 for usage or environment errors."
        ),
    )
    parser.add_argument("target", type=target, metavar="TARGET")
    parser.add_argument("--gpu", default=defaults.GPU, help=f"GPU architecture (default: {defaults.GPU}, the DGX Spark)")
    parser.add_argument("--kernels", action="store_true", help="decompress and list kernel names per target")
    parser.add_argument(
        "--profile",
        metavar="PROFILE",
        help="profile YAML whose verify.native_libraries must have native code (exit 1 if not)",
    )
    parser.add_argument(
        "--require",
        metavar="GLOB",
        action="append",
        default=[],
        help="a library glob relative to site-packages that must have native code (repeatable)",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 unless every library is native (partial fails too; so does an unreadable file)",
    )
    parser.add_argument("--progress", action="store_true", help="show download progress on stderr")
    add_json_flag(parser)
    parser.set_defaults(handler=run)


def profile_native_libraries(path: str) -> tuple[str, ...]:
    """The profile's verify.native_libraries globs (Finding / UsageError if the profile is bad)."""
    from spark_images.profiles.profile import load_profile

    return tuple(load_profile(path).verify.native_libraries)


def run(args: argparse.Namespace) -> int:
    required: list[str] = list(args.require)
    if args.profile:
        required.extend(profile_native_libraries(args.profile))
    progress = Progress(enabled=True if args.progress else None)
    report = scan_target(args.target, args.gpu, tuple(required), kernels=args.kernels, progress=progress)
    emit(args, report.to_json(), render_text(report, kernels=args.kernels))
    for item in report.warnings:
        warn("cubins", f"{args.target}: {item['path']}: warning: {item['warning']}")
    findings = exit_findings(report, strict=args.strict)
    for line in findings:
        warn("cubins", line)
    return EXIT_FINDING if findings else EXIT_OK


NOT_NATIVE = (v.V_MISSING, v.V_JIT_ONLY, v.V_NO_GPU_CODE)


def _first_unreadable(report: CubinReport) -> str:
    if not report.unreadable:
        return ""
    first = report.unreadable[0]
    more = f"; {len(report.unreadable) - 1} more unreadable" if len(report.unreadable) > 1 else ""
    return f"; unreadable: {first['path']}: {first['error'][:300]}{more}"


def exit_findings(report: CubinReport, *, strict: bool = False) -> list[str]:
    """One line per reason to exit 1 (none: exit 0); pure."""
    gpu = report.gpu.name
    lines: list[str] = []
    if report.verdict in NOT_NATIVE:
        c = report.counts
        lines.append(
            f"{report.target}: nothing runs natively on {gpu} (verdict {report.verdict}: "
            f"{c.native} of {c.units} fatbins native, {c.jit_only} JIT-only, {c.missing} missing"
            f"{_first_unreadable(report)})"
        )
    lines.extend(f"{report.target}: required: {line}" for line in report.missing_required)
    if strict and report.verdict not in NOT_NATIVE:
        for lib in report.libraries:
            if lib.verdict != v.V_NATIVE:
                lines.append(f"{report.target}: {lib.path}: verdict {lib.verdict}, not native on {gpu} (--strict)")
        for item in report.unreadable:
            lines.append(f"{report.target}: {item['path']}: unreadable: {item['error'][:300]} (--strict)")
    return lines


def _kernel_groups(kernels: dict[str, set[str]]) -> Iterable[tuple[str, list[str]]]:
    groups: dict[tuple[str, ...], list[str]] = {}
    for name, targets in kernels.items():
        groups.setdefault(tuple(v.sort_targets(targets)), []).append(name)
    for targets, names in sorted(groups.items(), key=lambda kv: (len(kv[0]), kv[0])):
        label = ("only " if len(targets) == 1 else "") + " ".join(targets)
        yield label, sorted(names)


TEXT_NAMES = 6


def _some(names: list[str]) -> str:
    """The first few names; --json has them all."""
    shown = ", ".join(names[:TEXT_NAMES])
    return shown + (f", ... {len(names) - TEXT_NAMES} more (--json lists all)" if len(names) > TEXT_NAMES else "")


def render_text(report: CubinReport, *, kernels: bool = False) -> str:
    counts = report.counts
    gpu = report.gpu.name
    lines = [
        f"{report.target} on {gpu}: {report.verdict} "
        f"({counts.native} of {counts.units} fatbins native, {counts.jit_only} JIT-only, "
        f"{counts.missing} missing; {len(report.libraries)} libraries, {len(report.scanned)} files scanned)"
    ]
    width = max((len(lib.path) for lib in report.libraries), default=0)
    for lib in report.libraries:
        c = lib.counts
        sass = " ".join(lib.targets("sass")) or "-"
        ptx = " ".join(lib.targets("ptx")) or "-"
        lines.append(
            f"  {lib.verdict:<11} {c.native:>4}/{c.units:<4} {lib.path:<{width}}  sass: {sass}  ptx: {ptx}"
        )
        for problem in lib.problems:
            lines.append(f"      unreadable: {problem}")
        for warning in lib.warnings:
            lines.append(f"      warning: {warning}")
        if kernels and lib.kernels:
            classes = lib.kernel_classes(report.gpu)
            for label, names in _kernel_groups(lib.kernels):
                lines.append(f"      {label} ({len(names)}): {_some(names)}")
            if classes[v.MISSING]:
                lines.append(f"      no {gpu} code ({len(classes[v.MISSING])}): {_some(classes[v.MISSING])}")
    for item in report.unreadable:
        if not any(lib.path == item["path"] for lib in report.libraries):
            lines.append(f"  unreadable   {item['path']}: {item['error']}")
    for line in report.missing_required:
        lines.append(f"required: {line}")
    return "\n".join(lines) + "\n"

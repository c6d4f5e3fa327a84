"""`spark-images cubins TARGET`: which GPUs can run the device code in a target.

Exit 0 when every library a profile (or --require) names has native code for
the GPU, 1 when one lacks it, 2 for usage/environment errors.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from spark_images.artifacts import Progress
from spark_images.cli._common import add_json_flag, emit, target
from spark_images.cubins import CubinReport, scan_target
from spark_images.cubins import verdict as v
from spark_images.errors import EXIT_FINDING, EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser(
        "cubins",
        help="list the GPU code a .so/.cubin, directory, wheel, requirement or image carries",
        description=(
            "Classify every fatbin for a GPU: native (a cubin runs), jit_only (only PTX), "
            "missing. TARGET: a .so or .cubin, a directory, a .whl, NAME==VERSION (PyPI, "
            "linux aarch64 wheel), docker://IMAGE, or HOST/REPO:TAG / HOST/REPO@sha256:..."
        ),
    )
    parser.add_argument("target", type=target, metavar="TARGET")
    parser.add_argument("--gpu", default="sm_121", help="GPU architecture (default: sm_121, the DGX Spark)")
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
    parser.add_argument("--progress", action="store_true", help="show download progress on stderr")
    add_json_flag(parser)
    parser.set_defaults(handler=run)


def profile_native_libraries(path: str) -> tuple[str, ...]:
    """The profile's verify.native_libraries globs (Finding / UsageError if the profile is bad)."""
    from spark_images.profiles import load_profile

    return tuple(load_profile(path).verify.native_libraries)


def run(args: argparse.Namespace) -> int:
    required: list[str] = list(args.require)
    if args.profile:
        required.extend(profile_native_libraries(args.profile))
    progress = Progress(enabled=True if args.progress else None)
    report = scan_target(args.target, args.gpu, tuple(required), kernels=args.kernels, progress=progress)
    emit(args, report.to_json(), render_text(report, kernels=args.kernels))
    return EXIT_FINDING if report.missing_required else EXIT_OK


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

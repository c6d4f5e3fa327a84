"""`spark-images check TARGET`: one verdict (ready / degraded / broken) for an image or wheel set.

Exit 0 when ready, 1 when degraded or broken, 2 for usage/environment errors.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from spark_images import defaults
from spark_images.check import check_target
from spark_images.check.report import render_check_markdown, render_check_text
from spark_images.check.verdict import READY
from spark_images.cli._common import add_json_flag, emit, target
from spark_images.core import atomic
from spark_images.core.errors import EXIT_FINDING, EXIT_OK
from spark_images.readers.artifacts import Progress

TARGETS = (
    "TARGET: HOST/REPO:TAG or HOST/REPO@sha256:... (read over the registry API, no daemon), "
    "docker://IMAGE, an OCI archive, a .whl, a directory of wheels, or a venv / site-packages directory"
)


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu", default=defaults.GPU, help=f"GPU architecture (default: {defaults.GPU}, the DGX Spark)")
    parser.add_argument("--markdown", metavar="FILE", help="also write the report as Markdown (a job summary)")
    parser.add_argument("--repo", metavar="PATH", type=Path, help="local vLLM clone for the fix audit")
    parser.add_argument("--no-audit", action="store_true", help="do not audit the vLLM commit's fixes")
    parser.add_argument("--progress", action="store_true", help="show download progress on stderr")
    add_json_flag(parser)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser(
        "check",
        help="one verdict (ready/degraded/broken) for a vLLM image or wheel set, without a GPU",
        description="Read the packages, CUDA tools, config and device code of TARGET and apply the "
        "toolchain rules. " + TARGETS,
    )
    parser.add_argument("target", type=target, metavar="TARGET")
    add_common(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    progress = Progress(enabled=True if args.progress else None)
    result = check_target(args.target, args.gpu, repo=args.repo, audit=not args.no_audit, progress=progress)
    doc = result.to_json()
    if args.markdown:
        atomic.write_text(args.markdown, render_check_markdown(doc))
    emit(args, doc, render_check_text(doc))
    return EXIT_OK if doc["verdict"] == READY else EXIT_FINDING

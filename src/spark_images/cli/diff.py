"""`spark-images diff A B`: what you gain or lose moving from image/wheel set A to B.

Exit 0 when B is no worse than A, 1 when B newly fails a rule, loses native
code in a library or loses a fix, 2 for usage/environment errors.
"""

from __future__ import annotations

import argparse

from spark_images.check import check_target
from spark_images.check.diff import compare, is_worse
from spark_images.check.report import render_diff_markdown, render_diff_text
from spark_images.cli._common import emit, target
from spark_images.cli.check import TARGETS, add_common
from spark_images.core import atomic
from spark_images.core.errors import EXIT_FINDING, EXIT_OK
from spark_images.readers.artifacts import Progress


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser(
        "diff",
        help="packages, native GPU code, fixes and rules that changed between two images or wheel sets",
        description="Check A and B, then list packages added/removed/re-versioned, per-library "
        "native/JIT/missing counts, fixes gained or lost and rules newly failing. " + TARGETS,
    )
    parser.add_argument("a", type=target, metavar="A")
    parser.add_argument("b", type=target, metavar="B")
    add_common(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    progress = Progress(enabled=True if args.progress else None)
    docs = [
        check_target(t, args.gpu, repo=args.repo, audit=not args.no_audit, progress=progress).to_json()
        for t in (args.a, args.b)
    ]
    diff = compare(docs[0], docs[1])
    if args.markdown:
        atomic.write_text(args.markdown, render_diff_markdown(diff))
    emit(args, diff, render_diff_text(diff))
    return EXIT_FINDING if is_worse(diff) else EXIT_OK

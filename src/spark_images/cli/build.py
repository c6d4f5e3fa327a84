"""`spark-images build` (not implemented yet)."""

from __future__ import annotations

import argparse

from spark_images.cli._common import add_json_flag
from spark_images.errors import UsageError


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("build", help="(not implemented yet)")
    add_json_flag(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    raise UsageError("'build' is not implemented yet")

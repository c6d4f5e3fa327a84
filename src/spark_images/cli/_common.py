"""Helpers shared by the subcommand modules: --json output, printing."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from spark_images.core import atomic


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print one JSON document on stdout instead of text"
    )


def emit(args: argparse.Namespace, doc: Any, text: str) -> None:
    """Print `doc` as JSON under --json, else the human text.

    The document is serialised whole before anything is written, and NaN or
    Infinity (not JSON) is refused: a value that became one is a bug, reported
    by the CLI's guard as one `internal error` line, never invalid JSON on stdout.
    """
    if getattr(args, "json", False):
        try:
            out = atomic.dumps_json(doc)  # allow_nan=False
        except ValueError as exc:
            raise ValueError(f"the --json document holds a value JSON cannot carry ({exc})") from None
        sys.stdout.write(out)
    else:
        sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")


def warn(command: str, line: str) -> None:
    print(f"spark-images {command}: {line}", file=sys.stderr)


def target(value: str) -> str:
    """argparse type of a TARGET: an empty one would silently mean the current folder."""
    if not value.strip():
        raise argparse.ArgumentTypeError("TARGET is empty (give a path, requirement, commit or image)")
    return value

"""Helpers shared by the subcommand modules: --json output, printing."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print one JSON document on stdout instead of text"
    )


def emit(args: argparse.Namespace, doc: Any, text: str) -> None:
    """Print `doc` as JSON under --json, else the human text."""
    if getattr(args, "json", False):
        print(json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False))
    else:
        sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")


def warn(command: str, line: str) -> None:
    print(f"spark-images {command}: {line}", file=sys.stderr)


def target(value: str) -> str:
    """argparse type of a TARGET: an empty one would silently mean the current folder."""
    if not value.strip():
        raise argparse.ArgumentTypeError("TARGET is empty (give a path, requirement, commit or image)")
    return value

"""`spark-images` entry point.

Each subcommand lives in its own module under `spark_images.cli` and exposes
`register(subparsers)`, which adds its parser and sets `handler` to a
function `(argparse.Namespace) -> int`. This module only dispatches and turns
exceptions into one-line errors and exit codes (0 ok, 1 finding, 2 usage or
environment); no traceback ever reaches the user.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence

from spark_images import __version__
from spark_images.errors import EXIT_USAGE, SparkImagesError

COMMANDS: tuple[str, ...] = (
    "validate",
    "render",
    "build",
    "verify-repro",
    "cubins",
    "audit",
    "coherence",
    "publish",
    "monitor",
)


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors in our one-line style, exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="spark-images",
        description="Build, inspect and prove vLLM images for the NVIDIA DGX Spark (sm_121).",
    )
    parser.add_argument("--version", action="version", version=f"spark-images {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMANDS:
        module = importlib.import_module(f"spark_images.cli.{name.replace('-', '_')}")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except SparkImagesError as exc:
        if getattr(args, "json", False):
            doc = {
                "error": exc.__class__.__name__,
                "exit_code": exc.exit_code,
                "problems": [p.to_json() for p in exc.problems],
            }
            print(json.dumps(doc, indent=2, sort_keys=True))
        for line in exc.lines():
            print(f"spark-images {args.command}: {line}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"spark-images {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # the last line of defence: never a traceback
        print(
            f"spark-images {args.command}: internal error: {exc.__class__.__name__}: {exc} "
            "(please report this with the command line)",
            file=sys.stderr,
        )
        return EXIT_USAGE


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

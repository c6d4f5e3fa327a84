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
from spark_images.errors import EXIT_USAGE, EnvironmentProblem, Problem, SparkImagesError

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


class _UsageExit(SystemExit):
    """argparse's exit 2, carrying the message so that --json can report it too."""

    def __init__(self, message: str) -> None:
        super().__init__(EXIT_USAGE)
        self.message = message


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors in our one-line style, exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise _UsageExit(message)


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


def _report(command: str, exc: SparkImagesError, as_json: bool) -> int:
    """One line per problem on stderr; under --json also the one JSON document on stdout."""
    if as_json:
        doc = {
            "error": exc.__class__.__name__,
            "exit_code": exc.exit_code,
            "problems": [p.to_json() for p in exc.problems],
        }
        print(json.dumps(doc, indent=2, sort_keys=True))
    for line in exc.lines():
        print(f"spark-images {command}: {line}", file=sys.stderr)
    return exc.exit_code


def _os_problem(exc: OSError) -> EnvironmentProblem:
    """A file the command had to read or write could not be: name it (exit 2)."""
    # a failed rename names its destination second: that is the path the user gave
    path = str(exc.filename2 if exc.filename2 is not None else exc.filename)
    return EnvironmentProblem(
        Problem(
            file=path,
            field="",
            message=exc.strerror or exc.__class__.__name__,
            fix="check that the path names what the option expects and that it is writable",
        )
    )


class InternalError(SparkImagesError):
    """A bug: reported as one line (and a JSON document), exit 2."""

    @classmethod
    def of(cls, exc: BaseException) -> InternalError:
        return cls(f"internal error: {exc.__class__.__name__}: {exc} (please report this with the command line)")


def main(argv: Sequence[str] | None = None) -> int:
    tokens = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(tokens)
    except _UsageExit as exc:
        if "--json" in tokens:  # the message is already on stderr; stdout still gets its document
            doc = {"error": "UsageError", "exit_code": EXIT_USAGE,
                   "problems": [Problem(file="command line", field="", message=exc.message).to_json()]}  # fmt: skip
            print(json.dumps(doc, indent=2, sort_keys=True))
        raise
    as_json = bool(getattr(args, "json", False))
    try:
        return int(args.handler(args))
    except SparkImagesError as exc:
        return _report(args.command, exc, as_json)
    except KeyboardInterrupt:
        print(f"spark-images {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:  # a path the user gave that cannot be read or written as asked
        problem = _os_problem(exc) if exc.filename is not None else InternalError.of(exc)
        return _report(args.command, problem, as_json)
    except Exception as exc:  # the last line of defence: never a traceback
        return _report(args.command, InternalError.of(exc), as_json)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

"""`spark-images` entry point.

Each subcommand lives in its own module under `spark_images.cli` and exposes
`register(subparsers)`, which adds its parser and sets `handler` to a
function `(argparse.Namespace) -> int`. This module only dispatches and turns
exceptions into one-line errors and exit codes (0 ok, 1 finding, 2 usage or
environment); no traceback ever reaches the user.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
from collections.abc import Sequence

from spark_images import __version__
from spark_images.core.errors import EXIT_USAGE, EnvironmentProblem, Problem, SparkImagesError
from spark_images.core.inputs import display_path, short
from spark_images.readers.common import tune_process_for_reading

COMMANDS: tuple[str, ...] = (
    "validate",
    "render",
    "plan",
    "schema",
    "build",
    "verify-repro",
    "cubins",
    "audit",
    "check",
    "diff",
    "coherence",
    "publish",
    "monitor",
    "kb",
    "recipe",
    "fit",
    "cluster",
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


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with `only`, just that command's parser is built in full.

    Importing a command module imports what it runs (the build line imports
    the engine client, ~0.7 s), so a `validate` should not pay for `build`:
    the other commands get a placeholder that still makes them valid choices.
    """
    parser = _Parser(
        prog="spark-images",
        description="Build, inspect and prove vLLM images for the NVIDIA DGX Spark (sm_121).",
    )
    parser.add_argument("--version", action="version", version=f"spark-images {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMANDS:
        if only is not None and name != only:
            sub.add_parser(name)
            continue
        module = importlib.import_module(f"spark_images.cli.{name.replace('-', '_')}")
        module.register(sub)
    return parser


def _command_of(tokens: Sequence[str]) -> str | None:
    """The subcommand the tokens name (the first non-option token), if it is one of ours."""
    first = next((t for t in tokens if not t.startswith("-")), None)
    return first if first in COMMANDS else None


def _report(command: str, exc: SparkImagesError, as_json: bool) -> int:
    """One line per problem on stderr; under --json also the one JSON document on stdout."""
    if as_json:
        doc = {
            "error": exc.__class__.__name__,
            "exit_code": exc.exit_code,
            "problems": [p.to_json() for p in exc.problems],
        }
        _print_json(doc)
    for line in exc.lines():
        print(f"spark-images {command}: {line}", file=sys.stderr)
    return exc.exit_code


def _print_json(doc: object) -> None:
    # ASCII escapes: a file name that is not UTF-8 (surrogate-escaped) stays valid JSON
    print(json.dumps(doc, indent=2, sort_keys=True, allow_nan=False))


def _os_problem(exc: OSError) -> EnvironmentProblem:
    """A file the command had to read or write could not be: name it (exit 2)."""
    # a failed rename names its destination second: that is the path the user gave
    path = display_path(exc.filename2 if exc.filename2 is not None else exc.filename)
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
        try:
            message = short(str(exc))
        except Exception:  # a message that cannot even be rendered
            message = "(unprintable message)"
        return cls(f"internal error: {exc.__class__.__name__}: {message} (please report this with the command line)")


def _guard_standard_streams() -> bool:
    """Give closed fds 0-2 a /dev/null, so no file we open later becomes our stdout.

    Returns True when stdout was closed. Text streams escape what they cannot
    encode (a non-UTF-8 file name) instead of failing on it.
    """
    closed_stdout = False
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            if fd == 1:
                closed_stdout = True
            devnull = os.open(os.devnull, os.O_RDWR)
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)
    if sys.stdout is None or closed_stdout:
        sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    if sys.stderr is None:
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if callable(reconfigure):
            with contextlib.suppress(ValueError, OSError):
                reconfigure(errors="backslashreplace")
    return closed_stdout


def _silence_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so the interpreter's final flush cannot fail."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    tokens = list(sys.argv[1:] if argv is None else argv)
    tune_process_for_reading()
    closed_stdout = _guard_standard_streams() if argv is None else False
    if closed_stdout and "--json" in tokens:
        print("spark-images: stdout is closed, so the --json document cannot be written "
              "(fix: redirect stdout to a file or a pipe)", file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    parser = build_parser(_command_of(tokens))
    try:
        args = parser.parse_args(tokens)
    except _UsageExit as exc:
        if "--json" in tokens:  # the message is already on stderr; stdout still gets its document
            doc = {"error": "UsageError", "exit_code": EXIT_USAGE,
                   "problems": [Problem(file="command line", field="", message=exc.message).to_json()]}  # fmt: skip
            _print_json(doc)
        raise
    as_json = bool(getattr(args, "json", False))
    try:
        code = _dispatch(args, as_json)
        if argv is None and getattr(args, "interrupted", False):
            _exit_now(code)
        return code
    except BrokenPipeError:  # the reader went away (`| head`), even while we reported: nothing left to tell it
        _silence_stdout()
        return 0
    except BaseException as exc:  # a failure while reporting a failure
        if isinstance(exc, SystemExit | KeyboardInterrupt):
            raise
        with contextlib.suppress(Exception):
            print(f"spark-images {args.command}: internal error: {exc.__class__.__name__} while reporting", file=sys.stderr)
        return EXIT_USAGE


def _exit_now(code: int) -> None:
    """End the process at once after an interrupt. A normal exit joins every worker thread,
    and one still reading a slow blob would hold the exit until its own deadline (tens of
    seconds); every `finally` of the command has already run, so nothing is left half-written."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os._exit(code)


def _dispatch(args: argparse.Namespace, as_json: bool) -> int:
    try:
        return int(args.handler(args))
    except SparkImagesError as exc:
        return _report(args.command, exc, as_json)
    except KeyboardInterrupt:
        print(f"spark-images {args.command}: interrupted", file=sys.stderr)
        args.interrupted = True
        return 130
    except BrokenPipeError:
        raise
    except OSError as exc:  # a path the user gave that cannot be read or written as asked
        problem = _os_problem(exc) if exc.filename is not None else InternalError.of(exc)
        return _report(args.command, problem, as_json)
    except Exception as exc:  # the last line of defence (MemoryError, RecursionError too): never a traceback
        return _report(args.command, InternalError.of(exc), as_json)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

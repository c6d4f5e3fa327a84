"""`coherence --serve "vllm serve ..."`: vLLM as a child process, for bare-metal Sparks.

Many Spark users pip-install vLLM and run it without Docker. The gate starts
the command in its own process group, reads its output line by line (the
signature table and vLLM's own refusal lines), waits for /health while the
model loads, and tells a dead server from a slow one by the child's exit:
argparse's refusal (exit 2, naming the flag and vLLM's choices) and a config
refusal (max_model_len, out of memory) are findings that name vLLM's line.
The child's whole process group is always ended: on return, on an error and
on Ctrl-C/SIGTERM.
"""

from __future__ import annotations

import collections
import contextlib
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from spark_images.coherence import judge, verdict
from spark_images.coherence.checks import GateOptions, Outcome, Progress, check_server, quiet
from spark_images.coherence.client import OpenAIClient
from spark_images.coherence.readiness import wait_for_health
from spark_images.coherence.refusal import refusal
from spark_images.coherence.signatures import LogScan
from spark_images.core.errors import Problem, UsageError

TAIL_LINES = 400
STOP_GRACE_S = 15.0


def _flag(argv: Sequence[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def parse_serve(command: str) -> tuple[list[str], str, str, str]:
    """(argv, base URL, served model name, model) of a `vllm serve MODEL ...` command line."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise _usage(f"cannot split the command: {exc}") from None
    try:
        at = argv.index("serve")
    except ValueError:
        raise _usage("the command has no `serve` (e.g. \"vllm serve ORG/MODEL --port 8000\")") from None
    model = argv[at + 1] if at + 1 < len(argv) and not argv[at + 1].startswith("-") else _flag(argv, "--model")
    if not model:
        raise _usage("the command names no model after `serve`")
    port_text = _flag(argv, "--port") or "8000"
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise _usage(f"--port {port_text!r} is not a TCP port (1-65535)")
    host = _flag(argv, "--host") or "127.0.0.1"
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    served = _flag(argv, "--served-model-name") or model
    return argv, f"http://{host}:{port_text}", served, model


def _usage(message: str) -> UsageError:
    return UsageError(Problem(file="command line", field="--serve", message=message,
                              fix='--serve "vllm serve ORG/MODEL --port 8000"'))  # fmt: skip


class _Output:
    """The child's output: the signature scan and the last lines, fed by a reader thread."""

    def __init__(self) -> None:
        self.scan = LogScan()
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.lock = threading.Lock()

    def feed(self, stream: Any) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            with self.lock:
                self.tail.append(line)
                self.scan.feed(line)

    def cause(self) -> str | None:
        with self.lock:
            said = refusal(self.tail)
            hit = self.scan.root_cause()
        if said:
            return said
        return f"log: fatal {hit.name}: {hit.line[:200]}" if hit else None


@contextlib.contextmanager
def child(argv: Sequence[str]) -> Iterator[tuple[subprocess.Popen[bytes], _Output, threading.Thread]]:
    """The command running in its own process group; the group is ended on the way out."""
    try:
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    except OSError as exc:
        raise _usage(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from None
    out = _Output()
    reader = threading.Thread(target=out.feed, args=(proc.stdout,), daemon=True)
    reader.start()
    try:
        yield proc, out, reader
    finally:
        _end_group(proc)
        reader.join(timeout=2)


def _end_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the child's process group (vLLM's engine core is a grandchild), then SIGKILL."""
    for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait_s)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # what the leader left behind
            return
        except subprocess.TimeoutExpired:
            continue


def gate_local(command: str, *, options: GateOptions | None = None, progress: Progress = quiet) -> dict[str, Any]:
    """The record's `coherence` section for a server started from `command` (no container)."""
    opts = options or GateOptions()
    argv, url, served, model = parse_serve(command)
    combo = verdict.Combination(served, _flag(argv, "--moe-backend") or verdict.AUTO,
                                _flag(argv, "--linear-backend") or verdict.AUTO,
                                _flag(argv, "--kv-cache-dtype") or verdict.AUTO)  # fmt: skip
    started = time.monotonic()
    with child(argv) as (proc, out, reader):

        def exited() -> str | None:
            code = proc.poll()
            if code is None:
                return None
            reader.join(timeout=2)  # the last lines name the cause
            cause = out.cause()
            return f"the server exited with code {code}" + (f": {cause}" if cause else " without a reason in its output")

        client = OpenAIClient(url, served, seed=opts.seed, timeout_s=opts.request_timeout_s)
        progress(f"{shlex.join(argv)}: started (pid {proc.pid}), waiting for {url}/health")
        wait = wait_for_health(client, opts.health_timeout_s, poll_s=opts.health_poll_s,
                               failed=lambda: exited() or out.cause(), progress=progress)  # fmt: skip
        outcome = Outcome(reasons=[wait.reason]) if wait.reason else check_server(client, opts, alive=exited,
                                                                                 progress=progress)  # fmt: skip
        late = out.cause()
        if late and late not in outcome.reasons and not wait.reason:
            outcome.reasons.append(late)
        with out.lock:
            doc = judge.combination_record(combo, outcome.doc, outcome.reasons, outcome.warnings, out.scan,
                                             startup_s=round(wait.waited_s, 2),
                                             wall_s=round(time.monotonic() - started, 2),
                                             serve_command=shlex.join(argv), model_path=model)  # fmt: skip
    status, why = verdict.gate_status([doc], [served])
    section: dict[str, Any] = {"status": status, "serve_command": shlex.join(argv), "combinations": [doc]}
    if why:
        section["reason"] = why
    return section

"""`coherence --serve "vllm serve ..."` or `--recipe FILE`: vLLM as a child process, for bare-metal Sparks.

Many Spark users pip-install vLLM and run it without Docker. The gate starts
the command in its own process group, reads its output line by line (the
signature table and vLLM's own refusal lines), waits for /health while the
model loads, and tells a dead server from a slow one by the child's exit:
argparse's refusal (exit 2, naming the flag and vLLM's choices) and a config
refusal (max_model_len, out of memory) are findings that name vLLM's line.
`--recipe FILE` starts the recipe's exact command and environment
(`recipes.gate.serve_command`), the recipe's model as the served model.
The child's whole process group is always ended: on return, on an error and
on Ctrl-C/SIGTERM.
The section's `selected` has container mode's shape (less the docker
command): the one combination, with the exact command, when it passed with a
measured speed; else None with `selected_reason` (`verdict.served_selection`).
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
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from spark_images.coherence import judge, rounds, verdict
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
    return parse_argv(argv)


def parse_argv(argv: Sequence[str], field: str = "--serve") -> tuple[list[str], str, str, str]:
    """(argv, base URL, served model name, model) of a `vllm serve MODEL ...` argv."""
    argv = list(argv)
    try:
        at = argv.index("serve")
    except ValueError:
        raise _usage("the command has no `serve` (e.g. \"vllm serve ORG/MODEL --port 8000\")", field) from None
    model = argv[at + 1] if at + 1 < len(argv) and not argv[at + 1].startswith("-") else _flag(argv, "--model")
    if not model:
        raise _usage("the command names no model after `serve`", field)
    port_text = _flag(argv, "--port") or "8000"
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise _usage(f"--port {port_text!r} is not a TCP port (1-65535)", field)
    host = _flag(argv, "--host") or "127.0.0.1"
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    served = _flag(argv, "--served-model-name") or model
    return argv, f"http://{host}:{port_text}", served, model


def _usage(message: str, field: str = "--serve") -> UsageError:
    fix = '--serve "vllm serve ORG/MODEL --port 8000"' if field == "--serve" else "correct the recipe's serve.args"
    return UsageError(Problem(file="command line", field=field, message=message, fix=fix))


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
def child(
    argv: Sequence[str], env: Mapping[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], _Output, threading.Thread]]:
    """The command running in its own process group (this environment, plus `env`);
    the group is ended on the way out."""
    try:
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, **env} if env else None)  # fmt: skip
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
    argv, *_ = parse_serve(command)
    return gate_argv(argv, options=options, progress=progress)


def gate_argv(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    options: GateOptions | None = None,
    progress: Progress = quiet,
) -> dict[str, Any]:
    """The `coherence` section for a server started from `argv` (`vllm serve MODEL ...`).

    With `rounds` N the server is started N times, one after another (there is
    one combination, so the order is A A A); every round is judged and the
    speed runs of all rounds are pooled (`rounds`).
    """
    opts = options or GateOptions()
    argv, url, served, model = parse_argv(argv)
    combo = verdict.Combination(served, _flag(argv, "--moe-backend") or verdict.AUTO,
                                _flag(argv, "--linear-backend") or verdict.AUTO,
                                _flag(argv, "--kv-cache-dtype") or verdict.AUTO)  # fmt: skip
    docs: list[tuple[int, dict[str, Any]]] = []
    order: list[dict[str, Any]] = []
    for rnd, _ in rounds.round_robin(1, opts.rounds):
        if docs and docs[-1][1]["status"] == "failed":
            order.append({"round": rnd, **combo.to_json(), "served": False, "why": f"failed round {docs[-1][0]}"})
            continue
        if opts.rounds > 1:
            progress(f"{combo.label()}: round {rnd} of {opts.rounds}")
        doc = _serve_once(argv, env, combo, url, served, model, opts, progress)
        docs.append((rnd, doc))
        order.append({"round": rnd, **combo.to_json(), "served": True, "status": doc["status"]})
    result = docs[0][1] if opts.rounds == 1 else rounds.merge(docs)
    status, why = verdict.gate_status([result], [served])
    section: dict[str, Any] = {"status": status, "serve_command": shlex.join(argv), "combinations": [result]}
    if why:
        section["reason"] = why
    chosen, none_why = verdict.served_selection(result, shlex.join(argv))
    section["selected"] = chosen
    section["selected_per_model"] = {result["model"]: chosen} if chosen else {}
    if chosen is None:
        section["selected_reason"] = none_why
    if opts.rounds > 1:
        section["rounds"] = rounds.section_doc(opts.rounds, order)
    return section


def _serve_once(
    argv: list[str], env: Mapping[str, str] | None, combo: verdict.Combination, url: str, served: str, model: str,
    opts: GateOptions, progress: Progress,
) -> dict[str, Any]:
    """One start of the server: wait for it, check it, end it; its combination record."""
    started = time.monotonic()
    with child(argv, env) as (proc, out, reader):

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
            return judge.combination_record(combo, outcome.doc, outcome.reasons, outcome.warnings, out.scan,
                                            startup_s=round(wait.waited_s, 2),
                                            wall_s=round(time.monotonic() - started, 2),
                                            serve_command=shlex.join(argv), model_path=model)  # fmt: skip

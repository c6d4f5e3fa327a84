"""One combination served in a container, its log watched while the checks run.

Start the image (`docker run --gpus all --ipc host ... vllm serve`), stream
its log through the signature table, wait for `/health` (failing at once when
the container exits or logs a fatal line), run the checks, and hand what was
seen to `judge.combination_record`. The container is always removed.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from spark_images.coherence import judge, verdict
from spark_images.coherence.checks import GateOptions, Outcome, Progress, check_server
from spark_images.coherence.client import OpenAIClient
from spark_images.coherence.readiness import wait_for_health
from spark_images.coherence.refusal import refusal
from spark_images.coherence.signatures import LogScan
from spark_images.coherence.verdict import Combination

if TYPE_CHECKING:
    from spark_images.engine.containers import ServedContainer

CONTAINER_PORT = 8000


class _LogWatch:
    """The container's log, fed line by line from the follower thread."""

    def __init__(self) -> None:
        self.scan = LogScan()
        self.tail: collections.deque[str] = collections.deque(maxlen=400)
        self.lock = threading.Lock()

    def on_line(self, line: str) -> None:
        with self.lock:
            self.scan.feed(line)
            self.tail.append(line)

    def fatal(self) -> str | None:
        """vLLM's own refusal line whole (flag and choices), else the fatal signature."""
        with self.lock:
            hit = self.scan.root_cause()
            said = refusal(self.tail) if hit else None
        if said:
            return f"log: {said}"
        return f"log: fatal {hit.name}: {hit.line[:200]}" if hit else None

    def refused(self) -> str | None:
        """vLLM's own refusal (argparse, config) in the log: named once the container exited."""
        with self.lock:
            return refusal(self.tail)


def run_in_container(
    image: str,
    combo: Combination,
    opts: GateOptions,
    *,
    gpus: str | None,
    serve_args: Sequence[str],
    env: Mapping[str, str] | None,
    volumes: Sequence[tuple[str, str]],
    progress: Progress,
) -> tuple[dict[str, Any], list[judge.Greedy]]:
    argv = verdict.serve_argv(combo, extra_args=serve_args, host="0.0.0.0", port=CONTAINER_PORT)
    doc, greedy, _ran = serve_in_container(image, argv, combo, opts, gpus=gpus, env=env, volumes=volumes,
                                           progress=progress)  # fmt: skip
    return doc, greedy


def serve_in_container(
    image: str,
    argv: Sequence[str],
    combo: Combination,
    opts: GateOptions,
    *,
    gpus: str | None,
    env: Mapping[str, str] | None,
    volumes: Sequence[tuple[str, str]],
    progress: Progress,
) -> tuple[dict[str, Any], list[judge.Greedy], dict[str, Any] | None]:
    """Serve `argv` (`vllm serve MODEL ...`, as given) and check `combo.model` on it.

    Returns the combination record, the greedy samples, and what the engine
    says the container ran (`argv`: entrypoint and arguments; `env`: the
    variables of `env` as the container holds them), or None when it never started.
    """
    from spark_images.engine import containers  # the only Docker-touching code of the gate

    watch = _LogWatch()
    started = time.monotonic()
    try:
        with containers.served(image, list(argv[1:]), on_line=watch.on_line, gpus=gpus, env=env,
                               volumes=volumes, container_port=CONTAINER_PORT, entrypoint=argv[0]) as box:  # fmt: skip
            ran = box.command(keys=tuple(env or ()))
            outcome, waited = _check_container(box, combo, opts, watch, progress)
            with watch.lock:
                doc = judge.combination_record(combo, outcome.doc, outcome.reasons, outcome.warnings, watch.scan,
                                                 startup_s=round(waited, 2), wall_s=round(time.monotonic() - started, 2),
                                                 container=box.name)  # fmt: skip
    except containers.ImageCannotServe as exc:
        doc = judge.combination_record(combo, {}, [str(exc)], [], watch.scan, startup_s=0.0,
                                         wall_s=round(time.monotonic() - started, 2))  # fmt: skip
        return doc, [], None
    return doc, outcome.greedy, ran


def _check_container(
    box: ServedContainer, combo: Combination, opts: GateOptions, watch: _LogWatch, progress: Progress
) -> tuple[Outcome, float]:
    def stopped() -> str | None:
        running, code = box.state()
        if running:
            return None
        time.sleep(0.5)  # let the follower read the last lines, which name the cause
        cause = watch.fatal() or watch.refused()
        return f"container exited with code {code}" + (f" ({cause})" if cause else "")

    client = OpenAIClient(f"http://127.0.0.1:{box.host_port}", combo.model,
                          seed=opts.seed, timeout_s=opts.request_timeout_s)  # fmt: skip
    wait = wait_for_health(client, opts.health_timeout_s, poll_s=opts.health_poll_s,
                           failed=lambda: stopped() or watch.fatal(), progress=progress)  # fmt: skip
    waited = wait.waited_s
    if wait.reason:
        return Outcome(reasons=[wait.reason]), waited
    progress(f"  healthy after {waited:.1f} s")
    outcome = check_server(client, opts, alive=stopped, progress=progress)
    late = watch.fatal()  # a fault during the checks (e.g. an illegal memory access under load)
    if late and late not in outcome.reasons:
        outcome.reasons.append(late)
    return outcome, waited

"""Wait for a server's /health the way a person would: through the model load, bounded.

Real vLLM 0.26 keeps its port closed for the whole model load (117 s and 78 s
for a 135M model on an H200; minutes for a large one on a Spark), then opens
it and answers /health with 200. So a refused connection means "not up yet",
never "nothing there", until the deadline. What ends the wait early is the
caller's `failed()`: the container or child process exited, or its log
named a fatal line. Progress goes to `progress` every `PROGRESS_EVERY_S`
seconds and whenever the answer changes; the deadline is kept to the poll.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from spark_images.coherence.client import OpenAIClient

PROGRESS_EVERY_S = 15.0
PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Waited:
    """How a wait for /health ended."""

    reason: str | None  # None: /health answered 200
    waited_s: float
    last_seen: str
    ever_connected: bool  # something accepted a connection at some point
    no_host: bool = False

    @property
    def never_answered(self) -> bool:
        """Nothing was ever there to talk to: an environment problem, not a finding."""
        return self.reason is not None and not self.ever_connected


def wait_for_health(
    client: OpenAIClient,
    timeout_s: float,
    *,
    poll_s: float,
    failed: Callable[[], str | None],
    progress: Callable[[str], None],
) -> Waited:
    """Poll /health until 200, `failed()` says why not, or `timeout_s` has passed."""
    start = time.monotonic()
    deadline = start + timeout_s
    last_seen, connected = "nothing yet", False
    last_said, said_at = "", start
    while True:
        reason = failed()
        if reason:
            return Waited(reason, time.monotonic() - start, last_seen, connected)
        remaining = deadline - time.monotonic()
        answer = client.health_answer(max(0.05, min(PROBE_TIMEOUT_S, remaining)))
        last_seen, connected = answer.seen, connected or answer.connected
        waited = time.monotonic() - start
        if answer.status == 200:
            return Waited(None, waited, last_seen, True)
        if answer.no_host:
            return Waited(f"{client.base_url}: no such host", waited, last_seen, False, no_host=True)
        if time.monotonic() >= deadline:
            return Waited(
                f"/health did not answer 200 within {timeout_s:g} s (waited {waited:.0f} s; last seen: {last_seen})",
                waited, last_seen, connected,
            )  # fmt: skip
        if last_seen != last_said or time.monotonic() - said_at >= PROGRESS_EVERY_S:
            progress(f"  waiting for {client.base_url}/health: {waited:.0f} s of {timeout_s:g} s, last seen: {last_seen}")
            last_said, said_at = last_seen, time.monotonic()
        time.sleep(max(0.0, min(poll_s, deadline - time.monotonic())))

"""Run the CLI as a user would, under a clock and a memory meter.

Every hostile case goes through `run_cli`: a fresh `python -m spark_images`
subprocess (the installed package), its wall time, and its peak RSS read
from the kernel's own accounting of that child (`os.wait4`), so a case that
inflates memory is caught even if it finishes.

The CLI is forked from a small launcher, not from pytest itself: Linux
carries a process's peak RSS across exec (`signal->maxrss`), so a child
forked straight from a test process that once held 4 GB would report the
parent's pages as its own peak. The launcher (~10 MB) forks the CLI, waits
for it with `wait4` and writes the CLI's own rusage to a file. `assert_clean_failure` holds
the contract every case must meet: the documented exit code, one line per
problem naming the file or URL, no traceback, no internal-error guard, and
bounded time and memory.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

WALL_LIMIT_S = 60.0
RSS_LIMIT_MB = 512.0
# A runaway case must fail fast instead of taking the machine's memory with it:
# the child's address space is capped well above RSS_LIMIT_MB, so an honest run
# never meets the cap and a dishonest one dies early and fails its assertion.
ADDRESS_SPACE_CAP = 4 * 1024**3

# argv: REPORT_FILE CLI_ARGS...; exits as the CLI did (re-raising its signal)
_LAUNCHER = f"""
import os, resource, signal, sys
report, args = sys.argv[1], sys.argv[2:]
pid = os.fork()
if pid == 0:
    resource.setrlimit(resource.RLIMIT_AS, ({ADDRESS_SPACE_CAP}, {ADDRESS_SPACE_CAP}))
    os.execv(sys.executable, [sys.executable, "-m", "spark_images", *args])
_, status, usage = os.wait4(pid, 0)
with open(report, "w") as out:
    out.write(str(usage.ru_maxrss))
if os.WIFSIGNALED(status):
    signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
    os.kill(os.getpid(), os.WTERMSIG(status))
sys.exit(os.waitstatus_to_exitcode(status))
"""


@dataclass(frozen=True)
class Result:
    rc: int
    stdout: str
    stderr: str
    wall_s: float
    max_rss_mb: float
    timed_out: bool

    def lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


def run_cli(
    args: Sequence[str],
    *,
    timeout: float = WALL_LIMIT_S,
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
) -> Result:
    """`spark-images ARGS` in a subprocess; kill it (and its group) past `timeout`."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    fd, report_name = tempfile.mkstemp(prefix="hostile-rusage-", suffix=".txt")
    os.close(fd)
    report = Path(report_name)
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", _LAUNCHER, str(report), *args],
        cwd=cwd,
        env=full_env,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    out: list[bytes] = []
    err: list[bytes] = []

    def drain(stream: object, sink: list[bytes]) -> None:
        # bounded: a runaway printer cannot fill the test's memory
        total = 0
        while chunk := stream.read(65536):  # type: ignore[attr-defined]
            if total < 4 * 1024 * 1024:
                sink.append(chunk)
            total += len(chunk)

    readers = [
        threading.Thread(target=drain, args=(proc.stdout, out), daemon=True),
        threading.Thread(target=drain, args=(proc.stderr, err), daemon=True),
    ]
    for reader in readers:
        reader.start()
    if stdin is not None and proc.stdin is not None:
        try:
            proc.stdin.write(stdin)
            proc.stdin.close()
        except BrokenPipeError:
            pass
    timed_out = False
    deadline = start + timeout
    status = rusage = None
    while True:
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            _, status, rusage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.02)
    wall = time.monotonic() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    try:  # the CLI's own peak; a launcher killed at the deadline leaves none: its own then
        max_rss_kib = float(report.read_text() or rusage.ru_maxrss)
    except (OSError, ValueError):
        max_rss_kib = float(rusage.ru_maxrss)
    finally:
        report.unlink(missing_ok=True)
    for reader in readers:
        reader.join(timeout=5)
    return Result(
        rc=proc.returncode,
        stdout=b"".join(out).decode("utf-8", "replace"),
        stderr=b"".join(err).decode("utf-8", "replace"),
        wall_s=wall,
        max_rss_mb=max_rss_kib / 1024.0,  # Linux reports KiB
        timed_out=timed_out,
    )


def assert_clean_failure(
    result: Result,
    *,
    rc: int | Iterable[int],
    names: Iterable[str] = (),
    wall_s: float = WALL_LIMIT_S,
    rss_mb: float = RSS_LIMIT_MB,
    max_lines: int | None = None,
) -> None:
    """The contract of every hostile case (see the module docstring)."""
    allowed = {rc} if isinstance(rc, int) else set(rc)
    context = f"rc={result.rc} wall={result.wall_s:.1f}s rss={result.max_rss_mb:.0f}MB\nstderr:\n{result.stderr[-2000:]}\nstdout:\n{result.stdout[-1000:]}"
    assert not result.timed_out, f"did not finish within {wall_s} s: {context}"
    assert result.rc in allowed, f"exit {result.rc}, expected {sorted(allowed)}: {context}"
    assert "Traceback" not in result.stderr, context
    assert "internal error" not in result.stderr, f"reached the internal-error guard: {context}"
    assert result.wall_s < wall_s, f"took {result.wall_s:.1f} s (limit {wall_s}): {context}"
    assert result.max_rss_mb < rss_mb, f"peak RSS {result.max_rss_mb:.0f} MB (limit {rss_mb}): {context}"
    lines = result.lines()
    assert lines, f"no message on stderr: {context}"
    if max_lines is not None:
        assert len(lines) <= max_lines, f"{len(lines)} lines, expected at most {max_lines}: {context}"
    wanted = list(names)
    if wanted:
        assert any(name in line for line in lines for name in wanted), f"no line names any of {wanted}: {context}"


def tree_digest(root: Path) -> dict[str, str]:
    """Path -> sha256 of every file under root: 'no partial file left' and 'lock unchanged'."""
    if root.is_file():
        return {root.name: hashlib.sha256(root.read_bytes()).hexdigest()}
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }

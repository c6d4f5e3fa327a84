"""Run the CLI as a user would, under a clock and a memory meter.

Every hostile case goes through `run_cli`: `spark-images ARGS` in a process
of its own (the installed package), its wall time, and its peak RSS read
from the kernel's own accounting of that child (`os.wait4`), so a case that
inflates memory is caught even if it finishes.

A fresh interpreter spends ~0.3-0.9 s of CPU on start-up and imports before
the CLI's first line runs; over ~900 cases that was most of the folder's
time. So each test process starts one small CLI server (`_SERVER`) that
imports `spark_images.cli` and every command module once, then forks one
child per case. The child is a real process: its own session, stdin, stdout
and stderr (pipes passed over a Unix socket), cwd, environment, argv and the
address-space cap; it runs `spark_images.__main__` exactly as `python -m`
does, and leaves through the interpreter's own exit (atexit, thread join,
flush, an uncaught exception printed as a traceback). Its peak RSS counts the
pages it shares with the server (every command's imports, ~50 MB), so the
memory limit is met with less room than a fresh process gets, never more.
Settings an interpreter reads only at start-up (PYTHON*, locale, TZ) cannot
be changed in a forked child: a case whose environment changes one of them,
and every case when SPARK_IMAGES_TEST_CLI=exec, runs through a fresh
interpreter instead (`_LAUNCHER`).

The fresh interpreter is forked from a small launcher, not from pytest
itself: Linux carries a process's peak RSS across exec (`signal->maxrss`), so
a child forked straight from a test process that once held 4 GB would report
the parent's pages as its own peak. The launcher (~10 MB) forks the CLI,
waits for it with `wait4` and writes the CLI's own rusage to a file. The
server needs no such care: a forked child that does not exec starts its peak
from the server's own pages. `assert_clean_failure` holds the contract every
case must meet: the documented exit code, one line per problem naming the
file or URL, no traceback, no internal-error guard, and bounded time and memory.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO

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


# argv: CONTROL_FD. Imports the CLI once, says b"ready", then per request (a
# pickled (args, env, cwd) with the case's stdin, stdout and stderr passed as
# SCM_RIGHTS) forks a child, answers its pid, and after `wait4` its wait status
# and peak RSS (KiB). The child returns from `_serve` and runs the CLI as
# `python -m spark_images` does; the interpreter's own exit ends it.
_SERVER = f"""
import gc, importlib, os, pickle, resource, socket, struct, sys
import spark_images.cli
for _name in spark_images.cli.COMMANDS:
    importlib.import_module("spark_images.cli." + _name.replace("-", "_"))
# the imports are for life: a child's collections and its exit skip them (0.5 s -> 0.15 s)
gc.freeze()
_ctl = socket.socket(fileno=int(sys.argv[1]))
_ctl.send(b"ready")

def _serve():
    while True:
        msg, fds, _, _ = socket.recv_fds(_ctl, 1 << 20, 3)
        if not msg:
            raise SystemExit(0)
        args, env, cwd = pickle.loads(msg)
        pid = os.fork()
        if pid == 0:
            _ctl.close()
            os.setsid()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_AS, ({ADDRESS_SPACE_CAP}, {ADDRESS_SPACE_CAP}))
            if cwd is not None:
                os.chdir(cwd)
            os.environ.clear()
            os.environ.update(env)
            sys.argv = ["-m", *args]
            return
        for fd in fds:
            os.close(fd)
        _ctl.send(struct.pack("q", pid))
        _, status, usage = os.wait4(pid, 0)
        _ctl.send(struct.pack("qq", status, usage.ru_maxrss))

_serve()
import runpy
runpy._run_module_as_main("spark_images")
"""
# what an interpreter reads once at start-up: a forked child keeps the server's
_STARTUP_KEYS = ("PYTHON", "LC_", "LANG", "LANGUAGE", "TZ")
_UNBUFFERED = {"PYTHONUNBUFFERED": "1"}


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


class _Output:
    """The case's stdout and stderr, each read by a thread into a bounded buffer."""

    def __init__(self, stdout: BinaryIO, stderr: BinaryIO) -> None:
        self.out: list[bytes] = []
        self.err: list[bytes] = []
        self.readers = [
            threading.Thread(target=self._drain, args=(stdout, self.out), daemon=True),
            threading.Thread(target=self._drain, args=(stderr, self.err), daemon=True),
        ]
        for reader in self.readers:
            reader.start()

    @staticmethod
    def _drain(stream: BinaryIO, sink: list[bytes]) -> None:
        # bounded: a runaway printer cannot fill the test's memory
        total = 0
        with stream:
            while chunk := stream.read(65536):
                if total < 4 * 1024 * 1024:
                    sink.append(chunk)
                total += len(chunk)

    def result(self, status: int, max_rss_kib: float, wall: float, timed_out: bool) -> Result:
        for reader in self.readers:
            reader.join(timeout=5)
        return Result(
            rc=os.waitstatus_to_exitcode(status),
            stdout=b"".join(self.out).decode("utf-8", "replace"),
            stderr=b"".join(self.err).decode("utf-8", "replace"),
            wall_s=wall,
            max_rss_mb=max_rss_kib / 1024.0,  # Linux reports KiB
            timed_out=timed_out,
        )


def _feed(stream: IO[bytes] | None, data: bytes | None) -> None:
    if stream is None or data is None:
        return
    try:
        stream.write(data)
        stream.close()
    except BrokenPipeError:
        pass


class _CliServer:
    """This process's CLI server (`_SERVER`); one case at a time."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.env = {**os.environ, **_UNBUFFERED}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        theirs.close()
        self.sock = ours
        self.busy = threading.Lock()
        ours.settimeout(300)
        if ours.recv(16) != b"ready":
            raise RuntimeError(f"the CLI server did not start (exit {self.proc.wait(timeout=30)})")
        ours.settimeout(None)
        atexit.register(self.close)

    def close(self) -> None:
        self.sock.close()  # the server's EOF: it exits
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def serves(self, env: dict[str, str]) -> bool:
        keys = {k for k in (*env, *self.env) if k.startswith(_STARTUP_KEYS)}
        return all(env.get(k) == self.env.get(k) for k in keys)

    def _answer(self, size: int) -> bytes:
        data = self.sock.recv(size)
        if not data:
            raise RuntimeError(f"the CLI server died (exit {self.proc.wait(timeout=30)})")
        return data

    def run(self, args: Sequence[str], timeout: float, cwd: str | None, env: dict[str, str], stdin: bytes | None) -> Result:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r, in_w = os.pipe() if stdin is not None else (os.open(os.devnull, os.O_RDONLY), -1)
        start = time.monotonic()
        try:
            socket.send_fds(self.sock, [pickle.dumps((list(args), env, cwd))], [in_r, out_w, err_w])
        finally:
            for fd in (in_r, out_w, err_w):
                os.close(fd)
        output = _Output(open(out_r, "rb"), open(err_r, "rb"))  # noqa: SIM115 (closed by the reader)
        (pid,) = struct.unpack("q", self._answer(16))
        _feed(open(in_w, "wb") if in_w >= 0 else None, stdin)  # noqa: SIM115 (closed by _feed)
        timed_out = False
        self.sock.settimeout(max(0.0, start + timeout - time.monotonic()))
        try:
            answer = self._answer(16)
        except TimeoutError:
            timed_out = True
            for kill in (os.killpg, os.kill):  # its session, or itself before setsid
                with contextlib.suppress(ProcessLookupError):
                    kill(pid, signal.SIGKILL)
            self.sock.settimeout(None)
            answer = self._answer(16)
        finally:
            self.sock.settimeout(None)
        wall = time.monotonic() - start
        status, max_rss_kib = struct.unpack("qq", answer)
        return output.result(status, float(max_rss_kib), wall, timed_out)


_server: _CliServer | None = None


def _cli_server() -> _CliServer | None:
    global _server
    if os.environ.get("SPARK_IMAGES_TEST_CLI") == "exec":
        return None
    if _server is None:
        _server = _CliServer()
    return _server


def _run_fresh(args: Sequence[str], timeout: float, cwd: str | None, env: dict[str, str], stdin: bytes | None) -> Result:
    fd, report_name = tempfile.mkstemp(prefix="hostile-rusage-", suffix=".txt")
    os.close(fd)
    report = Path(report_name)
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", _LAUNCHER, str(report), *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    output = _Output(proc.stdout, proc.stderr)  # type: ignore[arg-type]
    _feed(proc.stdin, stdin)
    timed_out = False
    deadline = start + timeout
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
    return output.result(status, max_rss_kib, wall, timed_out)


def run_cli(
    args: Sequence[str],
    *,
    timeout: float = WALL_LIMIT_S,
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
) -> Result:
    """`spark-images ARGS` in a process of its own; kill it (and its group) past `timeout`."""
    full_env = {**os.environ, **_UNBUFFERED, **(env or {})}
    where = None if cwd is None else os.fspath(cwd)
    server = _cli_server()
    if server is not None and server.serves(full_env) and server.busy.acquire(blocking=False):
        try:
            return server.run(args, timeout, where, full_env, stdin)
        finally:
            server.busy.release()
    return _run_fresh(args, timeout, where, full_env, stdin)


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

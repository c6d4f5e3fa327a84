"""Layer digests hashed beside the walk: by a child process, or here when none can help.

Every answer is held against hashlib on the same bytes; a blob that does not match
its digest is one line, exit 2, whichever side hashed it; a child that dies leaves
the rest to this process, not to a pass.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import mmap
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest

from spark_images.core.errors import UsageError
from spark_images.readers import digests
from spark_images.readers.blob_hash import hash_range, map_range
from spark_images.readers.digests import SideDigests
from support.oci_blobs import digest_of
from support.oci_blobs import layer_tar as layer
from support.paths import ORACLE_BIN

ORACLE_LIB = ORACLE_BIN / "lib"


@pytest.fixture(autouse=True)
def _patient(monkeypatch: pytest.MonkeyPatch) -> None:
    """The child hashes at idle priority: on a host whose cores other tests keep busy it may
    wait its turn for seconds, and these tests are about its answers, not its deadline."""
    monkeypatch.setattr(digests, "ANSWER_GRACE_S", 60.0)


def _blobs(tmp_path: Path, sizes: list[int]) -> tuple[int, list[tuple[str, int, int]], bytes]:
    """A file of random blobs back to back, opened; (fd, [(digest, offset, size)], its bytes)."""
    data = os.urandom(sum(sizes) + 100)
    path = tmp_path / "blobs.bin"
    path.write_bytes(data)
    out, at = [], 7
    for size in sizes:
        out.append(("sha256:" + hashlib.sha256(data[at : at + size]).hexdigest(), at, size))
        at += size
    return os.open(path, os.O_RDONLY), out, data


@pytest.mark.parametrize("side_over", [0, 1 << 40], ids=["child", "here"])
def test_every_digest_is_checked_against_the_bytes(tmp_path: Path, side_over: int) -> None:
    fd, blobs, _data = _blobs(tmp_path, [5, (1 << 20) + 3, 3 << 20, 0])
    try:
        with SideDigests(fd, blobs, "x.tar", side_over=side_over) as side:
            assert (side.child is not None) == (side_over == 0)
            for digest, _offset, _size in reversed(blobs):  # asked in another order than hashed
                side.check(digest)
            bad = "sha256:" + "0" * 64
            side.jobs.append((bad, 0, 10))
            side.order[bad] = len(side.jobs) - 1
            with pytest.raises(
                UsageError, match=r"^x.tar: layer sha256:0+ does not match its digest"
            ):
                side.check(bad)  # not among the child's jobs: hashed here, and refused
    finally:
        os.close(fd)


def test_a_wrong_digest_is_refused_by_the_child(tmp_path: Path) -> None:
    fd, blobs, _data = _blobs(tmp_path, [1 << 20, 2 << 20])
    lying = [
        (blobs[0][0], blobs[0][1] + 1, blobs[0][2]),
        blobs[1],
    ]  # the first blob read one byte off
    try:
        with SideDigests(fd, lying, "x.tar", side_over=0) as side:
            assert side.child is not None
            with pytest.raises(UsageError, match="does not match its digest"):
                side.check(lying[0][0])
            side.check(lying[1][0])
            assert side.answers[0] != lying[0][0][7:] and side.answers[1] == lying[1][0][7:]
    finally:
        os.close(fd)


def test_a_blob_past_the_end_of_the_file_is_refused(tmp_path: Path) -> None:
    fd, blobs, data = _blobs(tmp_path, [1000])
    try:
        assert hash_range(fd, "sha256", len(data) - 10, 20) == "short"
        past = [(blobs[0][0], len(data) - 10, 1000)]
        for side_over in (0, 1 << 40):
            with (
                SideDigests(fd, past, "x.tar", side_over=side_over) as side,
                pytest.raises(UsageError),
            ):
                side.check(past[0][0])
    finally:
        os.close(fd)


def test_the_mapped_hash_answers_as_the_read_one(tmp_path: Path) -> None:
    """The child hashes through windows of mappings: every range, aligned or not, across
    window ends or inside one, gives hashlib's digest of the same bytes, as a read does."""
    grain = mmap.ALLOCATIONGRANULARITY
    data = os.urandom(7 * grain + 123)
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        ranges = [(0, len(data)), (7, 3 * grain), (grain - 1, 2), (grain, grain), (5 * grain + 9, 2 * grain + 100), (3, 0)]
        for offset, size in ranges:
            want = hashlib.sha256(data[offset : offset + size]).hexdigest()
            for window in (grain, 2 * grain, 1 << 26):
                assert map_range(fd, "sha256", offset, size, window) == want, (offset, size, window)
            assert hash_range(fd, "sha256", offset, size) == want
        assert map_range(fd, "sha512", 11, 4 * grain) == hashlib.sha512(data[11 : 11 + 4 * grain]).hexdigest()
        assert map_range(fd, "sha256", len(data) - 10, 11) == "short"
        assert map_range(fd, "sha256", len(data) + 1, 0) == "short"
    finally:
        os.close(fd)


def test_a_file_that_cannot_be_mapped_is_read(tmp_path: Path) -> None:
    """A kernel attribute file says 4096 bytes and refuses mmap: the child reads it instead,
    and a range past what it really holds is refused as short."""
    attribute = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not attribute.is_file():
        pytest.skip(f"{attribute} is not on this host")
    real = attribute.read_bytes()
    fd = os.open(attribute, os.O_RDONLY)
    try:
        with pytest.raises(OSError):
            mmap.mmap(fd, 4096, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        assert map_range(fd, "sha256", 0, 10) == hashlib.sha256(real[:10]).hexdigest()
        assert map_range(fd, "sha256", 0, 4096) == "short"
    finally:
        os.close(fd)


def _refused_here(side: SideDigests, n: int) -> None:
    """Job `n`, renamed to a digest its bytes do not have, is refused by this process."""
    wrong = "sha256:" + "1" * 64
    side.jobs[n] = (wrong, *side.jobs[n][1:])
    side.order[wrong] = n
    with pytest.raises(UsageError, match="does not match its digest"):
        side.check(wrong)


def test_a_child_that_dies_leaves_the_rest_to_this_process(tmp_path: Path) -> None:
    fd, blobs, _data = _blobs(tmp_path, [1 << 20] * 4)
    try:
        with SideDigests(fd, blobs, "x.tar", side_over=0) as side:
            assert side.child is not None
            side.check(blobs[0][0])
            side.close()
            # a child that dies before it answers the rest (killed, out of memory): a real
            # process, so the pipe ends as it would, but one that surely answers nothing
            # (the hasher itself may finish 4 MiB before a kill lands)
            side.child = subprocess.Popen(
                [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
                stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            for digest, _offset, _size in blobs[1:]:
                side.check(digest)  # hashed here, never skipped
            assert side.child is None, "a dead child is let go"
            assert len(side.answers) == 1
            _refused_here(side, 2)
    finally:
        os.close(fd)


def test_a_child_that_gives_no_answer_in_time_is_let_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle-priority child on a host with no idle core answers nothing: the walk waits
    for it only ANSWER_GRACE_S plus the unhashed bytes at ANSWER_FLOOR_RATE, then hashes here."""
    monkeypatch.setattr(digests, "ANSWER_GRACE_S", 0.3)
    monkeypatch.setattr(digests, "ANSWER_FLOOR_RATE", 1 << 40)
    fd, blobs, _data = _blobs(tmp_path, [1 << 20] * 3)
    try:
        with SideDigests(fd, blobs, "x.tar", side_over=0) as side:
            side.close()
            # a real process that holds its pipe open and writes nothing: what a starved child looks like
            side.child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], stdout=subprocess.PIPE)
            stalled = side.child
            t0 = time.monotonic()
            side.check(blobs[1][0])  # hashed here once the child is let go
            assert 0.25 < time.monotonic() - t0 < 3
            assert side.child is None and stalled.poll() is not None, "the stalled child is killed"
            _refused_here(side, 2)
    finally:
        os.close(fd)


def test_a_child_stopped_for_less_than_its_grace_still_answers(tmp_path: Path) -> None:
    """Stopped for 0.3 s (SIGSTOP, as a busy host would starve it) within its grace: the
    deadline lets a child go only once it has passed, so every answer is the child's."""
    fd, blobs, _data = _blobs(tmp_path, [1 << 20] * 4)
    try:
        with SideDigests(fd, blobs, "x.tar", side_over=0) as side:
            assert side.child is not None
            os.kill(side.child.pid, signal.SIGSTOP)
            threading.Timer(0.3, os.kill, (side.child.pid, signal.SIGCONT)).start()
            for digest, _offset, _size in blobs:
                side.check(digest)
            assert side.child is not None and len(side.answers) == 4, "every answer came from the child"
    finally:
        os.close(fd)


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_the_hasher_runs_at_idle_priority(tmp_path: Path) -> None:
    """The script as `digests` starts it, waiting for its jobs: its policy is SCHED_IDLE."""
    fd, _unused, _data = _blobs(tmp_path, [3])
    with subprocess.Popen([sys.executable, "-I", "-S", str(digests._HASHER), str(fd)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, pass_fds=(fd,)) as child:  # closes the pipes
        try:
            deadline = time.monotonic() + 10
            while os.sched_getscheduler(child.pid) != os.SCHED_IDLE and time.monotonic() < deadline:
                time.sleep(0.01)
            assert os.sched_getscheduler(child.pid) == os.SCHED_IDLE
        finally:
            child.kill()
            os.close(fd)


def test_the_hasher_runs_alone_on_the_standard_library(tmp_path: Path) -> None:
    """The child's script runs isolated (-I -S, no site-packages): it must import nothing
    of this package, and answer as `hash_range` does."""
    fd, blobs, _data = _blobs(tmp_path, [3, 2 << 20])
    try:
        jobs = "".join(json.dumps(["sha256", offset, size]) + "\n" for _d, offset, size in blobs)
        proc = subprocess.run(
            [sys.executable, "-I", "-S", str(digests._HASHER), str(fd)], input=jobs, pass_fds=(fd,),
            capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        assert proc.stdout.split() == [digest[7:] for digest, _o, _s in blobs]
        assert "spark_images" not in digests._HASHER.read_text().split('"""', 2)[2]
    finally:
        os.close(fd)


def _archive(path: Path, blob: bytes, digest: str) -> None:
    """A docker-save archive of one layer, stored under `digest` (its true one, or not)."""
    name = f"blobs/sha256/{digest[7:]}"
    with tarfile.open(path, "w") as tar:
        for member, data in {
            "manifest.json": json.dumps([{"Layers": [name]}]).encode(),
            name: blob,
        }.items():
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("side_over", ["0", str(1 << 40)], ids=["child", "here"])
def test_a_layer_that_is_not_what_its_digest_names_is_one_line(
    tmp_path: Path, side_over: str
) -> None:
    """The CLI on an archive whose layer bytes were changed after its digest was taken:
    refused, exit 2, one line naming the layer, whichever side hashed it; the same
    archive with its true digest passes."""
    lib = (ORACLE_LIB / "libsm121a.so").read_bytes()
    blob = gzip.compress(layer({"usr/lib/libsm121a.so": lib}), 6, mtime=0)
    changed = gzip.compress(layer({"usr/lib/libsm121a.so": lib + b"\0"}), 6, mtime=0)
    run = [sys.executable, "-c", f"from spark_images.readers import digests; digests.SIDE_OVER = {side_over}; "
           "from spark_images.cli import main; raise SystemExit(main())", "cubins"]  # fmt: skip
    good, bad = tmp_path / "good.tar", tmp_path / "bad.tar"
    _archive(good, blob, digest_of(blob))
    _archive(bad, changed, digest_of(blob))
    ok = subprocess.run(
        [*run, str(good)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert ok.returncode == 0 and "native" in ok.stdout, ok.stdout + ok.stderr
    proc = subprocess.run(
        [*run, str(bad)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"layer {digest_of(blob)} does not match its digest" in lines[0], (
        proc.stderr
    )
    assert "Traceback" not in proc.stderr

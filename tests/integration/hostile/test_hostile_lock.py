"""Hostile lock files, read by `spark-images plan --lock` (through `lock.load_lock`)
and by `spark-images publish --lock`.

A FIFO, a symlink to /dev/zero, bytes that are not UTF-8, JSON nested 10 000
deep, NaN, and a digest with a trailing newline (which a `^...$` pattern would
let through). Each case must end with its documented exit code (2: the lock
cannot be read as a file; 1: it was read and is malformed), one line naming
the lock file, no traceback, within the harness's time and memory bounds, and
leave the lock exactly as it was (bytes, or the FIFO / symlink itself).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from harness import assert_clean_failure, run_cli
from hostile_cases import lock_entry

pytestmark = pytest.mark.processes  # every case runs the CLI as a process under a clock

PROFILE = str(Path(__file__).resolve().parents[3] / "profiles" / "cu130.yaml")
REPO = "127.0.0.1:9/spark-vllm"  # nothing listens: no case may get as far as a registry
DIGEST = "sha256:" + "a" * 64
WALL_S = 30.0


def entry(**over: Any) -> dict[str, Any]:
    return lock_entry(REPO, DIGEST, **over)


def good_lock() -> bytes:
    return json.dumps({"lock_version": 1, "images": {"cu130": entry()}}, indent=2).encode()


def _make(kind: str, path: Path) -> None:
    """Put the hostile lock of `kind` at `path`."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "not-utf8":
        path.write_bytes(good_lock().replace(b'"cuda_line": "cu130"', b'"cuda_line": "cu\xff\xfe130"'))
    elif kind == "deep":
        path.write_bytes(b'{"lock_version": 1, "images": ' + b"[" * 10_000 + b"]" * 10_000 + b"}")
    elif kind == "nan":
        path.write_bytes(good_lock().replace(b'"lock_version": 1', b'"lock_version": NaN'))
    elif kind == "digest-newline":
        bad = DIGEST + "\n"
        path.write_text(json.dumps({"lock_version": 1, "images": {"cu130": entry(digest=bad, image=f"{REPO}@{bad}")}}))
    elif kind == "fixes-bools":  # bool is an int in Python
        path.write_text(json.dumps({"lock_version": 1, "images": {"cu130": entry(fixes_included=[True, False])}}))
    elif kind == "fixes-strings":
        path.write_text(json.dumps({"lock_version": 1, "images": {"cu130": entry(fixes_included=["40923"])}}))
    else:  # pragma: no cover
        raise AssertionError(kind)


def _snapshot(path: Path) -> tuple[object, ...]:
    """What 'unchanged' means for each kind: the bytes of a file; the FIFO or symlink itself."""
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        return ("link", os.readlink(path))
    if stat.S_ISFIFO(info.st_mode):
        return ("fifo", info.st_ino)
    return ("file", path.read_bytes())


# kind -> (exit code, words the line must hold besides the file)
KINDS = {
    "fifo": (2, ""),
    "dev-zero": (2, ""),
    "not-utf8": (1, "not UTF-8"),
    "deep": (1, "nests deeper"),
    "nan": (1, "NaN"),
    "digest-newline": (1, "images.cu130.digest"),
    "fixes-bools": (1, "images.cu130.fixes_included"),
    "fixes-strings": (1, "images.cu130.fixes_included"),
}


def _publish(lock: Path, tmp_path: Path) -> list[str]:
    record = tmp_path / "coherence.json"
    record.write_text(json.dumps({"status": "passed", "image": f"{REPO}@{DIGEST}", "gpu": "sm_121", "combinations": [
        {"model": "org/m", "moe_backend": "auto", "status": "passed", "reasons": [], "warnings": []}]}))
    return ["publish", "cu130", "--tag", "cu130", "--lock", str(lock), "--coherence", str(record),
            "--pr-body", str(tmp_path / "pr.md")]  # fmt: skip


def test_the_good_lock_is_read(tmp_path: Path) -> None:
    """The baseline every case departs from: plan reports the entry's digest."""
    lock = tmp_path / "images.lock.json"
    lock.write_bytes(good_lock())
    result = run_cli(["plan", PROFILE, "--lock", str(lock), "--field", "lock.digest"])
    assert result.rc == 0, result.stderr
    assert result.stdout.strip() == DIGEST


@pytest.mark.parametrize("command", ["plan", "publish"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_hostile_lock(kind: str, command: str, tmp_path: Path) -> None:
    lock = tmp_path / "state" / "images.lock.json"
    lock.parent.mkdir()
    _make(kind, lock)
    before = _snapshot(lock)
    argv = ["plan", PROFILE, "--lock", str(lock)] if command == "plan" else _publish(lock, tmp_path)
    result = run_cli(argv, env={"SPARK_IMAGES_HTTP_TIMEOUT": "4", "NO_PROXY": "*"})
    rc, words = KINDS[kind]
    assert_clean_failure(result, rc=rc, names=[str(lock)], wall_s=WALL_S, max_lines=1)
    (line,) = result.lines()
    assert words in line, line
    assert _snapshot(lock) == before, "the lock changed"
    assert sorted(p.name for p in lock.parent.iterdir()) == ["images.lock.json"], "a partial file was left"
    assert not (tmp_path / "pr.md").exists()

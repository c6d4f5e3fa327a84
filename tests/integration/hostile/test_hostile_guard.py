"""The top-level guard: what reaches it, and what must never reach it.

Every hostile case of this folder asserts through `assert_clean_failure`
that its stderr holds no `internal error`: that is the proof that none of
them reaches the guard. The tests here prove the other half: the guard does
catch what slips through (MemoryError, RecursionError, any exception, with a
bounded one-line message and the JSON document under --json), so the
absence of its line in the hostile cases means something; and the streams
around it hold up (a closed stdout, a reader that goes away, file names that
are not UTF-8).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness import assert_clean_failure, run_cli

import spark_images.cli.validate as validate_cmd
from spark_images.cli import main

pytestmark = pytest.mark.processes  # every case runs the CLI as a process under a clock


def _sh(command: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["sh", "-c", command], cwd=cwd, capture_output=True, timeout=60,
                          env={**os.environ, "PY": sys.executable})  # fmt: skip


@pytest.mark.parametrize(
    "exc",
    [MemoryError(), RecursionError("maximum recursion depth exceeded"), ValueError("x" * 100000),
     KeyError("k"), TypeError("unsupported operand"), UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
     OSError("no filename")],
    ids=lambda e: type(e).__name__,
)
@pytest.mark.parametrize("as_json", [False, True])
def test_the_guard_turns_any_exception_into_one_line(
    exc: BaseException, as_json: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def boom(_args: object) -> int:
        raise exc

    monkeypatch.setattr(validate_cmd, "run", boom)
    code = main(["validate", "p.yaml", *(["--json"] if as_json else [])])
    out, err = capsys.readouterr()
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"spark-images validate: internal error: {type(exc).__name__}")
    assert "please report" in lines[0] and "Traceback" not in err
    assert len(lines[0]) < 400  # an unbounded message is cut
    if as_json:
        doc = json.loads(out)
        assert doc["error"] == "InternalError" and doc["exit_code"] == 2


def test_a_closed_stdout_with_json_is_a_usage_error(tmp_path: Path) -> None:
    proc = _sh('"$PY" -m spark_images validate missing.yaml --json >&-', tmp_path)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert "stdout is closed" in err and "Traceback" not in err and "internal error" not in err


def test_a_closed_stdout_without_json_still_reports_on_stderr(tmp_path: Path) -> None:
    proc = _sh('"$PY" -m spark_images validate missing.yaml >&-', tmp_path)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "missing.yaml" in err
    assert "Traceback" not in err and "internal error" not in err


def test_a_reader_that_goes_away_is_not_a_traceback(tmp_path: Path) -> None:
    proc = _sh('"$PY" -m spark_images validate missing.yaml --json | head -c 1 >/dev/null', tmp_path)
    err = proc.stderr.decode()
    assert "Traceback" not in err and "Exception ignored" not in err and "internal error" not in err, err


@pytest.mark.parametrize("name", [b"\xff.yaml", b"caf\xe9.yaml", b"\xed\xa0\x80.yaml", b"ok\x1b[31m.yaml"])
def test_non_utf8_file_names_with_json(name: bytes, tmp_path: Path) -> None:
    path = os.fsencode(tmp_path) + b"/" + name
    with open(path, "wb") as fh:
        fh.write(b"name: [unclosed\n")
    result = run_cli(["validate", os.fsdecode(path), "--json"])
    assert_clean_failure(result, rc=(1, 2), wall_s=30)
    json.loads(result.stdout)  # still one valid JSON document


@pytest.mark.parametrize("command", [["publish", "cu130", "--tag", "x", "--lock"], ["coherence", "--record"]])
def test_non_utf8_option_paths(command: list[str], tmp_path: Path) -> None:
    path = os.fsdecode(os.fsencode(tmp_path) + b"/\xff\xfe.json")
    args = [*command, path, "--json"] + (["--endpoint", "http://127.0.0.1:9", "--model", "m", "--health-timeout", "1"]
                                         if command[0] == "coherence" else [])  # fmt: skip
    result = run_cli(args, timeout=60)
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr
    assert result.rc in (1, 2)
    json.loads(result.stdout)

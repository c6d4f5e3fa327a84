"""CLI edges that need no server: skip without a Spark GPU, usage errors, the record."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from spark_images.buildline.record import BuildRecord
from spark_images.cli import main
from spark_images.coherence import gpu
from support.coherence_fakes import FAKE_PATH

FAKE = FAKE_PATH


@pytest.fixture
def no_spark_gpu() -> str:
    found = gpu.detect_sm121()
    if found.ok:
        pytest.skip("this machine has an sm_121 GPU")
    return found.reason


def test_skipped_without_sm121_and_written_to_the_record(
    no_spark_gpu: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record_path = tmp_path / "record.json"
    BuildRecord(profile="cu130", sections={"build": {"status": "passed"}}).save(record_path)
    rc = main(["coherence", "repo@sha256:" + "0" * 64, "--model", "m", "--json", "--record", str(record_path)])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert doc["status"] == "skipped" and doc["reason"] == f"no sm_121 GPU ({no_spark_gpu})"
    record = BuildRecord.load(record_path)
    assert record.status("coherence") == "skipped" and record.status("build") == "passed"


def test_require_gpu_turns_the_skip_into_an_environment_error(
    no_spark_gpu: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["coherence", "img", "--model", "m", "--require-gpu"])
    assert rc == 2
    assert "no sm_121 GPU" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["coherence", "img"], "--model"),
        (["coherence", "--model", "m"], "IMAGE"),
        (["coherence", "img", "--endpoint", "http://x", "--model", "m"], "IMAGE"),
        (["coherence", "--endpoint", "http://x", "--model", "a", "--model", "b"], "--model"),
        (["coherence", "img", "--model", "m", "--env", "NOEQUALS"], "--env"),
        (["coherence", "img", "--model", "m", "--api", "grpc"], "--api"),
        (["coherence", "img", "--model", "m", "--min-probe-pass", "1.5"], "--min-probe-pass"),
    ],
)
def test_usage_errors_are_one_line_exit_2(
    argv: list[str], field: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu, "detect_sm121", lambda: gpu.GpuCheck(False, "test"))
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"command line: {field}:" in err[0] and "fix:" in err[0]


def test_bad_numbers_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["coherence", "img", "--model", "m", "--health-timeout", "-5"])
    assert exc.value.code == 2


def test_stand_in_server_imports_only_the_standard_library() -> None:
    tree = ast.parse(FAKE.read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert names - {"__future__"} <= set(sys.stdlib_module_names)

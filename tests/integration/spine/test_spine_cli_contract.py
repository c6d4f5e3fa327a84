"""The command-line contract, driven as a user drives it: `spark-images` in a subprocess.

For bad input every command prints one line per problem (no traceback, no
"internal error"), exits 1 for a finding and 2 for usage/environment, and
under `--json` prints exactly one JSON document on stdout, errors included.
Nothing here leaves the machine: proxies point at a closed loopback port and
the vLLM history URL at another, so a stray download fails fast and locally.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes  # the CLI as a process per test (one waits out a refused connection)

REPO = Path(__file__).resolve().parents[3]
CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens on it here


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str

    def one_json_document(self) -> dict[str, object]:
        text = self.out.strip()
        doc, end = json.JSONDecoder().raw_decode(text)
        assert text[end:].strip() == "", f"more than one document on stdout: {self.out!r}"
        assert isinstance(doc, dict)
        return doc

    def assert_clean_errors(self) -> None:
        assert "Traceback" not in self.out + self.err, self.err
        assert "internal error" not in self.err, self.err


def _cli(tmp: Path, *argv: str, timeout: float = 120) -> Run:
    env = {
        **os.environ,
        "XDG_CACHE_HOME": str(tmp / "xdg"),
        "SPARK_IMAGES_CACHE": str(tmp / "cache"),
        "SPARK_IMAGES_VLLM_GIT_URL": f"{CLOSED}/vllm.git",
        "SPARK_IMAGES_PYPI_SIMPLE": f"{CLOSED}/simple",
        **{k: CLOSED for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")},
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "spark_images.cli", *argv],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout, check=False,
    )  # fmt: skip
    return Run(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture(scope="module")
def junk(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Bad inputs a user can plausibly hand the CLI."""
    root = tmp_path_factory.mktemp("junk")
    (root / "empty.yaml").write_text("")
    (root / "text.whl").write_text("hello\n")
    (root / "not-json.json").write_text("not json\n")
    (root / "corrupt.so").write_bytes(b"garbage, not an ELF file")
    (root / "empty").mkdir()
    with zipfile.ZipFile(root / "full.whl", "w") as wheel:
        wheel.writestr("vllm/_C.so", b"\x7fELF" + b"x" * 50_000)
    data = (root / "full.whl").read_bytes()
    (root / "trunc.whl").write_bytes(data[: len(data) // 2])
    (root / "lock.json").write_text(json.dumps({"lock_version": 1, "images": {}}))
    (root / "notrepo").mkdir()
    return root


# (argv with {j} for the junk folder, expected exit code, a word the error line must hold)
CASES: list[tuple[str, int, str]] = [
    ("validate {j}/empty.yaml --no-audit", 1, "expected a mapping"),
    ("validate {j}/missing.yaml", 2, "no such profile file"),
    ("validate", 2, "PROFILE"),
    ("render {j}/empty.yaml", 1, "expected a mapping"),
    ("render profiles/cu130.yaml -o {j}/text.whl", 2, "text.whl"),
    ("build {j}/missing.yaml --dry-run", 2, "no such profile file"),
    ("build profiles/cu130.yaml --dry-run --build-dir {j}/text.whl --repo {j}/notrepo", 2, "text.whl"),
    ("verify-repro profiles/cu130.yaml --ca-cert {j}/missing.pem", 2, "--ca-cert"),
    ("verify-repro {j}/missing.yaml", 2, "no such profile file"),
    ("cubins {j}/text.whl", 2, "not a readable zip"),
    ("cubins {j}/trunc.whl", 2, "not a readable zip"),
    ("cubins {j}/missing.so", 2, "not an existing file"),
    ("cubins {j}/empty --gpu garbage", 2, "--gpu"),
    ("cubins {j}/empty --require vllm/_C*.so", 1, "no such library"),
    ("audit deadbeef --repo {j}/notrepo", 2, "not a git repository"),
    ("audit deadbeef --fix abc", 2, "not a PR number"),
    ("audit deadbeef --repo {j}/missing", 2, "no such directory"),
    ("coherence img --model m --env NOEQUALS", 2, "--env"),
    ("publish cu130 --tag cu130 --lock {j}/lock.json", 1, "no lock entry"),
    ("publish cu130 --tag cu130 --lock {j}/missing.json", 2, "no lock file"),
    ("monitor profiles/cu130.yaml --pinned {j}/missing.json --release {j}/missing.json", 2, "cannot read"),
    ("monitor profiles/cu130.yaml --pinned {j}/not-json.json --release {j}/not-json.json", 2, "not JSON"),
    ("monitor profiles/cu130.yaml", 2, "--pinned"),
]


@pytest.mark.parametrize(("argv", "code", "word"), CASES, ids=[c[0].split(" {j}")[0] + f"-{i}" for i, c in enumerate(CASES)])
def test_bad_input_is_one_line_per_problem_with_the_contract_exit_code(
    junk: Path, tmp_path: Path, argv: str, code: int, word: str
) -> None:
    words = argv.format(j=junk).split()
    text = _cli(tmp_path, *words)
    text.assert_clean_errors()
    assert text.code == code, text.err
    assert word in text.out + text.err, text.err  # a finding may be part of the report
    as_json = _cli(tmp_path, *words, "--json")
    as_json.assert_clean_errors()
    assert as_json.code == code, as_json.err
    doc = as_json.one_json_document()
    # an error document (or, for a finding the command reports itself, its report)
    # says the same exit code the process returns
    if "error" in doc:
        assert doc["exit_code"] == code and doc["problems"], doc


def test_usage_error_under_json_still_prints_one_document(tmp_path: Path) -> None:
    run = _cli(tmp_path, "audit", "main", "--fix", "abc", "--json")
    assert run.code == 2
    doc = run.one_json_document()
    assert doc["error"] == "UsageError" and doc["exit_code"] == 2
    assert "not a PR number" in doc["problems"][0]["message"]  # type: ignore[index]
    assert "not a PR number" in run.err  # and the human line on stderr, as without --json


def test_unwritable_output_path_names_the_path_not_an_internal_error(junk: Path, tmp_path: Path) -> None:
    """`render -o FILE` where FILE is a file: the OSError becomes one line naming it, exit 2."""
    run = _cli(tmp_path, "render", "profiles/cu130.yaml", "-o", str(junk / "text.whl"), "--json")
    run.assert_clean_errors()
    assert run.code == 2
    lines = run.err.strip().splitlines()
    assert len(lines) == 1 and str(junk / "text.whl") in lines[0] and "fix:" in lines[0]
    assert run.one_json_document()["problems"][0]["file"] == str(junk / "text.whl")  # type: ignore[index]


def test_cubins_tolerates_junk_files_and_empty_folders(junk: Path, tmp_path: Path) -> None:
    for target in ("corrupt.so", "empty", "full.whl"):
        run = _cli(tmp_path, "cubins", str(junk / target), "--json")
        run.assert_clean_errors()
        # nothing runs natively on the GPU: a finding (exit 1), still one report
        assert run.code == 1, run.err
        assert run.one_json_document()["verdict"] == "no-gpu-code"
        assert str(junk / target) in run.err


@pytest.mark.registry
def test_cubins_on_the_loopback_registry_and_a_closed_port(tmp_path: Path, local_registry: str) -> None:
    missing = _cli(tmp_path, "cubins", f"{local_registry}/nothing:tag", "--json")
    missing.assert_clean_errors()
    assert missing.code == 2 and "404" in missing.err
    assert missing.one_json_document()["exit_code"] == 2
    closed = _cli(tmp_path, "cubins", "127.0.0.1:9/nothing:tag", "--json")
    closed.assert_clean_errors()
    assert closed.code == 2 and "127.0.0.1:9/nothing" in closed.err
    assert closed.one_json_document()["exit_code"] == 2


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU may be present: the gate would run")
def test_coherence_without_a_gpu_is_skipped_and_a_bad_record_file_is_named(junk: Path, tmp_path: Path) -> None:
    run = _cli(tmp_path, "coherence", "img@sha256:" + "0" * 64, "--model", "m", "--json")
    run.assert_clean_errors()
    assert run.code == 0
    doc = run.one_json_document()
    assert doc["status"] == "skipped" and "sm_121" in str(doc["reason"])
    bad = _cli(tmp_path, "coherence", "img", "--model", "m", "--record", str(junk / "text.whl"), "--json")
    bad.assert_clean_errors()
    assert bad.code == 2 and "not a build record" in bad.err
    assert bad.one_json_document()["problems"][0]["file"] == str(junk / "text.whl")  # type: ignore[index]
    assert (junk / "text.whl").read_text() == "hello\n"  # refused, not overwritten


def test_coherence_endpoint_with_nothing_listening_ends_at_the_health_timeout_with_exit_2(tmp_path: Path) -> None:
    import socket
    import time

    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "spark_images", "coherence", "--endpoint", f"http://127.0.0.1:{port}", "--model", "m",
         "--health-timeout", "3"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "nothing answered in 3 s" in proc.stderr and "connection refused" in proc.stderr
    assert time.monotonic() - start < 30  # the health timeout, not the 1800 s default
    bad = subprocess.run(
        [sys.executable, "-m", "spark_images", "coherence", "--endpoint", "not-a-url", "--model", "m"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert bad.returncode == 2 and "is not an http(s) URL" in bad.stderr


def test_cubins_on_a_named_file_that_is_not_elf_reports_it_unreadable(tmp_path: Path) -> None:
    text_so = tmp_path / "libnot.so"
    text_so.write_text("this is not a shared library\n")
    proc = subprocess.run(
        [sys.executable, "-m", "spark_images", "cubins", str(text_so), "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 1, proc.stderr  # no-gpu-code is a finding
    doc = json.loads(proc.stdout)
    assert doc["verdict"] == "no-gpu-code"
    assert [u["path"] for u in doc["unreadable"]] == ["libnot.so"]
    assert "not an ELF file" in doc["unreadable"][0]["error"]


def test_empty_target_is_a_usage_error() -> None:
    for command in ("cubins", "audit"):
        proc = subprocess.run(
            [sys.executable, "-m", "spark_images", command, ""],
            capture_output=True, text=True, timeout=120, check=False,
        )
        assert proc.returncode == 2 and "TARGET is empty" in proc.stderr, (command, proc.stderr)

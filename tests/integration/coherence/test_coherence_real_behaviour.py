"""The gate against real vLLM 0.26 behaviour: a long model load, refused flags, refused configs.

The stand-in replays what was recorded from real vLLM (tests/data/coherence/vllm-0.26.0-h200):
the port closed for the whole load, argparse's exit with vLLM's choices, the
max_model_len refusal. The simulated load is 45 s, as in "a server that comes up
45 s after the gate starts is waited for and judged" (it costs one worker 45 s of
waiting, not CPU); SPARK_IMAGES_TEST_LOAD_S sets another for a quick local run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from spark_images.coherence.refusal import refusal
from support.coherence_captured import CAPTURE
from support.coherence_fakes import FAKE_PATH, free_port

pytestmark = pytest.mark.processes  # the gate against a stand-in vLLM process, in real time

LOAD_S = float(os.environ.get("SPARK_IMAGES_TEST_LOAD_S", "45"))
FAST = {"FAKE_VLLM_TOKS_PER_S": "2000", "FAKE_VLLM_STARTUP_S": "0.4"}


def gate(*args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "spark_images", "coherence", *args, "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **FAST, **env},
        # as at a terminal: a suite started in the background inherits SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip


def fake_command(port: int, *flags: str) -> str:
    return shlex.join([sys.executable, str(FAKE_PATH), "serve", "test/model", "--port", str(port),
                       "--host", "127.0.0.1", *flags])  # fmt: skip


def test_endpoint_waits_through_a_model_load_and_judges_the_server() -> None:
    port = free_port()
    checker = gate("--endpoint", f"http://127.0.0.1:{port}", "--model", "test/model", "--health-timeout", "120")
    time.sleep(1.0)  # the gate is already waiting when the server is started
    server = subprocess.Popen(shlex.split(fake_command(port)), env={**os.environ, **FAST, "FAKE_VLLM_MODE": "coherent",
                              "FAKE_VLLM_LOAD_S": str(LOAD_S)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        out, err = checker.communicate(timeout=LOAD_S + 120)
    finally:
        server.terminate()
        server.wait(10)
    assert checker.returncode == 0, err
    doc = json.loads(out)
    assert doc["status"] == "passed"
    assert doc["combinations"][0]["startup_s"] >= LOAD_S
    assert "last seen: connection refused" in err


def test_endpoint_that_never_comes_up_ends_at_the_health_timeout_with_the_line() -> None:
    port = free_port()
    started = time.monotonic()
    checker = gate("--endpoint", f"http://127.0.0.1:{port}", "--model", "m", "--health-timeout", "3")
    _out, err = checker.communicate(timeout=60)
    elapsed = time.monotonic() - started
    assert checker.returncode == 2
    assert 3.0 <= elapsed < 10.0
    last = err.strip().splitlines()[-1]
    assert "nothing answered in 3 s (--health-timeout 3); last seen: connection refused" in last, err


def test_serve_with_a_backend_vllm_does_not_know_is_a_finding_naming_the_flag_and_choices() -> None:
    port = free_port()
    checker = gate("--serve", fake_command(port, "--moe-backend", "no_such_backend"), "--health-timeout", "60")
    out, err = checker.communicate(timeout=90)
    assert checker.returncode == 1, err
    reasons = json.loads(out)["combinations"][0]["reasons"]
    assert any("exited with code 2" in r and "--moe-backend 'no_such_backend'" in r and "'marlin'" in r
               and "'flashinfer_cutlass'" in r for r in reasons), reasons  # fmt: skip
    assert "--moe-backend" in err


def test_serve_with_a_max_model_len_above_the_model_names_vllms_line() -> None:
    port = free_port()
    checker = gate("--serve", fake_command(port, "--max-model-len", "100000"), "--health-timeout", "60")
    out, err = checker.communicate(timeout=90)
    assert checker.returncode == 1, err
    reasons = json.loads(out)["combinations"][0]["reasons"]
    assert any("exited with code 1" in r and "User-specified max_model_len (100000) is greater than the derived"
               in r for r in reasons), reasons  # fmt: skip


def test_serve_judges_a_coherent_server_and_stops_it() -> None:
    port = free_port()
    checker = gate("--serve", fake_command(port), "--health-timeout", "60", FAKE_VLLM_MODE="coherent",
                   FAKE_VLLM_LOAD_S="1")  # fmt: skip
    out, err = checker.communicate(timeout=120)
    assert checker.returncode == 0, err
    doc = json.loads(out)
    assert doc["status"] == "passed"
    pid = int(re.search(r"started \(pid (\d+)\)", err).group(1))
    assert not _alive(pid)


def test_serve_child_is_ended_on_sigint() -> None:
    port = free_port()
    checker = gate("--serve", fake_command(port), "--health-timeout", "120", FAKE_VLLM_LOAD_S="60")
    line = ""
    while "started (pid" not in line:
        line = checker.stderr.readline()
        assert line, "the gate ended before starting the server"
    pid = int(re.search(r"started \(pid (\d+)\)", line).group(1))
    assert _alive(pid)
    checker.send_signal(signal.SIGINT)
    checker.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is not alive: its group leader already reaped or it waits for its parent
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_the_recorded_refusals_read_as_findings() -> None:
    argparse_line = refusal((CAPTURE / "refusal_argparse.log").read_text().splitlines())
    assert argparse_line and argparse_line.startswith("vLLM refused --moe-backend 'no_such_backend'")
    assert "'triton_unfused'" in argparse_line
    config_line = refusal((CAPTURE / "refusal_maxlen.log").read_text().splitlines())
    assert config_line and "User-specified max_model_len (100000)" in config_line
    assert refusal((CAPTURE / "server.log").read_text().splitlines()) is None


def test_two_token_events_real_and_replayed_are_counted_by_usage_not_by_events(run_fake) -> None:
    from spark_images.coherence.client import OpenAIClient
    from support.coherence_captured import stream_events

    real = [e for e in stream_events("speed_stream") if e.get("choices") and e["choices"][0].get("text")]
    assert len(real) < 256 and stream_events("speed_stream")[-1]["choices"] == []  # the usage event
    with run_fake("coherent") as url:
        client = OpenAIClient(url, "test/model")
        assert client.health_answer(5).status in (200, 503, None)
        deadline = time.monotonic() + 30
        while client.health() != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        streamed = client.stream_complete("Tell me a story.", 64, ignore_eos=True)
    assert streamed.completion_tokens == 64
    assert len(streamed.pieces) < 64  # some events carried two tokens, as real vLLM's did

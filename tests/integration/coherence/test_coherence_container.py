"""The gate on the real engine: a linux/arm64 image whose `vllm` is the stand-in server.

Start, health wait, log streaming and signature scan, crash detection,
backend parsing, selection and clean-up all run for real; only the GPU is
missing, so these runs pass `gpus=None` and `assume_gpu=True` (recorded in
the section, never silent).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from spark_images.coherence import GateOptions, gate_image
from spark_images.engine.containers import leftover_containers

pytestmark = [pytest.mark.engine, pytest.mark.slow]

OPTS = GateOptions(
    health_timeout_s=60, health_poll_s=0.3, request_timeout_s=60, speed_tokens=32,
    open_max_tokens=100, concurrency_tokens=24,
)  # fmt: skip


def test_gate_picks_the_fastest_coherent_backend(fake_vllm_image: str) -> None:
    env = {
        "FAKE_VLLM_MODE": "auto=crash-nvfp4,flashinfer_b12x=coherent,marlin=coherent",
        "FAKE_VLLM_TOKS_PER_S": "flashinfer_b12x=400,marlin=120",
        "FAKE_VLLM_STARTUP_S": "0.5",
    }
    section = gate_image(fake_vllm_image, ["org/moe-nvfp4"], ["auto", "flashinfer_b12x", "marlin"],
                         gpus=None, assume_gpu=True, options=OPTS, env=env)  # fmt: skip
    by_moe = {c["moe_backend"]: c for c in section["combinations"]}
    assert section["status"] == "passed", [c["reasons"] for c in section["combinations"]]
    assert section["assumed_gpu"] is True

    crashed = by_moe["auto"]
    assert crashed["status"] == "failed"
    assert any("nvfp4-kernel-missing" in r for r in crashed["reasons"]), crashed["reasons"]
    assert crashed["signatures"][0]["signature"] == "nvfp4-kernel-missing"
    assert "log_tail" in crashed

    fast, slow = by_moe["flashinfer_b12x"], by_moe["marlin"]
    assert fast["status"] == slow["status"] == "passed", (fast["reasons"], slow["reasons"])
    assert fast["backends"]["moe"] == {"NvFp4": "flashinfer_b12x"}
    assert fast["backends"]["linear"] == {"NVFP4 GEMM": "flashinfer_b12x"}
    assert fast["backend_mismatch"] == []
    assert fast["speed"]["decode_tokens_per_s"] > slow["speed"]["decode_tokens_per_s"]

    selected = section["selected"]
    assert selected["moe_backend"] == "flashinfer_b12x"
    assert selected["serve_command"] == (
        "vllm serve org/moe-nvfp4 --moe-backend flashinfer_b12x --linear-backend flashinfer_b12x"
    )
    assert fake_vllm_image in selected["docker_command"]
    assert selected["speed_basis"] == {"tie": False}  # 400 vs 120 tok/s: the intervals separate
    assert leftover_containers(owner=os.getpid()) == []


def test_garbage_mismatch_and_silent_exit_in_containers(fake_vllm_image: str) -> None:
    env = {
        "FAKE_VLLM_MODE": "flashinfer_b12x=loop,cutlass=mismatch,triton=crash-exit",
        "FAKE_VLLM_TOKS_PER_S": "400",
        "FAKE_VLLM_STARTUP_S": "0.5",
        "VLLM_FLASHINFER_MOE_BACKEND": "throughput",  # removed upstream: vLLM warns, we record it
    }
    # completions only: the garbage runs every probe to max_tokens, and the chat side of
    # each check is covered over HTTP in test_coherence_endpoint.py
    opts = dataclasses.replace(OPTS, endpoints=("completions",))
    section = gate_image(fake_vllm_image, ["org/m"], ["flashinfer_b12x", "cutlass", "triton"],
                         gpus=None, assume_gpu=True, options=opts, env=env)  # fmt: skip
    by_moe = {c["moe_backend"]: c for c in section["combinations"]}

    loop = by_moe["flashinfer_b12x"]
    assert loop["status"] == "failed"
    assert any("open prompt (completions): token 'handle' repeated" in r for r in loop["reasons"])

    mismatch = by_moe["cutlass"]
    assert mismatch["status"] == "passed", mismatch["reasons"]
    assert mismatch["backends"]["moe"] == {"NvFp4": "marlin"}
    assert any("asked --moe-backend cutlass" in w for w in mismatch["warnings"])
    assert any(s["signature"] == "unknown-env-var" for s in mismatch["signatures"])

    died = by_moe["triton"]
    assert died["status"] == "failed"
    assert died["reasons"] == ["container exited with code 3"]
    assert [s for s in died["signatures"] if s["severity"] == "fatal"] == []

    assert section["status"] == "passed"
    assert section["selected"]["moe_backend"] == "cutlass"
    assert leftover_containers(owner=os.getpid()) == []


def test_a_backend_vllm_refuses_is_told_from_a_slow_start_in_a_container(fake_vllm_image: str) -> None:
    section = gate_image(fake_vllm_image, ["org/m"], ["no_such_backend"], gpus=None, assume_gpu=True,
                         options=OPTS, env={"FAKE_VLLM_STARTUP_S": "0.5"})  # fmt: skip
    (combo,) = section["combinations"]
    assert combo["status"] == "failed"
    assert combo["startup_s"] < 30  # the exit ended the wait, not the health timeout
    assert any("--moe-backend 'no_such_backend'" in r and "'marlin'" in r and "'triton_unfused'" in r
               for r in combo["reasons"]), combo["reasons"]  # fmt: skip
    # nothing passed: the same keys as a selection, empty, with the reason (as in local-process mode)
    assert section["selected"] is None and section["selected_per_model"] == {}
    assert section["selected_reason"] == "no coherent combination for org/m"


def test_ctrl_c_removes_the_container(fake_vllm_image: str) -> None:
    cmd = [sys.executable, "-m", "spark_images.cli", "coherence", fake_vllm_image, "--model", "m",
           "--backends", "auto", "--gpus", "none", "--assume-gpu", "--health-timeout", "120",
           "--env", "FAKE_VLLM_MODE=hang", "--env", "FAKE_VLLM_STARTUP_S=0.5"]  # fmt: skip
    # as at a terminal: a suite started in the background inherits SIGINT ignored
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        # only the containers this gate process started: other gates may share the engine
        while not leftover_containers(owner=proc.pid) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert leftover_containers(owner=proc.pid), "the gate never started its container"
        name = leftover_containers(owner=proc.pid)[0]
        bindings = subprocess.run(
            ["docker", "inspect", "--format", "{{json .HostConfig.PortBindings}}", name],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert json.loads(bindings)["8000/tcp"][0]["HostIp"] == "127.0.0.1"
        time.sleep(1.0)  # well inside the health wait
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert leftover_containers(owner=proc.pid) == []


def test_no_spark_gpu_is_skipped_never_passed() -> None:
    from spark_images.coherence import gpu

    found = gpu.detect_sm121()
    if found.ok:
        pytest.skip("this machine has an sm_121 GPU")
    section = gate_image("never/run:1", ["m"], ["auto"])
    assert section["status"] == "skipped"
    assert section["reason"] == f"no sm_121 GPU ({found.reason})"
    assert os.environ.get("SPARK_IMAGES_NEVER") is None


def test_image_without_a_vllm_entrypoint_fails_its_combination(arm64_base: str) -> None:
    section = gate_image(arm64_base, ["m"], ["auto"], gpus=None, assume_gpu=True, options=OPTS)
    assert section["status"] == "failed"
    (combo,) = section["combinations"]
    assert "executable file not found" in combo["reasons"][0]
    assert leftover_containers(owner=os.getpid()) == []

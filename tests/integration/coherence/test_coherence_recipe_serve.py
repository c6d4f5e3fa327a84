"""`coherence --recipe FILE`: a recipe's exact `vllm serve` command as the child, like --serve.

The child is the stand-in server (tests/support/fake_vllm.py) behind a `vllm`
on PATH, so the recipe's own argv (`vllm serve MODEL ARGS... limits`) is what
starts, exactly as on a bare-metal Spark with a pip-installed vLLM. The
recipe's serve.env reaches the child: the gate's own environment asks the
stand-in for looping garbage and the recipe asks for a coherent server, so
only a child that got the recipe's environment passes.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from support.coherence_fakes import FAKE_PATH, free_port

pytestmark = pytest.mark.processes  # the gate against a stand-in vLLM process, in real time

FAST = {"FAKE_VLLM_TOKS_PER_S": "2000", "FAKE_VLLM_STARTUP_S": "0.4", "FAKE_VLLM_MODE": "loop"}
GGUF = "/models/SmolLM2-135M-Instruct.Q4_1.gguf"


def _recipe(tmp_path: Path, port: int, *args: str, env: dict[str, str] | None = None) -> Path:
    doc = {
        "name": "smoke-gguf", "status": "unvalidated",
        "model": {"gguf": GGUF, "quantization": "gguf", "moe": False},
        "serve": {"args": ["--tokenizer", "HuggingFaceTB/SmolLM2-135M-Instruct", "--host", "127.0.0.1",
                           "--port", str(port), *args],
                  "env": env if env is not None else {"FAKE_VLLM_MODE": "coherent"}},
        "limits": {"max_model_len": 8192, "max_num_seqs": 4, "gpu_memory_utilization": 0.1, "kv_cache_dtype": "auto"},
        "expect": {"decode_tok_s": {"value": None, "source": "none"}, "memory_gib": {"value": None, "source": "none"}},
        "profiles": ["cu130"],
    }  # fmt: skip
    path = tmp_path / "smoke-gguf.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _gate(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    shim = tmp_path / "bin"
    shim.mkdir(exist_ok=True)
    vllm = shim / "vllm"
    vllm.write_text(
        f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(FAKE_PATH))} "$@"\n'
    )
    vllm.chmod(0o755)
    full = {**os.environ, **FAST, "PATH": f"{shim}:{os.environ['PATH']}", **env}
    return subprocess.run([sys.executable, "-m", "spark_images", "coherence", *args], capture_output=True,
                          text=True, env=full, timeout=240, check=False)  # fmt: skip


def test_recipe_serves_its_exact_command_with_its_environment_round_after_round(
    tmp_path: Path,
) -> None:
    port = free_port()
    recipe = _recipe(tmp_path, port)
    starts = tmp_path / "starts.log"
    out = _gate(tmp_path, "--recipe", str(recipe), "--health-timeout", "60", "--speed-runs", "2",
                "--speed-tokens", "32", "--rounds", "2", "--json", FAKE_VLLM_START_LOG=str(starts))  # fmt: skip
    assert out.returncode == 0, out.stderr
    section = json.loads(out.stdout)
    assert section["status"] == "passed"
    assert section["recipe"] == {
        "name": "smoke-gguf",
        "file": str(recipe),
        "env": {"FAKE_VLLM_MODE": "coherent"},
    }
    assert section["serve_command"] == shlex.join([
        "vllm", "serve", GGUF, "--tokenizer", "HuggingFaceTB/SmolLM2-135M-Instruct", "--host", "127.0.0.1",
        "--port", str(port), "--max-model-len", "8192", "--max-num-seqs", "4", "--gpu-memory-utilization", "0.1",
        "--kv-cache-dtype", "auto",
    ])  # fmt: skip
    (combo,) = section["combinations"]
    assert combo["model"] == GGUF  # the recipe's model is the served model
    assert section["selected"]["serve_command"] == section["serve_command"]  # the recipe's exact command
    assert section["selected"]["decode_tokens_per_s"] == combo["speed"]["decode_tokens_per_s"]
    assert len(starts.read_text().splitlines()) == 2  # one start per round
    assert [(o["round"], o["served"]) for o in section["rounds"]["order"]] == [(1, True), (2, True)]
    assert combo["speed"]["spread"]["runs"] == 4 and [
        r["round"] for r in combo["speed"]["runs"]
    ] == [1, 1, 2, 2]
    assert out.stderr.count("started (pid") == 2


def test_a_recipe_with_a_flag_vllm_refuses_is_a_finding_naming_the_flag(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, free_port(), "--moe-backend", "no_such_backend")
    out = _gate(tmp_path, "--recipe", str(recipe), "--health-timeout", "60", "--json")
    assert out.returncode == 1, out.stderr
    reasons = json.loads(out.stdout)["combinations"][0]["reasons"]
    assert any("exited with code 2" in r and "--moe-backend 'no_such_backend'" in r and "'marlin'" in r
               for r in reasons), reasons  # fmt: skip


def test_the_recipes_environment_is_what_the_child_gets(tmp_path: Path) -> None:
    """Without serve.env the gate's own FAKE_VLLM_MODE=loop reaches the child, and it fails."""
    recipe = _recipe(tmp_path, free_port(), env={})
    out = _gate(tmp_path, "--recipe", str(recipe), "--health-timeout", "60", "--speed-runs", "2",
                "--speed-tokens", "32", "--json")  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert any(
        "repeated" in r or "loop" in r for r in json.loads(out.stdout)["combinations"][0]["reasons"]
    )


@pytest.mark.parametrize(
    ("case", "rc", "words"),
    [
        ("missing", 2, ["no such"]),
        ("invalid", 1, ["limits.max_num_seqs"]),
        ("not-utf8", 2, ["UTF-8"]),
    ],
)
def test_a_hostile_recipe_file_is_one_line_and_no_traceback(
    tmp_path: Path, case: str, rc: int, words: list[str]
) -> None:
    recipe = _recipe(tmp_path, free_port())
    if case == "missing":
        recipe = tmp_path / "nowhere.yaml"
    elif case == "invalid":
        recipe.write_text(recipe.read_text().replace("max_num_seqs: 4", "max_num_seqs: 0"))
    else:
        recipe.write_bytes(b"\xff\xfe name: x\n")
    out = _gate(tmp_path, "--recipe", str(recipe), "--health-timeout", "3")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == rc and "Traceback" not in out.stderr and len(lines) == 1, out.stderr
    assert str(recipe) in lines[0] and all(w in lines[0] for w in words), lines[0]


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--serve", "vllm serve m"], ["--recipe", "not both"]),
        (["--endpoint", "http://127.0.0.1:9"], ["--recipe", "--endpoint"]),
        (["some/image:1"], ["--recipe", "IMAGE"]),
        (["--rounds", "0"], ["--rounds", "between 1 and 20"]),
    ],
    ids=["with-serve", "with-endpoint", "with-image", "zero-rounds"],
)
def test_recipe_with_another_server_or_bad_rounds_is_a_usage_error(
    tmp_path: Path, extra: list[str], words: list[str]
) -> None:
    recipe = _recipe(tmp_path, free_port())
    out = _gate(tmp_path, "--recipe", str(recipe), *extra, "--health-timeout", "3")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert all(w in lines[0] for w in words), lines[0]


@pytest.mark.parametrize(
    "mode", [["--endpoint", "http://127.0.0.1:9", "--model", "m"]], ids=["endpoint"]
)
def test_rounds_where_the_gate_does_not_start_the_server_are_a_usage_error(
    tmp_path: Path, mode: list[str]
) -> None:
    out = _gate(tmp_path, *mode, "--rounds", "2", "--health-timeout", "3")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert "--rounds" in lines[0] and "does not start" in lines[0]

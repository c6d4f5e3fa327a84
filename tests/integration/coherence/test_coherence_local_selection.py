"""Local-process mode (`--serve`, `--recipe`) writes the `selected` entry container mode writes.

The child is the stand-in server (tests/support/fake_vllm.py), started by the
gate from the `--serve` command line exactly as a pip-installed `vllm serve`
would be: it opens its port after its start-up, answers the OpenAI API with
vLLM's stream and `usage` shapes and exports vLLM's `/metrics` names, so the
speed is measured as on a real server. One model and one combination: the
selection is that combination when it passed with a measured speed, else
there is none and the section says why. Publish judges a record by its
`combinations` (`release.publish.matrix_problems` re-selects with
`verdict.select_fastest`), so the selection must agree with that too.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

from spark_images.coherence import verdict
from support.coherence_fakes import FAKE_PATH, free_port

pytestmark = pytest.mark.processes  # the gate against a stand-in vLLM process, in real time

FAST = {"FAKE_VLLM_TOKS_PER_S": "2000", "FAKE_VLLM_STARTUP_S": "0.4"}


def _gate(command: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spark_images", "coherence", "--serve", command, "--health-timeout", "60",
         "--speed-runs", "3", "--speed-tokens", "32", *args, "--json"],
        capture_output=True, text=True, env={**os.environ, **FAST, **env}, timeout=240, check=False,
    )  # fmt: skip


def _command(port: int, *flags: str) -> str:
    return shlex.join([sys.executable, str(FAKE_PATH), "serve", "test/model", "--port", str(port),
                       "--host", "127.0.0.1", *flags])  # fmt: skip


def test_a_passing_served_combination_is_the_selection_in_container_modes_shape() -> None:
    command = _command(free_port(), "--moe-backend", "marlin")
    out = _gate(command, FAKE_VLLM_MODE="coherent")
    assert out.returncode == 0, out.stderr
    section = json.loads(out.stdout)
    (combo,) = section["combinations"]
    selected = section["selected"]
    # container mode's entry (verdict.selection with its speed_basis), less the docker command: no image
    assert set(selected) == set(verdict.selection(None, combo)) | {"speed_basis"}
    assert selected == {
        "model": "test/model", "moe_backend": "marlin", "linear_backend": "auto", "kv_cache_dtype": "auto",
        "decode_tokens_per_s": combo["speed"]["decode_tokens_per_s"], "serve_command": command,
        "speed_basis": {"tie": False},
    }  # fmt: skip
    assert (
        isinstance(selected["decode_tokens_per_s"], float) and selected["decode_tokens_per_s"] > 0
    )
    assert section["selected_per_model"] == {"test/model": selected}
    assert "selected_reason" not in section
    chosen = verdict.select_fastest(
        section["combinations"]
    )  # what publish re-selects from the record
    assert chosen is not None and {
        k: chosen[k] for k in ("model", "moe_backend", "linear_backend")
    } == {k: selected[k] for k in ("model", "moe_backend", "linear_backend")}


def test_a_failing_served_combination_selects_nothing_and_says_why() -> None:
    out = _gate(_command(free_port()), FAKE_VLLM_MODE="loop")
    assert out.returncode == 1, out.stderr
    section = json.loads(out.stdout)
    assert section["combinations"][0]["status"] == "failed"
    assert section["selected"] is None and section["selected_per_model"] == {}
    assert section["selected_reason"] == "test/model (moe=auto linear=auto kv=auto) did not pass"


def test_rounds_select_the_pooled_median() -> None:
    out = _gate(_command(free_port()), "--rounds", "2", FAKE_VLLM_MODE="coherent")
    assert out.returncode == 0, out.stderr
    section = json.loads(out.stdout)
    (combo,) = section["combinations"]
    assert combo["speed"]["pooled"]["runs"] == 6
    assert section["selected"]["decode_tokens_per_s"] == combo["speed"]["decode_tokens_per_s"]


def test_a_pass_without_a_measured_speed_is_no_selection() -> None:
    """Pure: a speed the server's counts could not back (`unknown`) selects nothing, naming why."""
    result = {"model": "m", "moe_backend": "auto", "linear_backend": "auto", "kv_cache_dtype": "auto",
              "status": "passed", "reasons": [],
              "speed": {"decode_tokens_per_s": "unknown", "unknown_reason": "usage.completion_tokens is -1"}}  # fmt: skip
    chosen, why = verdict.served_selection(result, "vllm serve m")
    assert chosen is None
    assert (
        why
        == "m (moe=auto linear=auto kv=auto) passed without a measured speed (usage.completion_tokens is -1)"
    )
    measured = {**result, "speed": {"decode_tokens_per_s": 41.5, "spread": {"ci95": [40.0, 43.0]}}}
    chosen, why = verdict.served_selection(measured, "vllm serve m")
    assert chosen is not None and chosen["decode_tokens_per_s"] == 41.5 and why == ""

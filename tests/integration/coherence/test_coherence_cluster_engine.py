"""`coherence --cluster PLAN`: the pair's gate through the CLI, on the real engine.

The head's endpoint is the stand-in server on loopback (tests/support/fake_vllm.py:
no GPU here, and no Spark pair); the plan is the one `cluster plan --json` writes,
and the node facts are read from this machine's real Docker engine, where the
planned image was never pulled. So the endpoint is judged coherent while the
pair is not publishable, and the gate must say exactly that.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from support.paths import DATA

RECIPE = DATA / "cluster" / "qwen3-235b-tp2.yaml"
IMAGE = "127.0.0.1:5000/spark-images-test/never-pulled@sha256:" + "a" * 64


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spark_images", *args], capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip


def test_the_cluster_gate_judges_the_head_and_refuses_a_pair_without_one_proven_digest(
    docker_engine: None, run_fake: Callable[..., Any], tmp_path: Path
) -> None:
    with run_fake("coherent") as url:
        port = int(urlsplit(url).port or 0)
        doc = yaml.safe_load(RECIPE.read_text())
        doc["cluster"].update(serve_port=port, name="gate-pair")
        recipe = tmp_path / "pair.yaml"
        recipe.write_text(yaml.safe_dump(doc))
        planned = _cli("cluster", "plan", str(recipe), "--node", "local=127.0.0.1", "--node", "local=127.0.0.2",
                       "--image", IMAGE, "--json")  # fmt: skip
        assert planned.returncode == 0, planned.stderr
        plan = tmp_path / "plan.json"
        plan.write_text(planned.stdout)
        out = _cli("coherence", "--cluster", str(plan), "--model", "test/model", "--json",
                   "--health-timeout", "30", "--speed-runs", "2", "--speed-tokens", "32")  # fmt: skip
    assert out.returncode == 1, out.stderr
    section = json.loads(out.stdout)
    assert section["combinations"] and all(c["status"] == "passed" for c in section["combinations"])
    assert section["status"] == "failed" and "cannot be published" in section["reason"]
    pair = section["cluster"]
    assert pair["tensor_parallel_size"] == 2 and pair["endpoint"] == f"http://127.0.0.1:{port}/v1"
    assert pair["publishable"] is False and "no proven digest" in pair["publishable_reason"]
    assert [n["planned_digest"] for n in pair["nodes"]] == ["sha256:" + "a" * 64] * 2
    assert all(n["ran_digest"] is None for n in pair["nodes"])
    assert any(f["fact"] == "containers" and not f["ok"] for f in pair["cluster_facts"])

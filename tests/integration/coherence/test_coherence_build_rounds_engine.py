"""The build line's gate serves each combination `verify.coherence.rounds` times.

The engine test serves the stand-in vLLM image (tests/support/fake_vllm.py as
the image's `vllm`) through the build's own coherence stage; only the GPU is
missing here (`gpus=None`, `assume_gpu=True`, recorded in the section). That the
image does not change with `rounds` is tests/unit/coherence/test_coherence_build_rounds.py.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from spark_images.buildline import steps
from spark_images.buildline.stages import PASSED, Built
from spark_images.coherence import GateOptions
from spark_images.engine.containers import leftover_containers
from support.recipe_projects import rounds_profile

OPTS = GateOptions(
    health_timeout_s=60, health_poll_s=0.3, request_timeout_s=60, speed_tokens=32, speed_runs=3,
    open_max_tokens=100, concurrency_tokens=24, endpoints=("completions",),
)  # fmt: skip


@pytest.mark.engine
@pytest.mark.slow
def test_the_build_gate_serves_each_combination_the_profiles_rounds(
    fake_vllm_image: str, tmp_path: Path
) -> None:
    v = steps.validate(rounds_profile(tmp_path, 2), lambda _line: None)
    digest = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", fake_vllm_image],
                            capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    built = Built(repository="127.0.0.1:5000/spark-images-test/line", digest=digest, config_digest=digest,
                  oci_archive=tmp_path / "none.oci.tar", local_image=fake_vllm_image, source_date_epoch=1_700_000_000,
                  source_date_epoch_from="profile pin", platform="linux/arm64", emulated=True, build_seconds=1.0)  # fmt: skip
    said: list[str] = []
    # OPTS asks for one round: the profile's rounds are what the build serves
    g = steps.coherence(v, built, said.append, gpus=None, assume_gpu=True, options=OPTS)
    assert g.status == PASSED, g.reason
    assert g.section["rounds"]["rounds"] == 2
    assert [(o["round"], o["moe_backend"], o["served"]) for o in g.section["rounds"]["order"]] == [
        (1, "marlin", True), (2, "marlin", True),
    ]  # fmt: skip
    (combo,) = g.section["combinations"]
    assert [r["round"] for r in combo["rounds"]] == [1, 2]
    assert combo["speed"]["pooled"] == {"rounds": [1, 2], "runs": 6}
    assert any("(round 2 of 2): starting" in line for line in said), said
    assert leftover_containers(owner=os.getpid()) == []

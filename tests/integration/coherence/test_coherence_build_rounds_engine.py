"""The build line's gate serves each combination `verify.coherence.rounds` times, and the image does not change.

plan.json is copied into the build context, so a setting that only the gate
reads must stay out of it: two profiles that differ only in `rounds` render
the same Dockerfile and the same build context, byte for byte, while the plan
the gate reads carries each one's rounds. The engine test serves the stand-in
vLLM image (tests/fakes/fake_vllm.py as the image's `vllm`) through the build's
own coherence stage; only the GPU is missing here (`gpus=None`,
`assume_gpu=True`, recorded in the section).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from spark_images.buildline import steps
from spark_images.buildline.resolve import resolve_profile
from spark_images.buildline.stages import PASSED, Built
from spark_images.coherence import GateOptions
from spark_images.engine.containers import leftover_containers

REPO = Path(__file__).resolve().parents[2]
OPTS = GateOptions(
    health_timeout_s=60, health_poll_s=0.3, request_timeout_s=60, speed_tokens=32, speed_runs=3,
    open_max_tokens=100, concurrency_tokens=24, endpoints=("completions",),
)  # fmt: skip


def project(tmp: Path, rounds: int | None) -> Path:
    """TMP/profiles/cu130.yaml: the shipped profile with a one-combination matrix, `rounds` set (or left out)."""
    (tmp / "profiles").mkdir(parents=True)
    shutil.copy(REPO / "profiles" / "cu130.requirements.lock", tmp / "profiles")
    doc = yaml.safe_load((REPO / "profiles" / "cu130.yaml").read_text())
    coherence = {"models": ["org/m"], "moe_backends": ["marlin"], "kv_cache_dtypes": ["auto"]}
    if rounds is not None:
        coherence["rounds"] = rounds
    doc["verify"]["coherence"] = coherence
    path = tmp / "profiles" / "cu130.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_profiles_differing_only_in_rounds_render_the_same_build_context(tmp_path: Path) -> None:
    contexts = {}
    for rounds in (None, 1, 3):
        profile = project(tmp_path / f"r{rounds}", rounds)
        assert resolve_profile(profile).plan.coherence.rounds == (rounds or 1)  # the gate gets it
        out = tmp_path / f"ctx{rounds}"
        proc = subprocess.run([sys.executable, "-m", "spark_images", "render", str(profile), "-o", str(out)],
                              capture_output=True, text=True, check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        contexts[rounds] = _tree(out)
    assert {"Dockerfile", "plan.json"} <= set(contexts[3])
    assert contexts[None] == contexts[1] == contexts[3]
    assert b"rounds" not in contexts[3]["plan.json"]


@pytest.mark.engine
@pytest.mark.slow
def test_the_build_gate_serves_each_combination_the_profiles_rounds(
    fake_vllm_image: str, tmp_path: Path
) -> None:
    v = steps.validate(project(tmp_path, 2), lambda _line: None)
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

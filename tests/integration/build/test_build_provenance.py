"""One plan, one digest: what the audit found never reaches the image.

The same profile is built twice with SOURCE_DATE_EPOCH fixed: once with a
real vLLM-shaped git history (tests/support/audit_histories.py, made with real
git) given to the audit, once with no history at all. The audit finds many
fixes in the first and none in the second; the digests must still be equal,
because the labels come from the plan alone. What the audit found goes to the
record, the lock entry and the audit predicate file.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from support.audit_histories import build_vllm_like, fixture_knowledge, git
from support.build_helpers import (
    CA_BUNDLE,
    TEST_COMMIT,
    LineProject,
    WheelServer,
    compile_library,
    make_vllm_wheel,
)

REPO_ROOT = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.engine, pytest.mark.registry, pytest.mark.nvcc, pytest.mark.network, pytest.mark.slow]

SM121 = ["-gencode=arch=compute_121a,code=sm_121a"]


def _labels(image: str) -> dict[str, str]:
    out = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", image],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def test_digest_is_the_same_with_and_without_vllm_history(
    make_project: Callable[..., LineProject], wheel_server: WheelServer, nvcc: str, tmp_path: Path
) -> None:
    history = build_vllm_like(tmp_path / "vllm")
    commit = git(history.path, "rev-parse", "main").strip()
    # the knowledge base of that history: `included` is proven by its commits, not by subjects
    kb = tmp_path / "fixes.yaml"
    kb.write_text(fixture_knowledge(history.path, (REPO_ROOT / "src" / "spark_images" / "audit" / "fixes.yaml").read_text()))
    project = make_project("hist", SM121)
    # the profile's commit and its wheel are the history's main tip
    wheel, sha = make_vllm_wheel(wheel_server.directory, compile_library(nvcc, SM121, tmp_path / "_C.abi3.so"), commit)
    text = project.profile.read_text().replace(TEST_COMMIT, commit).replace(project.wheel_sha256, sha)
    project.profile.write_text(re.sub(r"url: \S+\.whl", f"url: {wheel_server.url}/{wheel.name}", text))
    ca = ["--ca-cert", str(CA_BUNDLE)] if CA_BUNDLE.is_file() else []
    runs = {}
    for name, extra in (("with", ["--vllm-repo", str(history.path)]), ("without", [])):
        build_dir = project.root / "build" / name
        proc = project.run("build", "profiles/hist.yaml", *extra, *ca, "--lock", str(project.root / f"{name}.lock.json"),
                           "--build-dir", str(build_dir), "--cache", "bkcache", env={"SPARK_IMAGES_KB": str(kb)})  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
        runs[name] = (
            json.loads((build_dir / "record.json").read_text()),
            json.loads((build_dir / "audit-predicate.json").read_text()),
            json.loads((project.root / f"{name}.lock.json").read_text())["images"]["hist"],
        )
    (rec_with, pred_with, lock_with), (rec_without, pred_without, lock_without) = runs["with"], runs["without"]
    assert rec_with["audit"]["status"] == "passed" and rec_without["audit"]["status"] == "skipped"
    found = rec_with["audit"]["fixes_included"]
    assert found and rec_without["audit"]["fixes_included"] == []  # the audits really differ
    assert rec_with["build"]["digest"] == rec_without["build"]["digest"]
    # what the audit found is in the record, the lock entry and the predicate, not in the image
    assert lock_with["fixes_included"] == found and lock_without["fixes_included"] == []
    assert pred_with["fixes_included"] == found and pred_with["report"]["commit"] == commit
    assert pred_without["status"] == "skipped" and pred_without["report"] is None
    assert pred_with["image"]["digest"] == rec_with["build"]["digest"]
    labels = _labels(rec_with["build"]["local_image"])
    assert not any("included" in key for key in labels), labels
    assert labels["io.spark-images.fixes.required"] == "" and labels["io.spark-images.vllm.commit"] == commit

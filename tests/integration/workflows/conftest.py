"""Fixtures of the workflow-steps tests: a repository to check out, a vLLM history, a test profile.

The CUDA test base and the wheel server are the build line's own fixtures
(tests/support/build_fixtures.py, registered for every folder), not copied; the
vLLM-shaped git history is tests/support/audit_histories.py's.
"""

from __future__ import annotations

import uuid

import pytest
from workflow_project import StandinProfile, VllmHistory, git

from support.audit_histories import build_vllm_like


@pytest.fixture(scope="session")
def vllm_history(tmp_path_factory: pytest.TempPathFactory) -> VllmHistory:
    """A real vLLM-shaped history (git fast-import) standing for github.com/vllm-project/vllm."""
    like = build_vllm_like(tmp_path_factory.mktemp("vllm-history") / "vllm")
    commit = git(like.path, "rev-parse", "v0.23.0^{commit}")
    return VllmHistory(path=like.path, release_tag="v0.23.0", release_commit=commit)


@pytest.fixture(scope="session")
def standin_profile(
    cuda_test_base: str, wheel_server: object, nvcc: str, local_registry: str, vllm_history: VllmHistory,
    tmp_path_factory: pytest.TempPathFactory,
) -> StandinProfile:  # fmt: skip
    """The build tests' profile (tests/data/build/profile.yaml.in) for a wheel whose `vllm` is the stand-in server.

    Its library has real sm_121 code (the cubin gate passes), its commit is in
    `vllm_history` (the audit runs), its repository is new for each session so
    that the immutable tag publish creates is new too.
    """
    from standins import standin_vllm_wheel

    from support.build_helpers import (
        DATA,
        compile_library,
        make_torch_wheel,
        make_vllm_wheel,
        requirements_lock,
    )

    lib = compile_library(nvcc, ["-gencode=arch=compute_121a,code=sm_121a"],
                          tmp_path_factory.mktemp("wf-lib") / "_C.abi3.so")  # fmt: skip
    base_wheel, _ = make_vllm_wheel(wheel_server.directory, lib, vllm_history.release_commit)  # type: ignore[attr-defined]
    wheel, sha = standin_vllm_wheel(base_wheel)
    # the CUDA torch stand-in, so that the image's `check` verdict is not broken for want of torch
    torch, torch_sha = make_torch_wheel(wheel_server.directory / "torch-wf", lib)  # type: ignore[attr-defined]
    lock_text = requirements_lock(f"{wheel_server.url}/torch-wf/{torch.name}", torch_sha)  # type: ignore[attr-defined]
    repository = f"{local_registry}/spark-images-test/wf-{uuid.uuid4().hex[:10]}"
    name = "wf"
    text = (DATA / "profile.yaml.in").read_text()
    for key, value in {
        "@NAME@": name,
        "@COMMIT@": vllm_history.release_commit,
        "@BASE@": cuda_test_base,
        "@WHEEL_URL@": f"{wheel_server.url}/{wheel.name}",  # type: ignore[attr-defined]
        "@WHEEL_SHA256@": sha,
        "@REQUIRED@": "[]",
        "@REGISTRY@/spark-images-test/line": repository,
    }.items():
        text = text.replace(key, value)
    assert repository in text
    return StandinProfile(name=name, text=text, repository=repository,
                       lock_text=lock_text)  # fmt: skip

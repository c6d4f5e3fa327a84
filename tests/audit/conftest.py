"""Fixtures of the audit tests: the vLLM-shaped history (see audit_histories.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from audit_histories import VllmLike, build_vllm_like


@pytest.fixture(scope="session")
def vllm_like(tmp_path_factory: pytest.TempPathFactory) -> VllmLike:
    return build_vllm_like(tmp_path_factory.mktemp("vllm-like") / "repo")


@pytest.fixture()
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty user cache, so no test touches ~/.cache/spark-images."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"

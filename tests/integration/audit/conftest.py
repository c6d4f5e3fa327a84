"""Fixtures of the audit tests: the vLLM-shaped history (see audit_histories.py)
and a PEP 691 index on loopback listing its releases (see pypi_index.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pypi_index import LocalIndex, serve

from support.audit_histories import PYPI_RELEASES, VllmLike, build_vllm_like, fixture_knowledge, git


@pytest.fixture(scope="session")
def vllm_like(tmp_path_factory: pytest.TempPathFactory) -> VllmLike:
    return build_vllm_like(tmp_path_factory.mktemp("vllm-like") / "repo")


@pytest.fixture(scope="session")
def fixture_kb(vllm_like: VllmLike, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The knowledge base of the fixture history (see fixture_knowledge)."""
    shipped = (Path(__file__).resolve().parents[3] / "src" / "spark_images" / "audit" / "fixes.yaml").read_text()
    path = tmp_path_factory.mktemp("kb") / "fixes.yaml"
    path.write_text(fixture_knowledge(vllm_like.path, shipped))
    return path


def release_commits(repo: Path) -> dict[str, str]:
    return {v: git(repo, "rev-parse", f"v{v}^{{commit}}").strip() for v in PYPI_RELEASES}


@pytest.fixture(scope="session")
def vllm_index(vllm_like: VllmLike) -> Iterator[LocalIndex]:
    """PyPI for the fixture history: its four releases, each sdist naming its commit."""
    with serve() as index:
        index.publish(release_commits(vllm_like.path))
        yield index


@pytest.fixture(autouse=True)
def _audit_environment(vllm_index: LocalIndex, fixture_kb: Path, tmp_path_factory: pytest.TempPathFactory,
                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Every audit test asks the loopback index, reads the fixture history's knowledge
    base, and caches outside the user's home."""
    monkeypatch.setenv("SPARK_IMAGES_KB", str(fixture_kb))
    monkeypatch.setenv("SPARK_IMAGES_PYPI_SIMPLE", vllm_index.simple)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "audit-cache"))


@pytest.fixture()
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty user cache, so no test touches ~/.cache/spark-images."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"

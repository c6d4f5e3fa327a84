"""Real upstream: vLLM history from GitHub and release commits from PyPI.

These skip with the reason when the network cannot reach them (this is the
case on machines that only reach PyPI mirrors); the same code paths run
offline against the fast-import histories of the other tests.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from spark_images.audit import Auditor, load_knowledge, open_history
from spark_images.audit.git import upstream_url
from spark_images.audit.releases import sdist_commit
from spark_images.errors import SparkImagesError


@pytest.fixture(scope="module")
def upstream_reachable() -> None:
    url = upstream_url()
    try:
        proc = subprocess.run(["git", "ls-remote", "--heads", url, "main"], capture_output=True, text=True,
                              timeout=30, env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
    except subprocess.TimeoutExpired:
        pytest.skip(f"network: {url} did not answer within 30 s")
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or ["no answer"]
        pytest.skip(f"network: cannot reach {url} ({lines[-1]})")


@pytest.mark.network
@pytest.mark.slow
def test_real_history_matches_the_facts(upstream_reachable: None) -> None:
    kb = load_knowledge()
    auditor = Auditor(open_history(None), kb)
    final = auditor.resolve_commit("refs/tags/v0.22.1", "v0.22.1")
    report = auditor.audit(final, target="v0.22.1")
    marlin = report.get(40923)
    assert marlin is not None
    # facts: 0.23.0 final; 0.22.1rc0 on main; NOT in the 0.22.1 final
    assert (marlin.state, marlin.first_release, marlin.first_rc) == ("absent", "v0.23.0", "v0.22.1rc0")
    for fix in kb.fixes:
        result = report.get(fix.pr)
        assert result is not None
        if fix.first_release and result.first_release:
            assert result.first_release == f"v{fix.first_release}", f"#{fix.pr}"
        if fix.main_commit and result.state == "included":
            assert any(fix.main_commit[:9] in e for e in result.evidence), f"#{fix.pr}: {result.evidence}"
    b12x = auditor.audit(auditor.resolve_commit("refs/tags/v0.22.0", "v0.22.0"), target="v0.22.0", prs=[40082, 41215])
    assert b12x.get(40082).state == "included"  # type: ignore[union-attr]
    assert any("empty commit" in e for e in b12x.get(41215).evidence)  # type: ignore[union-attr]


@pytest.mark.network
def test_release_commit_from_the_pypi_sdist(pypi_reachable: None) -> None:
    try:
        commit = sdist_commit("0.29.0")
    except SparkImagesError as exc:
        if "no sdist" in str(exc):
            pytest.skip(f"network: the package index does not list vllm 0.29.0 ({exc.problems[0].message})")
        raise
    # facts sheet: vLLM 0.29.0 -> 98dff2a81
    assert commit.startswith("98dff2a81")

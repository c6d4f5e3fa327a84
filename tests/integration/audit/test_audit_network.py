"""Real upstream: vLLM history from GitHub and release commits from PyPI.

These skip with the reason when the network cannot reach them (this is the
case on machines that only reach PyPI mirrors); the same code paths run
offline against the fast-import histories of the other tests.
"""

from __future__ import annotations

import pytest

from spark_images.audit import Auditor, load_knowledge, open_history
from spark_images.audit.pypi_releases import sdist_commit
from spark_images.core.errors import SparkImagesError


@pytest.mark.history
@pytest.mark.slow
def test_real_history_matches_the_facts(vllm_history_reachable: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARK_IMAGES_PYPI_SIMPLE", raising=False)  # the real release list
    monkeypatch.delenv("SPARK_IMAGES_KB", raising=False)  # the shipped knowledge base, on upstream's history
    kb = load_knowledge()
    auditor = Auditor(open_history(None), kb)
    final = auditor.resolve_commit("refs/tags/v0.22.1", "v0.22.1")
    report = auditor.audit(final, target="v0.22.1")
    marlin = report.get(40923)
    assert marlin is not None
    # facts: 0.23.0 final; 0.22.1rc0 on main; NOT in the 0.22.1 final
    assert (marlin.state, marlin.first_release, marlin.first_rc) == ("absent", "v0.23.0", "v0.22.1rc0")
    # a release PyPI got before #40923's squash commit existed is never among its unchecked ones
    merged = kb.get(40923).merged_epoch  # type: ignore[union-attr]
    uploaded = auditor.catalog().uploaded
    assert merged and all(uploaded.get(t.removeprefix("v"), merged) >= merged for t in marlin.unchecked_releases)
    for fix in kb.fixes:
        result = report.get(fix.pr)
        assert result is not None
        if fix.first_release:
            # exact when every earlier PyPI release was checked, else an upper bound that must not be earlier
            if result.first_release:
                assert result.first_release == f"v{fix.first_release}", f"#{fix.pr}"
            else:
                assert result.first_release_at_most and result.unchecked_releases, f"#{fix.pr}"
        if fix.main_commit and result.state == "included":
            assert any(fix.main_commit[:9] in e for e in result.evidence), f"#{fix.pr}: {result.evidence}"
    b12x = auditor.audit(auditor.resolve_commit("refs/tags/v0.22.0", "v0.22.0"), target="v0.22.0", prs=[40082, 41215])
    assert b12x.get(40082).state == "included"  # type: ignore[union-attr]
    assert any("empty commit" in e for e in b12x.get(41215).evidence)  # type: ignore[union-attr]


# facts sheet: release -> commit prefix read off the sdists on PyPI
FACTS_COMMITS = {
    "0.18.0": "bcf2be961", "0.18.1": "a26e8dc7f", "0.19.0": "2a69949bd", "0.19.1": "b1388b1fb",
    "0.20.0": "b8160878f", "0.21.0": "9da56fd18", "0.22.0": "0b3ba88f1", "0.22.1": "0decac0d9",
    "0.23.0": "91df0fad4", "0.29.0": "98dff2a81", "0.33.0": "4ba787ec9",
}


@pytest.fixture()
def real_pypi(pypi_reachable: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real index instead of the loopback one the other audit tests use."""
    monkeypatch.delenv("SPARK_IMAGES_PYPI_SIMPLE", raising=False)


@pytest.mark.network
def test_release_commit_from_the_pypi_sdist(real_pypi: None) -> None:
    try:
        commit = sdist_commit("0.29.0")
    except SparkImagesError as exc:
        if "no sdist" in str(exc):
            pytest.skip(f"network: the package index does not list vllm 0.29.0 ({exc.problems[0].message})")
        raise
    # facts sheet: vLLM 0.29.0 -> 98dff2a81
    assert commit.startswith("98dff2a81")


@pytest.mark.network
@pytest.mark.slow
def test_pypi_release_list_resolves_every_release_since_0_9(real_pypi: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_images.audit import pypi_releases
    from spark_images.audit.releases import parse_tag

    monkeypatch.setattr(pypi_releases, "LOOKUPS_PER_RUN", 1000)
    catalog = pypi_releases.load_catalog()
    assert catalog.versions is not None, catalog.why
    since = [v for v in catalog.versions if (n := parse_tag(v)) and n.kind == "final" and n.key[0] >= (0, 9, 0, 0)]
    assert "0.9.2" in since
    resolved = {}
    for version in since:
        commit, why = catalog.commit(version)
        # sdists built before setuptools-scm wrote __commit_id__ (up to ~0.10) name none: said so,
        # never guessed; every release the facts sheet lists, and everything since 0.18, names one
        if commit is None:
            if why.startswith("no sdist"):  # a wheel-only release: unchecked, and said so
                assert version not in FACTS_COMMITS, version
                continue
            assert why == f"vllm-{version}.tar.gz records no commit", f"{version}: {why}"
            assert parse_tag(version).key[0] < (0, 18, 0, 0), version  # type: ignore[union-attr]
            continue
        assert len(commit) >= 7, version
        resolved[version] = commit
    catalog.save()
    for version, prefix in FACTS_COMMITS.items():
        if version in catalog.versions:
            assert resolved[version].startswith(prefix), version
    # a second catalog answers from the per-version cache, without the network
    again = pypi_releases.load_catalog()
    assert all(again.commits.get(v) == c for v, c in resolved.items())

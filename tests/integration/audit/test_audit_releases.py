"""First releases from PyPI's release list over real git: the failure shapes of
clones that lack release tags, downstream version-looking tags, and rc order.

The list comes from the loopback PEP 691 index of conftest.py (the fixture's
four releases, each sdist naming its commit)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pypi_index import LocalIndex, serve

from spark_images.audit import Auditor, load_knowledge, open_history
from spark_images.audit.firsts import Release, first_shipped, release_list
from spark_images.audit.releases import parse_tag
from spark_images.cli import main
from support.audit_histories import PYPI_RELEASES, VllmLike, git


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict, str]:
    code = main(["audit", *argv, "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def text(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["audit", *argv])
    return code, capsys.readouterr().out


def test_downstream_version_looking_tags_are_not_releases(vllm_like: VllmLike, capsys: pytest.CaptureFixture[str]) -> None:
    # v0.10.0.0 and 2024.06.25 sit on #33517's commit, well before v0.19.0
    tags = git(vllm_like.path, "tag", "--points-at", vllm_like.sha("p33517")).split()
    assert {"v0.10.0.0", "2024.06.25"} <= set(tags)
    code, doc, _ = run(capsys, "main", "--fix", "33517", "--repo", str(vllm_like.path))
    (fix,) = doc["fixes"]
    assert code == 0
    assert (fix["first_release"], fix["first_rc"]) == ("v0.19.0", "v0.19.0rc1")
    assert fix["unchecked_releases"] == [] and fix["first_release_at_most"] is None


def test_release_list_is_pypis_and_rc_tags_need_a_listed_or_upcoming_final() -> None:
    tags = {"v0.22.0": "a", "v0.22.0rc1": "b", "v0.10.0.0": "c", "2024.06.25": "d", "v0.5.0rc1": "e",
            "v0.24.0rc0": "f", "v0.22.1": "g"}
    listed = release_list(["0.22.0", "0.22.1", "0.23.0"], tags)
    assert [(n.version, t, c) for n, t, c in listed] == [
        ("0.22.0rc1", "v0.22.0rc1", "b"), ("0.22.0", "v0.22.0", "a"), ("0.22.1", "v0.22.1", "g"),
        ("0.23.0", "v0.23.0", None), ("0.24.0rc0", "v0.24.0rc0", "f"),
    ]
    # PyPI unreachable: only tags of vLLM's own shape stand in
    assert [t for _, t, _ in release_list(None, tags)] == ["v0.5.0rc1", "v0.22.0rc1", "v0.22.0", "v0.22.1", "v0.24.0rc0"]


def _release(tag: str, commit: str | None) -> Release:
    name = parse_tag(tag)
    assert name is not None
    return Release(name, tag, commit, "" if commit else "missing")


def test_first_shipped_is_exact_only_when_every_earlier_release_was_checked() -> None:
    rels = [_release("v0.19.0", "a"), _release("v0.20.0", None), _release("v0.22.1rc0", "c"), _release("v0.23.0", "d")]
    got = first_shipped(rels, lambda sha: sha in {"c", "d"})
    assert (got.first_release, got.first_release_at_most, got.first_rc, got.first_rc_at_most, got.unchecked) == (
        None, "v0.23.0", None, "v0.22.1rc0", ("v0.20.0",))
    exact = first_shipped(rels, lambda sha: sha in {"a", "c", "d"})
    assert (exact.first_release, exact.first_rc, exact.unchecked) == ("v0.19.0", "v0.19.0", ())
    nowhere = first_shipped(rels, lambda sha: False)
    assert (nowhere.first_release, nowhere.first_release_at_most, nowhere.unchecked) == (None, None, ("v0.20.0",))
    unlisted = first_shipped(rels[:1], lambda sha: True, list_known=False)
    assert (unlisted.first_release, unlisted.first_release_at_most) == (None, "v0.19.0")


def _partial_clone(src: Path, dest: Path, tags: list[str]) -> Path:
    """A clone of main only, with only the named tags (their commits come along)."""
    git(dest.parent, "clone", "-q", "--bare", "--single-branch", "--branch", "main", "--no-tags", f"file://{src}", str(dest))
    git(dest, "fetch", "-q", "origin", *[f"refs/tags/{t}:refs/tags/{t}" for t in tags])
    return dest


def test_clone_missing_middle_release_tags_and_commits_says_at_most(
    vllm_like: VllmLike, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rcs = [t for t in git(vllm_like.path, "tag", "--list", "v*rc*").split()]
    clone = _partial_clone(vllm_like.path, tmp_path / "fork.git", ["v0.19.0", "v0.23.0", *rcs])
    assert "v0.22.0\n" not in git(clone, "tag")
    code, doc, _ = run(capsys, "main", "--fix", "35568", "--repo", str(clone))
    (fix,) = doc["fixes"]
    # the truth is v0.22.0 (a cherry-pick on its release branch), which this clone cannot see
    assert code == 0 and fix["state"] == "included"
    assert fix["first_release"] is None
    assert fix["first_release_at_most"] == "v0.23.0"
    assert fix["unchecked_releases"] == ["v0.22.0", "v0.22.1"]
    assert fix["first_rc"] is None and fix["first_rc_at_most"] == "v0.22.1rc0"
    assert any("v0.22.0: no tag v0.22.0 here, and its commit g" in n and "not in this history" in n for n in doc["notes"])
    code, out = text(capsys, "main", "--fix", "35568", "--repo", str(clone))
    row = next(line for line in out.splitlines() if line.startswith("#35568"))
    assert row.split()[2:4] == ["<=v0.23.0", "<=v0.22.1rc0"]
    assert ("#35568: first release not proven because v0.22.0, v0.22.1 could not be checked in this history: "
            "shipped in v0.23.0 at the latest") in out


def test_clone_missing_tags_but_not_commits_resolves_them_through_pypi_once(
    vllm_like: VllmLike, vllm_index: LocalIndex, tmp_path: Path, isolated_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clone = tmp_path / "notags.git"
    git(tmp_path, "clone", "-q", "--bare", f"file://{vllm_like.path}", str(clone))
    git(clone, "tag", "-d", "v0.22.0", "v0.22.1")  # the release branches (and so the commits) are still here
    before = len(vllm_index.hits)
    code, doc, _ = run(capsys, "main", "--fix", "35568", "--repo", str(clone))
    (fix,) = doc["fixes"]
    assert code == 0 and (fix["first_release"], fix["unchecked_releases"]) == ("v0.22.0", [])
    sdists = [h for h in vllm_index.hits[before:] if h.startswith("/files/")]
    assert sorted(sdists) == ["/files/vllm-0.22.0.tar.gz", "/files/vllm-0.22.1.tar.gz"]
    # a release's commit never changes: the next run reads no sdist
    mark = len(vllm_index.hits)
    code, doc, _ = run(capsys, "main", "--fix", "35568", "--repo", str(clone))
    assert doc["fixes"][0]["first_release"] == "v0.22.0"
    assert not [h for h in vllm_index.hits[mark:] if h.startswith("/files/")]


def test_sdist_without_a_commit_leaves_the_release_unchecked(
    vllm_like: VllmLike, tmp_path: Path, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    clone = tmp_path / "notags.git"
    git(tmp_path, "clone", "-q", "--bare", f"file://{vllm_like.path}", str(clone))
    git(clone, "tag", "-d", "v0.22.0")
    commits = {v: git(vllm_like.path, "rev-parse", f"v{v}^{{commit}}").strip() for v in PYPI_RELEASES}
    with serve() as index:
        index.publish({**commits, "0.22.0": None})
        monkeypatch.setenv("SPARK_IMAGES_PYPI_SIMPLE", index.simple)
        _code, doc, _ = run(capsys, "main", "--fix", "35568", "--repo", str(clone))
    (fix,) = doc["fixes"]
    assert (fix["first_release"], fix["first_release_at_most"], fix["unchecked_releases"]) == (None, "v0.22.1", ["v0.22.0"])
    assert any("vllm-0.22.0.tar.gz records no commit" in n for n in doc["notes"])


def test_an_sdist_without_a_version_file_is_read_once_and_a_failed_read_again(
    vllm_like: VllmLike, tmp_path: Path, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What an sdist says is a fact of a file PyPI never replaces, so it is kept; an index
    that failed to answer is asked again. (Before, the first sdists of vLLM's list,
    0.0.1-0.1.6, which have no _version.py, took every run's lookups.)"""
    from pypi_index import sdist

    clone = tmp_path / "notags.git"
    git(tmp_path, "clone", "-q", "--bare", f"file://{vllm_like.path}", str(clone))
    git(clone, "tag", "-d", "v0.22.0", "v0.22.1")
    commits = {v: git(vllm_like.path, "rev-parse", f"v{v}^{{commit}}").strip() for v in PYPI_RELEASES}
    with serve() as index:
        index.publish(commits)
        monkeypatch.setenv("SPARK_IMAGES_PYPI_SIMPLE", index.simple)
        no_version_file = ("application/octet-stream", sdist("0.22.0", {"setup.py": b""}))
        index.files["/files/vllm-0.22.0.tar.gz"] = no_version_file
        later = index.files.pop("/files/vllm-0.22.1.tar.gz")  # 404 on this run
        _code, doc, _ = run(capsys, "main", "--fix", "35568", "--repo", str(clone))
        assert doc["fixes"][0]["unchecked_releases"] == ["v0.22.0", "v0.22.1"]
        assert any("vllm-0.22.0.tar.gz has no vllm/_version.py" in n for n in doc["notes"]), doc["notes"]
        index.files["/files/vllm-0.22.1.tar.gz"] = later
        mark = len(index.hits)
        _code, doc, _ = run(capsys, "main", "--fix", "35568", "--repo", str(clone))
        assert [h for h in index.hits[mark:] if h.startswith("/files/")] == ["/files/vllm-0.22.1.tar.gz"]
    (fix,) = doc["fixes"]
    assert (fix["first_release"], fix["first_release_at_most"], fix["unchecked_releases"]) == (None, "v0.22.1", ["v0.22.0"])
    assert any("vllm-0.22.0.tar.gz has no vllm/_version.py" in n for n in doc["notes"]), doc["notes"]


def test_without_pypi_no_first_release_is_called_proven(
    vllm_like: VllmLike, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SPARK_IMAGES_PYPI_SIMPLE", "http://127.0.0.1:9/simple")
    code, doc, _ = run(capsys, "v0.22.1rc0", "--fix", "40923", "--repo", str(vllm_like.path))
    (fix,) = doc["fixes"]
    assert code == 0 and fix["state"] == "included"
    assert (fix["first_release"], fix["first_release_at_most"]) == (None, "v0.23.0")
    assert any("PyPI's release list could not be read" in n for n in doc["notes"])


def test_first_rc_is_never_later_than_first_release(vllm_like: VllmLike) -> None:
    kb = load_knowledge()
    auditor = Auditor(open_history(vllm_like.path), kb)
    report = auditor.audit(auditor.resolve_commit("main", "main"), target="main")
    pairs = 0
    for fix in report.fixes:
        rc, final = fix.first_rc or fix.first_rc_at_most, fix.first_release or fix.first_release_at_most
        if rc and final:
            pairs += 1
            assert parse_tag(rc).key <= parse_tag(final).key, (fix.pr, rc, final)  # type: ignore[union-attr]
    assert pairs >= 5


def test_monitor_lists_the_new_releases_to_audit(vllm_like: VllmLike, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    root = Path(__file__).resolve().parents[3]
    doc = yaml.safe_load((root / "profiles" / "cu130.yaml").read_text())
    doc["vllm"]["version"] = "0.22.0"
    profile = tmp_path / "cu130.yaml"
    profile.write_text(yaml.safe_dump(doc))
    code = main(["monitor", str(profile), "--new-releases", "--repo", str(vllm_like.path), "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [r["tag"] for r in rows] == ["v0.22.1rc0", "v0.22.1", "v0.23.0rc0", "v0.23.0"]
    assert rows[1]["commit"] == git(vllm_like.path, "rev-parse", "v0.22.1^{commit}").strip()


def test_first_shipped_leaves_out_releases_uploaded_before_the_merge() -> None:
    rels = [Release(parse_tag(t), t, None, "missing", up) for t, up in  # type: ignore[arg-type]
            (("v0.1.0", 100), ("v0.2.0", 199), ("v0.3.0", 201), ("v0.4.0", None))]
    rels.append(_release("v0.5.0", "e"))
    got = first_shipped(rels, lambda sha: sha == "e", merged=200)
    # uploaded before the fix's commit existed: cannot carry it; unknown upload time: still a doubt
    assert (got.unchecked, got.excluded_before_merge, got.first_release_at_most) == (("v0.3.0", "v0.4.0"), 2, "v0.5.0")
    assert first_shipped(rels, lambda sha: sha == "e").unchecked == ("v0.1.0", "v0.2.0", "v0.3.0", "v0.4.0")
    exact = first_shipped(rels[:2] + rels[4:], lambda sha: sha == "e", merged=200)
    assert (exact.first_release, exact.unchecked, exact.excluded_before_merge) == ("v0.5.0", (), 2)


def _stamp(epoch: int) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(epoch))


def test_unchecked_releases_of_40923_are_only_those_uploaded_after_its_merge(
    vllm_like: VllmLike, tmp_path: Path, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """PyPI lists 80 releases from 0.0.1 on that this clone cannot check (no tags, no
    commits); all but three were uploaded before #40923's squash commit existed."""
    rcs = [t for t in git(vllm_like.path, "tag", "--list", "v*rc*").split()]
    clone = _partial_clone(vllm_like.path, tmp_path / "fork.git", ["v0.19.0", "v0.23.0", *rcs])
    merged = int(git(vllm_like.path, "show", "-s", "--format=%ct", vllm_like.sha("p40923")).strip())
    old = [f"0.{minor}.{patch}" for minor in range(0, 16) for patch in range(0, 5)]  # 80 releases
    commits = {v: git(vllm_like.path, "rev-parse", f"v{v}^{{commit}}").strip() for v in PYPI_RELEASES}
    releases: dict[str, str | None] = {**dict.fromkeys(old), "0.20.0": None, "0.21.0": None, **commits}
    uploaded = {v: _stamp(merged - 86_400 * (len(old) - i)) for i, v in enumerate(old)}
    uploaded |= {"0.19.0": _stamp(merged - 3_600), "0.20.0": _stamp(merged - 1), "0.21.0": _stamp(merged + 1),
                 "0.22.0": _stamp(merged + 7_200), "0.22.1": _stamp(merged + 9_000), "0.23.0": _stamp(merged + 90_000)}
    with serve() as index:
        index.publish(releases, uploaded=uploaded)
        monkeypatch.setenv("SPARK_IMAGES_PYPI_SIMPLE", index.simple)
        code, doc, _ = run(capsys, "v0.23.0", "--fix", "40923", "--repo", str(clone))
    (fix,) = doc["fixes"]
    assert code == 0 and fix["state"] == "included"
    assert fix["unchecked_releases"] == ["v0.21.0", "v0.22.0", "v0.22.1"]
    assert fix["excluded_before_merge"] == len(old) + 1  # and 0.20.0, uploaded a second before the merge
    # the run's lookups went to the releases that could carry it: no sdist of the 81 older ones was read
    read = sorted(h for h in index.hits if h.startswith("/files/"))
    assert read == ["/files/vllm-0.21.0.tar.gz", "/files/vllm-0.22.0.tar.gz", "/files/vllm-0.22.1.tar.gz"]
    assert (fix["first_release"], fix["first_release_at_most"]) == (None, "v0.23.0")

"""`spark-images audit` end to end over real git: outputs, exit codes, bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from spark_images.audit import check_required
from spark_images.cli import main
from spark_images.core.errors import EnvironmentProblem
from support.audit_histories import (
    HistoryBuilder,
    VllmLike,
    backport_patch,
    filler_files,
    git,
    source_strategy,
)

PROJECT = Path(__file__).resolve().parents[3]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["audit", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_answers_the_issue_question(vllm_like: VllmLike, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "v0.22.1", "--fix", "40923", "--repo", str(vllm_like.path), "--json")
    doc = json.loads(out)
    assert code == 1  # asked for and absent
    assert doc["commit"] == vllm_like.builder.sha(vllm_like.builder.tips["releases/v0.22.1"])
    (fix,) = doc["fixes"]
    assert (fix["pr"], fix["state"], fix["first_release"], fix["first_rc"]) == (40923, "absent", "v0.23.0", "v0.22.1rc0")
    assert fix["title"].startswith("Marlin MoE")


def test_release_with_and_without_v_and_exit_0_when_present(vllm_like: VllmLike, capsys: pytest.CaptureFixture[str]) -> None:
    results = []
    for target in ("0.22.0", "v0.22.0"):
        code, out, _ = run_cli(capsys, target, "--fix", "40082", "35568", "--repo", str(vllm_like.path), "--json")
        results.append((code, [(f["pr"], f["state"]) for f in json.loads(out)["fixes"]]))
    assert results[0] == results[1] == (0, [(40082, "included"), (35568, "cherry-picked")])


def test_table_and_markdown(vllm_like: VllmLike, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "v0.22.1rc0", "--repo", str(vllm_like.path))
    assert code == 0
    row = next(line for line in out.splitlines() if line.startswith("#40923"))
    assert row.split()[:4] == ["#40923", "included", "v0.23.0", "v0.22.1rc0"]
    code, md, _ = run_cli(capsys, "v0.22.1", "--fix", "40923", "--markdown", "--repo", str(vllm_like.path))
    assert code == 1
    assert "| #40923 | **absent** | v0.23.0 | v0.22.1rc0 |" in md
    assert "**Missing required fixes:** #40923 (absent)" in md


def test_short_commit_like_an_installed_version_file(vllm_like: VllmLike, capsys: pytest.CaptureFixture[str]) -> None:
    sha = vllm_like.sha("p40923")
    code, out, _ = run_cli(capsys, "g" + sha[:9], "--fix", "40923", "--repo", str(vllm_like.path), "--json")
    assert code == 0 and json.loads(out)["commit"] == sha


def test_profile_target_uses_commit_required_fixes_and_patches(
    vllm_like: VllmLike, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "project"
    (root / "profiles").mkdir(parents=True)
    (root / "patches").mkdir()
    # a real patch of #40923's change; the source strategy's build applies it
    (root / "patches" / "marlin.patch").write_text(backport_patch(vllm_like.path, vllm_like.sha("p40923"), (40923,)))
    doc = source_strategy(yaml.safe_load((PROJECT / "profiles" / "cu130.yaml").read_text()))
    doc["vllm"]["commit"] = vllm_like.sha(vllm_like.builder.tips["releases/v0.22.1"])
    doc["verify"]["required_fixes"] = [40923, 48245]
    doc["patches"] = ["patches/marlin.patch"]
    profile = root / "profiles" / "test.yaml"
    profile.write_text(yaml.safe_dump(doc))
    code, out, _ = run_cli(capsys, str(profile), "--repo", str(vllm_like.path), "--json")
    report = json.loads(out)
    states = {f["pr"]: (f["state"], f["required"]) for f in report["fixes"]}
    assert states[40923] == ("patched", True)
    assert states[48245] == ("absent", True)
    assert report["missing_required"] == [48245]
    assert code == 1


def test_check_required_api(vllm_like: VllmLike) -> None:
    report = check_required(vllm_like.sha("p40923"), [40923, 35568], [], vllm_like.path)
    assert report.missing_required == ()
    assert {40923, 35568} <= set(report.included_prs())
    assert report.to_json()["commit"] == vllm_like.sha("p40923")
    when = git(vllm_like.path, "show", "-s", "--format=%ct", vllm_like.sha("p40923")).strip()
    assert report.commit_time == int(when)  # the pipeline's SOURCE_DATE_EPOCH
    assert report.to_json()["commit_time"] == int(when)  # and the --json document carries it
    lacking = check_required(vllm_like.sha(vllm_like.builder.tips["releases/v0.22.1"]), [40923], [], vllm_like.path)
    assert [f.pr for f in lacking.missing_required] == [40923]


# --- bad input: exit 2 with one line naming the reason, never a traceback -------
def test_unknown_commit(vllm_like: VllmLike, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "0123456789abcdef0123456789abcdef01234567", "--repo", str(vllm_like.path))
    assert code == 2 and "no such commit" in err and "Traceback" not in err


def test_unknown_release_without_network_to_pypi(vllm_like: VllmLike, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_IMAGES_PYPI_SIMPLE", "http://127.0.0.1:9/simple")
    code, _, err = run_cli(capsys, "0.99.0", "--repo", str(vllm_like.path))
    assert code == 2 and "cannot reach the package index" in err


def test_ambiguous_short_sha(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = HistoryBuilder(tmp_path / "many")
    b.commit("main", "[Core] Initial import (#1)", {"vllm/__init__.py": ""})
    for i in range(2, 700):
        b.commit("main", f"[Misc] change {i} (#{i})", filler_files(i))
    b.build()
    shas = git(b.path, "rev-list", "main").split()
    seen: dict[str, str] = {}
    prefix = next(p for s in shas if (p := s[:4]) in seen or seen.setdefault(p, s) is None)
    code, _, err = run_cli(capsys, prefix, "--fix", "5", "--repo", str(b.path))
    assert code == 2 and "ambiguous" in err and prefix in err


def test_shallow_clone_says_so_instead_of_absent(vllm_like: VllmLike, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "3", "--branch", "main", f"file://{vllm_like.path}", str(shallow))
    code, _, err = run_cli(capsys, "HEAD", "--fix", "33517", "--repo", str(shallow))
    assert code == 2 and "shallow" in err and "#33517" in err and "absent" in err
    # a PR inside the fetched depth is still decided: positive evidence is complete
    code, out, _ = run_cli(capsys, "HEAD", "--fix", "80001", "--repo", str(shallow), "--json")
    assert code == 0 and json.loads(out)["fixes"][0]["state"] == "included"
    with pytest.raises(EnvironmentProblem):
        check_required("HEAD", [33517], [], shallow)


def test_repository_that_is_not_vllm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain = HistoryBuilder(tmp_path / "plain")
    for i in range(20):
        plain.commit("main", f"update readme {i}", {"README": f"{i}\n"})
    plain.build()
    code, _, err = run_cli(capsys, "main", "--fix", "40082", "--repo", str(plain.path))
    assert code == 2 and "does not look like vLLM" in err
    other = HistoryBuilder(tmp_path / "other")
    for i in range(20):
        other.commit("main", f"feat: thing {i} (#{i + 1})", {"src/lib.rs": f"// {i}\n"})
    other.build()
    code, _, err = run_cli(capsys, "main", "--fix", "40082", "--repo", str(other.path))
    assert code == 2 and "no vllm/ directory" in err


def test_repo_path_that_is_not_a_repository(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "main", "--repo", str(tmp_path))
    assert code == 2 and "not a git repository" in err
    code, _, err = run_cli(capsys, "main", "--repo", str(tmp_path / "missing"))
    assert code == 2 and "no such directory" in err


def test_bad_fix_number(vllm_like: VllmLike, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["audit", "main", "--fix", "abc", "--repo", str(vllm_like.path)])
    assert exc.value.code == 2
    assert "not a PR number" in capsys.readouterr().err


def test_no_network_for_the_cache_clone(isolated_cache: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # a port nothing listens on: the same failure as a machine without network
    monkeypatch.setenv("SPARK_IMAGES_VLLM_GIT_URL", "https://127.0.0.1:9/vllm-project/vllm.git")
    code, out, err = run_cli(capsys, "v0.22.0", "--json")
    assert code == 2
    assert "vLLM history unavailable" in err and "--repo" in err
    assert json.loads(out)["exit_code"] == 2
    assert not (isolated_cache / "spark-images" / "vllm.git").exists()  # no half clone left behind


def test_cache_clone_is_treeless_bare_and_fetched_incrementally(
    vllm_like: VllmLike, isolated_cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream = tmp_path / "upstream.git"
    git(tmp_path, "clone", "-q", "--bare", str(vllm_like.path), str(upstream))
    git(upstream, "config", "uploadpack.allowFilter", "true")
    monkeypatch.setenv("SPARK_IMAGES_VLLM_GIT_URL", f"file://{upstream}")
    code, out, _ = run_cli(capsys, "v0.22.1rc0", "--fix", "40923", "--json")
    assert code == 0 and json.loads(out)["fixes"][0]["state"] == "included"
    cache = isolated_cache / "spark-images" / "vllm.git"
    assert git(cache, "rev-parse", "--is-bare-repository").strip() == "true"
    assert "tree:0" in git(cache, "config", "--get", "remote.origin.partialclonefilter")
    assert (cache / "objects" / "info" / "commit-graph").is_file() or (cache / "objects" / "info" / "commit-graphs").is_dir()
    # upstream moves on: a commit the cache lacks is fetched on demand
    newer = HistoryBuilder(tmp_path / "work")
    git(tmp_path, "clone", "-q", str(upstream), str(newer.path))
    (newer.path / "vllm" / "later.py").write_text("LATER = 1\n")
    git(newer.path, "add", "vllm/later.py")
    git(newer.path, "-c", "user.name=D", "-c", "user.email=d@x", "commit", "-q", "-m", "[Misc] Later (#90001)")
    git(newer.path, "push", "-q", "origin", "HEAD:main")
    head = git(newer.path, "rev-parse", "HEAD").strip()
    code, out, _ = run_cli(capsys, head, "--fix", "90001", "--json")
    # found in the fetched history, but the knowledge base has no commit to compare its change with
    (later,) = json.loads(out)["fixes"]
    assert code == 1 and later["state"] == "effect-unproven"
    assert any(head[:12] in e for e in later["evidence"])
    assert any("no main_commit in the knowledge base" in e for e in later["evidence"])
    # upstream gone (offline): history questions need no lazy fetch; markers, which
    # need file contents, are unverified rather than failed, so the effect is unproven
    # (in the history, but not counted as present by a gate)
    upstream.rename(tmp_path / "gone.git")
    code, out, _ = run_cli(capsys, "v0.22.1rc0", "--fix", "40082", "--json")
    fix = json.loads(out)["fixes"][0]
    assert code == 1 and fix["state"] == "effect-unproven"
    assert any(e.startswith("marker unverified") for e in fix["evidence"])
    assert any("in the history, effect unproven" in e for e in fix["evidence"])


def test_entry_point_never_prints_a_traceback(tmp_path: Path) -> None:
    exe = shutil.which("spark-images", path=str(Path(sys.executable).parent))
    assert exe is not None
    proc = subprocess.run([exe, "audit", "deadbeef", "--repo", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1


def test_stale_local_main_in_a_work_clone(vllm_like: VllmLike, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clone = tmp_path / "work"
    git(tmp_path, "clone", "-q", "--no-checkout", str(vllm_like.path), str(clone))
    git(clone, "update-ref", "refs/heads/main", vllm_like.sha("p35568"))  # local main far behind origin/main
    code, out, _ = run_cli(capsys, "origin/main", "--fix", "80001", "--repo", str(clone), "--json")
    fix = json.loads(out)["fixes"][0]
    assert code == 0 and fix["state"] == "included"  # a squash on main, not a "cherry-pick"

"""`spark-images validate` runs the required-fixes audit on real git history.

The history is the vLLM-shaped repository built by audit_histories.py; the
profile is the shipped cu130 profile with its commit moved into that history.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from spark_images.cli import main
from support.audit_histories import VllmLike, backport_patch, source_strategy

PROJECT = Path(__file__).resolve().parents[3]


def _profile(tmp_path: Path, commit: str, required: list[int], patches: list[str] = (), *,
             strategy: str = "wheel", patch_text: str = "Backport-Of: vllm-project/vllm#40923\n\ndiff --git a/x b/x\n") -> Path:
    root = tmp_path / "project"
    (root / "profiles").mkdir(parents=True, exist_ok=True)
    (root / "patches").mkdir(exist_ok=True)
    (root / "patches" / "marlin.patch").write_text(patch_text)
    for lock in (PROJECT / "profiles").glob("*.requirements.lock"):
        shutil.copy(lock, root / "profiles" / lock.name)
    doc = yaml.safe_load((PROJECT / "profiles" / "cu130.yaml").read_text())
    if strategy == "source":
        source_strategy(doc)
    doc["vllm"]["commit"] = commit
    doc["verify"]["required_fixes"] = required
    doc["patches"] = list(patches)
    path = root / "profiles" / "audited.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _validate(capsys: pytest.CaptureFixture[str], profile: Path, repo: Path) -> tuple[int, dict, str]:
    code = main(["validate", "--json", "--repo", str(repo), str(profile)])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def test_required_fixes_present(vllm_like: VllmLike, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = _profile(tmp_path, vllm_like.sha("p40923"), [40923, 35568])
    code, doc, err = _validate(capsys, profile, vllm_like.path)
    assert code == 0, err
    (entry,) = doc["profiles"]
    assert entry["status"] == "valid"
    assert entry["audit"]["status"] == "passed"


def test_required_fix_absent_exits_1_naming_the_field(vllm_like: VllmLike, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the v0.22.1 final lacks #40923 (it is only in 0.22.1rc0 on main)
    profile = _profile(tmp_path, vllm_like.sha(vllm_like.builder.tips["releases/v0.22.1"]), [40923])
    code, doc, err = _validate(capsys, profile, vllm_like.path)
    assert code == 1
    (entry,) = doc["profiles"]
    assert entry["status"] == "invalid" and entry["audit"]["missing"] == [40923]
    assert f"{profile}: verify.required_fixes:" in err and "#40923" in err


def test_required_fix_patched_passes(vllm_like: VllmLike, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a real patch of #40923's change, on the source strategy, whose build runs git apply
    real = backport_patch(vllm_like.path, vllm_like.sha("p40923"), (40923,))
    profile = _profile(tmp_path, vllm_like.sha(vllm_like.builder.tips["releases/v0.22.1"]), [40923], ["patches/marlin.patch"],
                       strategy="source", patch_text=real)
    code, doc, err = _validate(capsys, profile, vllm_like.path)
    assert code == 0, err
    assert doc["profiles"][0]["audit"]["status"] == "passed"


def test_hunkless_patch_does_not_meet_a_required_fix(vllm_like: VllmLike, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = _profile(tmp_path, vllm_like.sha(vllm_like.builder.tips["releases/v0.22.1"]), [40923], ["patches/marlin.patch"],
                       strategy="source")
    code, doc, _err = _validate(capsys, profile, vllm_like.path)
    assert code == 1
    audit = doc["profiles"][0]["audit"]
    assert audit["status"] == "failed" and audit["missing"] == [40923]
    fix = next(f for f in audit["report"]["fixes"] if f["pr"] == 40923)
    assert any("but not patched: it has no hunks" in e for e in fix["evidence"])


def test_patch_on_the_wheel_strategy_is_a_finding(vllm_like: VllmLike, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    real = backport_patch(vllm_like.path, vllm_like.sha("p40923"), (40923,))
    profile = _profile(tmp_path, vllm_like.sha(vllm_like.builder.tips["releases/v0.22.1"]), [40923], ["patches/marlin.patch"],
                       patch_text=real)
    code, doc, err = _validate(capsys, profile, vllm_like.path)
    assert code == 1
    (entry,) = doc["profiles"]
    assert entry["status"] == "invalid" and entry["audit"]["missing"] == [40923]
    assert (f"{profile}: patches[0]: patches/marlin.patch is never applied: build.strategy wheel installs the wheel "
            "as built (fix: set build.strategy: source, or remove the patch)") in err.splitlines()


def test_repo_that_is_not_git_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = _profile(tmp_path, "98dff2a81d747d1dba01a47f939f48c3526d4206", [40082])
    not_git = tmp_path / "not-a-repo"
    not_git.mkdir()
    code = main(["validate", "--repo", str(not_git), str(profile)])
    _out, err = capsys.readouterr()
    assert code == 2
    assert "not a git repository" in err

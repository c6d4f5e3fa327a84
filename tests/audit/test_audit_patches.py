"""One patch model: `audit PROFILE` counts exactly the patches the build's plan
holds (read and parsed once, by resolve.py and plan.py), and refuses a profile's
patches in the build's own words; git's output is split by the pure git_parse."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from audit_histories import VllmLike, git

from spark_images.audit import check_required
from spark_images.audit import git_parse as parse
from spark_images.buildline.plan import PatchRef
from spark_images.buildline.resolve import resolve_profile
from spark_images.cli import main

PROJECT = Path(__file__).resolve().parents[2]
MARLIN = "Backport-Of: vllm-project/vllm#40923\n\ndiff --git a/x b/x\n"


def _project(tmp_path: Path, commit: str, patches: dict[str, str]) -> Path:
    """A project holding one profile (the shipped cu130, its commit moved) and `patches`."""
    root = tmp_path / "project"
    (root / "profiles").mkdir(parents=True)
    for rel, text in patches.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    doc = yaml.safe_load((PROJECT / "profiles" / "cu130.yaml").read_text())
    doc["vllm"]["commit"] = commit
    doc["verify"]["required_fixes"] = [40923]
    doc["patches"] = list(patches)
    profile = root / "profiles" / "test.yaml"
    profile.write_text(yaml.safe_dump(doc))
    return profile


def test_profile_audit_counts_the_plans_patches(vllm_like: VllmLike, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    lacking = vllm_like.sha(vllm_like.builder.tips["releases/v0.22.1"])
    profile = _project(tmp_path, lacking, {"patches/marlin.patch": MARLIN})
    plan = resolve_profile(profile, read_lock=False).plan
    code = main(["audit", str(profile), "--repo", str(vllm_like.path), "--json"])
    doc = json.loads(capsys.readouterr().out)
    fix = next(f for f in doc["fixes"] if f["pr"] == 40923)
    assert code == 0 and fix["state"] == "patched" and fix["required"]
    # the evidence names the patch as the plan (and the image's labels) name it
    assert fix["evidence"] == [f"{plan.patches[0].path}: Backport-Of #40923"]
    assert plan.patches[0].prs == (40923,)


@pytest.mark.parametrize(
    ("patches", "field", "says"),
    [
        ({"patches/empty.patch": "no header\n\ndiff --git a/x b/x\n"}, "patches[0]", "declares no upstream PR"),
        ({"patches/a/marlin.patch": MARLIN, "patches/b/marlin.patch": MARLIN}, "patches[1]", "same file name"),
    ],
)
def test_profile_audit_refuses_what_the_build_refuses(
    vllm_like: VllmLike, tmp_path: Path, patches: dict[str, str], field: str, says: str
) -> None:
    profile = _project(tmp_path, vllm_like.sha("p40923"), patches)
    proc = subprocess.run([sys.executable, "-m", "spark_images.cli", "audit", str(profile), "--repo", str(vllm_like.path)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"spark-images audit: {profile}: {field}: ") and says in line and "(fix: " in line


def test_missing_patch_is_one_line_naming_file_field_and_fix(vllm_like: VllmLike, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    profile = _project(tmp_path, vllm_like.sha("p40923"), {"patches/marlin.patch": MARLIN})
    (profile.parent.parent / "patches" / "marlin.patch").unlink()
    code = main(["audit", str(profile), "--repo", str(vllm_like.path)])
    (line,) = capsys.readouterr().err.splitlines()
    assert code == 1
    assert line.startswith(f"spark-images audit: {profile}: patches[0]: patches/marlin.patch does not exist (fix: ")


def test_check_required_takes_the_plans_patchrefs_without_reading_them(vllm_like: VllmLike) -> None:
    lacking = vllm_like.sha(vllm_like.builder.tips["releases/v0.22.1"])
    # no such file: the PRs come from the plan, which already read the patch
    ref = PatchRef(path="patches/never-on-disk.patch", sha256="0" * 64, prs=(40923,))
    report = check_required(lacking, [40923], [ref], vllm_like.path)
    assert report.missing_required == ()
    fix = report.get(40923)
    assert fix is not None and fix.state == "patched"
    assert fix.evidence == ("patches/never-on-disk.patch: Backport-Of #40923",)
    assert [f.pr for f in check_required(lacking, [40923], [], vllm_like.path).missing_required] == [40923]


def test_git_parse_reads_real_git_output(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    repo.mkdir()
    ident = ["-c", "user.name=Dev", "-c", "user.email=dev@example.invalid"]
    git(repo, "init", "-q", "-b", "main")
    (repo / "a.txt").write_text("one\n")
    git(repo, "add", "a.txt")
    git(repo, *ident, "commit", "-q", "-m", "Add a (#1)\n\nbody line")
    first = git(repo, "rev-parse", "HEAD").strip()
    git(repo, *ident, "tag", "-a", "v1", "-m", "annotated")
    git(repo, "tag", "light")
    git(repo, "mv", "a.txt", "b.txt")
    git(repo, *ident, "commit", "-q", "-m", "Move a (#2)")
    second = git(repo, "rev-parse", "HEAD").strip()

    def raw(*args: str) -> bytes:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, check=True).stdout

    log = parse.parse_log(raw("log", "-z", f"--format={parse.LOG_FORMAT_FULL}", "HEAD"))
    assert [(c.sha, c.parents, c.subject) for c in log] == [(second, (first,), "Move a (#2)"), (first, (), "Add a (#1)")]
    assert log[1].body.strip() == "body line" and log[1].time > 0
    tags = parse.parse_tags(raw("for-each-ref", f"--format={parse.TAG_FORMAT}", "refs/tags/"))
    assert sorted((t.name, t.commit) for t in tags) == [("light", first), ("v1", first)]
    assert parse.parse_rename(raw("diff-tree", "-r", "-M", "--no-commit-id", "--name-status", "-z", second), "a.txt") == "b.txt"
    asked = f"{first}:a.txt\n{first}:nope\n".encode()
    answer = subprocess.run(["git", "cat-file", "--batch"], cwd=repo, input=asked, capture_output=True, check=True).stdout
    assert parse.parse_blobs(["a.txt", "nope"], answer) == {"a.txt": b"one\n", "nope": None}
    cut = answer[: answer.index(b"\n", answer.index(b"one\n") + 4) + 1]  # git stopped after the first answer
    with pytest.raises(parse.BatchCut, match="nope"):
        parse.parse_blobs(["a.txt", "nope"], cut)
    added = parse.added_lines(raw("show", "-U0", "--no-color", "--format=%x1e%H", first))
    assert added == {first: [("a.txt", "one")]}

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

from spark_images.audit import check_required
from spark_images.audit import git_parse as parse
from spark_images.buildline.resolve import resolve_profile
from spark_images.cli import main
from spark_images.profiles.patches import PatchRef, patch_ref
from support.audit_histories import VllmLike, backport_patch, git, pin_commits, source_strategy

PROJECT = Path(__file__).resolve().parents[3]
MARLIN = "Backport-Of: vllm-project/vllm#40923\n\ndiff --git a/x b/x\n"


def _project(tmp_path: Path, commit: str, patches: dict[str, str], *, strategy: str = "source") -> Path:
    """A project holding one profile (the shipped cu130, its commit moved, built with
    `strategy`) and `patches`."""
    root = tmp_path / "project"
    (root / "profiles").mkdir(parents=True)
    for rel, text in patches.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    doc = yaml.safe_load((PROJECT / "profiles" / "cu130.yaml").read_text())
    if strategy == "source":
        source_strategy(doc)
    doc["vllm"]["commit"] = commit
    doc["verify"]["required_fixes"] = [40923]
    doc["patches"] = list(patches)
    profile = root / "profiles" / "test.yaml"
    profile.write_text(yaml.safe_dump(doc))
    return profile


def _marlin(vllm_like: VllmLike) -> str:
    """A real patch: #40923's change as `git format-patch` writes it."""
    return backport_patch(vllm_like.path, vllm_like.sha("p40923"), (40923,))


def _lacking(vllm_like: VllmLike) -> str:
    return vllm_like.sha(vllm_like.builder.tips["releases/v0.22.1"])  # the 0.22.1 final lacks #40923


def _fix_40923(profile: Path, vllm_like: VllmLike, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    code = main(["audit", str(profile), "--repo", str(vllm_like.path), "--json"])
    doc = json.loads(capsys.readouterr().out)
    return code, next(f for f in doc["fixes"] if f["pr"] == 40923)


def test_real_patch_applied_by_the_source_build_is_patched(vllm_like: VllmLike, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    profile = _project(tmp_path, _lacking(vllm_like), {"patches/marlin.patch": _marlin(vllm_like)})
    plan = resolve_profile(profile, read_lock=False).plan
    code, fix = _fix_40923(profile, vllm_like, capsys)
    assert code == 0 and fix["state"] == "patched" and fix["required"]
    # the evidence names the patch as the plan (and the image's labels) name it, and what proved it
    assert fix["evidence"] == [f"{plan.patches[0].path}: Backport-Of #40923; git apply --check passes at {_lacking(vllm_like)[:12]}"]
    assert plan.patches[0].prs == (40923,)
    # and git really applies it there: the tree gains #40923's line
    work = tmp_path / "work"
    git(tmp_path, "clone", "-q", "--branch", "releases/v0.22.1", str(vllm_like.path), str(work))
    git(work, "apply", str(profile.parent.parent / "patches" / "marlin.patch"))
    assert "MARLIN_MOE_ARCHS" in (work / "CMakeLists.txt").read_text()


@pytest.mark.parametrize(
    ("strategy", "text", "says"),
    [
        ("wheel", None, "never applied: the wheel strategy installs the wheel as built"),
        ("source", "Backport-Of: vllm-project/vllm#40923\n\ndiff --git a/x b/x\n", "it has no hunks"),
        ("source", "p36000", "git apply --check fails"),
    ],
    ids=["wheel-never-applies", "no-hunks", "does-not-apply"],
)
def test_patch_not_proven_is_not_patched(vllm_like: VllmLike, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         strategy: str, text: str | None, says: str) -> None:
    if text is None:
        text = _marlin(vllm_like)
    elif text == "p36000":  # a real patch of a change the 0.22.1 final already carries: it cannot apply twice
        text = backport_patch(vllm_like.path, vllm_like.sha("p36000"), (40923,))
    profile = _project(tmp_path, _lacking(vllm_like), {"patches/marlin.patch": text}, strategy=strategy)
    code, fix = _fix_40923(profile, vllm_like, capsys)
    assert code == 1 and fix["state"] == "absent"
    assert any(e.startswith("patches/marlin.patch: Backport-Of #40923, but not patched: ") and says in e
               for e in fix["evidence"]), fix["evidence"]


def test_patch_whose_tree_fails_the_fix_marker_is_not_patched(
    vllm_like: VllmLike, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kb = tmp_path / "kb.yaml"
    kb.write_text(pin_commits(KB_40923_MARKER, vllm_like.path))
    monkeypatch.setenv("SPARK_IMAGES_KB", str(kb))
    (tmp_path / "patches").mkdir()
    good = tmp_path / "patches" / "good.patch"
    good.write_text(_marlin(vllm_like))
    # applies cleanly at the 0.22.1 final, but is not #40923's change: the marker fails in the patched tree
    other = tmp_path / "patches" / "other.patch"
    other.write_text(backport_patch(vllm_like.path, vllm_like.sha("p48245"), (40923,)))
    for patch, want in ((good, "patched"), (other, "absent")):
        ref = patch_ref(f"patches/{patch.name}", patch.read_text())
        report = check_required(_lacking(vllm_like), [40923], [ref], vllm_like.path, strategy="source", base_dir=tmp_path)
        fix = report.get(40923)
        assert fix is not None and fix.state == want, fix.evidence
    assert any("in the patched tree: marker failed: CMakeLists.txt contains 'MARLIN_MOE_ARCHS'" in e for e in fix.evidence)


KB_40923_MARKER = """
schema: 1
fixes:
  - pr: 40923
    title: Marlin MoE arch list
    area: MoE
    severity: high
    symptom: no Marlin MoE kernels for SM12x
    markers:
      - path: CMakeLists.txt
        contains: MARLIN_MOE_ARCHS
        source: the fixture's change
"""


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


def test_check_required_proves_a_plans_patchref_from_its_text(vllm_like: VllmLike, tmp_path: Path) -> None:
    lacking = _lacking(vllm_like)
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "marlin.patch").write_text(_marlin(vllm_like))
    ref = patch_ref("patches/marlin.patch", _marlin(vllm_like))
    # the header alone (no text to apply, or no source build) proves nothing
    for kwargs in ({"strategy": "source"}, {"strategy": "wheel", "base_dir": tmp_path}):
        report = check_required(lacking, [40923], [ref], vllm_like.path, **kwargs)
        assert [f.pr for f in report.missing_required] == [40923], kwargs
    report = check_required(lacking, [40923], [ref], vllm_like.path, strategy="source", base_dir=tmp_path)
    assert report.missing_required == ()
    fix = report.get(40923)
    assert fix is not None and fix.state == "patched"
    # bytes changed since the plan hashed them: not the patch the build read
    (tmp_path / "patches" / "marlin.patch").write_text(_marlin(vllm_like) + "\n")
    report = check_required(lacking, [40923], [ref], vllm_like.path, strategy="source", base_dir=tmp_path)
    assert [f.pr for f in report.missing_required] == [40923]
    assert any("sha256 differs" in e for e in report.get(40923).evidence)  # type: ignore[union-attr]
    ghost = PatchRef(path="patches/never-on-disk.patch", sha256="0" * 64, prs=(40923,))
    report = check_required(lacking, [40923], [ghost], vllm_like.path, strategy="source", base_dir=tmp_path)
    assert [f.pr for f in report.missing_required] == [40923]


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


def test_patch_is_skipped_with_the_reason_where_the_tree_cannot_be_read(vllm_like: VllmLike, tmp_path: Path) -> None:
    """A treeless clone whose remote is gone cannot apply a patch: not patched, and it says why."""
    upstream = tmp_path / "upstream.git"
    git(tmp_path, "clone", "-q", "--bare", str(vllm_like.path), str(upstream))
    git(upstream, "config", "uploadpack.allowFilter", "true")
    clone = tmp_path / "treeless.git"
    git(tmp_path, "clone", "-q", "--bare", "--filter=tree:0", f"file://{upstream}", str(clone))
    upstream.rename(tmp_path / "gone.git")
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "marlin.patch").write_text(_marlin(vllm_like))
    ref = patch_ref("patches/marlin.patch", _marlin(vllm_like))
    report = check_required(_lacking(vllm_like), [40923], [ref], clone, strategy="source", base_dir=tmp_path)
    fix = report.get(40923)
    assert fix is not None and fix.state == "absent" and [f.pr for f in report.missing_required] == [40923]
    assert any("but not patched: skipped: " in e and "cannot read the tree" in e for e in fix.evidence), fix.evidence

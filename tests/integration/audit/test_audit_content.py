"""`included` is proven by content, never by a `(#N)` subject: real git history with
a planted commit titled like the fix whose change differs, and a real cherry-pick
whose SHA differs but whose `git patch-id --stable` equals the fix's."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_images.audit import Auditor, open_history, parse_knowledge
from spark_images.audit.states import FixResult
from support.audit_histories import VllmLike, git, patch_id

SUBJECT = "[Kernel] Marlin MoE: include SM12.x in default arch list (#40923)"
IDENT = ["-c", "user.name=Dev", "-c", "user.email=dev@example.invalid"]
UPSTREAM_40923 = "6cc8577421f2c02b1a908a551e15d4e8fdd2ba49"  # a commit this history does not hold


@pytest.fixture(scope="module")
def planted(vllm_like: VllmLike, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """A clone with two commits on the 0.22.1 final: `planted` has #40923's subject and
    another change; `picked` is `git cherry-pick` of #40923 (no -x line, new SHA)."""
    work = tmp_path_factory.mktemp("planted") / "repo"
    git(work.parent, "clone", "-q", str(vllm_like.path), str(work))
    git(work, "fetch", "-q", "origin", "+refs/heads/*:refs/heads/*", "--update-head-ok")
    git(work, "checkout", "-q", "-b", "planted", "releases/v0.22.1")
    (work / "CMakeLists.txt").write_text('set(CUDA_SUPPORTED_ARCHS "8.9;9.0")\n')
    git(work, *IDENT, "commit", "-q", "-am", SUBJECT)
    planted_sha = git(work, "rev-parse", "HEAD").strip()
    git(work, "checkout", "-q", "-b", "picked", "releases/v0.22.1")
    git(work, *IDENT, "cherry-pick", vllm_like.sha("p40923"))
    picked_sha = git(work, "rev-parse", "HEAD").strip()
    assert git(work, "log", "-1", "--format=%s", picked_sha).strip() == SUBJECT
    return work, planted_sha, picked_sha


def _kb(main_commit: str, patch_id: str = "") -> str:
    line = f"    patch_id: {patch_id}\n" if patch_id else ""
    return ("schema: 1\nfixes:\n  - pr: 40923\n    title: Marlin MoE arch list\n    area: MoE\n    severity: high\n"
            f"    symptom: no Marlin MoE kernels for SM12x\n    main_commit: {main_commit}\n{line}")


def _fix(repo: Path, rev: str, kb_text: str) -> FixResult:
    auditor = Auditor(open_history(repo), parse_knowledge(kb_text))
    report = auditor.audit(auditor.resolve_commit(rev, rev), target=rev, prs=[40923], releases=False)
    fix = report.get(40923)
    assert fix is not None
    return fix


def test_planted_subject_with_another_change_is_not_included(vllm_like: VllmLike, planted: tuple[Path, str, str]) -> None:
    repo, planted_sha, _ = planted
    fix = _fix(repo, "planted", _kb(vllm_like.sha("p40923")))
    assert fix.state == "effect-unproven"
    theirs = patch_id(repo, planted_sha)
    wanted = patch_id(repo, vllm_like.sha("p40923"))
    assert theirs != wanted
    assert (f"{planted_sha[:12]} has the (#40923) subject, but its change differs from the knowledge base's "
            f"{vllm_like.sha('p40923')[:12]} (patch-id {theirs[:12]}, not {wanted[:12]})") in fix.evidence


def test_cherry_pick_is_proven_by_itspatch_id(vllm_like: VllmLike, planted: tuple[Path, str, str]) -> None:
    repo, _, picked_sha = planted
    fix = _fix(repo, "picked", _kb(vllm_like.sha("p40923")))
    assert fix.state == "cherry-picked"
    assert any(e.startswith(f"{picked_sha[:12]}: same change as the knowledge base's") for e in fix.evidence)


def test_stored_patch_id_proves_the_change_without_the_main_commit(vllm_like: VllmLike, planted: tuple[Path, str, str]) -> None:
    """The knowledge base names upstream's commit, which this history lacks; its stored
    patch-id still finds the change (a release branch's cherry-pick, or main's squash)."""
    repo, _, _picked_sha = planted
    kb = _kb(UPSTREAM_40923, patch_id(repo, vllm_like.sha("p40923")))
    assert _fix(repo, "picked", kb).state == "cherry-picked"
    assert _fix(repo, "v0.22.1rc0", kb).state == "included"
    assert _fix(repo, "planted", kb).state == "effect-unproven"
    # without a patch-id there is nothing to compare a commit of another SHA with
    lacking = _fix(repo, "picked", _kb(UPSTREAM_40923))
    assert lacking.state == "effect-unproven"
    assert any("records no patch_id" in e for e in lacking.evidence)


def test_main_commit_reachable_is_included_with_its_sha(vllm_like: VllmLike) -> None:
    fix = _fix(vllm_like.path, "v0.22.1rc0", _kb(vllm_like.sha("p40923")))
    assert fix.state == "included"
    assert f"main commit {vllm_like.sha('p40923')[:12]} (the knowledge base's) is in the history" in fix.evidence

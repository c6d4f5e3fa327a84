"""Per-PR states and first releases over a real, vLLM-shaped git history."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_images.audit import Auditor, open_history, parse_knowledge
from spark_images.audit.knowledge import load_knowledge
from spark_images.audit.states import AuditReport
from support.audit_histories import VllmLike, backport_patch, pin_commits

# A knowledge base for shapes the shipped one cannot express with its real PRs:
# #70001's effect is a line in vllm/feature.py that #70002 later removes.
TEST_KB = """
schema: 1
fixes:
  - pr: 70001
    title: Add FEATURE_X
    area: build
    severity: high
    symptom: FEATURE_X missing
    markers:
      - path: vllm/feature.py
        contains: FEATURE_X = 1
        source: test history
  - pr: 39825
    title: stopgap
    area: MoE
    severity: low
    symptom: stopgap missing
    undone_by: [39959]
"""


def audit(repo: VllmLike, rev: str, prs: list[int], *, kb_text: str | None = None, patches: tuple[Path, ...] = ()) -> AuditReport:
    kb = parse_knowledge(pin_commits(kb_text, repo.path)) if kb_text else load_knowledge()
    auditor = Auditor(open_history(repo.path), kb)
    sha = auditor.resolve_commit(rev, rev)
    return auditor.audit(sha, target=rev, prs=prs, asked=prs, patches=patches)


def state(report: AuditReport, pr: int) -> str:
    fix = report.get(pr)
    assert fix is not None
    return fix.state


def test_squash_on_main_is_included_with_its_commit_as_evidence(vllm_like: VllmLike) -> None:
    report = audit(vllm_like, "main", [40082])
    fix = report.get(40082)
    assert fix is not None and fix.state == "included"
    assert any(vllm_like.sha("p40082")[:12] in e for e in fix.evidence)


def test_release_branch_cherry_picks_with_and_without_the_x_line(vllm_like: VllmLike) -> None:
    report = audit(vllm_like, "v0.22.0", [35568, 36000])
    with_line, same_subject = report.get(35568), report.get(36000)
    assert with_line is not None and with_line.state == "cherry-picked"
    assert any(vllm_like.sha("c35568")[:12] in e and vllm_like.sha("p35568")[:12] in e for e in with_line.evidence)
    assert same_subject is not None and same_subject.state == "cherry-picked"
    assert any(vllm_like.sha("c36000")[:12] in e for e in same_subject.evidence)


def test_reworded_cherry_pick_is_found_by_its_x_line(vllm_like: VllmLike) -> None:
    report = audit(vllm_like, "v0.22.0", [70001], kb_text=TEST_KB)
    assert state(report, 70001) == "cherry-picked"


def test_pr_merged_after_the_cut_is_absent_from_the_release_and_present_on_main(vllm_like: VllmLike) -> None:
    assert state(audit(vllm_like, "v0.23.0", [80001]), 80001) == "absent"
    assert state(audit(vllm_like, "main", [80001]), 80001) == "included"


def test_rc0_on_main_after_the_cut_has_a_pr_the_final_lacks(vllm_like: VllmLike) -> None:
    final = audit(vllm_like, "v0.22.1", [40923])
    rc0 = audit(vllm_like, "v0.22.1rc0", [40923])
    assert state(final, 40923) == "absent"
    assert state(rc0, 40923) == "included"
    fix = rc0.get(40923)
    assert fix is not None
    assert (fix.first_release, fix.first_rc) == ("v0.23.0", "v0.22.1rc0")


def test_first_release_counts_cherry_picks(vllm_like: VllmLike) -> None:
    fix = audit(vllm_like, "main", [35568]).get(35568)
    assert fix is not None
    # in v0.22.0 only as a cherry-pick; on main only after the v0.22.0rc1 tag, so the
    # first tagged build of any kind is the v0.22.0 final (first_rc is never later
    # than first_release: the v0.22.1rc0 tag came after the v0.22.0 final shipped it)
    assert (fix.first_release, fix.first_rc) == ("v0.22.0", "v0.22.0")
    assert (fix.first_release_at_most, fix.unchecked_releases) == (None, ())


def test_revert_after_the_cut_reverts_on_main_but_not_in_the_earlier_release(vllm_like: VllmLike) -> None:
    assert state(audit(vllm_like, "v0.22.0", [50001]), 50001) == "included"
    reverted = audit(vllm_like, "v0.22.1", [50001]).get(50001)
    assert reverted is not None and reverted.state == "reverted"
    assert any(vllm_like.sha("r50001")[:12] in e for e in reverted.evidence)
    assert reverted.first_release == "v0.22.0"


def test_revert_of_a_revert_puts_the_change_back(vllm_like: VllmLike) -> None:
    fix = audit(vllm_like, "main", [51001]).get(51001)
    assert fix is not None and fix.state == "included"
    assert any("re-applied" in e for e in fix.evidence)


def test_revert_named_only_in_the_body_is_followed(vllm_like: VllmLike) -> None:
    assert state(audit(vllm_like, "main", [52001]), 52001) == "reverted"
    assert state(audit(vllm_like, "v0.23.0", [52001]), 52001) == "included"


def test_effect_undone_by_a_later_pr(vllm_like: VllmLike) -> None:
    fix = audit(vllm_like, "v0.22.0", [39825], kb_text=TEST_KB).get(39825)
    assert fix is not None and fix.state == "effect-absent"
    assert any("#39959" in e for e in fix.evidence)
    # undone before any release: no release ever shipped the effect
    assert fix.first_release is None
    # before the undoing PR it is simply included
    assert state(audit(vllm_like, vllm_like.sha("p39825"), [39825], kb_text=TEST_KB), 39825) == "included"


def test_content_marker_removed_by_a_later_pr_is_effect_absent(vllm_like: VllmLike) -> None:
    assert state(audit(vllm_like, "v0.22.1", [70001], kb_text=TEST_KB), 70001) == "included"
    fix = audit(vllm_like, "main", [70001], kb_text=TEST_KB).get(70001)
    assert fix is not None and fix.state == "effect-absent"
    assert any("marker failed" in e and "vllm/feature.py" in e for e in fix.evidence)


def test_empty_commit_is_included_and_confirmed_by_its_marker(vllm_like: VllmLike) -> None:
    fix = audit(vllm_like, "v0.22.0", [41215]).get(41215)
    assert fix is not None and fix.state == "included"
    assert any("empty commit" in e for e in fix.evidence)
    assert any(e.startswith("marker ok") and "scaled_mm_sm120_fp8_dispatch.cuh" in e for e in fix.evidence)


def test_merged_side_branch_is_reachable_through_the_merge(vllm_like: VllmLike) -> None:
    fix = audit(vllm_like, "v0.22.0", [60001]).get(60001)
    assert fix is not None and fix.state == "included"
    assert fix.first_release == "v0.22.0"
    assert state(audit(vllm_like, "v0.19.0", [60001]), 60001) == "absent"


def test_patch_declaring_the_pr_is_not_patched_without_a_build_that_applies_it(vllm_like: VllmLike, tmp_path: Path) -> None:
    patch = tmp_path / "marlin-moe-sm12x.patch"
    patch.write_text(backport_patch(vllm_like.path, vllm_like.sha("p40923"), (40923,)))
    # a patch file given alone: no build applies it, so its header proves nothing
    report = audit(vllm_like, "v0.22.1", [40923], patches=(patch,))
    fix = report.get(40923)
    assert fix is not None and fix.state == "absent"
    assert any("but not patched: no build applies it" in e for e in fix.evidence)


def test_report_json_shape(vllm_like: VllmLike) -> None:
    doc = audit(vllm_like, "v0.22.1rc0", [40923]).to_json()
    assert doc["target"] == "v0.22.1rc0" and doc["commit"] == vllm_like.sha("p40923")
    (fix,) = doc["fixes"]
    assert {"pr", "state", "first_release", "first_rc", "title", "symptom", "evidence"} <= set(fix)
    assert fix["pr"] == 40923 and fix["state"] == "included"


@pytest.mark.parametrize("rev", ["v0.22.0", "releases/v0.22.0"])
def test_tag_and_branch_name_give_the_same_answer(vllm_like: VllmLike, rev: str) -> None:
    assert state(audit(vllm_like, rev, [35568]), 35568) == "cherry-picked"

"""Markers that follow moved files, and effects proven by content, over real git.

Shapes (audit_histories.py): #37221 renames the FP8 dispatch header and
common.hpp under csrc/libtorch_stable/ after v0.22.1rc0; #41215 is an empty
squash commit whose effect (enable_sm120_family in the dispatch header)
arrives with #35568.
"""

from __future__ import annotations

from spark_images.audit import Auditor, load_knowledge, open_history, parse_knowledge
from spark_images.audit.knowledge import Marker
from spark_images.audit.markers import candidates
from spark_images.audit.states import AuditReport, FixResult
from support.audit_histories import (
    COMMON_HPP,
    COMMON_HPP_NOW,
    FP8_DISPATCH,
    FP8_DISPATCH_NOW,
    VllmLike,
    git,
    pin_commits,
)


def audit(repo: VllmLike, rev: str, prs: list[int], kb_text: str | None = None, required: tuple[int, ...] = ()) -> AuditReport:
    kb = parse_knowledge(pin_commits(kb_text, repo.path)) if kb_text else load_knowledge()
    auditor = Auditor(open_history(repo.path), kb)
    return auditor.audit(auditor.resolve_commit(rev, rev), target=rev, prs=prs, required=required, releases=False)


def fix_of(report: AuditReport, pr: int) -> FixResult:
    fix = report.get(pr)
    assert fix is not None
    return fix


def kb_with_marker(path: str, text: str, pr: int = 33517, hints: str = "") -> str:
    return f"""
schema: 1
fixes:
  - pr: {pr}
    title: test entry
    area: build
    severity: high
    symptom: test symptom
    markers:
      - path: {path}
        {hints}
        contains: "{text}"
        source: test history
"""


def test_the_rename_commit_really_moved_the_files(vllm_like: VllmLike) -> None:
    status = git(vllm_like.path, "diff-tree", "-r", "-M", "--name-status", vllm_like.sha("p37221"))
    assert f"R100\t{FP8_DISPATCH}\t{FP8_DISPATCH_NOW}" in status and f"R100\t{COMMON_HPP}\t{COMMON_HPP_NOW}" in status


def test_shipped_markers_hold_at_todays_paths_and_at_the_old_ones_before_the_move(vllm_like: VllmLike) -> None:
    after = audit(vllm_like, "main", [33517, 41215])
    for pr in (33517, 41215):
        fix = fix_of(after, pr)
        assert fix.state == "included", (pr, fix.evidence)
        assert any(e.startswith("marker ok: csrc/libtorch_stable/") for e in fix.evidence), fix.evidence
    before = fix_of(audit(vllm_like, "v0.22.1rc0", [33517]), 33517)
    assert before.state == "included"
    assert any(f"checked at {COMMON_HPP}; an earlier path (hint)" in e for e in before.evidence), before.evidence


def test_marker_with_only_the_old_path_follows_gits_rename(vllm_like: VllmLike) -> None:
    fix = fix_of(audit(vllm_like, "main", [33517], kb_with_marker(COMMON_HPP, "struct enable_sm120_family")), 33517)
    assert fix.state == "included"
    line = next(e for e in fix.evidence if e.startswith("marker ok"))
    assert f"checked at {COMMON_HPP_NOW}" in line
    assert f"followed git's rename {COMMON_HPP} -> {COMMON_HPP_NOW} in {vllm_like.sha('p37221')[:12]}" in line


def test_marker_at_a_path_that_never_existed_is_found_by_name_and_reported_where(vllm_like: VllmLike) -> None:
    fix = fix_of(audit(vllm_like, "main", [33517], kb_with_marker("csrc/elsewhere/common.hpp", "struct enable_sm120_family")), 33517)
    assert fix.state == "included"
    assert any(f"checked at {COMMON_HPP_NOW}; found by searching files of the same name" in e for e in fix.evidence)


def test_marker_found_nowhere_is_unproven_not_failed(vllm_like: VllmLike) -> None:
    fix = fix_of(audit(vllm_like, "main", [33517], kb_with_marker("csrc/elsewhere/common.hpp", "no such text")), 33517)
    assert fix.state == "effect-unproven"
    assert any(e.startswith("marker unverified") and "searched 1 file(s)" in e for e in fix.evidence), fix.evidence


def test_marker_text_gone_from_the_file_is_effect_absent(vllm_like: VllmLike) -> None:
    fix = fix_of(audit(vllm_like, "main", [33517], kb_with_marker(COMMON_HPP_NOW, "struct enable_sm120_family_v2")), 33517)
    assert fix.state == "effect-absent"


def test_empty_squash_commit_is_proven_by_the_marker_only(vllm_like: VllmLike) -> None:
    info = git(vllm_like.path, "show", "-s", "--format=%T %P", vllm_like.sha("p41215")).split()
    assert info[0] == git(vllm_like.path, "rev-parse", f"{info[1]}^{{tree}}").strip()  # really empty
    # before #35568 the routing is not in the header: the squash is there, the effect is not
    early = fix_of(audit(vllm_like, "v0.22.0rc1", [41215]), 41215)
    assert early.state == "effect-absent"
    assert any("empty commit" in e for e in early.evidence)
    # after #35568 (on main, and cherry-picked into v0.22.0) the marker holds
    assert fix_of(audit(vllm_like, "main", [41215]), 41215).state == "included"
    assert fix_of(audit(vllm_like, "v0.22.0", [41215]), 41215).state == "included"


def test_empty_squash_commit_without_a_marker_is_unproven_and_fails_a_gate(vllm_like: VllmLike) -> None:
    kb = "schema: 1\nfixes:\n  - {pr: 41215, title: t, area: FP8, severity: high, symptom: s}\n"
    report = audit(vllm_like, "main", [41215], kb, required=(41215,))
    fix = fix_of(report, 41215)
    assert fix.state == "effect-unproven"
    assert any("in the history, effect unproven" in e for e in fix.evidence)
    assert [f.pr for f in report.missing_required] == [41215]
    assert 41215 not in report.included_prs()


def test_candidates_are_restricted_to_the_name_or_directory_family() -> None:
    marker = Marker(path="csrc/quantization/w8a8/cutlass/c3x/x.cuh", text="t", expect_present=True, source="s",
                    hints=("csrc/old/y.cuh",))
    tree = ["csrc/libtorch_stable/quantization/w8a8/cutlass/c3x/x.cuh", "csrc/other/c3x/z.cu", "csrc/old2/y.cuh",
            "vllm/x.py", "csrc/unrelated/w.cu"]
    assert candidates(tree, marker) == [
        "csrc/libtorch_stable/quantization/w8a8/cutlass/c3x/x.cuh", "csrc/old2/y.cuh", "csrc/other/c3x/z.cu",
    ]

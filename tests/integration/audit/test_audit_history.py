"""The pure history index: subjects, reverts, reachability (no git involved)."""

from __future__ import annotations

import pytest

from spark_images.audit.history import (
    CommitInfo,
    build_index,
    contains,
    make_view,
    presence,
    revert_of_subject,
    subject_pr,
    subject_prs,
    truncated_at,
)


@pytest.mark.parametrize(
    ("subject", "prs"),
    [
        ("[Kernel] Marlin MoE: include SM12.x in default arch list (#40923)", (40923,)),
        ("[Bugfix] Fix foo (#123) (#456)", (123, 456)),  # a backport PR keeping the original number
        ("Fix crash seen in #41190", ()),
        ('Revert "[Misc] Risky (#1)" (#2)', (2,)),
        ("[Doc] Add (#x)", ()),
        ("Bump (#١٢)", ()),  # non-ASCII digits are not PR numbers
    ],
)
def test_trailing_pr_numbers(subject: str, prs: tuple[int, ...]) -> None:
    assert subject_prs(subject) == prs
    assert subject_pr(subject) == (prs[-1] if prs else None)


@pytest.mark.parametrize(
    ("subject", "expected"),
    [
        ('Revert "[Misc] Risky (#1)" (#2)', (1, 1)),
        ('Revert "Revert "[Misc] Risky (#1)" (#2)" (#3)', (1, 2)),
        ('Reapply "[Misc] Risky (#1)"', (1, 2)),
        ("Revert #123 (#456)", (123, 1)),
        ("Revert PR #123", (123, 1)),
        ('Revert "[Misc] Risky"', None),  # only the body can tell
        ("[Misc] Revert-safe refactor (#9)", None),
    ],
)
def test_revert_subjects(subject: str, expected: tuple[int, int] | None) -> None:
    assert revert_of_subject(subject) == expected


def chain(*specs: tuple[str, tuple[str, ...], str]) -> list[CommitInfo]:
    return [CommitInfo(sha=s, tree=f"t-{s}", parents=p, subject=subj) for s, p, subj in specs]


def test_reach_positions_cover_merged_side_branches() -> None:
    # a - b - m(a merge of s2) - c ; side: a - s1 - s2
    main = chain(
        ("a", (), "root (#1)"),
        ("b", ("a",), "b (#2)"),
        ("s1", ("a",), "side one (#10)"),
        ("s2", ("s1",), "side two (#11)"),
        ("m", ("b", "s2"), "Merge side (#12)"),
        ("c", ("m",), "c (#3)"),
    )
    index = build_index("c", main)
    at_b, at_m = make_view(index, "b"), make_view(index, "m")
    assert not contains(index, at_b, "s1") and contains(index, at_m, "s1")
    # a tip on the side branch itself sees only its own ancestors
    at_s1 = make_view(index, "s1")
    assert contains(index, at_s1, "a") and not contains(index, at_s1, "b")


def test_branch_view_with_backport_subject_and_missing_parent() -> None:
    main = chain(("a", (), "root (#1)"), ("b", ("a",), "Fix foo (#123)"), ("c", ("b",), "later (#5)"))
    branch = [
        CommitInfo("r1", "t", ("a",), "Fix foo (#123) (#456)"),
        CommitInfo("r2", "t", ("r1", "gone"), "odd merge (#7)"),
    ]
    index = build_index("c", main, branch)
    view = make_view(index, "r2")
    here = presence(index, view, 123)
    assert here.squash == () and here.picks == (("r1", None),)
    assert truncated_at(index, view) == ["gone"]  # a parent git did not give us: history is cut


def test_revert_counting_and_shallow_boundary() -> None:
    main = chain(
        ("a", (), "root (#1)"),
        ("b", ("a",), "Thing (#2)"),
        ("c", ("b",), 'Revert "Thing (#2)" (#3)'),
        ("d", ("c",), 'Revert "Revert "Thing (#2)" (#3)" (#4)'),
    )
    index = build_index("d", main, shallow=["a"])
    assert presence(index, make_view(index, "c"), 2).reverted
    back = presence(index, make_view(index, "d"), 2)
    assert back.present and not back.reverted
    assert truncated_at(index, make_view(index, "d")) == ["a"]

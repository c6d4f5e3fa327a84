"""Subjects learnt after the scan (cherry-pick origins outside the index) are
linked in without scanning main again."""

from __future__ import annotations

from spark_images.audit.history import CommitInfo, build_index, with_extra_subjects

ORIGIN = "0" * 39 + "1"  # a commit on a branch the clone does not hold


def _history() -> tuple[list[CommitInfo], list[CommitInfo]]:
    main = [
        CommitInfo("a", "t", (), "root (#1)"),
        CommitInfo("b", "t", ("a",), "Thing (#2)"),
        CommitInfo("c", "t", ("b",), 'Revert "lost its number"', body=f"This reverts commit {ORIGIN}."),
    ]
    branch = [CommitInfo("p", "t", ("a",), "[Backport] fix", body=f"x\n(cherry picked from commit {ORIGIN})")]
    return main, branch


def test_linking_extra_subjects_finds_the_pick_and_the_revert_that_name_them() -> None:
    main, branch = _history()
    extra = {ORIGIN: "Fix the kernel (#77)"}
    first = build_index("c", main, branch)
    assert first.picked_for == {} and 77 not in first.reverts  # the origin's PR is not known yet
    linked = with_extra_subjects(first, extra)
    assert linked.picked_for == {77: ["p"]}
    assert linked.reverts == {77: [("c", 1)]}
    assert linked.extra_subjects == extra and linked.pr_of(ORIGIN) == 77
    # the first index is left as it was: it may already be in use
    assert first.picked_for == {} and first.reverts == {} and first.extra_subjects == {}


def test_linking_twice_does_not_count_a_revert_twice() -> None:
    main, branch = _history()
    once = with_extra_subjects(build_index("c", main, branch), {ORIGIN: "Fix the kernel (#77)"})
    twice = with_extra_subjects(once, {})
    assert twice.reverts == {77: [("c", 1)]} and twice.picked_for == {77: ["p"]}

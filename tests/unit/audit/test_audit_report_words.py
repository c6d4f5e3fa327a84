"""The audit's caveat words for people (pure): a long run of unchecked releases is
shown by its ends and its count, the JSON keeps every one."""

from __future__ import annotations

from spark_images.audit.report import first_release_words, releases_words
from spark_images.audit.states import FixResult


def test_a_short_list_is_named_whole_and_a_long_one_by_its_ends() -> None:
    few = tuple(f"v0.{n}.0" for n in range(8))
    assert releases_words(few) == ", ".join(few)
    many = tuple(f"v0.{n}.0" for n in range(40))
    assert releases_words(many) == "v0.0.0, v0.1.0, v0.2.0, v0.3.0, v0.4.0, v0.5.0 ... v0.39.0 (40 releases)"
    assert releases_words(()) == ""


def test_the_caveat_of_a_fix_with_dozens_of_unchecked_releases_stays_one_short_line() -> None:
    unchecked = tuple(f"v0.{n}.0" for n in range(12, 45))
    fix = FixResult(pr=29242, state="included", title="t", unchecked_releases=unchecked)
    words = first_release_words(fix)
    assert words == ("first release unknown: not in any release checked here, and v0.12.0, v0.13.0, v0.14.0, "
                     "v0.15.0, v0.16.0, v0.17.0 ... v0.44.0 (33 releases) could not be checked")
    assert fix.to_json()["unchecked_releases"] == list(unchecked)

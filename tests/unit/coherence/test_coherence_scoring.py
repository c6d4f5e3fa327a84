"""Degeneracy metrics: every garbage class of the reference is flagged, fluent text is not."""

from __future__ import annotations

from types import ModuleType

import pytest

from spark_images.coherence import scoring

FLUENT = (
    "A bicycle turns the push of your legs into forward motion. When you press the pedals, "
    "they turn a crank that spins the chainring, and the chain carries that motion to the rear "
    "wheel. Gears change the ratio between the two, so a hill feels lighter and a flat road "
    "feels fast. The brakes press pads against the rim or a disc, and friction slows you down. "
    "Keep the chain clean and oiled, check the tyre pressure, and every ride will be smoother."
)


def test_fluent_paragraph_has_no_issue() -> None:
    report = scoring.score_text(FLUENT)
    assert report.ok, report.issues
    assert report.metrics["distinct_2"] > 0.8


@pytest.mark.parametrize("answer", ["Paris.", "The capital of France is Paris.", "4", "888"])
def test_short_correct_answers_are_not_degenerate(answer: str) -> None:
    assert scoring.score_text(answer, completion_tokens=2).ok


def test_markdown_rules_and_tables_are_not_loops() -> None:
    text = FLUENT + "\n\n| part | job |\n|------------|------------|\n| chain | drive |\n\n---\n"
    assert scoring.score_text(text).ok


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("loop", "repeated"),
        ("apostrophe", "distinct-2"),
        ("bang", "'!'"),
        ("special", "special tokens"),
        ("tagloop", "repeated 4-grams"),
        ("soup", "unexpected scripts"),
        ("empty", "empty answer"),
        ("short", "1-token answer"),
    ],
)
def test_each_garbage_class_of_the_stand_in_is_flagged(
    fake_vllm: ModuleType, mode: str, expected: str
) -> None:
    pieces = fake_vllm.garbage_tokens(mode, 200, 7)
    report = scoring.score_text("".join(pieces), pieces)
    assert not report.ok
    assert any(expected in issue for issue in report.issues), report.issues


@pytest.mark.parametrize(
    "text",
    [
        "lockhandlehandlehandlehandlehandlehandlehandlehandlehandlehandlehandle",
        "'s's's't's's's's't's's's's't's's's's't's's's's't's's's's't's's's's't's's",
        "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!",
        "\n\n</\n\n</\n\n</\n\n</\n\n</\n\n</\n\n</\n\n</\n\n</\n\n</\n\n</\n\n</",
        "<|box_end|><|box_end|><|box_end|>",
    ],
)
def test_reference_garbage_strings_without_stream_pieces(text: str) -> None:
    assert not scoring.score_text(text).ok


def test_cjk_mixed_into_english_is_flagged_but_a_lone_symbol_is_not() -> None:
    soup = "The bicycle 的 chain 그리고 moves の wheel и pedals 是 fast 에서 gears."
    assert any("HAN" in i for i in scoring.score_text(soup).issues)
    assert scoring.score_text(FLUENT + " The ratio is about π.").ok
    assert scoring.score_text("Le café est très bon.").ok  # accented Latin is Latin


def test_expected_scripts_can_allow_another_script() -> None:
    text = "自行车通过踏板和链条把力传到后轮。刹车用摩擦让车慢下来。"
    assert not scoring.score_text(text).ok
    assert scoring.score_text(text, expected_scripts=("HAN",)).ok


def test_replacement_and_control_characters() -> None:
    report = scoring.score_text(FLUENT + " \ufffd\ufffd and \x07 bell")
    assert any("replacement" in i for i in report.issues)
    assert any("control" in i for i in report.issues)
    assert scoring.score_text(FLUENT + "\n\tindented\r\n").ok


def test_metric_helpers() -> None:
    assert scoring.max_identical_run(["a", "b", "b", "b", "c"]) == (3, "b")
    assert scoring.max_identical_run(["-", "-", "-", "-"]) == (0, "")
    assert scoring.distinct_n(["a", "b", "a", "b"], 2) == pytest.approx(2 / 3)
    assert scoring.repeated_ngram_fraction(list("abcdabcd"), 4) == pytest.approx(1 / 5)
    assert scoring.compression_ratio("ab" * 500) < 0.05
    assert scoring.max_periodic_chars("xxhandlehandlehandleyy")[1] in ("handle", "andleh", "ndleha")
    assert scoring.special_tokens("a <|im_end|> b </s>") == ["<|im_end|>", "</s>"]


def test_two_tokens_then_eos_fails_the_open_prompt() -> None:
    """A one-line answer is fine for a question, not for the paragraph the open prompt asks for."""
    from spark_images.coherence.probes import OPEN_THRESHOLDS

    assert scoring.score_text("The end.", ["The", " end."]).ok  # as a short answer: fine
    report = scoring.score_text("The end.", ["The", " end."], thresholds=OPEN_THRESHOLDS)
    assert "2-token answer" in report.issues
    assert scoring.score_text(FLUENT, thresholds=OPEN_THRESHOLDS).ok

"""Whitespace counts: the blank answers real vLLM 0.26 gave pass no longer."""

from __future__ import annotations

from spark_images.coherence import probes, scoring
from support.coherence_captured import stream_pieces


def test_the_real_85_percent_whitespace_answer_fails_with_a_named_reason() -> None:
    pieces = stream_pieces("open_completions_stream", chat=False)
    text = "".join(pieces)
    report = scoring.score_text(text, pieces, completion_tokens=200, thresholds=probes.OPEN_THRESHOLDS)
    # the metrics that passed it before still pass it: the new ones must catch it
    assert report.metrics["distinct_2"] > probes.OPEN_THRESHOLDS.min_distinct_2
    assert report.metrics["compression_ratio"] > probes.OPEN_THRESHOLDS.min_compression_ratio
    assert report.metrics["whitespace_tokens"] == 0.85
    assert any(i.startswith("mostly whitespace: 85% of tokens") for i in report.issues), report.issues
    assert any("blank lines in a row" in i for i in report.issues)


def test_the_real_chat_answer_of_newlines_fails_too() -> None:
    pieces = stream_pieces("open_chat_stream", chat=True)
    report = scoring.score_text("".join(pieces), pieces, thresholds=probes.OPEN_THRESHOLDS)
    assert any(i.startswith("mostly whitespace") for i in report.issues), report.issues


def test_a_mostly_newline_answer_without_stream_pieces_fails() -> None:
    text = "The bicycle\n" + "\n" * 60 + "works.\n\n\n\n" + "\n" * 30 + "A:"
    report = scoring.score_text(text, thresholds=probes.OPEN_THRESHOLDS)
    assert any(i.startswith("mostly whitespace") for i in report.issues), report.issues
    assert report.metrics["max_blank_lines"] == 60


def test_prose_with_paragraphs_and_a_list_passes() -> None:
    text = (
        "A bicycle turns the push of your legs into forward motion.\n\n"
        "1. The pedals turn a crank that spins the front chainring.\n"
        "2. The chain carries that turn to a smaller sprocket on the rear wheel.\n\n\n"
        "Because the rear sprocket is smaller, the wheel turns faster than the pedals, "
        "and gears let the rider trade force for speed on hills."
    )
    report = scoring.score_text(text, thresholds=probes.OPEN_THRESHOLDS)
    assert report.ok, report.issues
    assert report.metrics["max_blank_lines"] == 2

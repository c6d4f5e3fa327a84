"""Known-answer checkers: right answers in other words pass, wrong ones fail."""

from __future__ import annotations

from types import ModuleType

import pytest

from spark_images.coherence import probes
from spark_images.coherence.probes import (
    ExpectCopy,
    ExpectJson,
    ExpectNumber,
    ExpectSequence,
    ExpectWord,
)


def test_probe_set_has_upstream_four_and_at_least_twelve() -> None:
    probe_list = probes.probe_set()
    assert len(probe_list) >= 12
    assert len({p.id for p in probe_list}) == len(probe_list)
    assert [p.id for p in probe_list if p.upstream] == ["capital-france", "add-2-2", "freezing-point", "sub-10-5"]


def test_copy_string_is_random_per_seed_but_reproducible() -> None:
    assert probes.random_copy_string(1) == probes.random_copy_string(1)
    assert probes.random_copy_string(1) != probes.random_copy_string(2)
    probe = next(p for p in probes.probe_set(99) if p.id == "copy-random")
    assert probes.random_copy_string(99) in probe.completion_prompt


@pytest.mark.parametrize(
    "answer", ["Paris.", " Paris", "The capital of France is Paris.", "**Paris**", "paris, of course"]
)
def test_word_answer_in_other_words_passes(answer: str) -> None:
    assert ExpectWord(("Paris",)).check(answer, "chat").ok


@pytest.mark.parametrize("answer", ["Berlin.", "Parisian food is great", "", "The capital is Lyon"])
def test_wrong_word_answer_fails(answer: str) -> None:
    assert not ExpectWord(("Paris",)).check(answer, "chat").ok


@pytest.mark.parametrize(
    ("answer", "endpoint"),
    [
        (" 4\n\n3 + 3 = 6", "completions"),
        (" four.", "completions"),
        ("4", "chat"),
        ("2 + 2 = 4", "chat"),
        ("The answer is **4**.", "chat"),
        ("2 + 2 equals 4. Let me know if you need more help!", "chat"),
    ],
)
def test_number_answers_pass(answer: str, endpoint: probes.Endpoint) -> None:
    assert ExpectNumber(4).check(answer, endpoint).ok


@pytest.mark.parametrize(
    ("answer", "endpoint", "value"),
    [
        (" 5\n", "completions", 4),
        ("2 + 2 = 5", "chat", 4),
        ("10 - 5 = 15", "chat", 5),  # the operand 5 in the echo is not the answer
        ("37 * 24 = 878", "chat", 888),
        (" 6,913", "completions", 6912),
        ("no idea", "chat", 4),
    ],
)
def test_wrong_number_answers_fail(answer: str, endpoint: probes.Endpoint, value: int) -> None:
    assert not ExpectNumber(value).check(answer, endpoint).ok


def test_thousands_separator_and_multistep() -> None:
    assert ExpectNumber(6912).check("1234 + 5678 = 6,912", "chat").ok
    assert ExpectNumber(888).check("37 * 24 = 37 * 20 + 37 * 4 = 740 + 148 = 888", "chat").ok
    assert ExpectNumber(0).check(" 0 degrees Celsius (32 °F).", "completions").ok


def test_sequence_copy_and_json() -> None:
    seq = ExpectSequence((4, 5, 6, 7, 8, 9, 10))
    assert seq.check(" 4, 5, 6, 7, 8, 9, 10.", "completions").ok
    assert not seq.check(" 4, 5, 6, 8, 9, 10.", "completions").ok
    copy = ExpectCopy("Q7XK-M2PZ-9RTA")
    assert copy.check("Sure: `Q7XK-M2PZ-9RTA`", "chat").ok
    assert not copy.check("Q7XK-M2PZ-9RTB", "chat").ok
    js = ExpectJson((("name", "spark"), ("cores", 20)))
    assert js.check('```json\n{"cores": 20, "name": "spark"}\n```', "chat").ok
    assert not js.check('{"name": "spark", "cores": "20"}', "chat").ok
    assert not js.check('{"name": "spark"', "chat").ok


def test_stand_in_coherent_answers_pass_and_wrong_ones_fail(fake_vllm: ModuleType) -> None:
    """The stand-in's answerer and the checkers agree, on both endpoints and every probe."""
    for probe in probes.probe_set(5):
        for endpoint in ("completions", "chat"):
            chat = endpoint == "chat"
            good = fake_vllm.known_answer(probe.prompt_for(endpoint), chat, wrong=False)
            bad = fake_vllm.known_answer(probe.prompt_for(endpoint), chat, wrong=True)
            assert probe.judge(good, endpoint).ok, (probe.id, endpoint, good)
            assert not probe.judge(bad, endpoint).ok, (probe.id, endpoint, bad)


@pytest.mark.parametrize(
    ("probe_id", "answer"),
    [
        ("spider-legs", "Spiders have eight legs, arranged in 4 pairs."),
        ("freezing-point", "Water freezes at 0 °C (32 °F)."),
        ("mul-37-24", "888 (37 × 24)"),
        ("sub-10-5", "10 - 5 = 5"),
        ("add-2-2", "4"),
    ],
)
def test_chat_number_first_stated_before_an_aside_passes(probe_id: str, answer: str) -> None:
    """The answer comes first; a trailing aside (units, operands, pairs) is not the answer."""
    probe = next(p for p in probes.probe_set() if p.id == probe_id)
    assert probe.judge(answer, "chat").ok, probe.judge(answer, "chat").detail


@pytest.mark.parametrize(
    ("probe_id", "endpoint", "answer"),
    [
        ("capital-france", "completions", " Paris" * 15),
        ("add-2-2", "chat", ", ".join(["4"] * 20)),
        ("add-2-2", "completions", " 4" + "!" * 15),
        ("capital-france", "chat", "Paris<|im_end|><|im_end|><|im_end|>"),
        ("capital-france", "chat", "Paris 巴黎 パリ 파리 Париж"),
    ],
)
def test_degenerate_answer_holding_the_right_token_fails(probe_id: str, endpoint: probes.Endpoint, answer: str) -> None:
    probe = next(p for p in probes.probe_set() if p.id == probe_id)
    assert probe.checker.check(answer, endpoint).ok  # the bare checker is fooled...
    judged = probe.judge(answer, endpoint)
    assert not judged.ok  # ...the probe's judgement is not
    assert "degenerate" in judged.detail

"""Known-answer probes and their answer checkers (pure).

Fluent-but-wrong output (vllm#52308) passes every degeneracy metric; only a
question with a known answer catches it. Each probe is asked twice: as a raw
completion (`/v1/completions`, the prompt ends where the answer starts) and
as a chat question (`/v1/chat/completions`). Checkers accept the answer in
other words ("Paris." and "The capital of France is Paris." both pass) and
reject a wrong one ("Berlin", "2 + 2 = 5").

The first four are upstream's `tests/evals/general_correctness_check.py`
prompts; the rest add multi-digit arithmetic, counting, copying a random
string and a small JSON object, which short loops and token soup cannot fake.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from spark_images.coherence import scoring

Endpoint = Literal["completions", "chat"]

_NUMBER_WORDS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12,
}  # fmt: skip
_NUMBER_RE = re.compile(
    r"(?<![\w.])-?\d{1,3}(?:,\d{3})+(?![\d])|(?<![\w.])-?\d+(?:\.\d+)?(?![\d])|\b("
    + "|".join(_NUMBER_WORDS)
    + r")\b",
    re.IGNORECASE,
)
# A number that an answer *states*: after `=`, `is`, `are`, `equals`, `:` (markdown bold allowed).
_STATED_RE = re.compile(r"(?:=|\bis\b|\bare\b|\bequals\b|:)\s*(?:\*\*|`)?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    detail: str


class Checker(Protocol):
    def check(self, answer: str, endpoint: Endpoint) -> CheckResult: ...

    def describe(self) -> str: ...


def numbers_in(text: str) -> list[tuple[int, float]]:
    """(position, value) of every number in the text, digits or small number words."""
    found: list[tuple[int, float]] = []
    for m in _NUMBER_RE.finditer(text):
        token = m.group(0)
        if m.group(1):
            found.append((m.start(), float(_NUMBER_WORDS[token.lower()])))
        else:
            found.append((m.start(), float(token.replace(",", ""))))
    return found


def _fmt(value: float) -> str:
    return str(int(value)) if value == int(value) else str(value)


@dataclass(frozen=True)
class ExpectNumber:
    """The answer states `value`.

    A completion continues right after `=` / `is`, so its first number is the
    answer. A chat reply may restate the question ("37 * 24 = 888"), so the
    candidates are the numbers it states (after `=`, `is`, `:`), its last
    number, and its first number once a restated `operands` prefix is skipped
    ("888 (37 * 24)", "Spiders have eight legs, in 4 pairs"); the question's
    own operands are never mistaken for the answer.
    """

    value: float
    operands: tuple[float, ...] = ()

    def describe(self) -> str:
        return f"the number {_fmt(self.value)}"

    def check(self, answer: str, endpoint: Endpoint) -> CheckResult:
        found = numbers_in(answer)
        if not found:
            return CheckResult(False, f"no number in the answer (expected {_fmt(self.value)})")
        if endpoint == "completions":
            candidates = [found[0][1]]
        else:
            values = [v for _, v in found]
            echoed = len(self.operands) if values[: len(self.operands)] == list(self.operands) else 0
            candidates = [found[-1][1]]
            candidates += [v for pos, v in found if _STATED_RE.search(answer[:pos])]
            if echoed < len(values):
                candidates.append(values[echoed])
        if self.value in candidates:
            return CheckResult(True, f"states {_fmt(self.value)}")
        shown = ", ".join(_fmt(v) for v in dict.fromkeys(candidates))
        return CheckResult(False, f"states {shown}, expected {_fmt(self.value)}")


@dataclass(frozen=True)
class ExpectWord:
    """One of `words` appears as a whole word (case-insensitive unless told)."""

    words: tuple[str, ...]
    case_sensitive: bool = False

    def describe(self) -> str:
        return " or ".join(repr(w) for w in self.words)

    def check(self, answer: str, endpoint: Endpoint) -> CheckResult:
        flags = 0 if self.case_sensitive else re.IGNORECASE
        for word in self.words:
            if re.search(rf"(?<!\w){re.escape(word)}(?!\w)", answer, flags):
                return CheckResult(True, f"says {word!r}")
        return CheckResult(False, f"does not say {self.describe()}")


@dataclass(frozen=True)
class ExpectSequence:
    """These numbers appear consecutively, in order (counting)."""

    items: tuple[int, ...]

    def describe(self) -> str:
        return ", ".join(str(i) for i in self.items)

    def check(self, answer: str, endpoint: Endpoint) -> CheckResult:
        values = [int(v) for _, v in numbers_in(answer) if v == int(v)]
        want = list(self.items)
        for start in range(len(values) - len(want) + 1):
            if values[start : start + len(want)] == want:
                return CheckResult(True, f"counts {self.describe()}")
        return CheckResult(False, f"does not count {self.describe()} (numbers seen: {values[:16]})")


@dataclass(frozen=True)
class ExpectCopy:
    """The exact string (a random one, so no model knows it) is repeated back."""

    text: str

    def describe(self) -> str:
        return repr(self.text)

    def check(self, answer: str, endpoint: Endpoint) -> CheckResult:
        if self.text in answer:
            return CheckResult(True, "copied exactly")
        return CheckResult(False, f"did not copy {self.text!r}")


@dataclass(frozen=True)
class ExpectJson:
    """A JSON object with exactly these key/value pairs (other keys refused)."""

    pairs: tuple[tuple[str, str | int], ...]

    def describe(self) -> str:
        return json.dumps(dict(self.pairs))

    def check(self, answer: str, endpoint: Endpoint) -> CheckResult:
        obj = first_json_object(answer)
        if obj is None:
            return CheckResult(False, "no JSON object in the answer")
        if obj == dict(self.pairs):
            return CheckResult(True, "the expected JSON object")
        return CheckResult(False, f"JSON object {json.dumps(obj)[:120]}, expected {self.describe()}")


def first_json_object(text: str) -> dict[str, object] | None:
    """The first `{...}` in the text that parses as a JSON object."""
    decoder = json.JSONDecoder()
    for m in re.finditer(r"\{", text):
        try:
            obj, _ = decoder.raw_decode(text, m.start())
        except ValueError:
            continue
        if isinstance(obj, dict):
            return obj
    return None


@dataclass(frozen=True)
class Probe:
    id: str
    completion_prompt: str
    chat_prompt: str
    checker: ExpectNumber | ExpectWord | ExpectSequence | ExpectCopy | ExpectJson
    max_tokens: int = 16
    chat_max_tokens: int = 64
    upstream: bool = False

    def prompt_for(self, endpoint: Endpoint) -> str:
        return self.completion_prompt if endpoint == "completions" else self.chat_prompt

    def max_tokens_for(self, endpoint: Endpoint) -> int:
        return self.max_tokens if endpoint == "completions" else self.chat_max_tokens

    def judge(self, answer: str, endpoint: Endpoint, expected_scripts: Sequence[str] = ("LATIN",)) -> CheckResult:
        """The checker's verdict, refused when the answer is degenerate: a loop
        that happens to hold the right word (`Paris Paris Paris ...`), `4!!!!`,
        leaked special tokens, token soup."""
        checked = self.checker.check(answer, endpoint)
        if not checked.ok:
            return checked
        shape = scoring.score_text(answer, expected_scripts=expected_scripts, thresholds=PROBE_THRESHOLDS)
        if shape.ok:
            return checked
        return CheckResult(False, f"{checked.detail}, but degenerate: {'; '.join(shape.issues)}")


# Probe answers are short and may be one token ("4"), so only the shape metrics
# that a short answer can trip (loops, runs, leaks, soup) decide here.
PROBE_THRESHOLDS = scoring.Thresholds(min_tokens=1)


_BRIEF = " Answer briefly."
_NUMBER_ONLY = " Reply with the number only."
# No 0/O or 1/I/L: a copy error must not hide behind a look-alike glyph.
_COPY_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"


def random_copy_string(seed: int) -> str:
    rng = random.Random(seed)
    chars = "".join(rng.choice(_COPY_ALPHABET) for _ in range(12))
    return f"{chars[:4]}-{chars[4:8]}-{chars[8:]}"


def probe_set(seed: int = 1234) -> tuple[Probe, ...]:
    """The known-answer probes; `seed` picks the random string to copy."""
    copy = random_copy_string(seed)
    return (
        Probe(
            "capital-france",
            "The capital of France is",
            "What is the capital of France?" + _BRIEF,
            ExpectWord(("Paris",)),
            upstream=True,
        ),
        Probe("add-2-2", "2 + 2 =", "What is 2 + 2?" + _NUMBER_ONLY, ExpectNumber(4, (2, 2)), upstream=True),
        Probe(
            "freezing-point",
            "The freezing point of water in degrees Celsius is",
            "At how many degrees Celsius does water freeze?" + _NUMBER_ONLY,
            ExpectNumber(0),
            upstream=True,
        ),
        Probe("sub-10-5", "10 - 5 =", "What is 10 - 5?" + _NUMBER_ONLY, ExpectNumber(5, (10, 5)), upstream=True),
        Probe("mul-37-24", "37 * 24 =", "What is 37 * 24?" + _NUMBER_ONLY, ExpectNumber(888, (37, 24))),
        Probe(
            "add-1234-5678", "1234 + 5678 =", "What is 1234 + 5678?" + _NUMBER_ONLY,
            ExpectNumber(6912, (1234, 5678)),
        ),
        Probe(
            "count-1-10",
            "Counting from 1 to 10: 1, 2, 3,",
            "Count from 1 to 10, separated by commas. Reply with the numbers only.",
            ExpectSequence((4, 5, 6, 7, 8, 9, 10)),
            max_tokens=24,
        ),
        Probe(
            "copy-random",
            f"Repeat the code exactly.\nCode: {copy}\nRepeated: ",
            f"Repeat this code exactly, with nothing else: {copy}",
            ExpectCopy(copy),
            max_tokens=24,
        ),
        Probe(
            "json-object",
            'A JSON object with the key "name" set to "spark" and the key "cores" set to 20:\n',
            'Write a JSON object with the key "name" set to the string "spark" and the key '
            '"cores" set to the number 20. Reply with the JSON only.',
            ExpectJson((("name", "spark"), ("cores", 20))),
            max_tokens=32,
            chat_max_tokens=96,
        ),
        Probe(
            "day-after-monday",
            "The day of the week after Monday is",
            "Which day of the week comes after Monday?" + _BRIEF,
            ExpectWord(("Tuesday",)),
        ),
        Probe(
            "opposite-hot",
            "The opposite of hot is",
            "What is the opposite of hot? Answer with one word.",
            ExpectWord(("cold",)),
        ),
        Probe(
            "spider-legs",
            "The number of legs a spider has is",
            "How many legs does a spider have?" + _NUMBER_ONLY,
            ExpectNumber(8),
        ),
        Probe(
            "largest-planet",
            "The largest planet in the Solar System is",
            "Which is the largest planet in the Solar System?" + _BRIEF,
            ExpectWord(("Jupiter",)),
        ),
        Probe(
            "sky-colour",
            "On a clear day, the colour of the sky is",
            "What colour is a clear daytime sky? Answer with one word.",
            ExpectWord(("blue",)),
        ),
    )


# The open prompt for degeneracy metrics: long, free-form, plain English.
OPEN_PROMPT = (
    "Write a short, friendly paragraph that explains to a new student how a bicycle works: "
    "the pedals, the chain, the gears and the brakes."
)
# A paragraph takes dozens of tokens: one or two then EOS is a failure class of its own
# (reference: "empty output, or one or two tokens then EOS"), so the open prompt asks for more.
OPEN_THRESHOLDS = scoring.Thresholds(min_tokens=16)
# The concurrency probe: a prompt whose greedy continuation is long and specific.
CONCURRENCY_PROMPT = "Here is a detailed description of how a steam engine works:"
# The speed probe (ignore_eos keeps it generating for the fixed length).
SPEED_PROMPT = "Tell me a long story about a lighthouse keeper."

"""Degeneracy metrics on generated text (pure).

The silent failures on a Spark are recognisable by shape, not content: one
short token looping (`lockhandlehandle...`), `!!!!` (token id 0, usually a
NaN upstream of the sampler), empty answers, leaked special tokens
(`<|box_end|>` spam), and multilingual token soup. Each metric below is cheap,
computed from the text (and the streamed pieces when there are some), and has
a threshold that a normal greedy English paragraph is far from.
"""

from __future__ import annotations

import re
import unicodedata
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

_WORD_RE = re.compile(r"\w+|[^\w\s]", re.UNICODE)
# Tokens that legitimately repeat in a row: markdown rules, table borders, ellipses.
_RUN_EXEMPT = frozenset("-=_*#~|. \n\t")
_SPECIAL_TOKEN_RE = re.compile(
    r"<\|[A-Za-z0-9_.:\- ]{1,40}\|>"  # <|box_end|>, <|im_end|>, <|eot_id|>, <|endoftext|>
    r"|</?s>|<unk>|<pad>|<bos>|<eos>|\[/?INST\]|<(?:start|end)_of_turn>"
    r"|<\|?begin_of_text\|?>|<\|?end_of_text\|?>"
)
_ALLOWED_CONTROL = frozenset("\n\r\t")

# First word of a character's Unicode name -> script.
_SCRIPT_ALIASES = {
    "CJK": "HAN",
    "KATAKANA-HIRAGANA": "KANA",
    "HIRAGANA": "KANA",
    "KATAKANA": "KANA",
    "HALFWIDTH": "KANA",
}


@dataclass(frozen=True)
class Thresholds:
    max_identical_run: int = 8  # consecutive identical tokens
    min_distinct_2: float = 0.35  # unique bigrams / bigrams, texts of >= 24 tokens
    max_repeated_4gram: float = 0.5  # share of 4-grams that repeat an earlier one
    min_compression_ratio: float = 0.22  # zlib bytes / raw bytes, texts of >= 200 bytes
    max_foreign_script: float = 0.05  # letters outside the expected scripts
    min_foreign_letters: int = 3  # a lone π or é is not soup
    max_periodic_chars: int = 40  # characters covered by one repeated unit (<= 12 chars)
    min_tokens: int = 2  # empty or one-token answers
    # The word regex skips whitespace, so a blank answer passed every metric above: real
    # vLLM 0.26 answered an open prompt with 85% whitespace-only tokens (51 newlines in a
    # row) at distinct-2 0.73 and compression 0.315. Prose is about 17% whitespace.
    max_whitespace_tokens: float = 0.5  # share of tokens that are whitespace only
    max_whitespace_chars: float = 0.5  # share of characters that are whitespace
    max_blank_lines: int = 8  # blank lines in a row
    min_whitespace_chars: int = 40  # shorter answers are judged by the other metrics


@dataclass
class DegeneracyReport:
    metrics: dict[str, float | int | str] = field(default_factory=dict)
    issues: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.issues

    def to_json(self) -> dict[str, object]:
        return {"ok": self.ok, "metrics": dict(self.metrics), "issues": list(self.issues)}


def words(text: str) -> list[str]:
    return _WORD_RE.findall(text.lower())


def max_identical_run(tokens: Sequence[str]) -> tuple[int, str]:
    """Longest run of one identical token, ignoring rule-like punctuation."""
    best, best_tok, run, prev = 0, "", 0, None
    for tok in tokens:
        if tok == prev:
            run += 1
        else:
            run, prev = 1, tok
        if run > best and not set(tok) <= _RUN_EXEMPT:
            best, best_tok = run, tok
    return best, best_tok


def distinct_n(tokens: Sequence[str], n: int) -> float:
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def repeated_ngram_fraction(tokens: Sequence[str], n: int = 4) -> float:
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    if not grams:
        return 0.0
    counts = Counter(grams)
    return sum(c - 1 for c in counts.values()) / len(grams)


def compression_ratio(text: str) -> float:
    raw = text.encode("utf-8")
    return len(zlib.compress(raw, 9)) / len(raw) if raw else 1.0


def max_periodic_chars(text: str, max_period: int = 12) -> tuple[int, str]:
    """Most characters covered by one short unit repeated back to back.

    Catches loops inside a single word (`lockhandlehandlehandle`) that word
    tokens cannot see. Returns (characters covered, the unit).
    """
    best, unit = 0, ""
    n = len(text)
    for period in range(1, max_period + 1):
        run = 0
        for i in range(period, n):
            if text[i] == text[i - period]:
                run += 1
                covered = run + period
                if covered > best:
                    candidate = text[i - covered + 1 : i - covered + 1 + period]
                    if not set(candidate) <= _RUN_EXEMPT:
                        best, unit = covered, candidate
            else:
                run = 0
    return best, unit


def script_of(ch: str) -> str:
    try:
        first = unicodedata.name(ch).split()[0]
    except ValueError:
        return "UNKNOWN"
    return _SCRIPT_ALIASES.get(first, first)


def script_counts(text: str) -> Counter[str]:
    return Counter(script_of(ch) for ch in text if ch.isalpha())


def bad_characters(text: str) -> tuple[int, int]:
    """(replacement characters U+FFFD, control/private/unassigned characters)."""
    replacement = text.count("\ufffd")
    control = sum(
        1
        for ch in text
        if ch not in _ALLOWED_CONTROL and unicodedata.category(ch) in ("Cc", "Cs", "Co", "Cn")
    )
    return replacement, control


def whitespace_shape(text: str, pieces: Sequence[str] | None) -> tuple[float, float, int]:
    """(whitespace-only share of the tokens, whitespace share of the characters, longest blank-line run).

    Tokens are the streamed pieces when there are some, else whitespace-separated
    runs of the text (each run of whitespace counting as one token).
    """
    tokens = [p for p in pieces if p] if pieces else re.findall(r"\s+|\S+", text)
    blank_tokens = sum(1 for tok in tokens if not tok.strip())
    spaces = sum(1 for ch in text if ch.isspace())
    runs = [m.group(0).count("\n") - 1 for m in re.finditer(r"\n[ \t\r\n]*", text)]
    return (blank_tokens / len(tokens) if tokens else 0.0, spaces / len(text) if text else 0.0, max(runs, default=0))


def special_tokens(text: str) -> list[str]:
    return _SPECIAL_TOKEN_RE.findall(text)


def score_text(
    text: str,
    pieces: Sequence[str] | None = None,
    *,
    completion_tokens: int | None = None,
    expected_scripts: Sequence[str] = ("LATIN",),
    thresholds: Thresholds = Thresholds(),
) -> DegeneracyReport:
    """Every metric of one answer, and one issue line per threshold crossed.

    `pieces` are the streamed deltas (one token each on vLLM's default stream
    interval); without them the text's words stand in for tokens.
    """
    t = thresholds
    report = DegeneracyReport()
    m = report.metrics
    toks = words(text)
    n_tokens = completion_tokens if completion_tokens is not None else len(pieces or toks)
    m["chars"] = len(text)
    m["tokens"] = n_tokens

    if not text.strip():
        report.issues.append("empty answer")
    elif n_tokens < t.min_tokens:
        report.issues.append(f"{n_tokens}-token answer")

    run_tokens = [p for p in pieces if p] if pieces else toks
    run, run_tok = max_identical_run(run_tokens)
    m["max_identical_run"] = run
    if run > t.max_identical_run:
        report.issues.append(f"token {run_tok!r} repeated {run} times in a row")

    period_chars, unit = max_periodic_chars(text)
    m["max_periodic_chars"] = period_chars
    if period_chars > t.max_periodic_chars:
        report.issues.append(f"{unit!r} loops over {period_chars} characters")

    if len(toks) >= 24:
        d2 = distinct_n(toks, 2)
        m["distinct_2"] = round(d2, 3)
        if d2 < t.min_distinct_2:
            report.issues.append(f"distinct-2 {d2:.2f} < {t.min_distinct_2}")
        r4 = repeated_ngram_fraction(toks, 4)
        m["repeated_4gram"] = round(r4, 3)
        if r4 > t.max_repeated_4gram:
            report.issues.append(f"repeated 4-grams {r4:.2f} > {t.max_repeated_4gram}")

    if len(text.encode("utf-8")) >= 200:
        cr = compression_ratio(text)
        m["compression_ratio"] = round(cr, 3)
        if cr < t.min_compression_ratio:
            report.issues.append(f"compression ratio {cr:.2f} < {t.min_compression_ratio}")

    ws_tokens, ws_chars, blank_run = whitespace_shape(text, pieces)
    m["whitespace_tokens"], m["whitespace_chars"], m["max_blank_lines"] = round(ws_tokens, 3), round(ws_chars, 3), blank_run
    if text.strip() and len(text) >= t.min_whitespace_chars:
        if ws_tokens > t.max_whitespace_tokens or ws_chars > t.max_whitespace_chars:
            report.issues.append(
                f"mostly whitespace: {ws_tokens:.0%} of tokens and {ws_chars:.0%} of characters"
            )
        if blank_run > t.max_blank_lines:
            report.issues.append(f"{blank_run} blank lines in a row (> {t.max_blank_lines})")

    scripts = script_counts(text)
    letters = sum(scripts.values())
    foreign = {s: c for s, c in scripts.items() if s not in expected_scripts}
    n_foreign = sum(foreign.values())
    m["foreign_script_fraction"] = round(n_foreign / letters, 3) if letters else 0.0
    if foreign:
        m["scripts"] = ",".join(f"{s}:{c}" for s, c in sorted(scripts.items()))
    if n_foreign >= t.min_foreign_letters and n_foreign / max(letters, 1) > t.max_foreign_script:
        names = ", ".join(sorted(foreign))
        report.issues.append(
            f"unexpected scripts ({names}): {n_foreign} of {letters} letters"
        )

    replacement, control = bad_characters(text)
    m["replacement_chars"] = replacement
    m["control_chars"] = control
    if replacement:
        report.issues.append(f"{replacement} replacement characters (U+FFFD)")
    if control:
        report.issues.append(f"{control} control characters")

    leaked = special_tokens(text)
    m["special_tokens"] = len(leaked)
    if leaked:
        report.issues.append(f"leaked special tokens: {', '.join(sorted(set(leaked))[:5])}")
    return report

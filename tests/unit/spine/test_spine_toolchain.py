"""The rules table: arch list per CUDA line and what runs on sm_121."""

from __future__ import annotations

import pytest

from spark_images.profiles.toolchain import (
    ARCH_BY_CUDA,
    RULES,
    arch_list_for,
    cuda_line,
    parse_arch_target,
    parse_version,
)


@pytest.mark.parametrize(
    ("cuda", "expected"),
    [("12.6.3", None), ("12.7", None), ("12.8.0", "12.1a"), ("12.9.1", "12.1a"), ("13.0.2", "12.0f"), ("13.2", "12.0f")],
)
def test_arch_list_for(cuda: str, expected: str | None) -> None:
    assert arch_list_for(cuda) == expected


def test_arch_table_has_no_gaps_from_12_8() -> None:
    starts = [start for start, _, _ in ARCH_BY_CUDA]
    ends = [end for _, end, _ in ARCH_BY_CUDA]
    assert starts[0] == (12, 8)
    assert ends[:-1] == starts[1:] and ends[-1] is None


@pytest.mark.parametrize(
    ("token", "native"),
    [("12.1a", True), ("12.0f", True), ("12.1f", True), ("12.0", True), ("12.1", True),
     ("12.0a", False), ("10.0", False), ("9.0a", False), ("10.0f", False)],
)
def test_which_targets_run_on_sm121(token: str, native: bool) -> None:
    target = parse_arch_target(token)
    assert target is not None
    assert target.runs_natively_on_sm121() is native


def test_bad_tokens_do_not_parse() -> None:
    for token in ("12.1x", "sm_121", "twelve", "12", ""):
        assert parse_arch_target(token) is None


def test_versions_and_lines() -> None:
    assert parse_version("13.0.2") == (13, 0, 2)
    assert parse_version("0.6.11.post2") == (0, 6, 11)
    assert parse_version("2.13.0+cu130") == (2, 13, 0)
    assert cuda_line("13.0.2") == "cu130"
    assert cuda_line("12.9") == "cu129"


def test_every_rule_is_complete() -> None:
    for rule in RULES.values():
        assert rule.message and rule.fix and rule.why, rule.id
        assert rule.severity in ("error", "warning")

"""`coherence --cluster PLAN` on a plan file that is not one: one line, no traceback.

The pair's gate through the CLI on the real engine is
tests/integration/coherence/test_coherence_cluster_engine.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support.recipe_support import run_cli


@pytest.mark.parametrize(
    ("content", "rc", "words"),
    [
        (b'{"x": 1}', 1, "plan_version"),
        (b"\xff\xfe", 2, "not UTF-8"),
        (b"[" * 100_000, 2, "nests deeper"),
        (None, 2, "no such plan file"),
    ],
    ids=["not-a-plan", "not-utf8", "deep", "missing"],
)
def test_a_hostile_plan_file_is_one_line_and_no_traceback(tmp_path: Path, content: bytes | None, rc: int, words: str) -> None:
    plan = tmp_path / "plan.json"
    if content is not None:
        plan.write_bytes(content)
    out = run_cli(["coherence", "--cluster", str(plan), "--model", "m", "--health-timeout", "3"], timeout=300)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == rc and "Traceback" not in out.stderr and len(lines) == 1, out.stderr
    assert str(plan) in lines[0] and words in lines[0]

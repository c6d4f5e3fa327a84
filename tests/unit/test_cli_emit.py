"""`--json` output never carries NaN or Infinity: the CLI's one printer refuses them,
and the guard turns that into one `internal error` line and a valid JSON error document."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from spark_images import cli
from spark_images.cli._common import emit


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_emit_refuses_a_value_json_cannot_carry(value: float, capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(json=True)
    with pytest.raises(ValueError, match="JSON cannot carry"):
        emit(args, {"decode_tokens_per_s": value}, "text")
    assert capsys.readouterr().out == ""  # serialised whole first: no half document


def test_emit_prints_the_one_json_style(capsys: pytest.CaptureFixture[str]) -> None:
    emit(argparse.Namespace(json=True), {"b": 1.5, "a": "é"}, "text")
    out = capsys.readouterr().out
    assert out == '{\n  "a": "é",\n  "b": 1.5\n}\n'
    emit(argparse.Namespace(json=False), {"b": 1}, "human")
    assert capsys.readouterr().out == "human\n"


def test_nan_in_a_document_is_one_internal_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(command="coherence", json=True,
                              handler=lambda a: emit(a, {"speed": math.nan}, "") or 0)  # fmt: skip
    rc = cli._dispatch(args, True)
    captured = capsys.readouterr()
    assert rc == 2
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and "internal error: ValueError" in lines[0] and "JSON cannot carry" in lines[0], lines
    doc = json.loads(captured.out)  # what stdout holds is valid JSON: the error document
    assert "NaN" not in captured.out and doc.get("exit_code") == 2, doc

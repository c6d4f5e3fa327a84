"""Readers of the recorded real vLLM 0.26.0 behaviour in tests/data/coherence/vllm-0.26.0-h200 (see its README)."""

from __future__ import annotations

import json
from typing import Any

from support.paths import DATA

CAPTURE = DATA / "coherence" / "vllm-0.26.0-h200"


def exchanges() -> dict[str, Any]:
    return json.loads((CAPTURE / "exchanges.json").read_text(encoding="utf-8"))


def stream_events(key: str) -> list[dict[str, Any]]:
    """The JSON events of one recorded stream, in order (`[DONE]` left out).

    `speed_stream` is the first of the timed decode runs (256 tokens, ignore_eos).
    """
    doc = exchanges()
    lines = doc["decode_runs"][0]["lines"] if key == "speed_stream" else doc[key]["lines"]
    return [json.loads(line[6:]) for _t, line in lines if line.startswith("data: {")]


def stream_pieces(key: str, *, chat: bool) -> list[str]:
    """The text pieces of a recorded stream, as the gate's client reads them."""
    pieces: list[str] = []
    for event in stream_events(key):
        for choice in event.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
            if piece:
                pieces.append(piece)
    return pieces

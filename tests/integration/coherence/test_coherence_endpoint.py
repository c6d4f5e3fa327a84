"""The whole gate against the stand-in server over real HTTP (`--endpoint` mode).

Each garbage pattern of the reference is served with HTTP 200 by the
stand-in; the gate must fail it for the right reason, and pass the coherent
server with a measured, cross-checked speed.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable

import pytest

from spark_images.cli import main
from spark_images.coherence import GateOptions, gate_endpoint
from spark_images.coherence.client import OpenAIClient

pytestmark = pytest.mark.slow
Fake = Callable[..., contextlib.AbstractContextManager[str]]

OPTS = GateOptions(
    health_timeout_s=15, health_poll_s=0.1, request_timeout_s=30, speed_tokens=32, open_max_tokens=120
)


def _gate(url: str) -> dict:
    section = gate_endpoint(url, "test/model", options=OPTS)
    assert len(section["combinations"]) == 1
    return section


def test_coherent_server_passes_with_measured_speed(run_fake: Fake) -> None:
    with run_fake("coherent", toks="400") as url:
        section = _gate(url)
    combo = section["combinations"][0]
    assert section["status"] == "passed", combo["reasons"]
    assert combo["probes"]["passed"] == combo["probes"]["total"] >= 24
    assert combo["concurrency"]["identical"] == 8
    rate = combo["speed"]["decode_tokens_per_s"]
    assert 100 < rate < 450  # the stand-in sleeps 1/400 s per token
    assert combo["speed"]["cross_check"]["ok"], combo["speed"]["cross_check"]
    assert all(run["tokens"] == 32 for run in combo["speed"]["runs"])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("wrong", "known-answer probes"),
        ("loop", "open prompt (chat): token 'handle' repeated"),
        ("apostrophe", "open prompt (chat): distinct-2"),
        ("bang", "open prompt (chat): token '!' repeated"),
        ("empty", "open prompt (chat): empty answer"),
        ("short", "open prompt (chat): 1-token answer"),
        ("special", "leaked special tokens: <|box_end|>"),
        ("tagloop", "open prompt (chat): repeated 4-grams"),
        ("soup", "unexpected scripts"),
        ("concurrency-bang", "parallel answers differ from the serial greedy answer"),
        ("crash-concurrency", "the server stopped answering during concurrency probe"),
        ("hang", "/health did not answer 200 within"),
    ],
)
def test_garbage_is_caught(run_fake: Fake, mode: str, expected: str) -> None:
    # slower tokens where the fault needs requests to overlap (8 x 32 tokens at 300 tok/s)
    toks = "300" if mode.startswith(("concurrency", "crash-concurrency")) else "2000"
    with run_fake(mode, toks=toks) as url:
        if mode == "hang":
            section = gate_endpoint(url, "test/model", options=GateOptions(health_timeout_s=2, health_poll_s=0.2))
        else:
            section = _gate(url)
    combo = section["combinations"][0]
    assert section["status"] == "failed"
    assert any(expected in r for r in combo["reasons"]), combo["reasons"]


def test_fluent_but_wrong_passes_degeneracy_and_fails_only_on_known_answers(run_fake: Fake) -> None:
    with run_fake("wrong") as url:
        combo = _gate(url)["combinations"][0]
    assert combo["degeneracy"]["chat"]["ok"] and combo["degeneracy"]["completions"]["ok"]
    assert combo["probes"]["passed"] == 0
    assert all("known-answer" in r for r in combo["reasons"])


def test_garbage_only_under_concurrency_passes_serial_checks(run_fake: Fake) -> None:
    with run_fake("concurrency-bang", toks="300") as url:
        combo = _gate(url)["combinations"][0]
    assert combo["probes"]["passed"] == combo["probes"]["total"]
    assert combo["degeneracy"]["chat"]["ok"]
    # how many of the 8 overlap depends on thread timing; garbage in any of them fails
    assert combo["concurrency"]["diverged"] >= 1
    assert any("!" in d["sample"] for d in combo["concurrency"]["differences"])


def test_reasoning_model_answers_only_with_thinking_off(run_fake: Fake) -> None:
    with run_fake("coherent", FAKE_VLLM_REASONING="1") as url:
        section = _gate(url)
        thinking = OpenAIClient(url, "test/model", thinking_off=False, timeout_s=30)
        answer = thinking.chat("What is the capital of France? Answer briefly.", 16)
    assert section["status"] == "passed", section["combinations"][0]["reasons"]
    assert answer.text == "" and answer.reasoning  # the budget went to thinking


def test_cli_endpoint_json_and_exit_codes(run_fake: Fake, capsys: pytest.CaptureFixture[str]) -> None:
    with run_fake("coherent") as url:
        rc = main(["coherence", "--endpoint", url, "--model", "test/model", "--speed-tokens", "16",
                   "--health-timeout", "15", "--json"])  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["status"] == "passed"
    with run_fake("bang") as url:
        rc = main(["coherence", "--endpoint", url, "--model", "test/model", "--speed-tokens", "16",
                   "--health-timeout", "15"])  # fmt: skip
    out = capsys.readouterr()
    assert rc == 1
    assert "coherence: failed" in out.out and "Traceback" not in out.err
    with run_fake("coherent") as url:
        rc = main(["coherence", "--endpoint", url, "--model", "other/model", "--speed-tokens", "16",
                   "--health-timeout", "15"])  # fmt: skip
    out = capsys.readouterr()
    assert rc == 1 and "/v1/models lists ['test/model']" in out.out


def test_base_model_without_chat_template_passes_on_completions_only(run_fake: Fake) -> None:
    """`--api completions` checks a base model: no request may need a chat template."""
    opts = GateOptions(
        health_timeout_s=15, health_poll_s=0.1, request_timeout_s=30, speed_tokens=32, open_max_tokens=120,
        endpoints=("completions",),
    )
    with run_fake("coherent", toks="400", FAKE_VLLM_NO_CHAT_TEMPLATE="1") as url:
        section = gate_endpoint(url, "test/model", options=opts)
        with pytest.raises(Exception, match="chat template"):  # the stand-in really refuses chat
            OpenAIClient(url, "test/model").chat("Hello", 3)
    combo = section["combinations"][0]
    assert section["status"] == "passed", combo["reasons"]
    assert {r.split("/")[-1] for r in combo["probes"]["answers"]} == {"completions"}


def test_a_stream_whose_body_is_never_read_still_closes_its_response(
    run_fake: Fake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The body generator closes the response only once started; an event parser that fails
    before its first pull must not leave the connection open."""
    from spark_images.coherence import client as client_module

    def failing_sse(_chunks: object) -> object:
        raise client_module.ServerError("parser refused before reading")

    sent: list[object] = []
    real_post = OpenAIClient._post

    def spying_post(self: OpenAIClient, *args: object, **kwargs: object) -> object:
        resp, deadline = real_post(self, *args, **kwargs)  # type: ignore[arg-type]
        sent.append(resp)
        return resp, deadline

    monkeypatch.setattr(client_module, "iter_sse", failing_sse)
    monkeypatch.setattr(OpenAIClient, "_post", spying_post)
    with run_fake("coherent") as url:
        client = OpenAIClient(url, "test/model", timeout_s=10)
        for _ in range(150):  # the stand-in starts in a moment; the gate polls health the same way
            if client.health(timeout_s=1.0) == 200:
                break
            time.sleep(0.1)
        with pytest.raises(client_module.ServerError, match="parser refused"):
            client.stream_chat("Say hi", 8)
    assert len(sent) == 1
    assert sent[0].raw.closed  # type: ignore[attr-defined]

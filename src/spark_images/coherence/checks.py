"""The checks on a server that answers /health, in the order the gate runs them.

The warm-up request, then `/v1/models`, the known-answer probes, degeneracy
metrics on an open prompt, the concurrency probe, decode speed (cross-checked
with `/metrics`) and, when asked, greedy samples for an A/B. Each check talks
to the server through the client and hands what it saw to the pure modules
(`probes`, `scoring`, `verdict`, `judge`) to be judged.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from spark_images.coherence import judge, probes, scoring, speed, verdict
from spark_images.coherence.client import Completion, OpenAIClient, ServerError
from spark_images.core.errors import Problem, UsageError
from spark_images.profiles.profile import MAX_COHERENCE_ROUNDS as MAX_ROUNDS

Progress = Callable[[str], None]


def quiet(_line: str) -> None:
    """The default `Progress`: says nothing."""
    return None


@dataclass(frozen=True)
class GateOptions:
    health_timeout_s: float = 1800.0  # upstream CI's limit; a Spark start takes minutes
    health_poll_s: float = 2.0
    request_timeout_s: float = 300.0
    seed: int = 1234
    min_probe_pass_rate: float = 0.9
    open_max_tokens: int = 200
    concurrency: int = 8
    concurrency_tokens: int = 32
    speed_tokens: int = 256
    speed_runs: int = 5  # decode runs spread widely; 5 gives a median with an interval
    top_logprobs: int = 5
    expected_scripts: tuple[str, ...] = ("LATIN",)
    ab_reference: str | None = None  # a MoE backend known to be good (e.g. "marlin")
    ab_tokens: int = 32
    endpoints: tuple[probes.Endpoint, ...] = ("completions", "chat")
    # Each combination served this often, interleaved A B A B ... (`rounds`): every round
    # reloads the model, so the default is one, as the gate always was.
    rounds: int = 1

    def __post_init__(self) -> None:
        # NaN compares false with everything: `--health-timeout nan` would wait forever
        for name in ("health_timeout_s", "health_poll_s", "request_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                flag = "--" + name.removesuffix("_s").replace("_", "-")
                raise UsageError(
                    Problem(file="command line", field=flag, message=f"{value!r} is not a finite number of seconds above 0",
                            fix=f"e.g. {flag} 1800")
                )
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or not 1 <= self.rounds <= MAX_ROUNDS:
            raise UsageError(Problem(file="command line", field="--rounds",
                                     message=f"{self.rounds!r} is not a whole number from 1 to {MAX_ROUNDS}",
                                     fix="e.g. --rounds 3"))  # fmt: skip


@dataclass
class Outcome:
    """What the checks of one combination found."""

    reasons: list[str] = field(default_factory=list)  # each one fails the combination
    warnings: list[str] = field(default_factory=list)
    doc: dict[str, Any] = field(default_factory=dict)
    greedy: list[judge.Greedy] = field(default_factory=list)  # for the A/B, not recorded


class ServerGone(Exception):
    """The server stopped answering because its process ended."""


# --- the checks ---------------------------------------------------------------------------


def _guard(outcome: Outcome, what: str, alive: Callable[[], str | None], exc: ServerError) -> None:
    gone = alive()
    if gone:
        outcome.reasons.append(f"{gone} during {what}")
        raise ServerGone from exc
    outcome.reasons.append(f"{what}: {exc}")


def check_models(client: OpenAIClient, outcome: Outcome) -> None:
    served = client.models()
    outcome.doc["served_models"] = served
    if client.model not in served:
        outcome.reasons.append(f"/v1/models lists {served}, not {client.model!r}")


def check_probes(client: OpenAIClient, opts: GateOptions, outcome: Outcome) -> None:
    results: list[dict[str, Any]] = []
    probe_list = probes.probe_set(opts.seed)
    for probe in probe_list:
        for endpoint in opts.endpoints:
            prompt = probe.prompt_for(endpoint)
            if endpoint == "completions":
                answer = client.complete(prompt, probe.max_tokens_for(endpoint))
            else:
                answer = client.chat(prompt, probe.max_tokens_for(endpoint))
            checked = probe.judge(answer.text, endpoint, opts.expected_scripts)
            detail = checked.detail
            if not answer.text.strip():
                detail = "empty answer"
                if answer.reasoning:
                    detail += " (the tokens went to reasoning: thinking was not switched off)"
            results.append(
                {
                    "probe": probe.id,
                    "endpoint": endpoint,
                    "ok": checked.ok and bool(answer.text.strip()),
                    "answer": answer.text[:200],
                    "detail": detail,
                }
            )
    upstream = [p.id for p in probe_list if p.upstream]
    judged = verdict.judge_probes(results, min_pass_rate=opts.min_probe_pass_rate, upstream_ids=upstream)
    outcome.reasons += judged.reasons
    outcome.doc["probes"] = {
        "passed": judged.passed,
        "total": judged.total,
        "failed": [r for r in results if not r["ok"]],
        "answers": {f"{r['probe']}/{r['endpoint']}": r["answer"] for r in results},
    }


def check_degeneracy(client: OpenAIClient, opts: GateOptions, outcome: Outcome) -> None:
    doc: dict[str, Any] = {}
    for endpoint in opts.endpoints:
        if endpoint == "chat":
            streamed = client.stream_chat(probes.OPEN_PROMPT, opts.open_max_tokens)
        else:
            streamed = client.stream_complete(probes.OPEN_PROMPT + "\n\n", opts.open_max_tokens)
        count = speed.token_count(streamed.completion_tokens, len(streamed.pieces), opts.open_max_tokens)
        if count.problem:
            outcome.warnings.append(f"open prompt ({endpoint}): {count.problem}; the streamed pieces are counted instead")
        report = scoring.score_text(
            streamed.text,
            streamed.pieces,
            completion_tokens=count.value,
            expected_scripts=opts.expected_scripts,
            thresholds=probes.OPEN_THRESHOLDS,
        )
        doc[endpoint] = {**report.to_json(), "sample": streamed.text[:300]}
        outcome.reasons += [f"open prompt ({endpoint}): {issue}" for issue in report.issues]
    outcome.doc["degeneracy"] = doc


def _greedy(answer: Completion) -> judge.Greedy:
    return judge.Greedy(
        answer.text,
        tuple(answer.tokens) if answer.tokens is not None else None,
        tuple(answer.top_logprobs) if answer.top_logprobs is not None else None,
    )


def observe_concurrency(client: OpenAIClient, opts: GateOptions) -> judge.ConcurrencyObservation:
    """The serial greedy answer, then `concurrency` of the same request at once."""
    n, k = opts.concurrency_tokens, opts.top_logprobs
    serial = client.complete(probes.CONCURRENCY_PROMPT, n, logprobs=k)
    pool = ThreadPoolExecutor(max_workers=opts.concurrency)
    answers: list[judge.Greedy | str] = []
    try:
        futures = [
            pool.submit(client.complete, probes.CONCURRENCY_PROMPT, n, logprobs=k)
            for _ in range(opts.concurrency)
        ]
        for fut in futures:
            try:
                answers.append(_greedy(fut.result()))
            except ServerError as exc:
                answers.append(str(exc))
    finally:
        # On Ctrl-C, do not wait for requests to a server that is about to be removed.
        pool.shutdown(wait=False, cancel_futures=True)
    return judge.ConcurrencyObservation(opts.concurrency, n, k, _greedy(serial), tuple(answers))


def _apply(outcome: Outcome, key: str, judged: judge.Judgement) -> None:
    outcome.doc[key] = judged.doc
    outcome.reasons += judged.reasons
    outcome.warnings += judged.warnings


def check_concurrency(client: OpenAIClient, opts: GateOptions, outcome: Outcome) -> None:
    obs = observe_concurrency(client, opts)
    _apply(outcome, "concurrency", judge.judge_concurrency(obs))
    first_error = next((a for a in obs.parallel if isinstance(a, str)), None)
    if first_error is not None:
        raise ServerError(first_error)  # lets check_server ask whether the server is still there


def observe_speed(client: OpenAIClient, opts: GateOptions) -> judge.SpeedObservation:
    """`speed_runs` timed streams with ignore_eos, and /metrics before and after."""
    problems: list[str] = []
    before: dict[str, float] | None
    try:
        before = speed.parse_prometheus(client.metrics())
    except ServerError as exc:
        before = None
        problems.append(f"speed: /metrics unavailable ({exc})")
    runs = []
    for _ in range(opts.speed_runs):
        streamed = client.stream_complete(probes.SPEED_PROMPT, opts.speed_tokens, ignore_eos=True)
        runs.append(judge.SpeedRun(streamed.completion_tokens, len(streamed.pieces), tuple(streamed.times),
                                     streamed.t_sent))  # fmt: skip
    after: dict[str, float] | None = None
    if before is not None:
        try:
            after = speed.parse_prometheus(client.metrics())
        except ServerError as exc:
            problems.append(f"speed: /metrics unavailable after the runs ({exc})")
    return judge.SpeedObservation(opts.speed_tokens, tuple(runs), before, after, tuple(problems))


def check_speed(client: OpenAIClient, opts: GateOptions, outcome: Outcome) -> None:
    _apply(outcome, "speed", judge.judge_speed(observe_speed(client, opts)))


def collect_greedy(client: OpenAIClient, opts: GateOptions, outcome: Outcome) -> None:
    """Greedy tokens + top logprobs on fixed prompts, for an A/B between backends."""
    prompts = [p.completion_prompt for p in probes.probe_set(opts.seed)[:6]]
    prompts.append(probes.CONCURRENCY_PROMPT)
    outcome.greedy = [_greedy(client.complete(p, opts.ab_tokens, logprobs=opts.top_logprobs)) for p in prompts]


def warm_up(client: OpenAIClient, opts: GateOptions) -> None:
    """The first request JIT-compiles kernels; send it through an API being checked
    (chat when it is, so the chat template is exercised; a base model has none)."""
    if "chat" in opts.endpoints:
        client.chat("Hello", 3)
    else:
        client.complete("Hello", 3)


def check_server(
    client: OpenAIClient,
    opts: GateOptions,
    *,
    alive: Callable[[], str | None] = lambda: None,
    progress: Progress = quiet,
) -> Outcome:
    """Every check on a server that answers /health."""
    outcome = Outcome()
    steps: list[tuple[str, Callable[[OpenAIClient, GateOptions, Outcome], None]]] = [
        ("/v1/models", lambda c, _o, out: check_models(c, out)),
        ("warm-up request", lambda c, o, _out: warm_up(c, o)),
        ("known-answer probes", check_probes),
        ("degeneracy", check_degeneracy),
        ("concurrency probe", check_concurrency),
        ("speed", check_speed),
    ]
    if opts.ab_reference:
        steps.append(("A/B greedy samples", collect_greedy))
    try:
        for what, step in steps:
            progress(f"  {what}")
            try:
                step(client, opts, outcome)
            except ServerError as exc:
                _guard(outcome, what, alive, exc)
                if exc.timed_out:  # a server that does not answer in time is not asked again
                    outcome.reasons.append(f"stopped after {what}: the server did not answer within its deadline")
                    break
    except ServerGone:
        pass
    return outcome

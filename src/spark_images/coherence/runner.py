"""The coherence gate: serve each combination, check it, pick the fastest coherent one.

Per combination: start the image (`docker run --gpus all --ipc host ... vllm
serve`), stream its log through the signature table, wait for `/health`
(failing at once when the container exits or logs a fatal line), send the
warm-up request, then the checks: known-answer probes, degeneracy metrics on
an open prompt, the concurrency probe, decode speed (cross-checked with
`/metrics`) and, when asked, an A/B against a known-good backend. The
decisions are made by the pure modules next to this one; this module only
talks to the server and the engine, and always removes the container.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spark_images.coherence import gpu, probes, scoring, speed, verdict
from spark_images.coherence.client import Completion, OpenAIClient, ServerError
from spark_images.coherence.signatures import LogScan, backend_mismatches
from spark_images.coherence.verdict import Combination
from spark_images.errors import EnvironmentProblem, Problem, UsageError
from spark_images.profiles import DEFAULT_KV_CACHE_DTYPES, DEFAULT_MOE_BACKENDS

if TYPE_CHECKING:
    from spark_images.engine.containers import ServedContainer

Progress = Callable[[str], None]
CONTAINER_PORT = 8000


def _quiet(_line: str) -> None:
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
    speed_runs: int = 3
    top_logprobs: int = 5
    expected_scripts: tuple[str, ...] = ("LATIN",)
    ab_reference: str | None = None  # a MoE backend known to be good (e.g. "marlin")
    ab_tokens: int = 32
    endpoints: tuple[probes.Endpoint, ...] = ("completions", "chat")

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


@dataclass
class Outcome:
    """What the checks of one combination found."""

    reasons: list[str] = field(default_factory=list)  # each one fails the combination
    warnings: list[str] = field(default_factory=list)
    doc: dict[str, Any] = field(default_factory=dict)
    greedy: list[verdict.Greedy] = field(default_factory=list)  # for the A/B, not recorded


class ServerGone(Exception):
    """The server stopped answering because its process ended."""


# --- readiness ----------------------------------------------------------------------------


def wait_ready(
    client: OpenAIClient,
    timeout_s: float,
    *,
    poll_s: float,
    failed: Callable[[], str | None],
) -> tuple[str | None, float]:
    """Poll /health until 200. Returns (failure reason or None, seconds waited).

    Fails at once when `failed()` reports something (the container exited, the
    log showed a fatal line) instead of waiting out the (long) limit.
    """
    start = time.monotonic()
    deadline = start + timeout_s
    while True:
        reason = failed()
        if reason:
            return reason, time.monotonic() - start
        if client.health() == 200:
            return None, time.monotonic() - start
        if time.monotonic() >= deadline:
            return f"/health did not answer 200 within {timeout_s:g} s", time.monotonic() - start
        time.sleep(max(0.05, min(poll_s, deadline - time.monotonic())))


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


def _greedy(answer: Completion) -> verdict.Greedy:
    return verdict.Greedy(
        answer.text,
        tuple(answer.tokens) if answer.tokens is not None else None,
        tuple(answer.top_logprobs) if answer.top_logprobs is not None else None,
    )


def observe_concurrency(client: OpenAIClient, opts: GateOptions) -> verdict.ConcurrencyObservation:
    """The serial greedy answer, then `concurrency` of the same request at once."""
    n, k = opts.concurrency_tokens, opts.top_logprobs
    serial = client.complete(probes.CONCURRENCY_PROMPT, n, logprobs=k)
    pool = ThreadPoolExecutor(max_workers=opts.concurrency)
    answers: list[verdict.Greedy | str] = []
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
    return verdict.ConcurrencyObservation(opts.concurrency, n, k, _greedy(serial), tuple(answers))


def _apply(outcome: Outcome, key: str, judged: verdict.Judgement) -> None:
    outcome.doc[key] = judged.doc
    outcome.reasons += judged.reasons
    outcome.warnings += judged.warnings


def check_concurrency(client: OpenAIClient, opts: GateOptions, outcome: Outcome) -> None:
    obs = observe_concurrency(client, opts)
    _apply(outcome, "concurrency", verdict.judge_concurrency(obs))
    first_error = next((a for a in obs.parallel if isinstance(a, str)), None)
    if first_error is not None:
        raise ServerError(first_error)  # lets check_server ask whether the server is still there


def observe_speed(client: OpenAIClient, opts: GateOptions) -> verdict.SpeedObservation:
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
        runs.append(verdict.SpeedRun(streamed.completion_tokens, len(streamed.pieces), tuple(streamed.times),
                                     streamed.t_sent))  # fmt: skip
    after: dict[str, float] | None = None
    if before is not None:
        try:
            after = speed.parse_prometheus(client.metrics())
        except ServerError as exc:
            problems.append(f"speed: /metrics unavailable after the runs ({exc})")
    return verdict.SpeedObservation(opts.speed_tokens, tuple(runs), before, after, tuple(problems))


def check_speed(client: OpenAIClient, opts: GateOptions, outcome: Outcome) -> None:
    _apply(outcome, "speed", verdict.judge_speed(observe_speed(client, opts)))


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
    progress: Progress = _quiet,
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


# --- one combination ----------------------------------------------------------------------


def _result(combo: Combination, outcome: Outcome, scan: LogScan | None, **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {**combo.to_json(), **extra, **outcome.doc}
    if scan is not None:
        doc["signatures"] = [h.to_json() for h in scan.hits]
        doc["backends"] = scan.backends.to_json()
        mismatches = backend_mismatches(scan.backends, combo.moe_backend, combo.linear_backend)
        doc["backend_mismatch"] = mismatches
        outcome.warnings += [f"backend: {m}" for m in mismatches]
        outcome.warnings += [f"log: {h.name}: {h.line[:200]}" for h in scan.degraded()]
        fatal = [h for h in scan.fatal() if not any(h.name in r for r in outcome.reasons)]
        outcome.reasons += [f"log: fatal {h.name}: {h.line[:200]}" for h in fatal]
        if outcome.reasons:
            doc["log_tail"] = list(scan.tail)
    doc["status"] = "failed" if outcome.reasons else "passed"
    doc["reasons"] = list(dict.fromkeys(outcome.reasons))
    doc["warnings"] = list(dict.fromkeys(outcome.warnings))
    return doc


class _LogWatch:
    """The container's log, fed line by line from the follower thread."""

    def __init__(self) -> None:
        self.scan = LogScan()
        self.lock = threading.Lock()

    def on_line(self, line: str) -> None:
        with self.lock:
            self.scan.feed(line)

    def fatal(self) -> str | None:
        with self.lock:
            hit = self.scan.root_cause()
        return f"log: fatal {hit.name}: {hit.line[:200]}" if hit else None


def run_in_container(
    image: str,
    combo: Combination,
    opts: GateOptions,
    *,
    gpus: str | None,
    serve_args: Sequence[str],
    env: Mapping[str, str] | None,
    volumes: Sequence[tuple[str, str]],
    progress: Progress,
) -> tuple[dict[str, Any], list[verdict.Greedy]]:
    from spark_images.engine import containers  # the only Docker-touching code of the gate

    watch = _LogWatch()
    argv = verdict.serve_argv(combo, extra_args=serve_args, host="0.0.0.0", port=CONTAINER_PORT)
    started = time.monotonic()
    try:
        with containers.served(image, argv[1:], on_line=watch.on_line, gpus=gpus, env=env,
                               volumes=volumes, container_port=CONTAINER_PORT) as box:  # fmt: skip
            outcome, waited = _check_container(box, combo, opts, watch, progress)
            with watch.lock:
                doc = _result(combo, outcome, watch.scan, startup_s=round(waited, 2),
                              wall_s=round(time.monotonic() - started, 2), container=box.name)  # fmt: skip
    except containers.ImageCannotServe as exc:
        doc = _result(combo, Outcome(reasons=[str(exc)]), watch.scan, startup_s=0.0,
                      wall_s=round(time.monotonic() - started, 2))  # fmt: skip
        return doc, []
    return doc, outcome.greedy


def _check_container(
    box: ServedContainer, combo: Combination, opts: GateOptions, watch: _LogWatch, progress: Progress
) -> tuple[Outcome, float]:
    def stopped() -> str | None:
        running, code = box.state()
        if running:
            return None
        time.sleep(0.5)  # let the follower read the last lines, which name the cause
        cause = watch.fatal()
        return f"container exited with code {code}" + (f" ({cause})" if cause else "")

    client = OpenAIClient(f"http://127.0.0.1:{box.host_port}", combo.model,
                          seed=opts.seed, timeout_s=opts.request_timeout_s)  # fmt: skip
    reason, waited = wait_ready(client, opts.health_timeout_s, poll_s=opts.health_poll_s,
                                failed=lambda: stopped() or watch.fatal())  # fmt: skip
    if reason:
        return Outcome(reasons=[reason]), waited
    progress(f"  healthy after {waited:.1f} s")
    outcome = check_server(client, opts, alive=stopped, progress=progress)
    late = watch.fatal()  # a fault during the checks (e.g. an illegal memory access under load)
    if late and late not in outcome.reasons:
        outcome.reasons.append(late)
    return outcome, waited


# --- A/B --------------------------------------------------------------------------------


def apply_ab(
    results: list[dict[str, Any]], greedy: Mapping[int, list[verdict.Greedy]], reference_moe: str, opts: GateOptions
) -> list[dict[str, Any]]:
    """New combination records with the A/B against the reference backend judged in."""
    judged = verdict.judge_ab(results, greedy, reference_moe, opts.ab_tokens)
    return [verdict.with_judgement(r, "ab", judged[i]) if i in judged else r for i, r in enumerate(results)]


# --- the gate ---------------------------------------------------------------------------


def _skip_reason(assume_gpu: bool) -> tuple[str | None, dict[str, Any]]:
    if assume_gpu:
        return None, {"assumed_gpu": True, "gpu": "not checked (--assume-gpu: stand-in server testing)"}
    found = gpu.detect_sm121()
    if not found.ok:
        return f"no sm_121 GPU ({found.reason})", {"gpu": found.reason}
    return None, {"gpu": found.reason}


def gate_image(
    image_ref: str,
    models: Sequence[str],
    moe_backends: Sequence[str] = DEFAULT_MOE_BACKENDS,
    linear_backends: Sequence[str] | None = None,
    kv_cache_dtypes: Sequence[str] = DEFAULT_KV_CACHE_DTYPES,
    *,
    health_timeout_s: float = 1800.0,
    gpus: str | None = "all",
    assume_gpu: bool = False,
    options: GateOptions | None = None,
    serve_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    volumes: Sequence[tuple[str, str]] = (),
    progress: Progress = _quiet,
) -> dict[str, Any]:
    """The record's `coherence` section for an image: passed, failed or skipped."""
    opts = options or GateOptions(health_timeout_s=health_timeout_s)
    if options is not None and health_timeout_s != GateOptions.health_timeout_s:
        opts = dataclasses.replace(options, health_timeout_s=health_timeout_s)
    skip, gpu_doc = _skip_reason(assume_gpu)
    if skip:
        return {"status": "skipped", "reason": skip, "image": image_ref, **gpu_doc, "combinations": []}
    combos = verdict.combinations(models, moe_backends, linear_backends, kv_cache_dtypes)
    results: list[dict[str, Any]] = []
    greedy: dict[int, list[verdict.Greedy]] = {}
    for combo in combos:
        progress(f"{combo.label()}: starting")
        doc, samples = run_in_container(image_ref, combo, opts, gpus=gpus, serve_args=serve_args,
                                        env=env, volumes=volumes, progress=progress)  # fmt: skip
        greedy[len(results)] = samples
        results.append(doc)
        progress(f"{combo.label()}: {doc['status']}" + (f" ({doc['reasons'][0]})" if doc["reasons"] else ""))
    if opts.ab_reference:
        results = apply_ab(results, greedy, opts.ab_reference, opts)
    return _section(results, models, image_ref, serve_args, env, gpu_doc)


ENDPOINT_CONNECT_GRACE_S = 20.0


def gate_endpoint(
    url: str, model: str, *, options: GateOptions | None = None, progress: Progress = _quiet
) -> dict[str, Any]:
    """Check a server that is already running (no container, no log to scan)."""
    opts = options or GateOptions()
    client = OpenAIClient(url, model, seed=opts.seed, timeout_s=opts.request_timeout_s)
    # "already running": a server that is still starting answers /health with an
    # error; one whose port stays closed for the grace period is not there at all
    grace_end = time.monotonic() + min(ENDPOINT_CONNECT_GRACE_S, opts.health_timeout_s)
    while (refused := client.connection_refused()) and time.monotonic() < grace_end:
        time.sleep(0.5)
    if refused:
        raise EnvironmentProblem(
            f"--endpoint {url}: nothing answers there ({refused} for {ENDPOINT_CONNECT_GRACE_S:g} s) "
            "(fix: start the server first, or correct the URL, e.g. http://127.0.0.1:8000)"
        )
    reason, waited = wait_ready(client, opts.health_timeout_s, poll_s=opts.health_poll_s,
                                failed=lambda: None)  # fmt: skip
    outcome = Outcome()
    if reason:
        outcome.reasons.append(reason)
    else:

        def alive() -> str | None:
            return None if client.health() is not None else "the server stopped answering"

        outcome = check_server(client, opts, alive=alive, progress=progress)
    combo = Combination(model)
    doc = _result(combo, outcome, None, endpoint=url, startup_s=round(waited, 2))
    doc["moe_backend"] = doc["linear_backend"] = doc["kv_cache_dtype"] = "unknown"
    doc["warnings"].append("endpoint mode: no server log, so no signature scan or backend check")
    doc["warnings"].append("endpoint mode: the server's GPU is not checked (it may not be an sm_121 GPU)")
    status, why = verdict.gate_status([doc], [model])
    section: dict[str, Any] = {"status": status, "endpoint": url, "combinations": [doc]}
    if why:
        section["reason"] = why
    return section


def _section(
    results: list[dict[str, Any]],
    models: Sequence[str],
    image: str,
    serve_args: Sequence[str],
    env: Mapping[str, str] | None,
    gpu_doc: Mapping[str, Any],
) -> dict[str, Any]:
    status, why = verdict.gate_status(results, models)
    section: dict[str, Any] = {"status": status, "image": image, **gpu_doc, "combinations": results}
    if why:
        section["reason"] = why
    per_model: dict[str, Any] = {}
    for model in models:
        best = verdict.select_fastest([r for r in results if r["model"] == model])
        if best is not None:
            per_model[model] = verdict.selection(image, best, serve_args, env)
    if per_model:
        section["selected"] = per_model[next(m for m in models if m in per_model)]
        section["selected_per_model"] = per_model
    return section

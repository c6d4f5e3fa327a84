"""`spark-images coherence IMAGE --profile P` (or `--model M`): serve, check, pick the fastest coherent backend.

Five ways to reach a server: IMAGE (one container per combination),
`--serve "vllm serve ..."` (vLLM as a child process, no Docker: a refused flag
or config is a finding, exit 1, naming vLLM's own line), `--recipe FILE` (the
same, with a recipe's exact command and environment; a missing file is exit 2,
a recipe that does not validate exit 1, as for every command reading one), `--endpoint URL`
(a server running or still loading: a refused connection is waited for until
`--health-timeout`; nothing there in that time is exit 2) and `--cluster PLAN`
(the head of a two-Spark cluster that `cluster up` started from that plan: the
same probes against its endpoint, plus each node's facts, its digest and the TP
size in the record; the gate passes only when every node ran one digest and
every fact held).

`--rounds N` (or the profile's `verify.coherence.rounds`) serves each
combination N times, interleaved A B A B ..., judges every round and pools
the speed runs of all rounds (`coherence.rounds`). The default is one round:
each round reloads the model, so more rounds are asked for, never assumed.

The models, backends and KV-cache dtypes come from the profile's
`verify.coherence` settings (`spark-images plan P` shows the matrix); flags
given on the command line replace the profile's value of that one setting.
Without a profile, a backend or dtype not named takes the profile model's default
(`auto`: vLLM's own choice).

Exit 0 when every model has a coherent combination (or the stage is skipped
because there is no sm_121 GPU: the reason is printed, and `--require-gpu`
turns that into exit 2), 1 when none is coherent, 2 for usage/environment.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import re
import signal
import sys
from pathlib import Path
from typing import Any

from spark_images.cli._common import add_json_flag, emit
from spark_images.core.errors import EnvironmentProblem, Problem, UsageError
from spark_images.profiles.profile import DEFAULT_KV_CACHE_DTYPES, DEFAULT_MOE_BACKENDS
from spark_images.profiles.profile import MAX_COHERENCE_ROUNDS as MAX_ROUNDS


def _csv(value: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list, e.g. auto,marlin")
    return items


def _positive(value: str) -> float:
    try:
        number = float(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from exc
    if not math.isfinite(number) or number <= 0:  # nan <= 0 is False: test finiteness first
        raise argparse.ArgumentTypeError(f"must be a finite number greater than 0, not {value!r}")
    return number


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "coherence",
        help="serve a model from an image and prove the output is coherent and fast",
        description=(
            "Serve each model with each backend combination (docker run --gpus all --ipc host), "
            "scan the log for fatal signatures, check known answers, degeneracy, concurrency and "
            "speed, and select the fastest coherent combination. Without a GPU of compute "
            "capability 12.1 the stage is skipped, never passed."
        ),
    )
    parser.add_argument("image", nargs="?", help="image reference (repo@sha256:... preferred)")
    parser.add_argument("--profile", type=Path, metavar="FILE",
                        help="take models, backends and KV-cache dtypes from the profile's verify.coherence")  # fmt: skip
    parser.add_argument("--model", action="append", default=[], metavar="M",
                        help="model to serve (repeatable; default: the profile's models); "
                        "with --endpoint, the served model name")  # fmt: skip
    parser.add_argument("--backends", type=_csv, default=None, metavar="LIST",
                        help="--moe-backend values to try (default: the profile's moe_backends, else the profile "
                        f"default {','.join(DEFAULT_MOE_BACKENDS)})")  # fmt: skip
    parser.add_argument("--linear-backends", type=_csv, default=None, metavar="LIST",
                        help="--linear-backend values (default: the profile's linear_backends, else the same "
                        "name as each MoE backend)")  # fmt: skip
    parser.add_argument("--kv-cache-dtype", type=_csv, default=None, metavar="LIST",
                        help="--kv-cache-dtype values to try (default: the profile's kv_cache_dtypes, else the profile "
                        f"default {','.join(DEFAULT_KV_CACHE_DTYPES)})")  # fmt: skip
    parser.add_argument("--endpoint", metavar="URL",
                        help="check a server that is already running (no container)")  # fmt: skip
    parser.add_argument("--cluster", type=Path, metavar="PLAN",
                        help="gate the head endpoint of the cluster `cluster up` started from PLAN (a `cluster plan "
                        "--json` file); the record holds each node's facts and digest and the TP size")  # fmt: skip
    parser.add_argument("--serve", metavar="COMMAND",
                        help='start vLLM as a child process, without Docker (a pip-installed vLLM), e.g. '
                        '--serve "vllm serve ORG/MODEL --port 8000"; its exit and output are read, so a '
                        "refused flag or config is a finding naming vLLM's line; it is always stopped")  # fmt: skip
    parser.add_argument("--recipe", type=Path, metavar="FILE",
                        help="like --serve, with the recipe's exact `vllm serve` command and environment "
                        "(recipes/NAME.yaml); the recipe's model is the served model")  # fmt: skip
    parser.add_argument("--health-timeout", type=_positive, default=1800.0, metavar="S",
                        help="seconds to wait for /health 200 (default 1800, as upstream CI). vLLM keeps its "
                        "port closed while it loads the model (about 80-120 s for a 135M model on an H200, "
                        "many minutes for a large model on a Spark), so a refused connection counts as "
                        "'not up yet' until then; progress goes to stderr. With --endpoint, a port that "
                        "never opened in that time is exit 2; one that answered but never became healthy "
                        "is a failed gate (exit 1)")  # fmt: skip
    parser.add_argument("--request-timeout", type=_positive, default=300.0, metavar="S",
                        help="overall deadline of one completion request, body included (default 300)")  # fmt: skip
    parser.add_argument("--gpus", default="all",
                        help="docker --gpus value; 'none' runs without GPUs (stand-in server tests)")  # fmt: skip
    parser.add_argument("--assume-gpu", action="store_true",
                        help="do not check for an sm_121 GPU: ONLY for testing with a stand-in server; "
                        "the record says so")  # fmt: skip
    parser.add_argument("--require-gpu", action="store_true",
                        help="exit 2 instead of recording `skipped` when there is no sm_121 GPU")  # fmt: skip
    parser.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                        help="extra argument for vllm serve (repeatable), e.g. --serve-arg=--max-model-len=8192")  # fmt: skip
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="environment variable for the container (repeatable)")  # fmt: skip
    parser.add_argument("--volume", action="append", default=[], metavar="HOST:CONTAINER",
                        help="bind mount (repeatable); default: ~/.cache/huggingface if it exists")  # fmt: skip
    parser.add_argument("--ab-reference", metavar="BACKEND",
                        help="A/B each coherent combination against this known-good MoE backend")  # fmt: skip
    parser.add_argument("--api", type=_csv, default=["completions", "chat"], metavar="LIST",
                        help="APIs to probe: completions,chat (default both; a base model without "
                        "a chat template: completions)")  # fmt: skip
    parser.add_argument("--min-probe-pass", type=float, default=0.9, metavar="F",
                        help="share of known-answer probes that must pass (default 0.9; "
                        "upstream's four must always pass)")  # fmt: skip
    parser.add_argument("--speed-tokens", type=int, default=256, metavar="N",
                        help="tokens per timed stream (default 256, ignore_eos)")  # fmt: skip
    parser.add_argument("--speed-runs", type=int, default=5, metavar="N",
                        help="timed streams per combination (default 5, at most 50): the record holds their "
                        "median, IQR and bootstrap 95%% interval, and a combination is only 'fastest' when "
                        "its interval separates from the others'; otherwise it is a tie, broken by the "
                        "profile's order")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=None, metavar="N",
                        help="serve each combination N times, interleaved (A B A B ...; default: the profile's "
                        "verify.coherence.rounds, else 1): every round is judged, the speed runs of all rounds "
                        "are pooled into one median and spread, and the order is recorded. Each round reloads "
                        "the model, so N rounds cost N model loads per combination. Only where the gate starts "
                        f"the server (IMAGE, --serve, --recipe); at most {MAX_ROUNDS}")  # fmt: skip
    parser.add_argument("--record", type=Path, metavar="FILE",
                        help="write the result as the `coherence` section of this build record")  # fmt: skip
    add_json_flag(parser)
    parser.set_defaults(handler=run)


def _usage(field: str, message: str, fix: str) -> UsageError:
    return UsageError(Problem(file="command line", field=field, message=message, fix=fix))


def _env(items: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise _usage("--env", f"{item!r} is not KEY=VALUE", "--env HF_HOME=/data/hf")
        env[key] = value
    return env


def _volumes(items: list[str]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for item in items:
        host, sep, inside = item.partition(":")
        if not sep or not host or not inside:
            raise _usage("--volume", f"{item!r} is not HOST:CONTAINER", "--volume /data/hf:/root/.cache/huggingface")
        out.append((host, inside))
    if not items:
        cache = Path.home() / ".cache" / "huggingface"
        if cache.is_dir():
            out.append((str(cache), "/root/.cache/huggingface"))
    return out


# A timed stream longer than this measures the KV cache filling, not decode speed, and a
# typo (--speed-tokens 2560000) would hold the gate for hours.
MAX_SPEED_TOKENS = 8192
_ENDPOINT_RE = re.compile(r"^https?://[^/\s:]+(?::(\d+))?(/\S*)?$")


def _check_endpoint(url: str) -> None:
    """An http(s) URL whose port, if given, is a TCP port (1-65535): a usage error at once."""
    match = _ENDPOINT_RE.match(url)
    if not match:
        raise _usage("--endpoint", f"{url!r} is not an http(s) URL", "e.g. --endpoint http://127.0.0.1:8000")
    if match.group(1) is not None and not 1 <= int(match.group(1)) <= 65535:
        raise _usage("--endpoint", f"port {match.group(1)} is outside 1-65535", "e.g. --endpoint http://127.0.0.1:8000")


def _sigterm_as_interrupt() -> None:
    """SIGTERM (CI cancelling a job) unwinds like Ctrl-C, so containers are removed."""

    def handler(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    with contextlib.suppress(ValueError):  # not the main thread (main() called from a worker)
        signal.signal(signal.SIGTERM, handler)


def _text(section: dict[str, Any]) -> str:
    lines = [f"coherence: {section['status']}" + (f": {section['reason']}" if section.get("reason") else "")]
    for c in section.get("combinations", []):
        rate = (c.get("speed") or {}).get("decode_tokens_per_s")
        shown = f"{rate:.1f} tok/s" if isinstance(rate, int | float) else "- tok/s"
        lines.append(
            f"  {c['status']:<7} {c['model']} moe={c['moe_backend']} linear={c['linear_backend']} "
            f"kv={c['kv_cache_dtype']}  {shown}"
        )
        lines += [f"      fail: {r}" for r in c.get("reasons", [])[:6]]
        lines += [f"      warn: {w}" for w in c.get("warnings", [])[:6]]
    if section.get("rounds"):
        served = [f"{o['round']}:{o['moe_backend']}" for o in section["rounds"]["order"] if o.get("served")]
        lines.append(f"rounds: {section['rounds']['rounds']}, served in order {' '.join(served)}")
    if section.get("selected"):
        lines.append(f"selected: {section['selected']['serve_command']}")
    lines += [f"  {run.get('line', '')}" for run in section.get("recipes", [])]
    return "\n".join(lines)


def _matrix(args: argparse.Namespace) -> tuple[list[str], list[str], list[str] | None, list[str]]:
    """Models, MoE backends, linear backends, KV-cache dtypes: the flags, else the profile's.

    The profile model holds the one default of each setting (profiles.DEFAULT_*;
    `spark-images plan` shows the same matrix), so this module keeps no list of its own.
    """
    models, moe, linear, kv = args.model, args.backends, args.linear_backends, args.kv_cache_dtype
    if args.profile is not None:
        from spark_images.profiles.profile import load_profile

        settings = load_profile(args.profile).verify.coherence
        if settings is None:
            raise UsageError(Problem(
                file=str(args.profile), field="verify.coherence", message="the profile has no coherence settings",
                fix="add verify.coherence.models (and backends) to the profile, or pass --model",
            ))  # fmt: skip
        models = models or list(settings.models)
        moe = moe or list(settings.moe_backends)
        linear = linear if linear is not None else (list(settings.linear_backends) if settings.linear_backends else None)
        kv = kv or list(settings.kv_cache_dtypes)
        if args.rounds is None:
            args.rounds = settings.rounds
    if not models:
        raise _usage("--model", "at least one model is required", "--profile profiles/NAME.yaml, or --model ORG/NAME")
    return models, moe or list(DEFAULT_MOE_BACKENDS), linear, kv or list(DEFAULT_KV_CACHE_DTYPES)


def _options(args: argparse.Namespace) -> Any:
    from spark_images.coherence import GateOptions

    unknown_api = [a for a in args.api if a not in ("completions", "chat")]
    if unknown_api:
        raise _usage("--api", f"unknown API {', '.join(unknown_api)}", "--api completions,chat")
    if not 0.0 <= args.min_probe_pass <= 1.0:
        raise _usage("--min-probe-pass", f"{args.min_probe_pass} is not between 0 and 1", "--min-probe-pass 0.9")
    if not 2 <= args.speed_tokens <= MAX_SPEED_TOKENS:
        raise _usage("--speed-tokens", f"{args.speed_tokens} is not between 2 and {MAX_SPEED_TOKENS}",
                     "--speed-tokens 256")  # fmt: skip
    if not 2 <= args.speed_runs <= 50:
        raise _usage("--speed-runs", f"{args.speed_runs} is not between 2 and 50", "--speed-runs 5")
    rounds = 1 if args.rounds is None else args.rounds
    if not 1 <= rounds <= MAX_ROUNDS:
        raise _usage("--rounds", f"{rounds} is not between 1 and {MAX_ROUNDS}", "--rounds 3")
    return GateOptions(
        speed_runs=args.speed_runs,
        health_timeout_s=args.health_timeout,
        request_timeout_s=args.request_timeout,
        ab_reference=args.ab_reference.lower().replace("-", "_") if args.ab_reference else None,
        speed_tokens=args.speed_tokens,
        endpoints=tuple(dict.fromkeys(args.api)),
        min_probe_pass_rate=args.min_probe_pass,
        rounds=rounds,
    )


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _run_cluster(args: argparse.Namespace) -> int:
    """The pair's gate: the head endpoint judged like --endpoint, the nodes' facts beside it."""
    from spark_images.cluster.gate import cluster_record, publishable
    from spark_images.cluster.plan_inputs import load_plan
    from spark_images.coherence import gate_endpoint

    if args.image or args.endpoint or args.serve or args.recipe:
        raise _usage("--cluster", "give one of IMAGE, --endpoint, --serve, --recipe and --cluster", "drop the others")
    _one_round("--cluster", args.rounds)
    opts = _options(args)
    plan = load_plan(args.cluster)
    from spark_images.cluster import driver  # the engine client, once the plan is known to be good

    model = args.model[0] if args.model else str(plan.source.model)
    _sigterm_as_interrupt()
    pair = cluster_record(plan, driver.facts(plan))
    ok, why = publishable(pair)
    pair.update(publishable=ok, publishable_reason=why)
    section = gate_endpoint(plan.endpoint.removesuffix("/v1"), model, options=opts, progress=_progress)
    section["cluster"] = pair
    if section["status"] == "passed" and not ok:
        section.update(status="failed", reason=f"the cluster cannot be published: {why}")
    return _finish(args, section)


def _finish(args: argparse.Namespace, section: dict[str, Any]) -> int:
    if args.record:
        from spark_images.buildline.record import BuildRecord

        record = BuildRecord.load(args.record) if args.record.is_file() else BuildRecord(profile="")
        record.set("coherence", section)
        record.save(args.record)
    emit(args, section, _text(section))
    if section["status"] == "failed" and args.json:
        # the JSON document is on stdout; the reasons still reach the person, one line each
        for combo in section.get("combinations", []):
            for reason in combo.get("reasons", []):
                print(f"spark-images coherence: {reason}", file=sys.stderr)
    return 1 if section["status"] == "failed" else 0


def _one_round(mode: str, rounds: int | None) -> None:
    """A server the gate did not start cannot be restarted: --rounds above 1 is refused there."""
    if rounds is not None and rounds > 1:
        raise _usage("--rounds", f"{mode} judges a server the gate does not start, so it cannot serve it again",
                     "drop --rounds, or let the gate start the server (IMAGE, --serve, --recipe)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from spark_images.coherence import gate_endpoint, gate_image

    if args.cluster is not None:
        return _run_cluster(args)
    if args.serve and args.recipe:
        raise _usage("--recipe", "give either --serve or --recipe, not both", "drop one of them")
    local = args.serve or args.recipe
    if local and (args.image or args.endpoint):
        flag = "--serve" if args.serve else "--recipe"
        raise _usage(flag, f"give one of IMAGE, --endpoint and {flag}", "drop the others")
    if not local:
        explicit_rounds = args.rounds
        args.model, args.backends, args.linear_backends, args.kv_cache_dtype = _matrix(args)
        if args.endpoint:
            _one_round("--endpoint", explicit_rounds)
            args.rounds = 1  # a profile's rounds are for servers the gate starts
    opts = _options(args)
    progress = _progress

    _sigterm_as_interrupt()
    if local:
        from spark_images.coherence.local import gate_local
        from spark_images.recipes.serving import gate_recipe

        if args.serve:
            section = gate_local(args.serve, options=opts, progress=progress)
        else:
            section = gate_recipe(args.recipe, options=opts, progress=progress)
    elif args.endpoint:
        if args.image:
            raise _usage("IMAGE", "give either IMAGE or --endpoint, not both", "drop one of them")
        if len(args.model) != 1:
            raise _usage("--model", "--endpoint checks one served model", "give --model once")
        _check_endpoint(args.endpoint)
        section = gate_endpoint(args.endpoint, args.model[0], options=opts, progress=progress)
    else:
        if not args.image:
            raise _usage("IMAGE", "an image is required unless --endpoint is given", "spark-images coherence REPO@sha256:... --model M")
        gpus = None if args.gpus.lower() == "none" else args.gpus
        recipes = _profile_recipes(args)
        section = gate_image(
            args.image,
            args.model,
            args.backends,
            args.linear_backends,
            args.kv_cache_dtype,
            gpus=gpus,
            assume_gpu=args.assume_gpu,
            options=opts,
            serve_args=args.serve_arg,
            env=_env(args.env),
            volumes=_volumes(args.volume),
            progress=progress,
        )
        if recipes:
            section = _with_recipes(args, section, recipes, gpus, opts)
        if section["status"] == "skipped" and args.require_gpu:
            raise EnvironmentProblem(f"coherence: {section['reason']} (--require-gpu)")
    return _finish(args, section)


def _profile_recipes(args: argparse.Namespace) -> tuple[Any, ...]:
    """The recipes the profile's gate serves (`verify.coherence.recipes`), read and checked
    before anything is served: a bad one is one line (exit 1)."""
    if args.profile is None:
        return ()
    from spark_images.buildline.resolve import base_dir_of, read_recipes
    from spark_images.profiles.profile import load_profile

    return read_recipes(load_profile(args.profile), base_dir_of(args.profile))


def _with_recipes(args: argparse.Namespace, section: dict[str, Any], recipes: tuple[Any, ...], gpus: str | None,
                  opts: Any) -> dict[str, Any]:
    """The section with a run of each recipe, each with its own exact command
    (no --serve-arg, --env or --model applies to it); the digest is IMAGE's."""
    from spark_images.recipes import gate as recipe_rules
    from spark_images.recipes.serving import gate_recipes

    _, at, digest = args.image.partition("@")
    runs = gate_recipes(args.image, recipes, digest=digest if at else args.image, gpus=gpus,
                        assume_gpu=args.assume_gpu, options=opts, volumes=_volumes(args.volume), progress=_progress)  # fmt: skip
    return recipe_rules.with_recipes(section, runs)

"""`spark-images cluster plan|up|down|status`: two (or more) Sparks serving one model through Ray.

`plan SOURCE --node HOST[=IP] --node HOST[=IP]` prints, per node, the exact
`docker run` (image by digest, host network, host IPC, GPUs, shm, RoCE
devices, the HF cache), its `ray start` and the NCCL/Gloo environment, and
the head's `vllm serve ... --tensor-parallel-size N --distributed-executor-backend ray`.
SOURCE is a profile (Spark defaults) or a recipe (its `cluster` section); the
image is the profile's lock entry (`--lock`, default images.lock.json) or
`--image REPOSITORY@sha256:...`. The first --node is the head. HOST is
`local`, `ssh://user@host[:port]` (a bare name means ssh://NAME), `unix://` or
`tcp://`; `=IP` is the node's ConnectX-7 address. Pure: reads the files, runs nothing.

`up`, `down` and `status` take the same arguments, or a plan file written by
`plan --json`. `up` pulls by digest on every node (different digests: exit 1,
nothing started), starts the Ray head then the workers, checks the
pre-flight facts (driver major, interface up, Ray's nodes and GPUs; one line
each, exit 1 when one fails) and starts vLLM on the head; every wait has a
deadline. `down` removes the containers labelled with this cluster's name,
and only those.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spark_images.cli._common import add_json_flag, emit
from spark_images.cluster import plan_inputs
from spark_images.cluster.plan import ClusterPlan, NodeSpec, make_plan, parse_node, plan_text
from spark_images.core.errors import EXIT_FINDING, UsageError
from spark_images.release.lock import DEFAULT_LOCK


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("cluster", help="plan, start, check and stop a Ray cluster of Sparks serving one model",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=type(parser))
    verbs.required = True
    for verb, text in (("plan", "print the deployment plan (no I/O beyond reading the files)"),
                       ("up", "pull, start Ray head and workers, check the facts, start vLLM"),
                       ("down", "remove what `up` started (containers with this cluster's label)"),
                       ("status", "containers per node, Ray's nodes and GPUs, vLLM's health")):  # fmt: skip
        p = verbs.add_parser(verb, help=text, description=text)
        p.add_argument("source", type=Path, metavar="PROFILE|RECIPE|PLAN.json",
                       help="a profile, a recipe, or (up/down/status) a plan file from `plan --json`")  # fmt: skip
        p.add_argument("--node", action="append", default=[], metavar="HOST[=IP]",
                       help="a node's engine (local, ssh://user@host) and CX7 address; the first is the head")  # fmt: skip
        p.add_argument("--image", metavar="REPOSITORY@sha256:...", help="the image of every node (default: the lock entry)")
        p.add_argument("--lock", type=Path, default=Path(DEFAULT_LOCK), metavar="FILE",
                       help=f"the lock whose entry gives the image (default {DEFAULT_LOCK})")  # fmt: skip
        p.add_argument("--model", metavar="ORG/NAME", help="serve this model instead of the source's")
        if verb == "up":
            p.add_argument("--no-serve", action="store_true", help="stop after Ray and the facts; do not start vLLM")
        add_json_flag(p)
        p.set_defaults(handler=run)


def resolve_plan(args: argparse.Namespace) -> ClusterPlan:
    source_path: Path = args.source
    if source_path.suffix == ".json":
        if args.node or args.image or args.model:
            raise UsageError(f"{source_path}: a plan file already names its nodes, image and model "
                             "(fix: drop --node/--image/--model, or plan from the profile or recipe)")  # fmt: skip
        return plan_inputs.load_plan(source_path)
    if len(args.node) < 2:
        raise UsageError("a cluster needs at least two --node (fix: --node HEAD --node WORKER; the first is the head)")
    source = plan_inputs.load_source(source_path, args.model)
    image = args.image or plan_inputs.image_from_lock(source, source_path, args.lock)
    nodes = [NodeSpec(host=host, ip=ip, image=image) for host, ip in map(parse_node, args.node)]
    return make_plan(source, nodes)


def _progress(line: str) -> None:
    print(f"spark-images cluster: {line}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    plan = resolve_plan(args)
    if args.verb == "plan":
        emit(args, plan.to_json(), plan_text(plan))
        return 0
    from spark_images.cluster import driver  # the engine client only for the verbs that drive one

    if args.verb == "up":
        outcome = driver.up(plan, _progress, serve=not args.no_serve)  # a failed fact: Finding, exit 1
        text = "\n".join([*(f.line() for f in outcome.facts),
                          "times: " + ", ".join(f"{k} {v:.1f} s" for k, v in outcome.timings.items()),
                          f"endpoint: {plan.endpoint}" if not args.no_serve else "vLLM not started (--no-serve)"])  # fmt: skip
        emit(args, {"cluster": plan.settings.name, "up": True, **outcome.to_json(), "endpoint": plan.endpoint}, text)
        return 0
    if args.verb == "down":
        doc = driver.down(plan)
        removed = sorted(n for names in doc["removed"].values() for n in names)
        emit(args, doc, f"removed {', '.join(removed) or 'nothing'} in {doc['seconds']} s")
        return 0
    healthy, doc, lines = driver.status(plan)
    emit(args, doc, "\n".join(lines))
    return 0 if healthy else EXIT_FINDING

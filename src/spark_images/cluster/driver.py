"""`cluster up` / `down` / `status`: the plan carried out on each node's engine.

The only module of the room that does I/O, and only through
`spark_images.engine.nodes`. Order of `up`: every engine answers; nothing of
this cluster exists yet; every node pulls its image by digest and the digests
must agree (else exit 1, nothing started); Ray head, then workers; the
pre-flight facts (driver, interface); `ray status` on the head until it shows
every node and GPU; then vLLM on the head, until its /health answers. Every
wait has a deadline and, when it runs out, names the node and the step. A
failed `up` removes what it started; `down` removes the containers carrying
this cluster's label, and only those.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from spark_images.cluster import facts as judge
from spark_images.cluster.gate import node_label
from spark_images.cluster.plan import LABEL, ClusterPlan, NodePlan
from spark_images.cluster.ray_status import RayStatus, parse_ray_status
from spark_images.core.errors import Finding
from spark_images.engine.nodes import NodeEngine, RunRequest, StepFailed, StepTimedOut

EXEC_TIMEOUT_S = 60  # one probe in a container (nvidia-smi, ray status, a health request)
POLL_S = 2.0
VLLM_LOG = "/tmp/spark-images-vllm.log"

Progress = Callable[[str], None]


@dataclass
class Outcome:
    facts: list[judge.Fact] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"facts": [f.to_json() for f in self.facts], "timings_s": {k: round(v, 1) for k, v in self.timings.items()},
                "containers": list(self.started)}  # fmt: skip


def _engines(plan: ClusterPlan) -> list[NodeEngine]:
    engines = [NodeEngine(n.node.engine_host(), node_label(n.index, n.node.host)) for n in plan.nodes]
    for engine in engines:
        engine.server_version()
    return engines


def _request(node: NodePlan, plan: ClusterPlan) -> RunRequest:
    volumes = tuple((os.path.expanduser(h) if node.node.host == "local" else h, c) for h, c in node.volumes)
    return RunRequest(name=node.container, image=node.node.image, entrypoint="ray", command=node.ray[1:],
                      network=plan.settings.network, ipc="host", gpus=plan.settings.gpus,
                      shm_size=plan.settings.shm_size, devices=plan.settings.devices, volumes=volumes,
                      env=node.env, labels=node.labels)  # fmt: skip


def _ray_status(engine: NodeEngine, head: NodePlan) -> RayStatus | None:
    result = engine.exec(head.container, ["ray", "status"], EXEC_TIMEOUT_S, "ray status")
    return parse_ray_status(result.stdout) if result.returncode == 0 else None


def _dead_node(engines: list[NodeEngine], plan: ClusterPlan) -> str | None:
    """The first node whose Ray container stopped, named with its exit code and last log line."""
    for engine, node in zip(engines, plan.nodes, strict=True):
        state = engine.state(node.container)
        if state is None or not state.running:
            tail = engine.logs_tail(node.container, 1) if state is not None else []
            how = "is gone" if state is None else f"exited with code {state.exit_code}"
            return f"{engine.label}: Ray container {node.container} {how}" + (f": {tail[-1][:200]}" if tail else "")
    return None


def _wait_joined(engines: list[NodeEngine], plan: ClusterPlan, progress: Progress) -> judge.Fact:
    """Poll `ray status` on the head until every node and GPU shows, or the join deadline."""
    want_nodes, want_gpus = len(plan.nodes), plan.expected_gpus
    timeout = plan.settings.join_timeout_s
    deadline = time.monotonic() + timeout
    status: RayStatus | None = None
    while True:
        dead = _dead_node(engines, plan)
        if dead is not None:
            return judge.Fact("cluster", "ray", False, dead)
        try:
            status = _ray_status(engines[0], plan.head)
        except StepTimedOut:
            status = None
        if status is not None and status.nodes >= want_nodes and status.gpus >= want_gpus:
            return judge.ray_fact(status, want_nodes, want_gpus)
        if time.monotonic() >= deadline:
            seen = status.summary() if status else "no `ray status` summary"
            missing = [e.label for e, _n in zip(engines[1:], plan.nodes[1:], strict=True)]
            who = missing[0] if status is not None and status.nodes == want_nodes - 1 and len(missing) == 1 else \
                f"one of {', '.join(missing)}"  # fmt: skip
            if status is not None and status.nodes >= want_nodes:
                who = "the cluster"  # every node joined, but some GPU is missing
            return judge.Fact("cluster", "ray", False,
                              f"{who}: did not join: after {timeout} s Ray shows {seen} "
                              f"(expected {want_nodes} nodes, {want_gpus} GPUs) [step: ray join]")  # fmt: skip
        progress(f"waiting for Ray: {status.summary() if status else 'no summary yet'}")
        time.sleep(POLL_S)


def _preflight(engines: list[NodeEngine], plan: ClusterPlan) -> list[judge.Fact]:
    labels = [e.label for e in engines]
    smi = []
    for engine, node in zip(engines, plan.nodes, strict=True):
        r = engine.exec(node.container, ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                        EXEC_TIMEOUT_S, "nvidia-smi")  # fmt: skip
        smi.append((r.returncode, r.stdout))
    found = judge.driver_facts(labels, smi, plan.settings.driver_major)
    for engine, node in zip(engines, plan.nodes, strict=True):
        for ifname in plan.settings.socket_ifname.split(","):
            r = engine.exec(node.container, ["cat", f"/sys/class/net/{ifname}/operstate", f"/sys/class/net/{ifname}/flags"],
                            EXEC_TIMEOUT_S, f"interface {ifname}")  # fmt: skip
            found.append(judge.interface_fact(engine.label, ifname, r.returncode, r.stdout))
    return found


def _health_argv(plan: ClusterPlan) -> list[str]:
    port = plan.endpoint.rsplit(":", 1)[1].split("/", 1)[0]
    probe = f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/health', timeout=5).read()"
    return ["python3", "-c", probe]


def _wait_served(engine: NodeEngine, plan: ClusterPlan, progress: Progress) -> judge.Fact:
    timeout = plan.settings.serve_timeout_s
    deadline = time.monotonic() + timeout
    while True:
        try:
            ok = engine.exec(plan.head.container, _health_argv(plan), EXEC_TIMEOUT_S, "vLLM /health").returncode == 0
        except StepTimedOut:
            ok = False
        if ok:
            return judge.Fact(engine.label, "serve", True, f"vLLM answers /health ({plan.endpoint})")
        dead = _dead_node([engine], _head_only(plan))
        if dead is not None or time.monotonic() >= deadline:
            log = engine.exec(plan.head.container, ["tail", "-n", "3", VLLM_LOG], EXEC_TIMEOUT_S, "vLLM log") if dead is None else None
            tail = " | ".join(log.stdout.strip().splitlines()[-3:])[:300] if log and log.returncode == 0 else ""
            why = dead or f"no /health answer within {timeout} s [step: vllm serve]"
            return judge.Fact(engine.label, "serve", False, why + (f"; log: {tail}" if tail else ""))
        progress("waiting for vLLM /health on the head")
        time.sleep(POLL_S)


def _head_only(plan: ClusterPlan) -> ClusterPlan:
    return ClusterPlan(source=plan.source, settings=plan.settings, nodes=(plan.head,), head_address=plan.head_address,
                       tensor_parallel_size=plan.tensor_parallel_size, serve=plan.serve, endpoint=plan.endpoint)  # fmt: skip


def _failed(outcome: Outcome) -> Finding:
    return Finding(*[f.line() for f in outcome.facts if not f.ok])


def up(plan: ClusterPlan, progress: Progress, serve: bool = True) -> Outcome:
    """Bring the cluster up; Finding (exit 1, one line per failed fact) once anything fails."""
    outcome = Outcome()
    clock = time.monotonic()
    engines = _engines(plan)
    for engine in engines:
        existing = engine.labelled(LABEL, plan.settings.name)
        if existing:
            raise Finding(f"{engine.label}: cluster {plan.settings.name} already has containers {', '.join(existing)} "
                          f"(fix: `spark-images cluster down` first)")  # fmt: skip
    observed = []
    for engine, node in zip(engines, plan.nodes, strict=True):
        progress(f"{engine.label}: pulling {node.node.image}")
        try:
            engine.pull(node.node.image, plan.settings.pull_timeout_s)
        except (StepTimedOut, StepFailed) as exc:
            raise Finding(str(exc)) from None
        observed.append(engine.repo_digests(node.node.image))
    outcome.facts += judge.image_facts([e.label for e in engines], [n.node.image for n in plan.nodes], observed)
    outcome.timings["pull"] = time.monotonic() - clock
    if not all(f.ok for f in outcome.facts):
        raise _failed(outcome)  # nothing started: the digests differ
    try:
        _start_and_check(engines, plan, outcome, progress, serve)
    except BaseException:
        _remove_started(engines, plan, outcome)
        raise
    outcome.timings["total"] = time.monotonic() - clock
    return outcome


def _start_and_check(engines: list[NodeEngine], plan: ClusterPlan, outcome: Outcome, progress: Progress, serve: bool) -> None:
    clock = time.monotonic()
    for engine, node in zip(engines, plan.nodes, strict=True):
        progress(f"{engine.label}: starting Ray {node.role} {node.container}")
        outcome.started.append(node.container)  # before the call: a run cut short still gets removed
        try:
            engine.run(_request(node, plan))
        except StepFailed as exc:
            raise Finding(str(exc)) from None
    outcome.facts += _preflight(engines, plan)
    if not all(f.ok for f in outcome.facts):
        raise _failed(outcome)  # a wrong interface or driver: no point waiting for Ray
    outcome.facts.append(_wait_joined(engines, plan, progress))
    outcome.timings["ray_join"] = time.monotonic() - clock
    if not all(f.ok for f in outcome.facts):
        raise _failed(outcome)
    if not serve:
        return
    clock = time.monotonic()
    command = f"exec {shlex.join(plan.serve)} >{VLLM_LOG} 2>&1"
    progress(f"{engines[0].label}: {shlex.join(plan.serve)}")
    engines[0].exec(plan.head.container, ["sh", "-c", command], EXEC_TIMEOUT_S, "vllm serve", detach=True)
    served = _wait_served(engines[0], plan, progress)
    outcome.facts.append(served)
    outcome.timings["serve"] = time.monotonic() - clock
    if not served.ok:
        raise _failed(outcome)


def _remove_started(engines: list[NodeEngine], plan: ClusterPlan, outcome: Outcome) -> None:
    for engine, node in zip(engines, plan.nodes, strict=True):
        if node.container in outcome.started:
            engine.remove([node.container])


def facts(plan: ClusterPlan) -> list[judge.Fact]:
    """The pre-flight facts of a cluster that `up` started, read again for the gate: each
    node's digest of the planned image (no pull), its driver and interface, Ray's view."""
    engines = _engines(plan)
    observed = [engine.repo_digests(node.node.image) for engine, node in zip(engines, plan.nodes, strict=True)]
    found = judge.image_facts([e.label for e in engines], [n.node.image for n in plan.nodes], observed)
    missing = [e.label for e, n in zip(engines, plan.nodes, strict=True) if not (engine_state := e.state(n.container)) or not engine_state.running]
    if missing:
        return [*found, judge.Fact("cluster", "containers", False,
                                   f"{', '.join(missing)}: no running Ray container (fix: `spark-images cluster up` first)")]  # fmt: skip
    found += _preflight(engines, plan)
    try:
        found.append(judge.ray_fact(_ray_status(engines[0], plan.head), len(plan.nodes), plan.expected_gpus))
    except StepTimedOut:
        found.append(judge.Fact("cluster", "ray", False, "`ray status` did not answer in time"))
    return found


def down(plan: ClusterPlan) -> dict[str, Any]:
    """Remove this cluster's containers (by label) on every node's engine; check that none is left."""
    clock = time.monotonic()
    engines = _engines(plan)
    removed: dict[str, list[str]] = {}
    for engine in engines:
        names = engine.labelled(LABEL, plan.settings.name)
        engine.remove(names)
        removed[engine.label] = names
    left = sorted({n for e in engines for n in e.labelled(LABEL, plan.settings.name)})
    if left:
        raise Finding(f"cluster {plan.settings.name}: still there after down: {', '.join(left)}")
    return {"cluster": plan.settings.name, "removed": removed, "seconds": round(time.monotonic() - clock, 1)}


def status(plan: ClusterPlan) -> tuple[bool, dict[str, Any], list[str]]:
    """(healthy, JSON document, text lines): containers per node, Ray's view, vLLM's health."""
    engines = _engines(plan)
    nodes, lines, healthy = [], [], True
    for engine, node in zip(engines, plan.nodes, strict=True):
        state = engine.state(node.container)
        running = state is not None and state.running
        healthy &= running
        image = state.labels.get(f"{LABEL}.image") if state else None
        what = "absent" if state is None else ("running" if running else f"exited ({state.exit_code})")
        nodes.append({"node": engine.label, "role": node.role, "container": node.container, "state": what, "image": image})
        lines.append(f"{engine.label}: {node.role} {node.container}: {what}" + (f", {image}" if image else ""))
    ray: dict[str, Any] = {"nodes": 0, "gpus": 0}
    health = False
    if nodes[0]["state"] == "running":
        try:
            parsed = _ray_status(engines[0], plan.head)
            health = engines[0].exec(plan.head.container, _health_argv(plan), EXEC_TIMEOUT_S, "vLLM /health").returncode == 0
        except StepTimedOut:
            parsed = None
        fact = judge.ray_fact(parsed, len(plan.nodes), plan.expected_gpus)
        ray = {"nodes": parsed.nodes if parsed else 0, "gpus": parsed.gpus if parsed else 0, "ok": fact.ok}
        healthy &= fact.ok
        lines.append(fact.line())
    else:
        lines.append(f"FAIL cluster: ray: the head {plan.head.container} is not running")
    lines.append(f"vLLM at {plan.endpoint}: {'answers /health' if health else 'not serving'}")
    return healthy, {"cluster": plan.settings.name, "healthy": healthy, "nodes": nodes, "ray": ray,
                     "serving": health, "endpoint": plan.endpoint}, lines  # fmt: skip

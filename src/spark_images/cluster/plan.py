"""The deployment plan of a Ray cluster of Sparks serving one model: pure data, no I/O.

Per node: the exact `docker run` (image by digest, network, IPC, GPUs, shm,
RoCE devices, the Hugging Face cache), the Ray command it runs (`ray start
--head --port P` on the head, `ray start --address HEAD:P` on the workers,
both with `--num-gpus`), and the NCCL/Gloo environment that pins collectives
to the ConnectX-7 link. On the head also the `vllm serve ... --tensor-parallel-size N
--distributed-executor-backend ray` that `up` starts once Ray shows every node.

The plan's JSON carries its `inputs` (source, settings, nodes with their
image); `plan_from_json` rebuilds the plan from those alone, so a plan file
cannot say one thing in its commands and another in its inputs.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from spark_images.cluster.recipe import ServeSource
from spark_images.core.errors import Finding, Problem, UsageError
from spark_images.profiles.cluster import ClusterSettings, parse_settings
from spark_images.registry.reference import is_digest

PLAN_VERSION = 1
LABEL = "io.spark-images.cluster"  # = cluster name; `down` removes exactly these containers
ROLE_LABEL = f"{LABEL}.role"
IMAGE_LABEL = f"{LABEL}.image"
HF_IN_CONTAINER = "/root/.cache/huggingface"
_ENGINE_SCHEMES = ("ssh", "unix", "tcp")


@dataclass(frozen=True)
class NodeSpec:
    """One `--node HOST[=IP]`: the Docker engine to drive, the node's CX7 address, its image."""

    host: str  # "local", ssh://user@host[:port], unix:///path, tcp://host:port
    ip: str | None
    image: str  # REPOSITORY@sha256:...

    def engine_host(self) -> str | None:
        """The DOCKER_HOST of this node's engine; None: the local default."""
        return None if self.host == "local" else self.host

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "ip": self.ip, "image": self.image}


@dataclass(frozen=True)
class NodePlan:
    index: int
    role: str  # "head" | "worker"
    node: NodeSpec
    container: str
    env: tuple[tuple[str, str], ...]
    labels: tuple[tuple[str, str], ...]
    volumes: tuple[tuple[str, str], ...]
    ray: tuple[str, ...]  # the Ray command the container runs (its entrypoint is `ray`)
    docker_run: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "role": self.role,
            **self.node.to_json(),
            "container": self.container,
            "env": dict(self.env),
            "labels": dict(self.labels),
            "volumes": [f"{h}:{c}" for h, c in self.volumes],
            "ray": list(self.ray),
            "docker_run": list(self.docker_run),
            "docker_run_line": shlex.join(self.docker_run),
        }


@dataclass(frozen=True)
class ClusterPlan:
    source: ServeSource
    settings: ClusterSettings
    nodes: tuple[NodePlan, ...]
    head_address: str
    tensor_parallel_size: int
    serve: tuple[str, ...]  # run inside the head container
    endpoint: str  # the head's OpenAI endpoint

    @property
    def head(self) -> NodePlan:
        return self.nodes[0]

    @property
    def expected_gpus(self) -> int:
        return len(self.nodes) * self.settings.gpus_per_node

    def to_json(self) -> dict[str, Any]:
        return {
            "plan_version": PLAN_VERSION,
            "inputs": {
                "source": {"kind": self.source.kind, "path": self.source.path, "name": self.source.name,
                           "model": self.source.model, "profile": self.source.profile,
                           "serve_args": list(self.source.serve_args), "serve_env": dict(self.source.serve_env)},
                "cluster": self.settings.to_json(),
                "nodes": [n.node.to_json() for n in self.nodes],
            },
            "cluster": self.settings.name,
            "head_address": self.head_address,
            "ray_address": f"{self.head_address}:{self.settings.ray_port}",
            "tensor_parallel_size": self.tensor_parallel_size,
            "expected": {"nodes": len(self.nodes), "gpus": self.expected_gpus},
            "nodes": [n.to_json() for n in self.nodes],
            "serve": list(self.serve),
            "serve_line": shlex.join(self.serve),
            "endpoint": self.endpoint,
        }


def parse_node(text: str) -> tuple[str, str | None]:
    """`HOST[=IP]` -> (engine host, IP). A bare name means `ssh://NAME`; `local`: this engine."""
    host, _, ip = text.strip().partition("=")
    host, ip = host.strip(), ip.strip() or None
    if not host:
        raise UsageError(f"--node {text!r}: no host (fix: --node ssh://user@spark1=169.254.1.1, or --node local)")
    if host != "local" and "://" not in host:
        host = f"ssh://{host}"
    scheme = host.split("://", 1)[0] if host != "local" else "local"
    if scheme not in ("local", *_ENGINE_SCHEMES):
        raise UsageError(f"--node {text!r}: unknown scheme {scheme!r} (fix: local, ssh://, unix:// or tcp://)")
    if ip is not None and any(c.isspace() for c in ip):
        raise UsageError(f"--node {text!r}: bad IP {ip!r} (fix: HOST=ADDRESS, e.g. spark1=169.254.1.1)")
    return host, ip


def _host_name(host: str) -> str | None:
    if host == "local" or not host.startswith(("ssh://", "tcp://")):
        return None
    return urlsplit(host).hostname


def host_path(path: str, host: str) -> str:
    """A host folder as the node's engine sees it: `~` is the SSH user's home (root: /root)."""
    if not path.startswith("~"):
        return path
    user = urlsplit(host).username if host.startswith("ssh://") else None
    if host.startswith("ssh://"):
        home = "/root" if user in (None, "root") else f"/home/{user}"
        return home + path[1:]
    return path  # local: the driver expands it with this process's home


def _env(settings: ClusterSettings, source: ServeSource, node: NodeSpec) -> tuple[tuple[str, str], ...]:
    env = dict(source.serve_env)
    env.update(settings.env)
    env.update(settings.link_env())  # collectives pinned to the CX7 link on every node
    if node.ip is not None:
        env["VLLM_HOST_IP"] = node.ip  # vLLM's own address choice, else the default route's NIC
    return tuple(sorted(env.items()))


def _docker_run(name: str, node: NodeSpec, settings: ClusterSettings, env: Sequence[tuple[str, str]],
                labels: Sequence[tuple[str, str]], volumes: Sequence[tuple[str, str]], ray: Sequence[str]) -> tuple[str, ...]:  # fmt: skip
    argv = ["docker", "run", "--detach", "--name", name, "--network", settings.network, "--ipc", "host"]
    if settings.gpus is not None:
        argv += ["--gpus", settings.gpus]
    argv += ["--shm-size", settings.shm_size]
    for device in settings.devices:
        argv += ["--device", device]
    for host, inside in volumes:
        argv += ["--volume", f"{host}:{inside}"]
    for key, value in env:
        argv += ["--env", f"{key}={value}"]
    for key, value in labels:
        argv += ["--label", f"{key}={value}"]
    return (*argv, "--entrypoint", "ray", node.image, *ray[1:])


def _serve(source: ServeSource, settings: ClusterSettings, tp: int, file: str) -> tuple[str, ...]:
    args = list(source.serve_args)
    for flag in ("--tensor-parallel-size", "-tp", "--distributed-executor-backend"):
        if any(a == flag or a.startswith(f"{flag}=") for a in args):
            raise Finding(Problem(file=file, field="serve.args", message=f"sets {flag}, which the cluster plan decides",
                                  fix=f"remove {flag}: the plan sets --tensor-parallel-size {tp} --distributed-executor-backend ray"))  # fmt: skip
    if not any(a == "--port" or a.startswith("--port=") for a in args):
        args += ["--host", "0.0.0.0", "--port", str(settings.serve_port)]
    return ("vllm", "serve", str(source.model), *args,
            "--tensor-parallel-size", str(tp), "--distributed-executor-backend", "ray")  # fmt: skip


def _serve_port(serve: Sequence[str], default: int) -> int:
    for i, arg in enumerate(serve):
        if arg == "--port" and i + 1 < len(serve) and serve[i + 1].isdigit():
            return int(serve[i + 1])
        if arg.startswith("--port=") and arg[7:].isdigit():
            return int(arg[7:])
    return default


def make_plan(source: ServeSource, nodes: Sequence[NodeSpec]) -> ClusterPlan:
    """The whole plan; the first node is the head. Pure and deterministic."""
    file, settings = source.path, source.cluster
    if len(nodes) < 2:
        raise UsageError("a cluster needs at least two --node (fix: --node HEAD --node WORKER; the first is the head)")
    if source.model is None:
        raise UsageError(f"{file}: no model to serve (fix: --model ORG/NAME, or verify.coherence.models in the profile)")
    for i, node in enumerate(nodes):
        if not is_digest(node.image.rpartition("@")[2]) or "@" not in node.image:
            raise UsageError(f"node {i} ({node.host}): image {node.image!r} is not pinned by digest (fix: REPOSITORY@sha256:<64 hex>)")
    head = nodes[0]
    head_address = settings.head_address or head.ip or _host_name(head.host)
    if head_address is None:
        raise UsageError(f"node 0 ({head.host}): no address for the workers to join "
                         "(fix: --node local=IP, or cluster.head_address in the recipe)")  # fmt: skip
    tp = len(nodes) * settings.gpus_per_node
    plans: list[NodePlan] = []
    for i, node in enumerate(nodes):
        role = "head" if i == 0 else "worker"
        name = f"spark-images-{settings.name}-{role}" + ("" if i == 0 else f"-{i}")
        ray = ["ray", "start"]
        ray += ["--head", "--port", str(settings.ray_port)] if i == 0 else ["--address", f"{head_address}:{settings.ray_port}"]
        ray += ["--num-gpus", str(settings.gpus_per_node)]
        if node.ip is not None:
            ray += ["--node-ip-address", node.ip]
        ray += ["--disable-usage-stats", "--block"]
        env = _env(settings, source, node)
        labels = ((LABEL, settings.name), (IMAGE_LABEL, node.image), (ROLE_LABEL, role))
        volumes = ((host_path(settings.hf_cache, node.host), HF_IN_CONTAINER),)
        plans.append(NodePlan(index=i, role=role, node=node, container=name, env=env, labels=labels,
                              volumes=volumes, ray=tuple(ray),
                              docker_run=_docker_run(name, node, settings, env, labels, volumes, ray)))  # fmt: skip
    serve = _serve(source, settings, tp, file)
    endpoint_host = head.ip or _host_name(head.host) or "127.0.0.1"
    return ClusterPlan(source=source, settings=settings, nodes=tuple(plans), head_address=head_address,
                       tensor_parallel_size=tp, serve=serve,
                       endpoint=f"http://{endpoint_host}:{_serve_port(serve, settings.serve_port)}/v1")  # fmt: skip


def plan_from_json(doc: Any, file: str) -> ClusterPlan:
    """Rebuild a plan from the `inputs` of its JSON (what `cluster plan --json` wrote)."""
    def bad(field: str, fix: str) -> Finding:
        return Finding(Problem(file=file, field=field, message="missing or malformed", fix=fix))

    if not isinstance(doc, dict) or doc.get("plan_version") != PLAN_VERSION:
        raise bad("plan_version", f"write the plan with `spark-images cluster plan ... --json` (version {PLAN_VERSION})")
    inputs = doc.get("inputs")
    if not isinstance(inputs, dict):
        raise bad("inputs", "write the plan with `spark-images cluster plan ... --json`")
    src, nodes = inputs.get("source"), inputs.get("nodes")
    if not isinstance(src, dict) or not all(isinstance(src.get(k), str) for k in ("kind", "path", "name")):
        raise bad("inputs.source", "kind, path and name are strings")
    args, env = src.get("serve_args"), src.get("serve_env")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise bad("inputs.source.serve_args", "a list of strings")
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise bad("inputs.source.serve_env", "a mapping of strings")
    settings_doc = inputs.get("cluster")
    settings, problems = parse_settings(settings_doc, file, where="inputs.cluster")
    if problems:
        raise Finding(*problems)
    if not isinstance(nodes, list) or not all(isinstance(n, dict) and isinstance(n.get("host"), str)
                                              and isinstance(n.get("image"), str)
                                              and (n.get("ip") is None or isinstance(n.get("ip"), str))
                                              for n in nodes):  # fmt: skip
        raise bad("inputs.nodes", "a list of {host, ip, image}")
    source = ServeSource(kind=src["kind"], path=src["path"], name=src["name"], model=src.get("model"),
                         profile=src.get("profile"), serve_args=tuple(args),
                         serve_env=tuple(sorted(env.items())), cluster=settings)  # fmt: skip
    return make_plan(source, [NodeSpec(host=n["host"], ip=n.get("ip"), image=n["image"]) for n in nodes])


def plan_text(plan: ClusterPlan) -> str:
    """The plan for people: per node its docker run and Ray command, then the head's vllm serve."""
    lines = [f"cluster {plan.settings.name}: {len(plan.nodes)} nodes, tensor parallel {plan.tensor_parallel_size}, "
             f"Ray at {plan.head_address}:{plan.settings.ray_port}"]  # fmt: skip
    for node in plan.nodes:
        lines.append(f"\n# node {node.index} ({node.role}) on {node.node.host}")
        lines.append("# NCCL/Gloo: " + " ".join(f"{k}={v}" for k, v in node.env if k.startswith(("NCCL_", "GLOO_", "UCX_"))))
        lines.append("# ray: " + shlex.join(node.ray))
        lines.append(shlex.join(node.docker_run))
    lines.append(f"\n# head, once `ray status` shows {len(plan.nodes)} nodes and {plan.expected_gpus} GPUs:")
    lines.append(shlex.join(["docker", "exec", "--detach", plan.head.container, *plan.serve]))
    lines.append(f"# endpoint: {plan.endpoint}")
    return "\n".join(lines) + "\n"

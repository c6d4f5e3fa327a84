"""Pre-flight facts per node, judged from what each node's engine and container showed (pure).

A fact is one line: which node, what was checked, what was seen, and whether
it holds. `up` stops with exit 1 before vLLM starts when any fact fails:
- image: every node runs the same manifest digest, the one the plan names;
- driver: `nvidia-smi` in the container answers, and every node has the same
  driver major (or the one the plan requires);
- interface: each interface NCCL/Gloo are pinned to exists in the container and is up;
- ray: `ray status` shows every node and the GPUs the tensor-parallel size needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from spark_images.cluster.ray_status import RayStatus

IFF_UP = 0x1


@dataclass(frozen=True)
class Fact:
    node: str  # "node 1 (ssh://me@spark2)" or "cluster"
    name: str  # image | driver | interface | ray
    ok: bool
    seen: str

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'} {self.node}: {self.name}: {self.seen}"

    def to_json(self) -> dict[str, object]:
        return {"node": self.node, "fact": self.name, "ok": self.ok, "seen": self.seen}


def digest_of(reference: str) -> str:
    return reference.rpartition("@")[2]


def image_facts(labels: Sequence[str], planned: Sequence[str], observed: Sequence[tuple[str, ...]]) -> list[Fact]:
    """Per node: the digest its engine holds for the planned image, and whether all nodes agree."""
    wanted = {digest_of(p) for p in planned}
    facts = []
    for label, plan_ref, repo_digests in zip(labels, planned, observed, strict=True):
        digests = sorted({digest_of(r) for r in repo_digests})
        has = digest_of(plan_ref) in digests
        same = len(wanted) == 1
        if not has:
            seen = f"pulled {plan_ref} but the engine lists {', '.join(digests) or 'no digest'}"
        elif not same:
            seen = f"{digest_of(plan_ref)}, but the nodes' plans name {len(wanted)} digests: {', '.join(sorted(wanted))}"
        else:
            seen = f"{digest_of(plan_ref)} (same on every node)"
        facts.append(Fact(node=label, name="image", ok=has and same, seen=seen))
    return facts


def driver_major(nvidia_smi_out: str) -> int | None:
    """`nvidia-smi --query-gpu=driver_version --format=csv,noheader` -> 580 (first GPU)."""
    first = next((ln.strip() for ln in nvidia_smi_out.splitlines() if ln.strip()), "")
    head = first.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def driver_facts(labels: Sequence[str], outputs: Sequence[tuple[int, str]], required: int | None) -> list[Fact]:
    """outputs: per node (exit code, stdout) of nvidia-smi; majors must agree (and match `required`)."""
    majors = [driver_major(out) if code == 0 else None for code, out in outputs]
    known = {m for m in majors if m is not None}
    facts = []
    for label, (code, out), major in zip(labels, outputs, majors, strict=True):
        if major is None:
            why = "nvidia-smi failed in the container" if code != 0 else f"no driver version in {out.strip()[:60]!r}"
            facts.append(Fact(label, "driver", False, why))
        elif required is not None and major != required:
            facts.append(Fact(label, "driver", False, f"driver {major} (the plan requires {required})"))
        elif len(known) > 1:
            facts.append(Fact(label, "driver", False, f"driver {major}, but the nodes have {sorted(known)}"))
        else:
            facts.append(Fact(label, "driver", True, f"driver {out.strip().splitlines()[0]} (major {major})"))
    return facts


def interface_fact(label: str, ifname: str, code: int, out: str) -> Fact:
    """`cat /sys/class/net/IF/operstate /sys/class/net/IF/flags` in the container."""
    parts = out.split()
    if code != 0 or len(parts) != 2:
        return Fact(label, "interface", False, f"{ifname} does not exist in the container")
    state, flags = parts[0], parts[1]
    try:
        is_up = state == "up" or (state == "unknown" and int(flags, 16) & IFF_UP)
    except ValueError:
        is_up = False
    return Fact(label, "interface", bool(is_up), f"{ifname} is {state} (flags {flags})")


def ray_fact(status: RayStatus | None, nodes: int, gpus: int) -> Fact:
    if status is None:
        return Fact("cluster", "ray", False, "`ray status` gave no summary")
    ok = status.nodes == nodes and status.gpus == gpus
    return Fact("cluster", "ray", ok, f"Ray shows {status.summary()} (expected {nodes} nodes, {gpus} GPUs)")

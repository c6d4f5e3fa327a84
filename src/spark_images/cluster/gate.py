"""The cluster side of the coherence gate: what a pair's record holds, and when it may publish (pure).

`coherence --cluster PLAN` runs its probes and speed measurement against the
plan's head endpoint (`plan.endpoint`); this module gives it the record data
of the pair (per-node facts, the tensor-parallel size, each node's digest)
and the one publish rule: publishable only when every node ran the same
digest and every pre-flight fact held. The coherence room calls
`cluster_record(plan, facts)` and `publishable(record)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spark_images.cluster.facts import Fact, digest_of
from spark_images.cluster.plan import ClusterPlan


def cluster_record(plan: ClusterPlan, facts: Sequence[Fact]) -> dict[str, Any]:
    """The `cluster` section of a coherence record for this plan and the facts `up`/`status` saw."""
    ran = {}
    for fact in facts:
        if fact.name == "image" and fact.ok:
            ran[fact.node] = fact.seen.split(" ", 1)[0]
    nodes = []
    for node in plan.nodes:
        label = node_label(node.index, node.node.host)
        nodes.append({
            "index": node.index,
            "role": node.role,
            "host": node.node.host,
            "planned_digest": digest_of(node.node.image),
            "ran_digest": ran.get(label),
            "facts": [f.to_json() for f in facts if f.node == label],
        })
    return {
        "tensor_parallel_size": plan.tensor_parallel_size,
        "endpoint": plan.endpoint,
        "nodes": nodes,
        "cluster_facts": [f.to_json() for f in facts if f.node == "cluster"],
        "all_facts_ok": bool(facts) and all(f.ok for f in facts),
    }


def publishable(record: dict[str, Any]) -> tuple[bool, str]:
    """(may the gate publish, why): only when both (all) nodes ran one and the same digest."""
    ran = [n.get("ran_digest") for n in record.get("nodes", [])]
    if len(ran) < 2:
        return False, "a cluster record needs at least two nodes"
    if any(d is None for d in ran):
        missing = [str(n["index"]) for n in record["nodes"] if n.get("ran_digest") is None]
        return False, f"node {', '.join(missing)}: no proven digest (the image fact did not hold)"
    if len(set(ran)) != 1:
        return False, f"the nodes ran {len(set(ran))} digests: {', '.join(sorted(set(ran)))}"
    if not record.get("all_facts_ok"):
        return False, "a pre-flight fact failed"
    return True, f"every node ran {ran[0]}"


def node_label(index: int, host: str) -> str:
    return f"node {index} ({host})"

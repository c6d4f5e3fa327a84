"""The pure parts under `up` and the gate: `ray status` text, the pre-flight facts, the publish rule.

The `ray status` texts were recorded from Ray 2.60.0 (PyPI) in two containers
on one Docker network of an x86-64 host, 2026-12-01: both nodes up, then with
the worker stopped.
"""

from __future__ import annotations

import json

from spark_images.cluster import facts
from spark_images.cluster.gate import cluster_record, publishable
from spark_images.cluster.plan import plan_from_json
from spark_images.cluster.ray_status import parse_ray_status
from support import paths

DATA = paths.DATA / "cluster"
A = "r@sha256:" + "a" * 64
B = "r@sha256:" + "b" * 64


def test_ray_status_of_two_nodes_counts_nodes_and_gpus() -> None:
    status = parse_ray_status((DATA / "ray-status-2-nodes.txt").read_text())
    assert status is not None and (status.nodes, status.gpus) == (2, 2.0)
    assert all(i.startswith("node_") for i in status.node_ids)


def test_ray_status_after_the_worker_left_shows_one_node_one_gpu() -> None:
    status = parse_ray_status((DATA / "ray-status-worker-lost.txt").read_text())
    assert status is not None and status.summary() == "1 node, 1 GPU"
    assert not facts.ray_fact(status, 2, 2).ok


def test_text_that_is_not_a_summary_is_none() -> None:
    assert parse_ray_status("ConnectionError: Could not find any running Ray instance.") is None
    assert not facts.ray_fact(None, 2, 2).ok


def test_image_facts_fail_on_both_nodes_when_digests_differ() -> None:
    found = facts.image_facts(["n0", "n1"], [A, B], [(A,), (B,)])
    assert [f.ok for f in found] == [False, False]
    assert "2 digests" in found[1].seen
    same = facts.image_facts(["n0", "n1"], [A, A], [(A,), (A,)])
    assert all(f.ok for f in same)
    missing = facts.image_facts(["n0", "n1"], [A, A], [(A,), ()])
    assert [f.ok for f in missing] == [True, False] and "no digest" in missing[1].seen


def test_driver_majors_must_agree_and_match_the_plan() -> None:
    assert facts.driver_major("580.95.05\n") == 580
    split = facts.driver_facts(["n0", "n1"], [(0, "580.95.05"), (0, "575.57.08")], None)
    assert [f.ok for f in split] == [False, False]
    required = facts.driver_facts(["n0", "n1"], [(0, "580.95.05"), (0, "580.65.06")], 575)
    assert not any(f.ok for f in required) and "requires 575" in required[0].seen
    absent = facts.driver_facts(["n0", "n1"], [(127, ""), (0, "580.95.05")], None)
    assert [f.ok for f in absent] == [False, True]


def test_interface_fact_reads_operstate_and_flags() -> None:
    assert facts.interface_fact("n0", "eth0", 0, "up\n0x1003\n").ok
    assert facts.interface_fact("n0", "lo", 0, "unknown\n0x9\n").ok  # IFF_UP set, no carrier state
    assert not facts.interface_fact("n0", "enp1s0f1np1", 0, "down\n0x1002\n").ok
    assert "does not exist" in facts.interface_fact("n0", "x", 1, "").seen


def _plan():  # the golden two-Spark plan
    return plan_from_json(json.loads((DATA / "plan-recipe.golden.json").read_text()), "plan.json")


def test_the_gate_publishes_only_when_both_nodes_ran_the_same_digest() -> None:
    plan = _plan()
    labels = [f"node {n.index} ({n.node.host})" for n in plan.nodes]
    digests = [n.node.image for n in plan.nodes]
    ok = [*facts.image_facts(labels, digests, [(d,) for d in digests]), facts.Fact("cluster", "ray", True, "2 nodes")]
    record = cluster_record(plan, ok)
    assert record["tensor_parallel_size"] == 2
    assert [n["ran_digest"] for n in record["nodes"]] == [digests[0].rpartition("@")[2]] * 2
    assert publishable(record)[0]
    mixed = facts.image_facts(labels, [digests[0], B], [(digests[0],), (B,)])
    verdict, why = publishable(cluster_record(plan, mixed))
    assert not verdict and "no proven digest" in why
    forged = {**record, "nodes": [record["nodes"][0], {**record["nodes"][1], "ran_digest": "sha256:" + "b" * 64}]}
    assert publishable(forged) == (False, f"the nodes ran 2 digests: {', '.join(sorted({record['nodes'][0]['ran_digest'], 'sha256:' + 'b' * 64}))}")

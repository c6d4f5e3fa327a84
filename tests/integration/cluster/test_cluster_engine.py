"""`cluster up|status|down` on real parts: two Ray node containers of this engine form a real Ray cluster.

Ray is PyPI's, in a local amd64 image (images.py). Faked, because this host
has neither: the GPUs (Ray's `--num-gpus 1` on nodes without one, as the plan
writes it), `nvidia-smi` and `vllm` (stand-ins in the image, stand_ins/), and
the host network (a user-defined Docker network; the head is reached by its
container name). Unproven here: NCCL over the CX7 link and TP=2 on two GPUs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import write_recipe

pytestmark = [pytest.mark.engine, pytest.mark.registry, pytest.mark.network, pytest.mark.slow]
CLI_TIMEOUT_S = 600


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spark_images", "cluster", *args], capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S, env=env, check=False)  # fmt: skip


def leftovers(cluster: str) -> list[str]:
    out = subprocess.run(["docker", "ps", "--all", "--filter", f"label=io.spark-images.cluster={cluster}",
                          "--format", "{{.Names}}"], capture_output=True, text=True, check=True).stdout  # fmt: skip
    return out.split()


@pytest.fixture
def cleanup() -> list[str]:
    """Cluster names a test started; whatever it left is removed afterwards (and the test says so)."""
    names: list[str] = []
    yield names
    for name in names:
        stale = leftovers(name)
        if stale:
            subprocess.run(["docker", "rm", "--force", *stale], capture_output=True, check=False)


def test_up_from_one_digest_status_shows_two_nodes_and_down_leaves_nothing(
    ray_images: tuple[str, str], cluster_network: str, tmp_path: Path, cleanup: list[str]
) -> None:
    recipe, name = write_recipe(tmp_path, cluster_network)
    cleanup.append(name)
    nodes = ["--node", "local", "--node", "local", "--image", ray_images[0]]
    up = cli("up", str(recipe), *nodes, "--json")
    assert up.returncode == 0, up.stderr
    doc = json.loads(up.stdout)
    assert {f["fact"] for f in doc["facts"]} == {"image", "driver", "interface", "ray", "serve"}
    assert all(f["ok"] for f in doc["facts"]), doc["facts"]
    digest = ray_images[0].rpartition("@")[2]
    assert [f["seen"].split()[0] for f in doc["facts"] if f["fact"] == "image"] == [digest, digest]
    status = cli("status", str(recipe), *nodes)
    assert status.returncode == 0, status.stderr
    assert "Ray shows 2 nodes, 2 GPUs" in status.stdout
    assert "answers /health" in status.stdout  # the stand-in vllm joined Ray and found 2 GPUs for TP=2
    assert sorted(leftovers(name)) == [f"spark-images-{name}-head", f"spark-images-{name}-worker-1"]
    down = cli("down", str(recipe), *nodes)
    assert down.returncode == 0, down.stderr
    assert leftovers(name) == []
    after = cli("status", str(recipe), *nodes)
    assert after.returncode == 1 and "absent" in after.stdout


def test_down_removes_only_what_up_started(ray_images: tuple[str, str], cluster_network: str, tmp_path: Path,
                                           cleanup: list[str]) -> None:  # fmt: skip
    """A container of another cluster on the same engine survives `down`."""
    recipe, name = write_recipe(tmp_path, cluster_network)
    cleanup.append(name)
    bystander = f"spark-images-{name}-bystander"
    subprocess.run(["docker", "create", "--name", bystander, "--label", "io.spark-images.cluster=someone-else",
                    ray_images[0], "true"], check=True, capture_output=True)  # fmt: skip
    try:
        down = cli("down", str(recipe), "--node", "local", "--node", "local", "--image", ray_images[0])
        assert down.returncode == 0, down.stderr
        assert "removed nothing" in down.stdout
        kept = subprocess.run(["docker", "inspect", bystander], capture_output=True, check=False)
        assert kept.returncode == 0
    finally:
        subprocess.run(["docker", "rm", "--force", bystander], capture_output=True, check=False)


def test_a_different_digest_on_one_node_is_refused_before_anything_starts(
    ray_images: tuple[str, str], cluster_network: str, tmp_path: Path, cleanup: list[str]
) -> None:
    """A plan stitched from two builds (node 1 names another digest): both pulls are real, `up` exits 1."""
    recipe, name = write_recipe(tmp_path, cluster_network)
    cleanup.append(name)
    planned = cli("plan", str(recipe), "--node", "local", "--node", "local", "--image", ray_images[0], "--json")
    assert planned.returncode == 0, planned.stderr
    doc = json.loads(planned.stdout)
    doc["inputs"]["nodes"][1]["image"] = ray_images[1]
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(doc))
    up = cli("up", str(plan_file))
    assert up.returncode == 1, up.stderr
    lines = [ln for ln in up.stderr.splitlines() if "FAIL" in ln]
    assert len(lines) == 2 and "node 0 (local): image:" in lines[0] and "node 1 (local): image:" in lines[1]
    assert "2 digests" in lines[1] and ray_images[1].rpartition("@")[2] in lines[1]
    assert "Traceback" not in up.stderr
    assert leftovers(name) == []  # refused before any container started


def test_a_worker_that_never_joins_hits_the_deadline_with_the_node_named(
    ray_images: tuple[str, str], cluster_network: str, tmp_path: Path, cleanup: list[str]
) -> None:
    """The worker is sent to an address nobody answers (TEST-NET-1): it keeps trying, `up` gives up."""
    recipe, name = write_recipe(tmp_path, cluster_network, head_address="192.0.2.1", join_timeout_s=25)
    cleanup.append(name)
    up = cli("up", str(recipe), "--node", "local", "--node", "local", "--image", ray_images[0])
    assert up.returncode == 1, up.stderr
    failed = [ln for ln in up.stderr.splitlines() if "FAIL" in ln]
    assert failed, up.stderr
    assert "node 1 (local)" in failed[-1] and "[step: ray join]" in failed[-1] and "after 25 s" in failed[-1]
    assert "vllm serve" not in up.stderr  # stopped before vLLM
    assert leftovers(name) == []  # a failed up removes what it started


def test_a_missing_interface_is_a_failed_fact_before_vllm(
    ray_images: tuple[str, str], cluster_network: str, tmp_path: Path, cleanup: list[str]
) -> None:
    recipe, name = write_recipe(tmp_path, cluster_network, socket_ifname="enp1s0f1np1")
    cleanup.append(name)
    up = cli("up", str(recipe), "--node", "local", "--node", "local", "--image", ray_images[0])
    assert up.returncode == 1, up.stderr
    failed = [ln for ln in up.stderr.splitlines() if ln.startswith("spark-images cluster: FAIL")]
    assert len(failed) == 2, up.stderr
    assert all("interface: enp1s0f1np1 does not exist in the container" in ln for ln in failed)
    assert "vllm serve" not in up.stderr
    assert leftovers(name) == []


@pytest.fixture
def ssh_host(sshd_image: str, tmp_path: Path) -> tuple[str, dict[str, str]]:
    """An sshd container whose docker CLI reaches this engine's socket: (ssh://root@127.0.0.1:PORT, env).

    The env puts a wrapper `ssh` first on PATH that adds this test's key and
    config (the docker CLI runs `ssh ... docker system dial-stdio`); nothing in
    ~/.ssh is touched.
    """
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        pytest.skip("engine unavailable: no OpenSSH client on this host")
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    docker_cli = shutil.which("docker")
    assert docker_cli is not None
    name = f"spark-images-test-sshd-{tmp_path.name[-8:]}"
    subprocess.run(["docker", "run", "--detach", "--name", name, "--publish", "127.0.0.1::22",
                    "--volume", "/var/run/docker.sock:/var/run/docker.sock",
                    "--volume", f"{os.path.realpath(docker_cli)}:/usr/local/bin/docker:ro",
                    "--volume", f"{key}.pub:/root/.ssh/authorized_keys:ro", sshd_image],
                   check=True, capture_output=True)  # fmt: skip
    try:
        port = subprocess.run(["docker", "port", name, "22/tcp"], capture_output=True, text=True,
                              check=True).stdout.split(":")[-1].strip()  # fmt: skip
        config = tmp_path / "ssh_config"
        config.write_text(f"Host 127.0.0.1\n  User root\n  IdentityFile {key}\n  IdentitiesOnly yes\n"
                          "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n")  # fmt: skip
        wrapper = tmp_path / "bin"
        wrapper.mkdir()
        (wrapper / "ssh").write_text(f"#!/bin/sh\nexec {shutil.which('ssh')} -F {config} \"$@\"\n")
        (wrapper / "ssh").chmod(0o755)
        yield f"ssh://root@127.0.0.1:{port}", {**os.environ, "PATH": f"{wrapper}:{os.environ['PATH']}"}
    finally:
        subprocess.run(["docker", "rm", "--force", name], capture_output=True, check=False)


def test_a_worker_over_ssh_joins_the_head(ray_images: tuple[str, str], cluster_network: str, tmp_path: Path,
                                          cleanup: list[str], ssh_host: tuple[str, dict[str, str]]) -> None:  # fmt: skip
    """Node 1's engine is reached as ssh://root@127.0.0.1:PORT (python-on-whales' SSH host)."""
    host, env = ssh_host
    recipe, name = write_recipe(tmp_path, cluster_network)
    cleanup.append(name)
    nodes = ["--node", "local", "--node", host, "--image", ray_images[0]]
    up = cli("up", str(recipe), *nodes, "--no-serve", env=env)
    assert up.returncode == 0, up.stderr
    assert f"node 1 ({host}): pulling" in up.stderr
    assert f"ok   node 1 ({host}): interface: eth0 is up" in up.stdout
    status = cli("status", str(recipe), *nodes, env=env)
    assert "Ray shows 2 nodes, 2 GPUs" in status.stdout, status.stdout + status.stderr
    down = cli("down", str(recipe), *nodes, env=env)
    assert down.returncode == 0, down.stderr
    assert leftovers(name) == []

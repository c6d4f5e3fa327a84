"""Fixtures of the cluster tests: the Ray node images (two digests), a network, an sshd host.

No GPU here: the Ray nodes get their one GPU each from Ray's resource flag
(`ray start --num-gpus 1`, exactly as the plan writes it, which Ray accepts on
a node without a GPU), and `nvidia-smi` / `vllm` are stand-ins in the image
(see stand_ins/). No host network either: the two nodes are containers on a
user-defined Docker network of this engine, and the head is reached by its
container name; the plan for real Sparks uses --network host.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import images  # the folder's own helper module

TEST_CACHE = Path(os.environ.get("SPARK_IMAGES_TEST_CACHE", Path.home() / ".cache" / "spark-images-test"))


@pytest.fixture(scope="session")
def ray_images(docker_engine: None, local_registry: str, pypi_reachable: None,
               tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:  # fmt: skip
    """Two pushed Ray node images, REPOSITORY@sha256:..., that differ only by one label."""
    if not Path("/usr/sbin/debootstrap").exists():
        pytest.skip("engine unavailable: no debootstrap for the amd64 rootfs (run .ci/engine-up.sh)")
    work = tmp_path_factory.mktemp("cluster-images")
    return images.ray_image(TEST_CACHE, work, local_registry, "a"), images.ray_image(TEST_CACHE, work, local_registry, "b")


@pytest.fixture
def cluster_network() -> Iterator[str]:
    """A user-defined network standing in for the Sparks' host network (see the module docstring)."""
    name = f"spark-images-cluster-{uuid.uuid4().hex[:8]}"
    subprocess.run(["docker", "network", "create", name], check=True, capture_output=True)
    yield name
    subprocess.run(["docker", "network", "rm", name], check=False, capture_output=True)


def write_recipe(folder: Path, network: str, **cluster: object) -> tuple[Path, str]:
    """A recipe for a two-container cluster on `network`; returns (path, cluster name)."""
    name = f"t{uuid.uuid4().hex[:8]}"
    section = {
        "name": name,
        "network": network,
        "gpus": None,  # no GPU to request; Ray's --num-gpus 1 fakes one per node
        "devices": [],  # no RoCE devices here
        "shm_size": "256m",
        "socket_ifname": "eth0",  # the container's interface on the user-defined network
        "ib_hca": "none",
        "head_address": f"spark-images-{name}-head",  # the network's DNS: the head by container name
        "hf_cache": str(folder / "hf"),
        "join_timeout_s": 240,
        "serve_timeout_s": 180,
        "pull_timeout_s": 300,
        **cluster,
    }
    doc = {  # a whole recipe, as recipes.model reads it
        "name": "pair", "status": "unvalidated", "profiles": ["cu130"],
        "model": {"hub": "test/tiny-model", "revision": "0" * 40, "quantization": "bf16", "moe": False},
        "serve": {"args": []},
        "limits": {"max_model_len": 1024, "max_num_seqs": 2, "gpu_memory_utilization": 0.5, "kv_cache_dtype": "auto"},
        "expect": {"decode_tok_s": {"value": None, "source": "a test"}, "memory_gib": {"value": None, "source": "a test"}},
        "cluster": section,
    }  # fmt: skip
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=True))
    return path, name


@pytest.fixture(scope="session")
def sshd_image(docker_engine: None, tmp_path_factory: pytest.TempPathFactory) -> str:
    if not Path("/usr/sbin/debootstrap").exists():
        pytest.skip("engine unavailable: no debootstrap for the amd64 rootfs (run .ci/engine-up.sh)")
    return images.sshd_image(TEST_CACHE, tmp_path_factory.mktemp("sshd-image"))

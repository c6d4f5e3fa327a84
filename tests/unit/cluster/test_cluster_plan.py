"""`cluster plan`: golden for a profile and a recipe, deterministic, and one line per bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from spark_images.cluster.plan import plan_from_json
from support import paths

ROOT = Path(__file__).resolve().parents[3]
DATA = paths.DATA / "cluster"
RECIPE = "tests/data/cluster/qwen3-235b-tp2.yaml"
IMAGE = "ghcr.io/spark-images/spark-vllm@sha256:5dc1bca23d05bd37b011be68ec470c03b403a5da07ec3a86e41af9470e9d0cc6"
NODES = ["--node", "ssh://spark@spark1=169.254.10.1", "--node", "ssh://spark@spark2=169.254.10.2"]


def plan(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spark_images", "cluster", "plan", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60, env=env, check=False)  # fmt: skip


def test_the_recipe_plan_is_the_golden_document() -> None:
    out = plan(RECIPE, *NODES, "--image", IMAGE, "--json")
    assert out.returncode == 0, out.stderr
    assert out.stdout == (DATA / "plan-recipe.golden.json").read_text()


def test_the_profile_plan_is_the_golden_text_with_spark_defaults() -> None:
    out = plan("profiles/cu130.yaml", *NODES, "--image", IMAGE)
    assert out.returncode == 0, out.stderr
    assert out.stdout == (DATA / "plan-profile.golden.txt").read_text()
    head = out.stdout.splitlines()[5]
    for part in ("--network host --ipc host --gpus all --shm-size 16g --device /dev/infiniband",
                 "--env NCCL_SOCKET_IFNAME=enp1s0f1np1", "--env GLOO_SOCKET_IFNAME=enp1s0f1np1",
                 "--env NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1", f"{IMAGE} start --head --port 6379 --num-gpus 1"):  # fmt: skip
        assert part in head


def test_the_recipe_plan_says_what_each_node_runs() -> None:
    doc = json.loads(plan(RECIPE, *NODES, "--image", IMAGE, "--json").stdout)
    head, worker = doc["nodes"]
    assert head["ray"][:5] == ["ray", "start", "--head", "--port", "6380"]
    assert worker["ray"][:4] == ["ray", "start", "--address", "169.254.10.1:6380"]
    assert "--num-gpus" in worker["ray"] and worker["ray"][worker["ray"].index("--num-gpus") + 1] == "1"
    assert doc["serve"][-4:] == ["--tensor-parallel-size", "2", "--distributed-executor-backend", "ray"]
    assert worker["volumes"] == ["/home/spark/.cache/huggingface:/root/.cache/huggingface"]
    assert worker["env"]["VLLM_HOST_IP"] == "169.254.10.2" and worker["env"]["NCCL_DEBUG"] == "WARN"


def test_the_plan_does_not_depend_on_cwd_time_zone_or_locale(tmp_path: Path) -> None:
    env = {**os.environ, "TZ": "Asia/Kolkata", "LC_ALL": "C", "PYTHONHASHSEED": "7"}
    out = plan(str(ROOT / RECIPE), *NODES, "--image", IMAGE, "--json", cwd=tmp_path, env=env)
    golden = json.loads((DATA / "plan-recipe.golden.json").read_text())
    doc = json.loads(out.stdout)
    assert doc["inputs"]["source"].pop("path") != golden["inputs"]["source"].pop("path")  # as given
    assert doc == golden


def test_a_plan_file_rebuilds_the_same_plan() -> None:
    golden = json.loads((DATA / "plan-recipe.golden.json").read_text())
    assert plan_from_json(golden, "plan.json").to_json() == golden


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        ((RECIPE, "--node", "ssh://a", "--image", IMAGE), 2, "at least two --node"),
        ((RECIPE, *NODES, "--image", "ghcr.io/x/y:latest"), 2, "not pinned by digest"),
        ((RECIPE, *NODES, "--lock", "no-such.lock.json"), 2, "no such lock file"),
        (("profiles/nope.yaml", *NODES, "--image", IMAGE), 2, "no such profile or recipe"),
        ((RECIPE, "--node", "ftp://a", "--node", "b", "--image", IMAGE), 2, "unknown scheme"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(args: tuple[str, ...], code: int, needle: str) -> None:
    out = plan(*args)
    assert out.returncode == code
    assert needle in out.stderr and len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def _recipe(tmp_path: Path, **over: object) -> Path:
    """The fixture recipe (a full, valid recipe) with some top-level sections replaced."""
    doc = yaml.safe_load((ROOT / RECIPE).read_text())
    doc.update(over)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_bad_cluster_section_names_each_field(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, cluster={"ray_port": 70000, "socket_ifnam": "eth0"})
    out = plan(str(recipe), *NODES, "--image", IMAGE)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 2
    assert "cluster.ray_port: bad value" in lines[0] and "a port 1-65535" in lines[0]
    assert "cluster.socket_ifnam: unknown key" in lines[1]


def test_serve_args_may_not_set_what_the_plan_decides(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, serve={"args": ["--tensor-parallel-size", "4"]})
    out = plan(str(recipe), *NODES, "--image", IMAGE)
    assert out.returncode == 1 and "serve.args: sets --tensor-parallel-size" in out.stderr


def test_the_readme_table_lists_every_cluster_setting_with_its_default() -> None:
    from spark_images.profiles.cluster import DEFAULTS

    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Multi-Spark"):readme.index("## Local engine")]
    for key, (default, _meaning) in DEFAULTS.items():
        shown = "null" if default is None else f"`{default!r}`".replace("'", "")
        assert f"| `{key}` | {shown} |" in section, key

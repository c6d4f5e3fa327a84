"""The hash lock split into site-packages layers: each package in exactly one, the
lock's own lines kept, one installer stage per layer, and a path in two layers refused."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from spark_images import defaults
from spark_images.buildline import render
from spark_images.buildline.resolve import resolve_profile
from spark_images.core.errors import UsageError
from spark_images.profiles import reqlock

REPO = Path(__file__).resolve().parents[3]
CU130 = REPO / "profiles" / "cu130.yaml"
LOCK = REPO / "profiles" / "cu130.requirements.lock"
_HASH = re.compile(r"sha256:[0-9a-f]{64}")

SMALL_LOCK = """\
# header comment
--index-url https://pypi.org/simple
six==1.17.0 \\
    --hash=sha256:4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274
    # via demo
torch @ https://example.test/torch-2.13.0-cp312-cp312-manylinux_2_28_aarch64.whl \\
    --hash=sha256:""" + "a" * 64 + """

# a comment between entries
Nvidia_CuBLAS==13.1.1.3 \\
    --hash=sha256:""" + "b" * 64 + """
"""


def test_every_package_of_the_shipped_lock_is_in_exactly_one_layer() -> None:
    text = LOCK.read_text()
    layers = reqlock.layered(text, defaults.LOCK_LAYERS, defaults.LAST_LAYER)
    names = [name for _, packages in layers for name in packages]
    assert sorted(names) == sorted(reqlock.pinned_versions(text)) and len(names) == len(set(names)) == 197
    assert [layer for layer, _ in layers] == ["cuda-math", "torch", "cuda", "python"]
    by_layer = dict(layers)
    assert "torch" in by_layer["torch"] and "nvidia-cublas" in by_layer["cuda-math"]
    assert "nvidia-cudnn-cu13" in by_layer["cuda"] and "nvidia-cusparselt-cu13" in by_layer["cuda"]
    # both ship a top-level build_backend.py (different bytes): one layer, as one pip install
    assert {"torch-c-dlpack-ext", "flashinfer-python"} <= set(by_layer["python"])
    # the split files together carry exactly the lock's hashes, each once
    parts = [reqlock.split(text, packages, "# part") for _, packages in layers]
    found = [h for part in parts for h in _HASH.findall(part)]
    assert sorted(found) == sorted(_HASH.findall(text)) and len(found) == len(set(found))
    assert [reqlock.pinned_versions(p) for p in parts] == [
        {n: v for n, v in reqlock.pinned_versions(text).items() if n in dict(layers)[layer]} for layer, _ in layers
    ]


def test_entries_keep_continuations_and_options_and_drop_comments() -> None:
    options, found = reqlock.entries(SMALL_LOCK)
    assert options == ["--index-url https://pypi.org/simple"]
    assert [name for name, _ in found] == ["six", "torch", "nvidia-cublas"]
    assert found[0][1].splitlines() == [
        "six==1.17.0 \\", "    --hash=sha256:4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274", "    # via demo"
    ]
    assert "# a comment" not in found[1][1] and found[1][1].endswith("a" * 64)
    part = reqlock.split(SMALL_LOCK, ["nvidia-cublas"], "# the cuda-math part")
    assert part == "# the cuda-math part\n--index-url https://pypi.org/simple\nNvidia_CuBLAS==13.1.1.3 \\\n    --hash=sha256:" + "b" * 64 + "\n"


def test_the_first_matching_layer_wins_and_the_rest_go_last() -> None:
    layers = (("a", ("nvidia-cu*",)), ("b", ("nvidia-*", "torch")))
    assert reqlock.layer_of("nvidia-cublas", layers, "rest") == "a"
    assert reqlock.layer_of("nvidia-nccl-cu13", layers, "rest") == "b"
    assert reqlock.layer_of("torch", layers, "rest") == "b"
    assert reqlock.layer_of("torchvision", layers, "rest") == "rest"
    assert reqlock.layered(SMALL_LOCK, layers, "rest") == (("a", ("nvidia-cublas",)), ("b", ("torch",)), ("rest", ("six",)))


def test_the_context_carries_one_lock_file_per_layer_and_the_dockerfile_one_stage_each() -> None:
    resolved = resolve_profile(CU130)
    plan = resolved.plan
    contents = render.context_contents(plan, resolved.base_dir)
    assert "requirements.lock" not in contents
    files = sorted(name for name in contents if name.startswith("requirements/"))
    assert files == sorted(f"requirements/{layer}.lock" for layer, _ in plan.lock_layers)
    dockerfile = contents["Dockerfile"].decode()
    stages = re.findall(r"^FROM installer AS (installer-\S+)$", dockerfile, re.M)
    assert stages == [f"installer-{layer}" for layer, _ in plan.lock_layers] + ["installer-vllm", "installer-checked"]
    copies = re.findall(r"^COPY --from=(installer-\S+) /opt/spark/layers/(\S+)/site/ ", dockerfile, re.M)
    assert copies == [(f"installer-{layer}", layer) for layer, _ in plan.lock_layers]
    mounts = re.findall(r"--mount=type=bind,from=(installer-[^,]+),", dockerfile)
    assert mounts == [f"installer-{layer}" for layer, _ in plan.lock_layers] + ["installer-vllm"]
    assert plan.to_json()["lock_layers"][0] == {"name": plan.lock_layers[0][0], "packages": list(plan.lock_layers[0][1])}


def test_a_lock_changed_after_planning_is_refused(tmp_path: Path) -> None:
    resolved = resolve_profile(CU130)
    project = tmp_path / "p"
    (project / "profiles").mkdir(parents=True)
    (project / "profiles" / LOCK.name).write_text(LOCK.read_text().replace("six==", "six-renamed=="))
    with pytest.raises(UsageError, match="changed since it was planned"):
        render.context_contents(resolved.plan, project)


def _layer_check_script() -> str:
    """The shell the installer-checked stage runs, from the rendered Dockerfile, with its
    paths (/layers, /tmp, /opt/spark/bin) moved under $ROOT."""
    dockerfile = render.render_dockerfile(resolve_profile(CU130).plan)
    step = dockerfile.split("FROM installer AS installer-checked\n", 1)[1].split("\n\n", 1)[0]
    lines = [line.strip().removesuffix("\\").strip() for line in step.splitlines()]
    body = [line.removeprefix("&& ") for line in lines if not line.startswith(("RUN --mount", "--mount"))]
    script = " && ".join(body)
    for path in ("/layers", "/tmp/paths.txt", "/opt/spark/bin"):
        script = script.replace(path, "$ROOT" + path)
    return script


def _layers(root: Path, files: dict[str, list[str]]) -> None:
    for layer in ("cuda-math", "torch", "cuda", "python", "vllm"):
        for sub in ("site", "bin"):
            (root / "layers" / layer / sub).mkdir(parents=True, exist_ok=True)
    (root / "tmp").mkdir()
    for layer, paths in files.items():
        for rel in paths:
            (root / "layers" / layer / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / "layers" / layer / rel).write_text(f"{layer}:{rel}\n")


def _run(script: str, root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-o", "pipefail", "-euc", script], env={"ROOT": str(root), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True)  # fmt: skip


def test_the_layer_check_refuses_a_path_in_two_layers_and_gathers_the_scripts(tmp_path: Path) -> None:
    script = _layer_check_script()
    ok, bad = tmp_path / "ok", tmp_path / "bad"
    _layers(ok, {"cuda": ["site/nvidia/cu13/lib/a.so"], "python": ["site/six.py", "bin/demo"], "vllm": ["site/vllm/x.py", "bin/vllm"]})
    _layers(bad, {"python": ["site/build_backend.py"], "torch": ["site/build_backend.py", "site/torch/x.py"]})
    passed = _run(script, ok)
    assert passed.returncode == 0, passed.stderr + passed.stdout
    assert (ok / "opt" / "spark" / "bin" / "demo").read_text() == "python:bin/demo\n"
    assert not (ok / "opt" / "spark" / "bin" / "vllm").exists()  # vLLM's own script comes with vLLM, in the runtime stage
    refused = _run(script, bad)
    assert refused.returncode == 1
    assert refused.stdout.strip() == (
        "spark-images: site/build_backend.py is in two lock layers (python, torch): "
        "put both packages in one layer (spark_images.defaults.LOCK_LAYERS)"
    )

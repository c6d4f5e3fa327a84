"""Rendering: golden bytes, determinism, and BuildKit's own parser on the output."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import dockerfile
import pytest

from spark_images.buildline.render import render_dockerfile, write_render
from spark_images.buildline.resolve import resolve_profile
from support.paths import GOLDEN

REPO = Path(__file__).resolve().parents[3]
PROFILES = sorted((REPO / "profiles").glob("*.yaml"))
IDS = [p.stem for p in PROFILES]


@pytest.mark.parametrize("profile", PROFILES, ids=IDS)
def test_render_equals_golden(profile: Path) -> None:
    rendered = render_dockerfile(resolve_profile(profile).plan)
    golden = (GOLDEN / f"{profile.stem}.Dockerfile").read_text()
    assert rendered == golden, "re-render changed the Dockerfile: run `nox -s golden` and review the diff"


@pytest.mark.parametrize("profile", PROFILES, ids=IDS)
def test_render_is_deterministic_across_cwd_tz_locale(profile: Path, tmp_path: Path) -> None:
    first = render_dockerfile(resolve_profile(profile).plan)
    assert first == render_dockerfile(resolve_profile(profile).plan)
    env = {**os.environ, "TZ": "Pacific/Kiritimati", "LC_ALL": "C", "LANG": "C", "PYTHONHASHSEED": "12345"}
    out = tmp_path / "ctx"
    relative = os.path.relpath(profile, tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "spark_images", "render", relative, "-o", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert (out / "Dockerfile").read_text() == first
    stdout = subprocess.run(
        [sys.executable, "-m", "spark_images", "render", str(profile)],
        cwd="/", env={**env, "TZ": "America/Adak", "LC_ALL": "C.UTF-8"}, capture_output=True, check=True,
    ).stdout
    assert hashlib.sha256(stdout).hexdigest() == hashlib.sha256(first.encode()).hexdigest()
    plan = json.loads((out / "plan.json").read_text())
    assert plan["profile_path"] == f"profiles/{profile.name}"


def _parsed(profile: Path) -> tuple[list[dockerfile.Command], dict]:
    resolved = resolve_profile(profile)
    text = render_dockerfile(resolved.plan)
    return list(dockerfile.parse_string(text)), resolved.plan.to_json() | {"_text": text}


@pytest.mark.parametrize("profile", PROFILES, ids=IDS)
def test_every_from_is_digest_pinned(profile: Path) -> None:
    commands, plan = _parsed(profile)
    stages: set[str] = set()
    froms = [c for c in commands if c.cmd == "FROM"]
    assert froms, "no FROM at all"
    for command in froms:
        image = command.value[0]
        if image not in stages:
            assert re.search(r"@sha256:[0-9a-f]{64}$", image), f"FROM {image} is not pinned by digest"
            assert image.split("@")[0] == plan["base_name"]
            assert ":latest" not in image
        if len(command.value) == 3 and command.value[1].upper() == "AS":
            stages.add(command.value[2])
    assert "latest" not in plan["_text"].lower().replace("latest-", "")
    assert not re.search(r"(?im)^#\s*syntax\s*=", plan["_text"]), "a syntax line would pull a frontend image"


@pytest.mark.parametrize("profile", PROFILES, ids=IDS)
def test_arch_list_and_pins_match_the_plan(profile: Path) -> None:
    commands, plan = _parsed(profile)
    envs: dict[str, str] = {}
    for command in commands:
        if command.cmd == "ENV":
            pairs = command.value
            envs.update({pairs[i]: pairs[i + 1].strip('"') for i in range(0, len(pairs), 2)})
    assert envs["TORCH_CUDA_ARCH_LIST"] == plan["arch_list"]
    assert envs["TRITON_PTXAS_PATH"] == f"{plan['cuda_home']}/bin/ptxas"
    words = {w for c in commands if c.cmd == "RUN" for w in shlex.split(c.value[0])}
    if plan["requirements_lock"]:
        # the hash lock installs the pins (validate refuses a lock that differs);
        # no constraints file is written that nothing would read
        assert "/tmp/spark/constraints.txt" not in plan["_text"]
    else:
        for name, version in plan["pins"].items():
            assert f"{name}=={version}" in words, f"pin {name}=={version} missing from every RUN line"
    labels: dict[str, str] = {}
    for command in commands:
        if command.cmd == "LABEL":
            pairs = command.value
            labels.update({pairs[i]: pairs[i + 1].strip('"') for i in range(0, len(pairs), 2)})
    assert labels["io.spark-images.arch-list"] == plan["arch_list"]
    assert labels["io.spark-images.vllm.commit"] == plan["vllm_commit"]
    assert labels["org.opencontainers.image.base.digest"] == plan["base_digest"]
    assert labels["io.spark-images.pins"] == ",".join(f"{k}=={v}" for k, v in sorted(plan["pins"].items()))
    for key in ("source", "revision", "version", "created", "base.name", "base.digest"):
        assert f"org.opencontainers.image.{key}" in labels
    entry = next(c for c in commands if c.cmd == "ENTRYPOINT")
    assert list(entry.value[:2]) == ["vllm", "serve"]


@pytest.mark.parametrize("profile", PROFILES, ids=IDS)
def test_network_steps_take_the_ca_secret_and_runtime_keeps_nvcc(profile: Path) -> None:
    commands, plan = _parsed(profile)
    network_words = ("apt-get", "pip install", "git fetch")
    for command in commands:
        if command.cmd == "RUN" and any(w in command.value[0] for w in network_words):
            mounts = [f for f in command.flags if f.startswith("--mount=type=secret,id=cacert")]
            assert mounts, f"network step without the CA secret: {command.original[:80]}"
    froms = [c.value for c in commands if c.cmd == "FROM"]
    # runtime descends from the toolchain stage on the devel base (nvcc for FlashInfer JIT)
    assert froms[-1][0] == "deps" and froms[-1][2] == "runtime"
    assert "devel" in plan["base_name"]


def test_source_strategy_verifies_the_commit() -> None:
    cu129 = REPO / "profiles" / "cu129.yaml"
    commands, plan = _parsed(cu129)
    text = plan["_text"]
    assert plan["strategy"] == "source"
    assert f'[ "$head" = {shlex.quote(plan["vllm_commit"])} ]' in text
    assert "git rev-parse HEAD" in text
    assert "use_existing_torch.py" in text
    assert any(c.cmd == "RUN" and any("type=cache" in f for f in c.flags) for c in commands), "no ccache mount"


def test_the_context_modes_do_not_follow_the_umask(tmp_path: Path) -> None:
    """COPY keeps a context file's mode (plan.json lands in the image): under umask 077
    the context is still 0644 files in 0755 folders, so the digest does not move."""
    resolved = resolve_profile(REPO / "profiles" / "cu130.yaml")
    old = os.umask(0o077)
    try:
        write_render(resolved.plan, tmp_path / "ctx", resolved.base_dir)
    finally:
        os.umask(old)
    tree = [tmp_path / "ctx", *(tmp_path / "ctx").rglob("*")]
    modes = {p.relative_to(tmp_path).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in tree}
    assert modes["ctx/plan.json"] == modes["ctx/requirements/torch.lock"] == 0o644
    assert modes["ctx"] == modes["ctx/requirements"] == 0o755
    assert {m for p, m in modes.items() if (tmp_path / p).is_file()} == {0o644}

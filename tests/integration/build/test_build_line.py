"""The build line on a real engine: build, push, lock; gates that fail; repro; Ctrl-C.

Each test drives the `spark-images` CLI in a subprocess inside a scratch
project (profiles/, images.lock.json, build/), against the loopback registry
and a CUDA test base pinned there by digest (see conftest.py).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
import zstandard

from support.build_helpers import (
    CA_BUNDLE,
    CLI,
    TEST_EPOCH,
    LineProject,
    cli_env,
    ctrl_c_as_at_a_terminal,
)

pytestmark = [pytest.mark.engine, pytest.mark.registry, pytest.mark.nvcc, pytest.mark.network, pytest.mark.slow]

SM121 = ["-gencode=arch=compute_121a,code=sm_121a"]
SM90 = ["-gencode=arch=compute_90,code=sm_90"]
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _record(project: LineProject, name: str) -> dict[str, Any]:
    return json.loads((project.root / "build" / name / "record.json").read_text())


def _registry_digest(registry: str, repo: str, ref: str) -> str:
    resp = requests.head(f"http://{registry}/v2/{repo}/manifests/{ref}", headers={"Accept": MANIFEST}, timeout=30)
    resp.raise_for_status()
    return resp.headers["Docker-Content-Digest"]


@pytest.fixture(scope="module")
def ca_bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The host's bundle plus a CA made now: (bundle path, that CA's PEM body).

    The host bundle is what lets the build reach PyPI through a TLS proxy; the
    fresh CA is a marker no image layer could contain unless the bundle leaked.
    """
    if shutil.which("openssl") is None:
        pytest.skip("openssl unavailable to make a marker CA")
    work = tmp_path_factory.mktemp("ca")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=spark-images test marker CA", "-keyout", str(work / "k.pem"), "-out", str(work / "c.pem")],
        check=True, capture_output=True,
    )  # fmt: skip
    marker = (work / "c.pem").read_text()
    bundle = work / "bundle.pem"
    bundle.write_text((CA_BUNDLE.read_text() if CA_BUNDLE.is_file() else "") + marker)
    body = "".join(line for line in marker.splitlines() if not line.startswith("-----"))
    return bundle, body


@pytest.fixture(scope="module")
def passing(make_project: Callable[..., LineProject]) -> LineProject:
    return make_project("line", SM121)


@pytest.fixture(scope="module")
def first_build(passing: LineProject, ca_bundle: tuple[Path, str], local_registry: str) -> subprocess.CompletedProcess[str]:
    return passing.run(
        "build", "profiles/line.yaml", "--push", f"{local_registry}/spark-images-test/line",
        "--ca-cert", str(ca_bundle[0]), "--lock", str(passing.lock), "--cache", "bkcache",
    )  # fmt: skip


def test_build_pushes_by_digest_and_writes_the_lock(
    first_build: subprocess.CompletedProcess[str], passing: LineProject, local_registry: str
) -> None:
    assert first_build.returncode == 0, first_build.stdout + first_build.stderr[-3000:]
    record = _record(passing, "line")
    digest = record["build"]["digest"]
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest)
    # the buildx metadata digest is the registry's digest of what was pushed
    assert _registry_digest(local_registry, "spark-images-test/line", digest) == digest
    assert record["build"]["registry_digest"] == digest
    lock = json.loads(passing.lock.read_text())
    entry = lock["images"]["line"]
    assert entry["image"] == f"{local_registry}/spark-images-test/line@{digest}"
    assert entry["digest"] == digest
    assert entry["cubins"]["verdict"] == record["cubins"]["verdict"]
    assert record["cubins"]["status"] == "passed"
    assert record["coherence"]["status"] == "skipped" and "sm_121" in record["coherence"]["reason"]
    assert entry["coherence"] == {"status": "skipped", "reason": record["coherence"]["reason"]}
    assert entry["audit"]["status"] == record["audit"]["status"]
    # the record's verdict is `check` of the built archive, from the cubin stage's one read: the
    # test image installs the CUDA torch stand-in (build_helpers.make_torch_wheel), so torch is
    # proven from its files; it lacks vLLM's MoE library, which makes it degraded, and no more
    verdict = record["verdict"]
    assert verdict["kind"] == "oci-archive" and verdict["digest"] == digest
    assert verdict["verdict"] == "degraded", verdict["reasons"]
    assert {(r["impact"], r["rule"]) for r in verdict["reasons"]} == {("degraded", "no-native-moe-kernels")}, verdict["reasons"]
    assert verdict["status"] == "passed" and verdict["warnings"] == [r["line"] for r in verdict["reasons"]]
    assert verdict["inventory"]["torch"] == {"version": "2.13.0", "cuda": "13.0"}
    libs = {lib["path"].rsplit("site-packages/", 1)[-1]: lib for lib in verdict["device_code"]["libraries"]}
    assert libs["vllm/_C.abi3.so"]["native"] and libs["torch/lib/libtorch_cuda.so"]["verdict"] == "native"
    # the build's own audit is the check's `fixes` (the history is not read twice)
    assert (verdict["fixes"]["status"] == "skipped") == (record["audit"]["status"] == "skipped"), verdict["fixes"]
    report_md = (passing.root / "build" / "line" / "report.md").read_text()
    assert f"**{verdict['verdict']}**" in report_md and "no-native-moe-kernels" in report_md
    assert entry["created"] == "2026-01-01T00:00:00Z" and entry["source_date_epoch"] == int(TEST_EPOCH)
    assert entry["arch_list"] == "12.0f" and entry["cuda_line"] == "cu130"
    # the BuildKit cache went to the local directory given with --cache
    assert json.loads((passing.root / "bkcache" / "index.json").read_text())["manifests"]
    # the summary and the Markdown report name every stage
    for stage in ("validate", "audit", "render", "build", "cubins", "coherence", "lock"):
        assert stage in first_build.stdout
    assert digest in (passing.root / "build" / "line" / "report.md").read_text()
    # the local engine holds exactly the built image
    local = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", record["build"]["local_image"]],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert local.stdout.strip() == digest


def _layer_members(registry: str, repo: str, digest: str) -> list[tuple[str, bytes]]:
    manifest = requests.get(
        f"http://{registry}/v2/{repo}/manifests/{digest}", headers={"Accept": MANIFEST}, timeout=30
    ).json()
    out: list[tuple[str, bytes]] = []
    for layer in manifest["layers"]:
        blob = requests.get(f"http://{registry}/v2/{repo}/blobs/{layer['digest']}", timeout=300).content
        if blob[:2] == b"\x1f\x8b":
            raw = gzip.decompress(blob)
        elif blob[:4] == b"\x28\xb5\x2f\xfd":  # zstd: the layers the build line exports
            raw = zstandard.ZstdDecompressor().decompressobj().decompress(blob)
        else:
            raw = blob
        with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
            for info in tar:
                data = tar.extractfile(info).read() if info.isfile() else b""  # type: ignore[union-attr]
                out.append((info.name, data))
    return out


def test_ca_bundle_lands_in_no_layer(
    first_build: subprocess.CompletedProcess[str], passing: LineProject, ca_bundle: tuple[Path, str], local_registry: str
) -> None:
    assert first_build.returncode == 0
    digest = _record(passing, "line")["build"]["digest"]
    members = _layer_members(local_registry, "spark-images-test/line", digest)
    assert len(members) > 1000  # every layer, base included, was read
    marker = ca_bundle[1].encode()
    bundle = ca_bundle[0].read_bytes()
    for name, data in members:
        assert not name.lstrip("./").startswith("run/secrets"), name
        assert marker[:64] not in data, f"{name} carries the CA bundle"
        assert data != bundle, name


def test_locked_wheels_are_unpacked_natively_with_the_images_interpreter(
    first_build: subprocess.CompletedProcess[str], passing: LineProject, local_registry: str
) -> None:
    """The installer stage ran on the host's platform and left only the unpacked wheels:
    no installer venv, no .pyc, console scripts that name the image's interpreter (and
    run, under emulation here), and the arm64 checks did run (pip check, import vllm)."""
    assert first_build.returncode == 0
    record = _record(passing, "line")
    digest = record["build"]["digest"]
    members = dict(_layer_members(local_registry, "spark-images-test/line", digest))
    names = [n.lstrip("./") for n in members]
    site = "opt/venv/lib/python3.11/site-packages/"
    assert f"{site}six.py" in names and f"{site}vllm/_version.py" in names
    assert not [n for n in names if n.startswith("opt/installer") or n.startswith("opt/spark/")]
    # nothing the installer unpacked carries bytecode (the venv's own pip, made by
    # ensurepip in the toolchain stage, is not the installer's)
    unpacked = [n for n in names if n.startswith((f"{site}vllm", f"{site}six"))]
    assert unpacked and not [n for n in unpacked if n.endswith(".pyc") or "__pycache__" in n]
    script = next(data for name, data in members.items() if name.lstrip("./") == "opt/venv/bin/vllm-test-probe")
    assert script.splitlines()[0] == b"#!/opt/venv/bin/python"
    ran = subprocess.run(
        ["docker", "run", "--rm", "--platform", "linux/arm64", "--entrypoint", "vllm-test-probe", record["build"]["local_image"]],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert ran.returncode == 0 and ran.stdout.strip() == "0.29.0", ran.stderr
    log = (passing.root / "build" / "line" / "build.log")
    text = log.read_text() if log.is_file() else first_build.stderr
    assert re.search(r"\[(linux/\S+ )?installer-python \d+/\d+\]", text) and "--platform manylinux_2_28_aarch64" in text
    assert "pip check" in text and "import vllm" in text


def test_two_builds_without_cache_give_one_digest(
    first_build: subprocess.CompletedProcess[str], passing: LineProject, ca_bundle: tuple[Path, str]
) -> None:
    assert first_build.returncode == 0
    proc = passing.run("verify-repro", "profiles/line.yaml", "--ca-cert", str(ca_bundle[0]), "--json", "--quiet")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0, json.dumps(doc.get("differences", doc))[:3000]
    assert doc["reproducible"] is True
    first, second = doc["digests"]
    assert first == second == _record(passing, "line")["build"]["digest"]


def test_missing_sm121_code_fails_the_cubin_gate_and_leaves_the_lock(
    make_project: Callable[..., LineProject], ca_bundle: tuple[Path, str], local_registry: str
) -> None:
    project = make_project("sm90", SM90)
    project.lock.write_text('{"images": {}, "lock_version": 1}\n')
    before = project.lock.read_bytes()
    proc = project.run(
        "build", "profiles/sm90.yaml", "--push", f"{local_registry}/spark-images-test/sm90",
        "--ca-cert", str(ca_bundle[0]), "--lock", str(project.lock),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    record = _record(project, "sm90")
    assert record["build"]["status"] == "passed"
    assert record["cubins"]["status"] == "failed"
    assert "vllm/_C.abi3.so" in record["cubins"]["reason"]
    assert "coherence" not in record and "lock" not in record  # the line stopped at the gate
    assert record["result"]["reason"].startswith("stage cubins:")
    assert "cubins" in proc.stdout and "FAILED" in proc.stdout
    assert project.lock.read_bytes() == before


def test_a_cpu_only_torch_is_a_failed_verdict_that_leaves_the_lock(
    make_project: Callable[..., LineProject], ca_bundle: tuple[Path, str]
) -> None:
    """torch without CUDA (torch.version.cuda None, no libtorch_cuda.so): the cubin gate passes
    (vllm/_C has sm_121a code), but vLLM cannot use the GPU, so the verdict is broken naming
    torch, its stage failed, and the lock is not written."""
    project = make_project("cputorch", SM121, torch="cpu")
    project.lock.write_text('{"images": {}, "lock_version": 1}\n')
    before = project.lock.read_bytes()
    proc = project.run("build", "profiles/cputorch.yaml", "--ca-cert", str(ca_bundle[0]), "--lock", str(project.lock))
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    record = _record(project, "cputorch")
    assert record["build"]["status"] == "passed" and record["cubins"]["status"] == "passed"
    verdict = record["verdict"]
    assert verdict["verdict"] == "broken" and verdict["status"] == "failed"
    broken = {r["rule"] for r in verdict["reasons"] if r["impact"] == "broken"}
    assert broken == {"torch-no-cuda", "torch-no-gpu-code"}, verdict["reasons"]
    assert "[torch-no-cuda]" in verdict["reason"] and "[torch-no-gpu-code]" in verdict["reason"]
    assert verdict["inventory"]["torch"] == {"version": "2.13.0", "cuda": None}
    assert "coherence" not in record and "lock" not in record  # the line stopped at the verdict
    assert record["result"]["reason"].startswith("stage verdict:")
    assert "verdict" in proc.stdout and "FAILED" in proc.stdout
    assert project.lock.read_bytes() == before


def test_an_unproven_required_fix_leaves_the_lock(
    make_project: Callable[..., LineProject], ca_bundle: tuple[Path, str]
) -> None:
    project = make_project("needsfix", SM121, required=[40082])
    proc = project.run("build", "profiles/needsfix.yaml", "--ca-cert", str(ca_bundle[0]), "--lock", str(project.lock))
    assert proc.returncode == 1, proc.stderr[-3000:]
    record = _record(project, "needsfix")
    assert record["audit"]["status"] in ("skipped", "failed")
    if record["audit"]["status"] == "skipped":
        assert record["lock"]["status"] == "skipped"
        assert "#40082" in record["lock"]["reason"]
    assert not project.lock.exists()


def test_dry_run_renders_and_builds_nothing(passing: LineProject) -> None:
    proc = passing.run("build", "profiles/line.yaml", "--dry-run", "--lock", str(passing.root / "dry.lock.json"))
    assert proc.returncode == 0, proc.stderr
    assert (passing.root / "build" / "line" / "context" / "Dockerfile").is_file()
    assert "dry run" in proc.stdout
    assert not (passing.root / "dry.lock.json").exists()


def test_no_engine_exits_2_with_the_fix(passing: LineProject, tmp_path: Path) -> None:
    proc = passing.run(
        "build", "profiles/line.yaml", "--lock", str(tmp_path / "l.json"), "--build-dir", str(tmp_path / "b"),
        env={"DOCKER_HOST": f"unix://{tmp_path}/no-such.sock"},
    )  # fmt: skip
    assert proc.returncode == 2
    assert "engine" in proc.stdout and "engine-up.sh" in proc.stdout
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "l.json").exists()


def _buildx_children(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "buildx" in cmdline and marker in cmdline:
            pids.append(int(entry.name))
    return pids


def test_interrupt_leaves_no_partial_record_or_lock(
    make_project: Callable[..., LineProject], ca_bundle: tuple[Path, str]
) -> None:
    project = make_project("interrupted", SM121)
    proc = subprocess.Popen(
        [sys.executable, "-c", CLI, "build", "profiles/interrupted.yaml", "--no-cache",
         "--ca-cert", str(ca_bundle[0]), "--lock", str(project.lock)],
        cwd=project.root, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=ctrl_c_as_at_a_terminal,
    )  # fmt: skip
    assert proc.stderr is not None
    deadline = time.monotonic() + 300
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if re.match(r"#\d+ \[toolchain \d+/\d+\] RUN ", line) or time.monotonic() > deadline:
            break
    assert _buildx_children(str(project.root)), "the build was not running when interrupted"
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(seen)[-2000:] + err[-2000:]
    build_dir = project.root / "build" / "interrupted"
    assert not (build_dir / "record.json").exists()
    assert not project.lock.exists()
    leftovers = [p.name for p in build_dir.iterdir() if p.name.startswith(".")]
    assert leftovers == [], leftovers
    time.sleep(1)
    assert _buildx_children(str(project.root)) == []
    assert "Traceback" not in err
    # nothing half-written anywhere in the project
    assert not [p for p in project.root.rglob("*.tmp")]
    assert os.listdir(project.root / "profiles")


def test_push_is_by_digest_only_and_creates_no_tag(
    first_build: subprocess.CompletedProcess[str], passing: LineProject, ca_bundle: tuple[Path, str],
    local_registry: str, tmp_path: Path,
) -> None:
    assert first_build.returncode == 0
    # a repository of its own, so no earlier run's tag can be mistaken for this one's
    repo = f"spark-images-test/notag-{os.getpid()}-{int(time.time())}"
    proc = passing.run(
        "build", "profiles/line.yaml", "--push", f"{local_registry}/{repo}", "--ca-cert", str(ca_bundle[0]),
        "--lock", str(tmp_path / "l.json"), "--build-dir", str(tmp_path / "b"), "--cache", "bkcache",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    digest = json.loads((tmp_path / "b" / "record.json").read_text())["build"]["digest"]
    assert _registry_digest(local_registry, repo, digest) == digest  # the manifest is there, by digest
    listed = requests.get(f"http://{local_registry}/v2/{repo}/tags/list", timeout=30)
    # distribution answers NAME_UNKNOWN for a repository that holds manifests but no tag
    tags = [] if listed.status_code == 404 else (listed.json().get("tags") or [])
    assert listed.status_code in (200, 404) and tags == [], listed.text
    entry = json.loads((tmp_path / "l.json").read_text())["images"]["line"]
    assert entry["state"] == "candidate" and entry["tags"] == []
    # and a tag in --push is refused before anything is built or pushed
    refused = passing.run("build", "profiles/line.yaml", "--push", f"{local_registry}/{repo}:cu130")
    assert refused.returncode == 2 and "spark-images publish" in refused.stdout + refused.stderr
    assert requests.get(f"http://{local_registry}/v2/{repo}/tags/list", timeout=30).status_code == 404


def test_an_unresolvable_wheel_host_is_exit_2_quoting_the_build_line(
    make_project: Callable[..., LineProject], ca_bundle: tuple[Path, str]
) -> None:
    project = make_project("nodns", SM121)
    text = project.profile.read_text()
    text = re.sub(r"url: \S+\.whl", "url: https://nonexistent.invalid/vllm-0.29.0-py3-none-any.whl", text)
    project.profile.write_text(text)
    proc = project.run("build", "profiles/nodns.yaml", "--ca-cert", str(ca_bundle[0]), "--lock", str(project.lock))
    assert proc.returncode == 2, proc.stdout + proc.stderr[-3000:]
    reason = _record(project, "nodns")["build"]["reason"]
    assert _record(project, "nodns")["build"]["status"] == "error"
    assert "does not resolve" in reason and "--ca-cert" not in reason
    # the step's own line, as BuildKit printed it (`#N SECONDS ...`)
    assert re.search(r"`#\d+ \d+\.\d+ .*(Name or service not known|Temporary failure in name resolution)", reason), reason
    assert "does not resolve" in proc.stdout
    assert not project.lock.exists()


def test_a_lock_entry_without_an_arm64_wheel_is_one_line_naming_it(
    make_project: Callable[..., LineProject], ca_bundle: tuple[Path, str]
) -> None:
    """docopt 0.6.2 exists on PyPI as an sdist only (docopt-0.6.2.tar.gz, its real sha256)."""
    project = make_project("sdist", SM121)
    lock = project.root / "profiles" / "test.requirements.lock"
    lock.write_text(lock.read_text() + "docopt==0.6.2 \\\n    --hash=sha256:49b3a825280bd66b3aa83585ef59c4a8c82f2c8a522dbe754a8bc8d08c85c491\n")
    proc = project.run("build", "profiles/sdist.yaml", "--ca-cert", str(ca_bundle[0]), "--quiet", "--lock", str(project.lock))
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "docopt==0.6.2" in line]
    assert lines and all("has no wheel for linux/arm64" in line for line in lines), lines
    assert not project.lock.exists()

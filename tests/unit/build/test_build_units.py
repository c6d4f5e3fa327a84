"""Fast tests of the build line's pure parts: lock schema, push targets, buildx
arguments, SOURCE_DATE_EPOCH order, the reproducibility diff, the summary."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import multiprocessing
import re
import tarfile
import typing
from pathlib import Path
from typing import Any

import pytest

from spark_images.buildline import pipeline, repro, summary
from spark_images.core.errors import EnvironmentProblem, Finding, UsageError
from spark_images.engine import build as engine_build
from spark_images.registry.reference import ImageReference
from spark_images.release import lock

DIGEST = "sha256:" + "ab" * 32
COMMIT = "98dff2a81d747d1dba01a47f939f48c3526d4206"
PLAN = {
    "vllm_commit": COMMIT,
    "vllm_version": "0.29.0",
    "cuda_version": "13.0.2",
    "cuda_line": "cu130",
    "arch_list": "12.0f",
    "base_image": "nvidia/cuda:13.0.2-devel-ubuntu24.04@sha256:" + "cd" * 32,
    "pins": {"torch": "2.13.0"},
    "patches": [{"path": "patches/a.patch", "sha256": "00", "prs": [40923]}],
}


def entry(**over: Any) -> dict[str, Any]:
    doc = lock.make_entry(
        profile_path="profiles/cu130.yaml",
        repository="127.0.0.1:5000/spark-vllm",
        digest=DIGEST,
        plan=PLAN,
        fixes_included=[41215, 40923, 40923],
        audit={"status": "skipped", "reason": "no history", "required": [1]},
        cubins={"status": "passed", "verdict": "native", "gpu": "sm_121", "libraries": []},
        coherence={"status": "skipped", "reason": "no sm_121 GPU (no nvidia-smi)"},
        source_date_epoch=1767225600,
    )
    doc.update(over)
    return doc


def test_make_entry_follows_the_schema() -> None:
    doc = entry()
    assert doc["image"] == f"127.0.0.1:5000/spark-vllm@{DIGEST}"
    assert doc["created"] == "2026-01-01T00:00:00Z"
    assert doc["fixes_included"] == [40923, 41215]
    assert doc["coherence"] == {"status": "skipped", "reason": "no sm_121 GPU (no nvidia-smi)"}
    assert doc["audit"] == {"status": "skipped", "reason": "no history"}
    assert doc["cubins"] == {"verdict": "native", "gpu": "sm_121"}
    assert lock.entry_problems(doc, "f", "cu130") == []


def test_the_typed_lock_model_is_what_make_entry_promote_and_the_checker_use() -> None:
    # the lock is described once (lock.LockEntry); what is written and what is checked follow it
    hints = typing.get_type_hints(lock.LockEntry)
    required, optional = lock.LockEntry.__required_keys__, lock.LockEntry.__optional_keys__
    candidate = entry()
    assert set(candidate) <= set(hints) and required <= set(candidate)
    promoted = lock.promote(entry(coherence={"status": "passed", "image": f"r@{DIGEST}"}), None)
    assert set(promoted) <= set(hints) and {"state", "promoted"} <= optional
    # the file schema (reader, writers, `schema lock`) declares exactly the model's keys
    assert set(lock.ENTRY_SPEC) == set(hints)
    assert {key for key, spec in lock.ENTRY_SPEC.items() if spec.required} <= required
    for section in ("audit", "coherence"):
        assert set(candidate[section]) <= set(typing.get_type_hints(lock.GateSummary))
    assert set(candidate["cubins"]) <= set(typing.get_type_hints(lock.CubinSummary))
    # a key the model lacks would be written silently; a required one missing is refused
    broken = {k: v for k, v in candidate.items() if k != "vllm_commit"}
    assert [p.field for p in lock.entry_problems(broken, "f", "cu130")] == ["images.cu130.vllm_commit"]


def test_update_entry_writes_sorted_atomic_json_and_keeps_other_entries(tmp_path: Path) -> None:
    path = tmp_path / "images.lock.json"
    lock.update_entry(path, "cu130", entry())
    lock.update_entry(path, "cu129", entry(cuda_line="cu129"))
    text = path.read_text()
    doc = json.loads(text)
    assert sorted(doc["images"]) == ["cu129", "cu130"]
    assert text == json.dumps(doc, indent=2, sort_keys=True) + "\n"
    assert lock.load_lock(path) == doc
    assert [p.name for p in tmp_path.iterdir()] == ["images.lock.json"]  # no temp file left


def test_update_entry_refuses_a_broken_entry_and_leaves_the_file(tmp_path: Path) -> None:
    path = tmp_path / "images.lock.json"
    lock.update_entry(path, "cu130", entry())
    before = path.read_bytes()
    with pytest.raises(ValueError, match="image"):
        lock.update_entry(path, "cu130", entry(image="127.0.0.1:5000/spark-vllm:latest"))
    with pytest.raises(ValueError, match="coherence"):
        lock.update_entry(path, "cu130", entry(coherence={"status": "skipped"}))
    assert path.read_bytes() == before


def test_load_lock_reports_every_problem_with_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "images.lock.json"
    assert lock.load_lock(path) == {"lock_version": 1, "images": {}}
    bad = entry(digest="sha256:xyz")
    del bad["cubins"]
    path.write_text(json.dumps({"lock_version": 1, "images": {"cu130": bad}}))
    with pytest.raises(Finding) as info:
        lock.load_lock(path)
    lines = info.value.lines()
    assert any("images.cu130.digest" in line for line in lines)
    assert any("images.cu130.cubins" in line for line in lines)
    assert all(line.startswith(str(path)) for line in lines)
    path.write_text("{not json")
    with pytest.raises(Finding, match="not JSON"):
        lock.load_lock(path)


def _writer(path: str, name: str) -> None:
    for _ in range(15):
        lock.update_entry(path, name, entry())


def test_concurrent_writers_lose_no_entry(tmp_path: Path) -> None:
    path = str(tmp_path / "images.lock.json")
    procs = [multiprocessing.Process(target=_writer, args=(path, f"p{n}")) for n in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    assert sorted(lock.load_lock(path)["images"]) == ["p0", "p1", "p2", "p3"]


@pytest.mark.parametrize(
    ("target", "host", "name", "tags"),
    [
        ("127.0.0.1:5000/spark-vllm", "127.0.0.1:5000", "spark-vllm", ()),
        ("ghcr.io/owner/spark-vllm:cu130-rc", "ghcr.io", "owner/spark-vllm", ("cu130-rc",)),
        ("localhost:5000/a/b", "localhost:5000", "a/b", ()),
    ],
)
def test_parse_push_target(target: str, host: str, name: str, tags: tuple[str, ...]) -> None:
    ref = ImageReference.parse(target, what="--push", allow_digest=False)
    assert (ref.host, ref.repository, (ref.tag,) if ref.tag else ()) == (host, name, tags)


@pytest.mark.parametrize("target", ["spark-vllm", "ghcr.io/Owner/x", "ghcr.io/x@sha256:" + "0" * 64, "h.io/x:bad tag"])
def test_parse_push_target_refuses(target: str) -> None:
    with pytest.raises(UsageError):
        ImageReference.parse(target, what="--push", allow_digest=False)


def test_loopback_is_plain_http_and_others_https() -> None:
    assert ImageReference("127.0.0.1:5000", "a").api_base == "http://127.0.0.1:5000/v2/a"
    assert ImageReference("ghcr.io", "o/a").api_base == "https://ghcr.io/v2/o/a"


@pytest.mark.parametrize(
    ("where", "exists", "kind"),
    [
        ("/var/cache/bk", False, "local"),
        ("cache", False, "local"),
        ("./x/y", False, "local"),
        ("127.0.0.1:5000/cache/cu130", False, "registry"),
        ("ghcr.io/owner/cache:cu130", False, "registry"),
        ("ghcr.io/owner/cache", True, "local"),
    ],
)
def test_cache_specs(where: str, exists: bool, kind: str) -> None:
    spec_from, spec_to = engine_build.cache_specs(where, exists)
    assert spec_from.startswith(f"type={kind},")
    assert "mode=max" in spec_to


def test_buildx_argv_is_reproducible_and_never_carries_secret_contents(tmp_path: Path) -> None:
    secret = tmp_path / "ca.pem"
    secret.write_text("-----BEGIN CERTIFICATE-----\nSECRET\n")
    req = engine_build.BuildRequest(
        context=tmp_path,
        dockerfile=tmp_path / "Dockerfile",
        oci_dest=tmp_path / "o.tar",
        metadata_file=tmp_path / "m.json",
        image_name="spark-images/t:build",
        source_date_epoch=1767225600,
        build_args={"B": "2", "A": "1"},
        labels={"l": "v"},
        secrets=(engine_build.Secret("cacert", secret),),
    )
    argv = engine_build.buildx_argv(req)
    joined = " ".join(argv)
    assert "SECRET" not in joined
    assert f"id=cacert,src={secret}" in argv
    assert any("rewrite-timestamp=true" in a and a.startswith("type=oci,") for a in argv)
    assert argv[argv.index("--provenance") + 1] == "false"
    assert argv[argv.index("--platform") + 1] == "linux/arm64"
    build_args = [argv[i + 1] for i, a in enumerate(argv) if a == "--build-arg"]
    assert build_args == ["A=1", "B=2", "SOURCE_DATE_EPOCH=1767225600"]


def test_source_date_epoch_order() -> None:
    assert pipeline.source_date_epoch({"SOURCE_DATE_EPOCH": "5"}, 7, 9) == (5, "environment SOURCE_DATE_EPOCH")
    assert pipeline.source_date_epoch({}, 7, 9)[0] == 7
    assert pipeline.source_date_epoch({}, None, 9) == (9, "vLLM commit time (git history)")
    with pytest.raises(EnvironmentProblem, match="SOURCE_DATE_EPOCH"):
        pipeline.source_date_epoch({}, None, None)
    with pytest.raises(EnvironmentProblem, match="not a number"):
        pipeline.source_date_epoch({"SOURCE_DATE_EPOCH": "yesterday"}, None, None)


# -- the reproducibility diff on real OCI archives ----------------------------
LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"


def _layer(files: dict[str, tuple[bytes, int]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, (data, mtime) in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), mtime, 0o644
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def _oci(path: Path, layers: list[bytes], created: str) -> Path:
    blobs: dict[str, bytes] = {}

    def add(data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return digest

    config = json.dumps({"architecture": "arm64", "created": created, "rootfs": {}}).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"digest": add(config), "size": len(config)},
            "layers": [
                {"mediaType": LAYER_MEDIA_TYPE, "digest": add(layer), "size": len(layer)} for layer in layers
            ],
        }
    ).encode()
    index = json.dumps({"manifests": [{"digest": add(manifest), "size": len(manifest)}]}).encode()
    with tarfile.open(path, "w") as tar:
        for name, data in [("index.json", index)] + [
            (f"blobs/sha256/{d.split(':')[1]}", b) for d, b in blobs.items()
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_repro_differences_names_files_and_config_fields(tmp_path: Path) -> None:
    base = _layer({"etc/os-release": (b"debian", 0)})
    a = _oci(tmp_path / "a.tar", [base, _layer({"opt/x.pyc": (b"1", 0), "opt/same": (b"s", 0)})], "2026-01-01")
    b = _oci(tmp_path / "b.tar", [base, _layer({"opt/x.pyc": (b"2", 5), "opt/same": (b"s", 0), "opt/new": (b"", 0)})], "2026-01-02")
    la, lb = repro.listing(a), repro.listing(b)
    assert la.digest != lb.digest
    diffs = repro.differences(la, lb)
    assert "layer 2: opt/x.pyc: mtime 0 != 5, content" in diffs
    assert "layer 2: opt/new: only in the second build" in diffs
    assert any(line.startswith("config created:") for line in diffs)
    assert not any("layer 1" in line or "opt/same" in line for line in diffs)
    assert repro.differences(la, repro.listing(a)) == []


def test_repro_keeps_the_leading_dot_of_hidden_files(tmp_path: Path) -> None:
    # `./.profile` and `./profile` are two files; stripping every leading "."
    # merged them and hid the difference in the hidden one
    a = _oci(tmp_path / "a.tar", [_layer({"./.profile": (b"x", 0), "./profile": (b"p", 0)})], "2026-01-01")
    b = _oci(tmp_path / "b.tar", [_layer({"./.profile": (b"y", 0), "./profile": (b"p", 0)})], "2026-01-01")
    la, lb = repro.listing(a), repro.listing(b)
    assert set(la.layers[0][1]) == {".profile", "profile"}
    assert repro.differences(la, lb) == ["layer 1: .profile: content"]


def test_repro_unreadable_archive_is_one_usage_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.tar"
    broken.write_bytes(b"not a tar archive at all" * 40)
    with pytest.raises(UsageError, match="not a readable OCI image archive"):
        repro.listing(broken)
    no_index = _oci(tmp_path / "x.tar", [], "2026-01-01")
    with tarfile.open(no_index) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers() if m.name != "index.json"]  # type: ignore[union-attr]
    with tarfile.open(no_index, "w") as tar:
        for member, data in members:
            tar.addfile(member, io.BytesIO(data))
    with pytest.raises(UsageError, match=r"x\.tar: not a readable"):
        repro.listing(no_index)


def test_summary_names_the_failed_stage_and_why() -> None:
    doc = {
        "profile": "cu130",
        "validate": {"status": "passed"},
        "build": {"status": "passed", "digest": DIGEST, "image": f"r@{DIGEST}"},
        "cubins": {"status": "failed", "reason": "vllm/_C.abi3.so: no native sm_121 code"},
        "result": {"status": "failed", "reason": "stage cubins: vllm/_C.abi3.so: no native sm_121 code"},
    }
    text = summary.terminal(doc)
    assert "cubins" in text and "FAILED" in text and "no native sm_121 code" in text
    md = summary.markdown(doc)
    assert "| cubins | failed |" in md and f"`r@{DIGEST}`" in md


def test_requirements_locks_beside_the_profiles(tmp_path: Path) -> None:
    from spark_images.buildline.resolve import resolve_profile
    from spark_images.core.errors import Finding
    from spark_images.profiles import reqlock

    root = Path(__file__).resolve().parents[3]
    text = (root / "profiles" / "cu130.requirements.lock").read_text()
    assert reqlock.usability_problem(text) == ""
    assert "torch==2.13.0 \\" in text and "--hash=sha256:" in text
    assert "\nvllm==" not in text  # the wheel strategy installs vLLM by URL + sha256
    assert "incomplete" in reqlock.usability_problem((root / "profiles" / "cu129.requirements.lock").read_text())
    assert "pins no package" in reqlock.usability_problem("# nothing\n")
    # a direct reference to one wheel file pins the version its file name carries (PEP 427)
    direct = ("six==1.17.0 \\\n    --hash=sha256:" + "a" * 64 + "\n"
              "torch @ https://10.0.0.1:8443/cu/torch-2.13.0-cp311-cp311-manylinux_2_28_aarch64.whl \\\n"
              "    --hash=sha256:" + "b" * 64 + "\n"
              "torch-c-dlpack-ext @ https://h/torch_c_dlpack_ext-0.1.5%2Blocal-py3-none-any.whl --hash=sha256:" + "c" * 64 + "\n"
              "other @ https://h/not-this-name-1.0-py3-none-any.whl\n")  # fmt: skip
    assert reqlock.pinned_versions(direct) == {"six": "1.17.0", "torch": "2.13.0", "torch-c-dlpack-ext": "0.1.5+local"}
    assert reqlock.pin_mismatches(direct, {"torch": "2.13.0"}) == []
    assert reqlock.pin_mismatches(direct, {"torch": "2.12.0"}) == [("torch", "2.12.0", "2.13.0")]
    # the build line refuses a missing lock at validate (resolve_profile), exit 1
    project = tmp_path / "project"
    (project / "profiles").mkdir(parents=True)
    doc = (root / "profiles" / "cu130.yaml").read_text()
    (project / "profiles" / "cu130.yaml").write_text(doc)
    with pytest.raises(Finding, match=re.escape("build.requirements_lock: profiles/cu130.requirements.lock does not exist")):
        resolve_profile(project / "profiles" / "cu130.yaml")


def test_vllm_commit_time_comes_from_the_history(tmp_path: Path) -> None:
    import subprocess

    from spark_images import audit

    env = {
        "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.org", "GIT_AUTHOR_DATE": "@1700000000 +0000",
        "GIT_COMMITTER_DATE": "@1767225600 +0000", "PATH": "/usr/bin:/bin",
    }  # fmt: skip
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "commit", "-q", "--allow-empty", "-m", "x"], check=True, env=env)
    sha = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert pipeline.vllm_commit_time(audit, sha, tmp_path) == 1767225600
    assert pipeline.vllm_commit_time(audit, "0" * 40, tmp_path) is None


def test_unreachable_registry_is_an_environment_problem_not_a_finding() -> None:
    from spark_images.engine.build import unreachable_source

    pulled = (
        'ERROR: failed to solve: nvidia/cuda:13.0.2-devel-ubuntu24.04@sha256:5dc1: failed to resolve source '
        'metadata for docker.io/nvidia/cuda: dial tcp: lookup registry-1.docker.io: no such host'
    )
    assert unreachable_source(pulled)
    assert not unreachable_source('ERROR: process "/bin/bash -c test -x /usr/local/cuda/bin/nvcc" did not complete successfully: exit code: 1')


def test_a_usage_error_in_a_stage_is_exit_2_not_a_finding(tmp_path: Path) -> None:
    # a --vllm-repo that does not exist is the caller's mistake (exit 2), not a
    # finding about the image (exit 1); the record still says which stage and why
    root = Path(__file__).resolve().parents[3]
    opts = pipeline.BuildOptions(
        profile=root / "profiles" / "cu130.yaml", dry_run=True, vllm_repo=tmp_path / "missing",
        build_dir=tmp_path / "build", lock_path=tmp_path / "images.lock.json",
    )  # fmt: skip
    lines: list[str] = []
    outcome = pipeline.run_build(opts, lines.append)
    assert outcome.exit_code == 2
    audit = outcome.record.sections["audit"]
    assert audit["status"] == "error" and "missing" in audit["reason"]
    assert outcome.record.sections["result"]["reason"].startswith("stage audit:")
    assert outcome.record_path is not None and outcome.record_path.is_file()
    assert not outcome.lock_written and not (tmp_path / "images.lock.json").exists()

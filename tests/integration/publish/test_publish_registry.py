"""The publish sequence against the real loopback registry.

Candidate pushed by digest -> gate result in the lock -> `spark-images publish`
moves the tags to the same digest (checked with HEAD/GET on the registry) and
records them in the lock; a failed gate leaves the registry and the lock as
they were. The gate sections stand for what the Spark job records (there is
no sm_121 GPU here); everything on the registry side is real.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import requests

from spark_images.buildline.resolve import resolve_profile
from spark_images.cli import main
from spark_images.registry.tags import TagClient

pytestmark = pytest.mark.registry

# what `spark-images coherence --json` records for a combination that passed every check
CU130 = Path(__file__).resolve().parents[3] / "profiles" / "cu130.yaml"
# every combination `plan` lists for cu130, passed and measured
PASSED_COMBOS = [
    {"model": m, "moe_backend": moe, "linear_backend": lin, "kv_cache_dtype": kv, "status": "passed", "reasons": [],
     "warnings": [], "speed": {"decode_tokens_per_s": 40.0}}
    for m, moe, lin, kv in resolve_profile(CU130).plan.coherence.combinations  # type: ignore[union-attr]
]
ACCEPT = "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json"


def resolve(repository: str, ref: str) -> str | None:
    """Digest that `ref` resolves to in the registry (HEAD), None when absent."""
    host, name = repository.split("/", 1)
    resp = requests.head(f"http://{host}/v2/{name}/manifests/{ref}", headers={"Accept": ACCEPT}, timeout=10)
    if resp.status_code == 404:
        return None
    assert resp.status_code == 200, resp.status_code
    return resp.headers["Docker-Content-Digest"]


def manifest_bytes(repository: str, ref: str) -> bytes:
    host, name = repository.split("/", 1)
    resp = requests.get(f"http://{host}/v2/{name}/manifests/{ref}", headers={"Accept": ACCEPT}, timeout=10)
    assert resp.status_code == 200
    return resp.content


def publish(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any, str]:
    code = main(["publish", *args, "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else None, err


def test_promote_moves_tags_to_the_same_digest_and_records_them(
    push_candidate: Any, make_entry: Any, write_lock: Any, repo_name: str,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    repository, digest = push_candidate(repo_name, b"candidate one\n")
    assert resolve(repository, "cu130") is None
    lock = write_lock(tmp_path / "images.lock.json", {"cu130": make_entry(repository, digest)})
    body = tmp_path / "pr.md"

    code, doc, err = publish(
        capsys, "profiles/cu130.yaml", "--tag", "cu130", "--immutable", "--date", "20261201",
        "--lock", str(lock), "--pr-body", str(body),
    )
    assert code == 0, err
    immutable = "cu130-98dff2a81-20261201"
    assert [(s["tag"], s["action"]) for s in doc["steps"]] == [("cu130", "create"), (immutable, "create")]
    for tag in ("cu130", immutable):
        assert resolve(repository, tag) == digest
        # same bytes, so the same digest: nothing was re-encoded
        assert "sha256:" + hashlib.sha256(manifest_bytes(repository, tag)).hexdigest() == digest
    saved = json.loads(lock.read_text())
    assert saved["images"]["cu130"]["tags"] == ["cu130", immutable]
    assert saved["images"]["cu130"]["digest"] == digest
    text = body.read_text()
    assert f"{repository}@{digest}" in text and f"`{immutable}` | create" in text


def test_promoting_a_newer_candidate_moves_only_the_line_tag(
    push_candidate: Any, make_entry: Any, write_lock: Any, repo_name: str,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    repository, old = push_candidate(repo_name, b"old\n")
    lock = write_lock(tmp_path / "images.lock.json", {"cu130": make_entry(repository, old)})
    assert publish(capsys, "cu130", "--tag", "cu130", "--immutable", "--date", "20261101",
                   "--lock", str(lock))[0] == 0
    _, new = push_candidate(repo_name, b"new\n")
    assert new != old
    write_lock(lock, {"cu130": make_entry(repository, new)})

    # the same date and commit would move an immutable tag: refused, nothing moves
    code, _, err = publish(capsys, "cu130", "--tag", "cu130", "--immutable", "--date", "20261101",
                           "--lock", str(lock))
    assert code == 1 and "immutable tag already points at" in err
    assert resolve(repository, "cu130") == old
    assert json.loads(lock.read_text())["images"]["cu130"]["tags"] == []

    code, doc, err = publish(capsys, "cu130", "--tag", "cu130", "--immutable", "--date", "20261201",
                             "--lock", str(lock))
    assert code == 0, err
    assert doc["steps"][0] == {"tag": "cu130", "action": "move", "previous": old, "digest": new}
    assert resolve(repository, "cu130") == new
    assert resolve(repository, "cu130-98dff2a81-20261201") == new
    assert resolve(repository, "cu130-98dff2a81-20261101") == old  # rollback target kept


@pytest.mark.parametrize(
    ("cubins", "coherence", "reason"),
    [("native", "skipped", "no sm_121 GPU"), ("native", "failed", "gibberish"), ("missing", "passed", "")],
)
def test_failed_gate_leaves_tags_and_lock_untouched(
    push_candidate: Any, make_entry: Any, write_lock: Any, repo_name: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str], cubins: str, coherence: str, reason: str,
) -> None:
    repository, digest = push_candidate(repo_name, f"gate {cubins} {coherence}\n".encode())
    entry = make_entry(repository, digest, cubins=cubins, coherence=coherence, reason=reason)
    lock = write_lock(tmp_path / "images.lock.json", {"cu130": entry})
    before = lock.read_bytes()
    code, doc, err = publish(capsys, "cu130", "--tag", "cu130", "--immutable", "--lock", str(lock),
                             "--pr-body", str(tmp_path / "pr.md"))
    assert code == 1
    assert doc["error"] == "Finding"
    # a failed gate never passes the lock's own schema; a skipped one is refused by publish
    assert ("gate did not pass" in err) or ("coherence.status: 'failed' is not one of passed, skipped" in err)
    assert "Traceback" not in err
    assert resolve(repository, "cu130") is None
    assert lock.read_bytes() == before
    assert not (tmp_path / "pr.md").exists()


def test_spark_gate_result_replaces_the_skipped_coherence_gate(
    push_candidate: Any, make_entry: Any, write_lock: Any, repo_name: str,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    repository, digest = push_candidate(repo_name, b"gated on the spark\n")
    _, other = push_candidate(repo_name, b"another candidate\n")
    # what the arm64 build job locks: coherence skipped (no GPU on that runner)
    entry = make_entry(repository, digest, coherence="skipped", reason="no sm_121 GPU (no nvidia-smi)")
    lock = write_lock(tmp_path / "images.lock.json", {"cu130": entry})
    before = lock.read_bytes()
    gate = tmp_path / "coherence.json"

    # a gate that ran on another digest proves nothing about this one
    gate.write_text(json.dumps({"status": "passed", "image": f"{repository}@{other}", "gpu": "sm_121", "combinations": PASSED_COMBOS}))
    code, _, err = publish(capsys, str(CU130), "--tag", "cu130", "--coherence", str(gate), "--lock", str(lock))
    assert code == 1 and "not on the locked digest" in err
    assert resolve(repository, "cu130") is None and lock.read_bytes() == before

    gate.write_text(json.dumps({"status": "passed", "image": f"{repository}@{digest}", "gpu": "sm_121", "combinations": PASSED_COMBOS}))
    code, _, err = publish(capsys, str(CU130), "--tag", "cu130", "--coherence", str(gate), "--lock", str(lock))
    assert code == 0, err
    assert resolve(repository, "cu130") == digest
    saved = json.loads(lock.read_text())["images"]["cu130"]
    assert saved["coherence"] == {"status": "passed"} and saved["tags"] == ["cu130"]


def test_dry_run_reads_the_registry_and_changes_nothing(
    push_candidate: Any, make_entry: Any, write_lock: Any, repo_name: str,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    repository, digest = push_candidate(repo_name, b"dry\n")
    lock = write_lock(tmp_path / "images.lock.json", {"cu130": make_entry(repository, digest)})
    before = lock.read_bytes()
    code = main(["publish", "cu130", "--tag", "cu130", "--lock", str(lock), "--dry-run"])
    out, _ = capsys.readouterr()
    assert code == 0
    assert f"would create {repository}:cu130 -> {digest}" in out
    assert resolve(repository, "cu130") is None
    assert lock.read_bytes() == before


def test_no_entry_for_the_profile_is_exit_1(
    make_entry: Any, write_lock: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = write_lock(tmp_path / "images.lock.json",
                      {"cu130": make_entry("127.0.0.1:5000/x", "sha256:" + "c" * 64)})
    code, _, err = publish(capsys, "cu129", "--tag", "cu129", "--lock", str(lock))
    assert code == 1
    assert "no lock entry for profile 'cu129'" in err


def test_digest_missing_from_the_registry_is_exit_1(
    local_registry: str, make_entry: Any, write_lock: Any, repo_name: str,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    repository = f"{local_registry}/{repo_name}"
    lock = write_lock(tmp_path / "images.lock.json", {"cu130": make_entry(repository, "sha256:" + "d" * 64)})
    code, _, err = publish(capsys, "cu130", "--tag", "cu130", "--lock", str(lock))
    assert code == 1
    assert "has no such manifest" in err


def test_unreachable_registry_is_exit_2(
    make_entry: Any, write_lock: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # port 9 on loopback: nothing listens there, the connection is refused at once
    lock = write_lock(tmp_path / "images.lock.json",
                      {"cu130": make_entry("127.0.0.1:9/spark/vllm", "sha256:" + "e" * 64)})
    before = lock.read_bytes()
    code, doc, err = publish(capsys, "cu130", "--tag", "cu130", "--lock", str(lock))
    assert code == 2
    assert doc["exit_code"] == 2
    assert "127.0.0.1:9/spark/vllm" in err and "no answer" in err and "Traceback" not in err
    assert lock.read_bytes() == before


def test_registry_insecure_speaks_plain_http_to_a_non_loopback_name(
    push_candidate: Any, make_entry: Any, write_lock: Any, repo_name: str,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    repository, digest = push_candidate(repo_name, b"insecure\n")
    # "127.1" reaches the same loopback registry but is not a name the client treats as loopback
    other_name = repository.replace("127.0.0.1:", "127.1:")
    assert TagClient("127.1:5000", repo_name).client.scheme == "https"
    assert TagClient("127.1:5000", repo_name, insecure_http=True).client.scheme == "http"
    lock = write_lock(tmp_path / "images.lock.json", {"cu130": make_entry(other_name, digest)})
    code, doc, err = publish(capsys, "cu130", "--tag", "cu130", "--registry-insecure", "--lock", str(lock))
    assert code == 0, err
    assert doc["image"] == f"{other_name}@{digest}"
    assert resolve(repository, "cu130") == digest


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--tag=-bad"], "not a valid tag"),
        ([], "name at least one --tag"),
        (["--tag", "cu130", "--date", "2026-12-01"], "--date"),
        (["--tag", "cu130", "--lock", "/nonexistent/images.lock.json"], "no lock file"),
    ],
)
def test_usage_errors_are_exit_2(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, write_lock: Any,
    make_entry: Any,
) -> None:
    lock = write_lock(tmp_path / "images.lock.json", {"cu130": make_entry("127.0.0.1:9/a", "sha256:" + "f" * 64)})
    if "--lock" not in args:
        args = [*args, "--lock", str(lock)]
    code = main(["publish", "cu130", *args])
    _, err = capsys.readouterr()
    assert code == 2
    assert needle in err

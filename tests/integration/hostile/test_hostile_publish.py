"""`spark-images publish` against misbehaving registries and hostile inputs.

The lock entry names an image on a loopback registry that misbehaves on one
endpoint (the manifest by digest, the HEAD of the tag, the PUT that moves the
tag, the token endpoint), or the inputs themselves are hostile (a FIFO or
/dev/zero as the lock or the coherence record, a lock that is not UTF-8, a
record that says passed while its combinations failed, a --pr-body that
cannot be written). Every case ends with its documented exit code and one
named line, and leaves the lock byte for byte as it was and no PR body.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from harness import assert_clean_failure, run_cli, tree_digest
from hostile_cases import BODY_CASES, Image, lock_entry, passed_combinations, token_cases
from servers import Hostile, Req, Route

from support.oci_blobs import OCI_MANIFEST, digest_of

pytestmark = pytest.mark.processes  # every case runs the CLI as a process under a clock

IMAGE = Image()
DIGEST = digest_of(IMAGE.manifest)
NAME = "spark/img"
WALL_S = 30.0
PROFILES = Path(__file__).resolve().parents[3] / "profiles"
# the shipped cu130 profile's whole matrix (models x backends x KV dtypes), each measured
COMBOS = passed_combinations(PROFILES / "cu130.yaml")


def registry(slot: str, bad: Route | None, bearer: bool = False) -> Route:
    put_done: set[str] = set()

    def route(req: Req) -> None:
        if req.path == "/token":
            return bad(req) if slot == "token" and bad else req.answer(200, {"token": "good-token"})
        if bearer and "Authorization" not in req.headers:
            realm = f"http://{req.server.host}/token"
            return req.answer(401, b"{}", {"WWW-Authenticate": f'Bearer realm="{realm}",service="x"'})
        if req.path == f"/v2/{NAME}/manifests/{DIGEST}":
            if slot == "manifest" and bad:
                return bad(req)
            return req.answer(200, IMAGE.manifest, {"Docker-Content-Digest": DIGEST}, content_type=OCI_MANIFEST)
        if req.path.startswith(f"/v2/{NAME}/manifests/"):
            tag = req.path.rsplit("/", 1)[1]
            if req.method == "PUT":
                if slot == "put" and bad:
                    return bad(req)
                put_done.add(tag)
                return req.answer(201, b"", {"Docker-Content-Digest": DIGEST})
            if slot == "tag" and bad:
                return bad(req)
            if tag in put_done:
                return req.answer(200, IMAGE.manifest, {"Docker-Content-Digest": DIGEST}, content_type=OCI_MANIFEST)
            return req.answer(404, b"{}")
        return req.answer(404, b"{}")

    return route


def _setup(tmp_path: Path, host: str) -> tuple[Path, Path, dict[str, str]]:
    lock = tmp_path / "state" / "images.lock.json"
    lock.parent.mkdir()
    # the project the lock belongs to: the entry's `profile` (profiles/cu130.yaml) is the matrix
    shutil.copytree(PROFILES, lock.parent / "profiles")
    lock.write_text(json.dumps({"lock_version": 1, "images": {"cu130": lock_entry(f"{host}/{NAME}", DIGEST)}}, indent=2))
    record = tmp_path / "coherence.json"
    record.write_text(json.dumps({"status": "passed", "image": f"{host}/{NAME}@{DIGEST}", "gpu": "sm_121",
                                  "combinations": COMBOS}))  # fmt: skip
    return lock, record, tree_digest(lock.parent)


def _publish(lock: Path, record: Path | str, body: Path, *extra: str) -> list[str]:
    return ["publish", "cu130", "--tag", "cu130", "--lock", str(lock), "--coherence", str(record),
            "--pr-body", str(body), *extra]  # fmt: skip


def _env() -> dict[str, str]:
    return {"SPARK_IMAGES_HTTP_TIMEOUT": "4", "NO_PROXY": "*"}


def test_the_well_behaved_registry_is_promoted_to(tmp_path: Path) -> None:
    with Hostile(registry("", None, bearer=True)) as server:
        lock, record, before = _setup(tmp_path, server.host)
        body = tmp_path / "pr.md"
        result = run_cli(_publish(lock, record, body), env=_env())
    assert result.rc == 0, result.stderr
    saved = json.loads(lock.read_text())["images"]["cu130"]
    assert saved["state"] == "promoted" and saved["tags"] == ["cu130"]
    assert body.is_file() and tree_digest(lock.parent) != before


PUBLISH_CASES: list[tuple[str, str, Route]] = [
    *[(f"{slot}-{name}", slot, route) for slot in ("manifest", "tag", "put") for name, route in BODY_CASES.items()],
    *[(name, "token", route) for name, route in token_cases().items()],
    ("manifest-other-digest", "manifest", lambda req: req.answer(200, IMAGE.manifest + b" ", content_type=OCI_MANIFEST)),
    ("put-rewrites-digest", "put", lambda req: req.answer(201, b"", {"Docker-Content-Digest": "sha256:" + "1" * 64})),
]


@pytest.mark.parametrize(("slot", "route"), [pytest.param(s, r, id=i) for i, s, r in PUBLISH_CASES])
def test_hostile_registry_leaves_the_lock_alone(slot: str, route: Route, tmp_path: Path) -> None:
    with Hostile(registry(slot, route, bearer=slot == "token")) as server:
        lock, record, before = _setup(tmp_path, server.host)
        body = tmp_path / "pr.md"
        result = run_cli(_publish(lock, record, body), env=_env(), timeout=WALL_S + 10)
    assert_clean_failure(result, rc=2, names=[server.host], wall_s=WALL_S, max_lines=3)
    assert tree_digest(lock.parent) == before, "the lock changed"
    assert not body.exists(), "a PR body was written for a promotion that did not happen"
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def _records(host: str) -> dict[str, tuple[bytes, int]]:
    image = f"{host}/{NAME}@{DIGEST}"

    def doc(**over: Any) -> bytes:
        return json.dumps({"status": "passed", "image": image, "gpu": "sm_121", "combinations": COMBOS, **over}).encode()

    failed = [{**COMBOS[0], "status": "failed", "reasons": ["gibberish"]}]
    other_model = [{**c, "model": "org/another-model"} for c in COMBOS]
    unknown = {"decode_tokens_per_s": "unknown", "unknown_reason": "usage.completion_tokens is 0, below the text streamed"}
    first_model = COMBOS[0]["model"]
    return {
        "a-record-for-another-model": (doc(combinations=other_model), 1),
        "one-combination-of-the-matrix": (doc(combinations=COMBOS[:1]), 1),
        "every-speed-unknown": (doc(combinations=[{**c, "speed": unknown} for c in COMBOS]), 1),
        "one-models-speed-unknown": (doc(combinations=[{**c, "speed": unknown} if c["model"] == first_model else c
                                                      for c in COMBOS]), 1),
        "speed-not-a-number": (doc(combinations=[{**c, "speed": {"decode_tokens_per_s": True}} for c in COMBOS]), 1),
        "passed-but-every-combination-failed": (doc(combinations=failed), 1),
        "passed-but-a-reason": (doc(combinations=[{**COMBOS[0], "reasons": ["x"]}]), 1),
        "passed-without-combinations": (doc(combinations=[]), 1),
        "combinations-not-a-list": (doc(combinations="all"), 1),
        "combinations-of-strings": (doc(combinations=["passed"]), 1),
        "status-failed": (doc(status="failed"), 1),
        "status-list": (doc(status=["passed"]), 1),
        "assumed-gpu": (doc(assumed_gpu=True), 1),
        "other-image": (doc(image="ghcr.io/x/y@sha256:" + "0" * 64), 1),
        "nan-inside": (doc().replace(b'"gpu": "sm_121"', b'"gpu": NaN'), 2),
        "deep": (b"[" * 100000 + b"]" * 100000, 2),
        "not-utf8": (b'{"status": "\xff"}', 2),
        "not-json": (b"status: passed", 2),
        "array": (b"[]", 2),
        "empty": (b"", 2),
    }


RECORD_NAMES = sorted(_records("h"))
# the record passed, on this digest, but does not stand for the profile's matrix or has no speed
# (one line per problem: a model without a measured choice is one problem)
MODELS = len({c["model"] for c in COMBOS})
MATRIX_CASES = {"a-record-for-another-model": 1, "one-combination-of-the-matrix": 1, "every-speed-unknown": MODELS,
                "one-models-speed-unknown": 1, "speed-not-a-number": MODELS}


def test_an_unknown_speed_beside_a_measured_faster_choice_is_promoted(tmp_path: Path) -> None:
    """An unmeasured combination is never the chosen one while a measured one passed."""
    with Hostile(registry("", None)) as server:
        lock, record, _ = _setup(tmp_path, server.host)
        doc = json.loads(record.read_text())
        doc["combinations"][0]["speed"] = {"decode_tokens_per_s": "unknown", "unknown_reason": "usage lied"}
        record.write_text(json.dumps(doc))
        result = run_cli(_publish(lock, record, tmp_path / "pr.md"), env=_env())
    assert result.rc == 0, result.stderr
    assert json.loads(lock.read_text())["images"]["cu130"]["state"] == "promoted"


def test_a_record_needs_the_profile_for_its_matrix(tmp_path: Path) -> None:
    """No profile where the lock entry names it: the matrix is unknown, nothing is promoted (exit 2)."""
    with Hostile(registry("", None)) as server:
        lock, record, before = _setup(tmp_path, server.host)
        (lock.parent / "profiles" / "cu130.yaml").unlink()
        before = tree_digest(lock.parent)
        result = run_cli(_publish(lock, record, tmp_path / "pr.md"), env=_env())
    assert_clean_failure(result, rc=2, names=["images.cu130.profile"], wall_s=WALL_S, max_lines=1)
    assert tree_digest(lock.parent) == before
    assert not [h for h in server.hits if h.startswith("PUT")]


@pytest.mark.parametrize("name", RECORD_NAMES)
def test_hostile_coherence_record(name: str, tmp_path: Path) -> None:
    with Hostile(registry("", None)) as server:
        lock, record, before = _setup(tmp_path, server.host)
        data, rc = _records(server.host)[name]
        record.write_bytes(data)
        body = tmp_path / "pr.md"
        result = run_cli(_publish(lock, record, body), env=_env())
    assert_clean_failure(result, rc=rc, names=[str(record)], wall_s=WALL_S,
                         max_lines=MATRIX_CASES.get(name))  # fmt: skip
    assert tree_digest(lock.parent) == before and not body.exists()
    assert not server.hits or all(not h.startswith("PUT") for h in server.hits)


SPECIAL_FILES = ["fifo", "dev-zero", "directory", "missing"]


def _special(tmp_path: Path, kind: str) -> str:
    if kind == "fifo":
        path = tmp_path / "fifo.json"
        os.mkfifo(path)
        return str(path)
    if kind == "dev-zero":
        return "/dev/zero"
    if kind == "directory":
        return str(tmp_path)
    return str(tmp_path / "missing.json")


@pytest.mark.parametrize("kind", SPECIAL_FILES)
def test_a_special_file_as_the_coherence_record(kind: str, tmp_path: Path) -> None:
    with Hostile(registry("", None)) as server:
        lock, _record, before = _setup(tmp_path, server.host)
        special = _special(tmp_path, kind)
        result = run_cli(_publish(lock, special, tmp_path / "pr.md"), env=_env())
    assert_clean_failure(result, rc=2, names=[special], wall_s=WALL_S)
    assert tree_digest(lock.parent) == before


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "not-utf8", "deep", "nan"])
def test_a_hostile_lock(kind: str, tmp_path: Path) -> None:
    with Hostile(registry("", None)) as server:
        lock, record, _ = _setup(tmp_path, server.host)
        if kind == "fifo":
            lock.unlink()
            os.mkfifo(lock)
        elif kind == "not-utf8":
            lock.write_bytes(b'{"lock_version": 1, "images": {"\xff": 1}}')
        elif kind == "deep":
            lock.write_bytes(b"[" * 100000 + b"]" * 100000)
        elif kind == "nan":
            lock.write_bytes(lock.read_bytes().replace(b'"lock_version": 1', b'"lock_version": NaN'))
        target = "/dev/zero" if kind == "dev-zero" else str(lock)
        result = run_cli(["publish", "cu130", "--tag", "cu130", "--lock", target, "--coherence", str(record)], env=_env())
    assert_clean_failure(result, rc=(1, 2), names=[target], wall_s=WALL_S)
    assert not [h for h in server.hits if h.startswith("PUT")]


@pytest.mark.parametrize("kind", ["is-a-directory", "no-such-directory"])
def test_a_pr_body_that_cannot_be_written_moves_no_tag(kind: str, tmp_path: Path) -> None:
    with Hostile(registry("", None)) as server:
        lock, record, before = _setup(tmp_path, server.host)
        body = tmp_path if kind == "is-a-directory" else tmp_path / "nowhere" / "pr.md"
        result = run_cli(_publish(lock, record, body), env=_env())
    assert_clean_failure(result, rc=2, names=[str(body)], wall_s=WALL_S)
    assert tree_digest(lock.parent) == before
    assert not [h for h in server.hits if h.startswith("PUT")], "a tag moved before the PR body was known to be writable"

"""images.lock.json: the digest of every image whose gates all passed.

`build` writes an entry only when every gate passed (a skipped coherence gate
is recorded with its reason; see pipeline.py for which skips still allow the
lock); `publish` reads it and adds the tags it moved. Writes are atomic and
serialised with an flock on the lock's directory, so two builds finishing at
once do not lose each other's entry.

Schema (sorted keys, `atomic.dumps_json` style)::

    {
      "lock_version": 1,
      "images": {
        "<profile name>": {
          "profile": "profiles/cu130.yaml",
          "image": "REPO@sha256:...",          # always repository@digest
          "repository": "REPO",
          "digest": "sha256:...",              # the manifest digest
          "vllm_commit": "<40 hex>", "vllm_version": "0.29.0",
          "cuda_version": "13.0.2", "cuda_line": "cu130", "arch_list": "12.0f",
          "base_image": "NAME:TAG@sha256:...",
          "pins": {"torch": "...", ...},
          "fixes_included": [40923, ...],      # PR numbers, ascending
          "audit": {"status": "passed" | "skipped", "reason"?: "..."},
          "cubins": {"verdict": "...", ...},
          "coherence": {"status": "passed" | "skipped", "reason"?: "..."},
          "created": "2026-01-02T03:04:05Z",   # from SOURCE_DATE_EPOCH
          "source_date_epoch": 1767323045,
          "tags": ["..."]                      # human tags publish moved here
        }
      }
    }
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spark_images import atomic, profiles
from spark_images.errors import Finding, Problem, UsageError

LOCK_VERSION = 1
DEFAULT_LOCK = "images.lock.json"
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
HEX40 = profiles.HEX40  # one pattern for a full commit, where profiles pin it

REQUIRED_STR = (
    "profile",
    "image",
    "repository",
    "digest",
    "vllm_commit",
    "vllm_version",
    "cuda_version",
    "cuda_line",
    "arch_list",
    "created",
)
GATE_STATUSES = ("passed", "skipped")


def empty_lock() -> dict[str, Any]:
    return {"lock_version": LOCK_VERSION, "images": {}}


def rfc3339(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def entry_problems(entry: Mapping[str, Any], file: str, name: str) -> list[Problem]:
    """Every way `entry` breaks the schema (pure)."""
    where = f"images.{name}"
    out: list[Problem] = []

    def bad(field: str, message: str, fix: str = "") -> None:
        out.append(Problem(file, f"{where}.{field}", message, fix))

    for key in REQUIRED_STR:
        if not isinstance(entry.get(key), str) or not entry.get(key):
            bad(key, "missing or not a string", "rebuild the image with `spark-images build`")
    digest, repo = entry.get("digest"), entry.get("repository")
    if isinstance(digest, str) and not DIGEST.match(digest):
        bad("digest", f"{digest!r} is not sha256:<64 hex>")
    if isinstance(digest, str) and isinstance(repo, str) and entry.get("image") != f"{repo}@{digest}":
        bad("image", f"must be repository@digest ({repo}@{digest})")
    commit = entry.get("vllm_commit")
    if isinstance(commit, str) and not HEX40.match(commit):
        bad("vllm_commit", f"{commit!r} is not a 40-hex commit")
    if not isinstance(entry.get("pins"), dict):
        bad("pins", "missing or not a mapping")
    fixes = entry.get("fixes_included")
    if not isinstance(fixes, list) or not all(isinstance(n, int) for n in fixes):
        bad("fixes_included", "missing or not a list of PR numbers")
    if not isinstance(entry.get("tags", []), list):
        bad("tags", "not a list")
    cubins = entry.get("cubins")
    if not isinstance(cubins, dict) or "verdict" not in cubins:
        bad("cubins", "missing the cubin verdict")
    for gate in ("coherence", "audit"):
        section = entry.get(gate)
        if not isinstance(section, dict) or section.get("status") not in GATE_STATUSES:
            bad(gate, f"missing, or status not one of {', '.join(GATE_STATUSES)}")
        elif section["status"] == "skipped" and not section.get("reason"):
            bad(gate, "skipped without a reason")
    return out


def lock_problems(doc: Any, file: str) -> list[Problem]:
    """Every way a whole lock document breaks the schema (pure)."""
    if not isinstance(doc, dict):
        return [Problem(file, "", "not a JSON object", f"delete it or restore it from git ({DEFAULT_LOCK})")]
    out: list[Problem] = []
    if doc.get("lock_version") != LOCK_VERSION:
        out.append(
            Problem(file, "lock_version", f"{doc.get('lock_version')!r} is not {LOCK_VERSION}",
                    "regenerate it with this version of spark-images")
        )
    images = doc.get("images")
    if not isinstance(images, dict):
        return [*out, Problem(file, "images", "missing or not a mapping")]
    for name, entry in sorted(images.items()):
        if not isinstance(entry, dict):
            out.append(Problem(file, f"images.{name}", "not a mapping"))
            continue
        out.extend(entry_problems(entry, file, name))
    return out


def load_lock(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The lock document; an empty lock when the file does not exist.

    Raises Finding (exit 1) with one line per problem when it is malformed.
    """
    target = Path(path)
    try:
        text = target.read_text(encoding="utf-8")
    except FileNotFoundError:
        return empty_lock()
    except OSError as exc:
        raise UsageError(f"{target}: cannot read ({exc.strerror})") from exc
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise Finding(
            Problem(str(target), f"line {exc.lineno}", f"not JSON ({exc.msg})", "restore it from git")
        ) from exc
    problems = lock_problems(doc, str(target))
    if problems:
        raise Finding(*problems)
    return doc


@contextlib.contextmanager
def _exclusive(directory: Path) -> Iterator[None]:
    """Hold an exclusive flock on the directory for one read-modify-write."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def update_entry(path: str | os.PathLike[str], profile_name: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """Set one profile's entry and rewrite the lock atomically; return the new lock.

    ValueError when `entry` breaks the schema (a caller's bug, never written).
    """
    target = Path(path)
    problems = entry_problems(entry, str(target), profile_name)
    if problems:
        raise ValueError("; ".join(p.line() for p in problems))
    with _exclusive(target.parent.resolve()):
        doc = load_lock(target)
        doc["images"][profile_name] = dict(entry)
        atomic.write_json(target, doc)
    return doc


def make_entry(
    *,
    profile_path: str,
    repository: str,
    digest: str,
    plan: Mapping[str, Any],
    fixes_included: list[int],
    audit: Mapping[str, Any],
    cubins: Mapping[str, Any],
    coherence: Mapping[str, Any],
    source_date_epoch: int,
    tags: list[str] | None = None,
) -> dict[str, Any]:
    """A lock entry from the plan (as `BuildPlan.to_json()`) and the gates' sections (pure)."""

    def gate(section: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"status": section.get("status")}
        if section.get("reason"):
            out["reason"] = section["reason"]
        return out

    cubin_summary = {"verdict": cubins.get("verdict")}
    if "gpu" in cubins:
        cubin_summary["gpu"] = cubins["gpu"]
    return {
        "profile": profile_path,
        "image": f"{repository}@{digest}",
        "repository": repository,
        "digest": digest,
        "vllm_commit": plan["vllm_commit"],
        "vllm_version": plan["vllm_version"],
        "cuda_version": plan["cuda_version"],
        "cuda_line": plan["cuda_line"],
        "arch_list": plan["arch_list"],
        "base_image": plan.get("base_image", ""),
        "pins": dict(plan.get("pins", {})),
        "fixes_included": sorted(set(fixes_included)),
        "audit": gate(audit),
        "cubins": cubin_summary,
        "coherence": gate(coherence),
        "created": rfc3339(source_date_epoch),
        "source_date_epoch": source_date_epoch,
        "tags": list(tags or []),
    }

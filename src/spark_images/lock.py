"""images.lock.json: the digest of every image whose gates all passed.

`build` writes an entry only when every gate that ran passed (a skipped
coherence gate is recorded with its reason; see gates.py for which skips still
allow the lock). Each entry says which it is:
- `state: "candidate"`: written by `build`; its coherence gate may have been
  skipped (no sm_121 GPU where it was built); no tag points at it;
- `state: "promoted"`: `publish` proved it on a DGX Spark (`promote` with a
  passed coherence record of this digest) and moved its tags.
An entry without `state` (older locks) is a candidate. Writes are atomic and
serialised with an flock on the lock's directory, so two builds finishing at
once do not lose each other's entry.

The document is described once, by the typed model below (`LockDocument`,
`LockEntry` and its sections); `lock_problems` checks a file read from disk
against it, one line per broken field, and `make_entry` / `promote` build
entries of that type. Written with sorted keys (`atomic.dumps_json`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict

from spark_images import atomic, inputs, profile_values
from spark_images.errors import Finding, Problem, UsageError
from spark_images.registry.reference import is_digest  # the one digest grammar: a full match


# Optional keys sit in a `total=False` subclass: under postponed annotations (this module's
# `from __future__ import annotations`) Python 3.11 cannot see `NotRequired` in a TypedDict.
class _Gate(TypedDict):
    status: str  # "passed" | "skipped"


class GateSummary(_Gate, total=False):
    reason: str  # required when skipped


class _Cubins(TypedDict):
    verdict: str  # "native" | "partial" | ... (cubins.verdict)


class CubinSummary(_Cubins, total=False):
    gpu: str  # "sm_121"
    key: dict[str, Any]  # {"digest", "tool_version", "gpu", "globs"}


class _Entry(TypedDict):
    profile: str  # "profiles/cu130.yaml"
    image: str  # always REPOSITORY@DIGEST
    repository: str
    digest: str  # the manifest digest, sha256:<64 hex>
    vllm_commit: str  # 40 hex
    vllm_version: str
    cuda_version: str  # "13.0.2"
    cuda_line: str  # "cu130"
    arch_list: str  # "12.0f"
    base_image: str  # NAME:TAG@sha256:...
    pins: dict[str, str]  # {"torch": "...", ...}
    fixes_required: list[int]  # the plan's (also the image's label)
    fixes_included: list[int]  # what the audit found (+ patches), ascending
    audit: GateSummary
    cubins: CubinSummary
    coherence: GateSummary
    created: str  # RFC 3339, from SOURCE_DATE_EPOCH
    source_date_epoch: int
    tags: list[str]  # the human tags publish moved here


class LockEntry(_Entry, total=False):
    """One profile's image: `images.<profile name>` of the lock."""

    state: str  # "candidate" (written by build; also when absent) | "promoted" (by publish)
    promoted: dict[str, str]  # {"coherence_image": "REPO@sha256:..."}, set by promote


class LockDocument(TypedDict):
    lock_version: int
    images: dict[str, LockEntry]


LOCK_VERSION = 1
DEFAULT_LOCK = "images.lock.json"
HEX40 = profile_values.HEX40  # one pattern for a full commit, where profiles pin it; always .fullmatch

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
CANDIDATE = "candidate"
PROMOTED = "promoted"
STATES = (CANDIDATE, PROMOTED)


def empty_lock() -> LockDocument:
    return {"lock_version": LOCK_VERSION, "images": {}}


def rfc3339(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _shown(value: Any, limit: int = 80) -> str:
    """A lock value for a message: a clipped repr of a string, else its type (never an unbounded repr)."""
    if isinstance(value, str):
        return repr(value[:limit]) + ("..." if len(value) > limit else "")
    if value is None or isinstance(value, (bool, int, float)):
        return inputs.short(repr(value), limit)
    return f"a {type(value).__name__}"


def _key(name: str, limit: int = 80) -> str:
    """A profile name from the lock for a field path: control characters escaped (one line), clipped."""
    text = str(name)
    shown = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text[:limit])
    return shown + ("..." if len(text) > limit else "")


def entry_problems(entry: Mapping[str, Any], file: str, name: str) -> list[Problem]:
    """Every way `entry` breaks the schema (pure)."""
    where = f"images.{_key(name)}"
    out: list[Problem] = []

    def bad(field: str, message: str, fix: str = "") -> None:
        out.append(Problem(file, f"{where}.{field}", message, fix))

    for key in REQUIRED_STR:
        if not isinstance(entry.get(key), str) or not entry.get(key):
            bad(key, "missing or not a string", "rebuild the image with `spark-images build`")
    digest, repo = entry.get("digest"), entry.get("repository")
    if isinstance(digest, str) and not is_digest(digest):
        bad("digest", f"{_shown(digest)} is not sha256:<64 hex>")
    if isinstance(digest, str) and isinstance(repo, str) and entry.get("image") != f"{repo}@{digest}":
        bad("image", f"must be repository@digest ({_key(f'{repo}@{digest}', 200)})")
    commit = entry.get("vllm_commit")
    if isinstance(commit, str) and not HEX40.fullmatch(commit):
        bad("vllm_commit", f"{_shown(commit)} is not a 40-hex commit")
    if not isinstance(entry.get("pins"), dict):
        bad("pins", "missing or not a mapping")
    fixes = entry.get("fixes_included")
    # bool is an int in Python: `[true, false]` is not two PR numbers
    if not isinstance(fixes, list) or not all(type(n) is int and n > 0 for n in fixes):
        bad("fixes_included", "missing or not a list of PR numbers (positive integers)",
            "rebuild the image with `spark-images build`")
    if not isinstance(entry.get("tags", []), list):
        bad("tags", "not a list")
    state = entry.get("state", CANDIDATE)
    if state not in STATES:
        bad("state", f"{_shown(state)} is not one of {', '.join(STATES)}")
    elif state == PROMOTED and (entry.get("coherence") or {}).get("status") != "passed":
        bad("state", "promoted, but the coherence gate did not pass", "promote only through `spark-images publish`")
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
            Problem(file, "lock_version", f"{_shown(doc.get('lock_version'))} is not {LOCK_VERSION}",
                    "regenerate it with this version of spark-images")
        )
    images = doc.get("images")
    if not isinstance(images, dict):
        return [*out, Problem(file, "images", "missing or not a mapping")]
    for name, entry in sorted(images.items()):
        if not isinstance(entry, dict):
            out.append(Problem(file, f"images.{_key(name)}", "not a mapping"))
            continue
        out.extend(entry_problems(entry, file, name))
    return out


def load_lock(path: str | os.PathLike[str]) -> LockDocument:
    """The lock document; an empty lock when the file does not exist.

    Read through `inputs` (a regular file within the size limit: a FIFO or
    /dev/zero is refused, not waited on): UsageError (exit 2) when it cannot be
    read. Finding (exit 1) with one line per problem, each naming the file and
    the field, when it is not UTF-8, not JSON, nested too deeply, holds
    NaN/Infinity, or breaks the schema.
    """
    target = Path(path)
    file = inputs.display_path(target)
    if not os.path.lexists(target):  # a dangling symlink is read (and refused by name) below
        return empty_lock()
    data = inputs.read_bytes(target, what="lock", error=UsageError)
    text = inputs.decode_text(data, file=file, what="lock", error=Finding)
    doc = _parse(text, file)
    problems = lock_problems(doc, file)
    if problems:
        raise Finding(*problems)
    return doc  # type: ignore[no-any-return]


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _parse(text: str, file: str) -> Any:
    """Strict JSON with the lock's own one-line messages ("not JSON (...)", as before)."""
    fix = f"restore it from git ({DEFAULT_LOCK})"
    if inputs.json_depth_exceeds(text):  # linear scan first: json.loads would recurse
        raise Finding(Problem(file, "", f"not JSON as spark-images writes it (nests deeper than {inputs.MAX_DEPTH} levels)", fix))
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise Finding(Problem(file, f"line {exc.lineno}", f"not JSON ({exc.msg})", fix)) from None
    except ValueError as exc:  # NaN / Infinity / -Infinity, refused by _refuse_constant
        raise Finding(Problem(file, "", f"not JSON ({exc})", fix)) from None
    except RecursionError:  # belt and braces: the depth scan makes this unreachable
        raise Finding(Problem(file, "", "not JSON as spark-images writes it (nests too deeply)", fix)) from None


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


def record_candidate(path: str | os.PathLike[str], profile_name: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """Write `build`'s candidate entry in one locked read-modify-write; return what was written.

    A rebuild to the same digest keeps what the lock already knew of those
    bytes: the tags publish moved to them and, if promoted, the promotion.
    ValueError when `entry` breaks the schema (a caller's bug, never written).
    """
    target = Path(path)
    with _exclusive(target.parent.resolve()):
        doc = load_lock(target)
        previous = doc["images"].get(profile_name) or {}
        new = dict(entry)
        if previous.get("digest") == new.get("digest"):
            new["tags"] = sorted(set(previous.get("tags") or []) | set(new.get("tags") or []))
            if previous.get("state") == PROMOTED:
                new.update(state=PROMOTED, coherence=previous["coherence"])
                if "promoted" in previous:
                    new["promoted"] = previous["promoted"]
        problems = entry_problems(new, str(target), profile_name)
        if problems:
            raise ValueError("; ".join(p.line() for p in problems))
        doc["images"][profile_name] = new
        atomic.write_json(target, doc)
    return new


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
    fixes_required: list[int] | None = None,
) -> LockEntry:
    """A candidate's lock entry from the plan (as `BuildPlan.to_json()`) and the gates' sections (pure)."""

    def gate(section: Mapping[str, Any]) -> GateSummary:
        out: GateSummary = {"status": section.get("status")}  # type: ignore[typeddict-item]
        if section.get("reason"):
            out["reason"] = section["reason"]
        return out

    cubin_summary: CubinSummary = {"verdict": cubins.get("verdict")}  # type: ignore[typeddict-item]
    if "gpu" in cubins:
        cubin_summary["gpu"] = cubins["gpu"]
    if "key" in cubins:
        cubin_summary["key"] = cubins["key"]
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
        "state": CANDIDATE,
        "fixes_required": sorted(set(fixes_required if fixes_required is not None else plan.get("required_fixes", ()))),
        "fixes_included": sorted(set(fixes_included)),
        "audit": gate(audit),
        "cubins": cubin_summary,
        "coherence": gate(coherence),
        "created": rfc3339(source_date_epoch),
        "source_date_epoch": source_date_epoch,
        "tags": list(tags or []),
    }


def promote(entry: Mapping[str, Any], coherence: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A copy of a candidate entry as `promoted` (pure); `publish` calls it, nothing else.

    `coherence` is the Spark gate's coherence section (the record's
    `coherence`, or `spark-images coherence --json`); None keeps the entry's
    own, which must then have passed. The section must have passed on this
    very digest and on a real GPU. ValueError otherwise: publish checks the
    record with its rules first, so reaching it is a caller's bug.
    """
    gate = coherence if coherence is not None else entry.get("coherence") or {}
    digest = str(entry.get("digest", ""))
    if gate.get("status") != "passed":
        raise ValueError(f"promote {digest}: the coherence gate did not pass ({gate.get('status')!r})")
    if gate.get("assumed_gpu"):
        raise ValueError(f"promote {digest}: the coherence gate ran with --assume-gpu")
    image = gate.get("image")
    if coherence is not None and not (isinstance(image, str) and image.endswith(f"@{digest}")):
        raise ValueError(f"promote {digest}: the coherence record is of {image!r}, not of this digest")
    out = dict(entry)
    out["coherence"] = {"status": "passed"}
    out["state"] = PROMOTED
    if isinstance(image, str):
        out["promoted"] = {"coherence_image": image}
    return out

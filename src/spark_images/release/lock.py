"""images.lock.json: the digest of every image whose gates all passed.

`build` writes an entry only when every gate that ran passed (a skipped
coherence gate is recorded with its reason; see gates.py for which skips still
allow the lock). Each entry says which it is:
- `state: "candidate"`: written by `build`; its coherence gate may have been
  skipped (no sm_121 GPU where it was built); no tag points at it;
- `state: "promoted"`: `publish` proved it on a DGX Spark (`promote` with a
  passed coherence record of this digest) and moved its tags.
An entry without `state` (older locks) is a candidate. `recipes` holds one
line per recipe of the profile's `verify.coherence.recipes` ("recipe X passed
on D at T tok/s", or skipped with the reason); a promoted entry's lines all
passed, on its own digest. Writes are atomic and
serialised with an flock on the lock's directory, so two builds finishing at
once do not lose each other's entry.

The document is described once: the typed model below (`LockDocument`,
`LockEntry` and its sections) for the code, and `LOCK_SPEC`, the same fields as
a declarative schema, for files: `lock_problems` checks a file read from disk
against it, one line per broken field, the writers check their own entries
with it, and `spark-images schema lock` exports it as JSON Schema. Written with sorted keys (`atomic.dumps_json`).
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

from spark_images import defaults
from spark_images.core import atomic, inputs
from spark_images.core.errors import Finding, Problem, UsageError
from spark_images.profiles import values as profile_values
from spark_images.profiles.schema import Field, Validator, json_schema, validate
from spark_images.recipes.gate import RecipeLine  # a recipe's line: the recipe room says what it is


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

    recipes: list[RecipeLine]  # the profile's verify.coherence.recipes, as the gate left them
    state: str  # "candidate" (written by build; also when absent) | "promoted" (by publish)
    promoted: dict[str, str]  # {"coherence_image": "REPO@sha256:..."}, set by promote


class LockDocument(TypedDict):
    lock_version: int
    images: dict[str, LockEntry]


LOCK_VERSION = 1
DEFAULT_LOCK = defaults.LOCK_FILE
HEX40 = profile_values.HEX40  # one pattern for a full commit, where profiles pin it; always .fullmatch

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
    return inputs.short(str(name), limit)


# --- the schema: one declaration for the reader, the writer's self-check and `spark-images schema lock`


def _not_empty(value: Any) -> str | None:
    return "is empty" if value == "" else None


def _rebuilt(doc: str, **kw: Any) -> Field:
    """A string field `build` writes: required, not empty."""
    return Field(str, doc=doc, check=_not_empty, **kw)


_GATE = {
    "status": Field(str, enum=GATE_STATUSES, doc="passed, or skipped with the reason"),
    "reason": Field(str, required=False, max_length=2048, doc="why the gate was skipped"),
}
_CUBINS = {
    "verdict": Field(str, doc="the cubin verdict of the build's own scan (cubins.verdict)"),
    "gpu": Field(str, required=False, doc="the GPU the verdict is for, e.g. sm_121"),
    "key": Field(dict, required=False, doc="what the verdict was computed for: digest, tool_version, gpu, globs"),
}


def _rate(value: Any) -> str | None:
    return None if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else "must be a number above 0"


_RECIPE = {
    "recipe": Field(str, pattern=profile_values.NAME.pattern.strip("^$"), what="a recipe name", doc="recipes/NAME.yaml"),
    "file": Field(str, required=False, max_length=1024, doc="the recipe file, e.g. recipes/gpt-oss-120b.yaml"),
    "digest": Field(str, required=False, pattern=inputs.DIGEST.pattern, what="sha256:<64 hex>",
                    doc="the digest it was served on (the entry's)"),
    "status": Field(str, enum=GATE_STATUSES, doc="passed, or skipped with the reason"),
    "decode_tok_s": Field((int, float), required=False, check=_rate, doc="the measured batch-1 decode tok/s"),
    "reason": Field(str, required=False, max_length=2048, doc="why it was skipped"),
    "line": Field(str, max_length=4096, doc="'recipe X passed on DIGEST at T tok/s', or why it did not"),
}


# base_image, fixes_required, source_date_epoch and tags: always written, but locks written
# before them are still read (as they always were)
def _pr_numbers(value: list[Any]) -> str | None:
    # bool is an int in Python: `[true, false]` is not two PR numbers (one line for the list)
    if all(type(n) is int and n > 0 for n in value):
        return None
    return "not a list of PR numbers (positive integers)"


ENTRY_SPEC: dict[str, Field] = {
    "profile": _rebuilt("the profile file, e.g. profiles/cu130.yaml", max_length=1024),
    "image": _rebuilt("REPOSITORY@DIGEST", max_length=512),
    "repository": _rebuilt("HOST/NAME of the image", max_length=512),
    "digest": Field(str, pattern=inputs.DIGEST.pattern, what="sha256:<64 hex>", doc="the manifest digest"),
    "vllm_commit": Field(str, pattern=HEX40.pattern.strip("^$"), what="a 40-hex commit", doc="the pinned vLLM commit"),
    "vllm_version": _rebuilt("the pinned vLLM version"),
    "cuda_version": _rebuilt("e.g. 13.0.2"),
    "cuda_line": _rebuilt("e.g. cu130"),
    "arch_list": _rebuilt("TORCH_CUDA_ARCH_LIST of the build, e.g. 12.0f"),
    "base_image": Field(str, required=False, max_length=1024, doc="NAME:TAG@sha256:... the build started from"),
    "pins": Field(dict, keys=Field(str, max_length=128), values=Field(str, max_length=128), doc="name -> version"),
    "fixes_required": Field(list, required=False, check=_pr_numbers, max_items=1024, doc="the plan's PRs"),
    "fixes_included": Field(list, check=_pr_numbers, max_items=1024, doc="the PRs the audit found, ascending"),
    "audit": Field(dict, children=_GATE, doc="the audit gate"),
    "cubins": Field(dict, children=_CUBINS, doc="the cubin gate"),
    "coherence": Field(dict, children=_GATE, doc="the coherence gate (skipped unless built on a Spark)"),
    "created": _rebuilt("RFC 3339, from SOURCE_DATE_EPOCH"),
    "source_date_epoch": Field(int, required=False, doc="seconds since the epoch of every timestamp in the image"),
    "tags": Field(list, required=False, items=Field(str, max_length=128), doc="the tags publish moved here"),
    "recipes": Field(list, required=False, items=Field(dict, children=_RECIPE), max_items=256,
                     doc="each recipe of the profile's verify.coherence.recipes: passed on this digest at T tok/s, "
                     "or skipped with the reason"),
    "state": Field(str, required=False, enum=STATES, doc="candidate (build) or promoted (publish)"),
    "promoted": Field(dict, required=False, keys=Field(str, max_length=64), values=Field(str, max_length=512),
                      doc="set by publish: coherence_image"),
}
LOCK_SPEC: dict[str, Field] = {
    "lock_version": Field(int, check=lambda v: None if v == LOCK_VERSION else f"{_shown(v)} is not {LOCK_VERSION}",
                          doc="regenerate it with this version of spark-images"),
    "images": Field(dict, keys=Field(str, max_length=128), values=Field(dict, children=ENTRY_SPEC),
                    doc="profile name -> its image"),
}


def lock_json_schema() -> dict[str, Any]:
    """The JSON Schema of images.lock.json (`spark-images schema lock`), from the one declaration."""
    return json_schema(LOCK_SPEC, title="spark-images images.lock.json")


def _entry_rules(entry: Mapping[str, Any], file: str, where: str) -> list[Problem]:
    """What a field-by-field schema cannot say: how the fields of one entry agree."""
    out: list[Problem] = []
    digest, repo = entry.get("digest"), entry.get("repository")
    if isinstance(digest, str) and isinstance(repo, str) and entry.get("image") != f"{repo}@{digest}":
        out.append(Problem(file, f"{where}.image", f"must be repository@digest ({_key(f'{repo}@{digest}', 200)})"))
    coherence = entry.get("coherence")
    if entry.get("state") == PROMOTED and not (isinstance(coherence, dict) and coherence.get("status") == "passed"):
        out.append(Problem(file, f"{where}.state", "promoted, but the coherence gate did not pass",
                           "promote only through `spark-images publish`"))
    for gate in ("audit", "coherence"):
        section = entry.get(gate)
        if isinstance(section, dict) and section.get("status") == "skipped" and not section.get("reason"):
            out.append(Problem(file, f"{where}.{gate}", "skipped without a reason"))
    recipes = entry.get("recipes")
    for i, line in enumerate(recipes if isinstance(recipes, list) else []):
        if not isinstance(line, dict):
            continue
        at = f"{where}.recipes[{i}]"
        passed = line.get("status") == "passed"
        if passed and "decode_tok_s" not in line:
            out.append(Problem(file, f"{at}.decode_tok_s", "passed without a measured speed"))
        if line.get("status") == "skipped" and not line.get("reason"):
            out.append(Problem(file, at, "skipped without a reason"))
        if "digest" in line and isinstance(digest, str) and line["digest"] != digest:
            out.append(Problem(file, f"{at}.digest", f"{_shown(line['digest'])} is not the entry's digest"))
        if entry.get("state") == PROMOTED and not passed:
            out.append(Problem(file, f"{where}.state", f"promoted, but recipe {_shown(line.get('recipe'))} did not pass",
                               "promote only through `spark-images publish` with a Spark record of every recipe"))
    return out


def entry_problems(entry: Mapping[str, Any], file: str, name: str) -> list[Problem]:
    """Every way `entry` breaks the schema (pure)."""
    where = f"images.{_key(name)}"
    checker = Validator(file=file)
    checker.value(entry, Field(dict, children=ENTRY_SPEC), where)
    fix = "rebuild the image with `spark-images build`"
    found = [p if p.fix else Problem(p.file, p.field, p.message, fix) for p in checker.problems]
    return found + (_entry_rules(entry, file, where) if isinstance(entry, dict) else [])


def lock_problems(doc: Any, file: str) -> list[Problem]:
    """Every way a whole lock document breaks the schema (pure)."""
    if not isinstance(doc, dict):
        return [Problem(file, "", "not a JSON object", f"delete it or restore it from git ({DEFAULT_LOCK})")]
    out = validate(doc, LOCK_SPEC, file)
    images = doc.get("images")
    if isinstance(images, dict):
        for name, entry in sorted(images.items(), key=lambda kv: str(kv[0])):
            if isinstance(entry, dict):
                out.extend(_entry_rules(entry, file, f"images.{_key(name)}"))
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
                if "recipes" in previous:  # what the Spark proved of these bytes
                    new["recipes"] = previous["recipes"]
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
    recipes: list[RecipeLine] | None = None,
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
    entry: LockEntry = {
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
    if recipes:
        entry["recipes"] = list(recipes)
    return entry


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

"""`spark-images plan PROFILE...`: what a profile resolves to, for people and workflows.

The plan as the build reads it (repository, tags, arch list, CUDA line, vLLM
pin, labels) plus the coherence matrix the Spark gate will run (models,
backends, KV-cache dtypes and every combination), so that a workflow asks the
CLI instead of parsing the profile itself. With `--lock FILE` the profile's
lock entry comes along (`lock.image`, `lock.digest`, `lock.pr_title`, ...).

`--field PATH` prints one value per profile (a dotted path into the JSON
document, e.g. `repository`, `tags.line`, `lock.digest`): plain text, a list
one item per line; with `--json` one line of JSON, always an array with one
value per PROFILE, however many are given (`plan profiles/*.yaml --field name
--json` is a workflow matrix, with one profile too). A path with no value is a
usage error (exit 2).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from datetime import date
from pathlib import Path
from typing import Any

from spark_images import defaults
from spark_images.buildline.resolve import Resolved, resolve_profile
from spark_images.cli._common import add_json_flag, emit
from spark_images.coherence import verdict
from spark_images.core.errors import UsageError
from spark_images.recipes import gate as recipe_gate
from spark_images.recipes.model import Recipe
from spark_images.release import lock as lockfile
from spark_images.release import publish as rules

_ANY_DAY = date(2000, 1, 1)  # the immutable tag's prefix does not depend on the day


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "plan",
        help="print what a profile resolves to: repository, tags, arch list, coherence matrix",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("profiles", nargs="+", metavar="PROFILE", help="profile YAML files")
    parser.add_argument("--field", metavar="PATH",
                        help="print only this value, e.g. repository, tags.line, coherence.models, lock.digest")  # fmt: skip
    parser.add_argument("--lock", type=Path, metavar="FILE",
                        help="also report each profile's entry of this lock file under `lock`")  # fmt: skip
    add_json_flag(parser)
    parser.set_defaults(handler=run)


def _recipe_doc(recipe: Recipe) -> dict[str, Any]:
    argv, env = recipe_gate.serve_command(recipe)
    return {"recipe": recipe.name, "file": recipe.path, "argv": argv, "env": env}


def coherence_matrix(resolved: Resolved) -> dict[str, Any] | None:
    """The profile's verify.coherence settings and the combinations the gate tries, in order."""
    settings = resolved.profile.verify.coherence
    if settings is None:
        return None
    combos = verdict.combinations(
        settings.models, settings.moe_backends, settings.linear_backends, settings.kv_cache_dtypes
    )
    return {
        "models": list(settings.models),
        "moe_backends": list(settings.moe_backends),
        # null: each MoE backend is paired with the linear backend of the same name
        "linear_backends": list(settings.linear_backends) if settings.linear_backends is not None else None,
        "kv_cache_dtypes": list(settings.kv_cache_dtypes),
        "combinations": [c.to_json() for c in combos],
        # each recipe the gate serves, with the exact command (read and checked by resolve)
        "recipes": [_recipe_doc(r) for r in resolved.recipes],
    }


def _lock_doc(name: str, path: Path) -> dict[str, Any] | None:
    if not os.path.lexists(path):  # anything else (a FIFO, /dev/zero) is named by load_lock itself
        raise UsageError(f"--lock {path}: no such lock file (fix: build the profile first, or pass --lock FILE)")
    entry = (lockfile.load_lock(path).get("images") or {}).get(name)
    if not isinstance(entry, dict):
        return None
    return {**entry, "pr_title": rules.lock_pr_title(name, entry)}


def plan_doc(resolved: Resolved, lock_path: Path | None = None) -> dict[str, Any]:
    plan = resolved.plan
    doc: dict[str, Any] = {
        "name": plan.profile_name,
        "profile_path": plan.profile_path,
        "repository": plan.image_repository,
        "platform": defaults.TARGET_PLATFORM,
        # publish moves the line tag and creates the immutable one (its date is the promotion day)
        "tags": {
            "line": plan.profile_name,
            "immutable_prefix": rules.immutable_tag(plan.cuda_line, plan.vllm_commit, _ANY_DAY).removesuffix(
                f"{_ANY_DAY:%Y%m%d}"
            ),
        },
        "arch_list": plan.arch_list,
        "cuda_version": plan.cuda_version,
        "cuda_line": plan.cuda_line,
        "vllm_version": plan.vllm_version,
        "vllm_commit": plan.vllm_commit,
        "strategy": plan.strategy,
        "base_image": plan.base_image,
        "native_libraries": list(plan.native_libraries),
        "required_fixes": list(plan.required_fixes),
        "labels": dict(plan.labels),
        "coherence": coherence_matrix(resolved),
        "warnings": [w.to_json() for w in resolved.warnings],
        "plan": plan.to_json(),
    }
    if lock_path is not None:
        doc["lock"] = _lock_doc(plan.profile_name, lock_path)
    return doc


def field_value(doc: dict[str, Any], path: str, profile: str) -> Any:
    value: Any = doc
    for part in path.split("."):
        if not isinstance(value, dict) or value.get(part) is None:
            raise UsageError(f"{profile}: --field {path}: no value at {part!r} (fix: see `spark-images plan {profile} --json`)")
        value = value[part]
    return value


def _plain(value: Any, path: str) -> list[str]:
    if isinstance(value, dict):
        raise UsageError(f"--field {path}: an object, not a plain value (fix: add --json, or name a field inside it)")
    items = value if isinstance(value, list) else [value]
    if any(isinstance(i, dict | list) for i in items):
        raise UsageError(f"--field {path}: a list of objects (fix: add --json)")
    return [json.dumps(i) if isinstance(i, bool) else str(i) for i in items]


def _text(doc: dict[str, Any]) -> str:
    lines = [
        f"{doc['profile_path']}: {doc['name']}",
        f"  image      {doc['repository']} ({doc['platform']}), tags {doc['tags']['line']}, "
        f"{doc['tags']['immutable_prefix']}YYYYMMDD",
        f"  vLLM       {doc['vllm_version']} ({doc['vllm_commit']}), {doc['strategy']}",
        f"  CUDA       {doc['cuda_version']} ({doc['cuda_line']}), TORCH_CUDA_ARCH_LIST={doc['arch_list']}",
    ]
    matrix = doc["coherence"]
    if matrix is None:
        lines.append("  coherence  no verify.coherence settings")
    else:
        lines.append(f"  coherence  {len(matrix['combinations'])} combination(s):")
        lines += [f"    {c['model']} moe={c['moe_backend']} linear={c['linear_backend']} kv={c['kv_cache_dtype']}"
                  for c in matrix["combinations"]]  # fmt: skip
        lines += [f"    recipe {r['recipe']}: {shlex.join(r['argv'])}" for r in matrix["recipes"]]
    if "lock" in doc:
        entry = doc["lock"]
        lines.append(f"  lock       {entry['image']}" if entry else "  lock       no entry")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    docs = []
    for path in args.profiles:
        resolved = resolve_profile(path)
        for warning in resolved.warnings:
            print(f"spark-images plan: {warning.line()}", file=sys.stderr)
        docs.append(plan_doc(resolved, args.lock))
    if args.field:
        values = [field_value(doc, args.field, path) for doc, path in zip(docs, args.profiles, strict=True)]
        if args.json:  # one line, so that it fits a `name=value` line of $GITHUB_OUTPUT
            print(json.dumps(values, sort_keys=True, ensure_ascii=False))
        else:
            sys.stdout.write("".join(f"{line}\n" for value in values for line in _plain(value, args.field)))
        return 0
    emit(args, docs[0] if len(docs) == 1 else {"plans": docs}, "\n".join(_text(d) for d in docs))
    return 0

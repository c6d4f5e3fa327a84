"""A recipe YAML read minimally: the model, its serve arguments and env, the `cluster` section.

Recipes (`recipes/*.yaml`, one per served model) are defined by the recipes
room; until the two meet, this adapter reads only the keys a cluster plan
needs and ignores the rest, so a fuller recipe still plans. Keys read:
`name`, `model`, `profile` (optional), `serve.args`, `serve.env`, `cluster`.
Pure: `parse_recipe` takes the text; the loader is `load_source` in `plan_inputs`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spark_images import inputs
from spark_images.cluster.settings import ClusterSettings, parse_settings
from spark_images.errors import Finding, Problem

RECIPE_LIMIT = 256 * 1024


@dataclass(frozen=True)
class ServeSource:
    """What a plan serves, from a profile or a recipe."""

    kind: str  # "profile" | "recipe"
    path: str
    name: str
    model: str | None
    profile: str | None  # the profile a recipe names (its image's lock entry)
    serve_args: tuple[str, ...]
    serve_env: tuple[tuple[str, str], ...]
    cluster: ClusterSettings


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str | int | float) and not isinstance(v, bool) for v in value)


def parse_recipe(text: str, file: str) -> ServeSource:
    doc = inputs.loads_yaml(text, file=file, what="recipe", max_bytes=RECIPE_LIMIT)
    problems: list[Problem] = []
    if not isinstance(doc, dict):
        raise Finding(Problem(file=file, field="", message="a recipe is a mapping", fix="start with `name:` and `model:`"))
    name, model, profile = doc.get("name"), doc.get("model"), doc.get("profile")
    if not isinstance(name, str) or not name.strip():
        problems.append(Problem(file=file, field="name", message="missing or not a string", fix="name: qwen3-235b-tp2"))
    if not isinstance(model, str) or not model.strip():
        problems.append(Problem(file=file, field="model", message="missing or not a string", fix="model: ORG/NAME"))
    if profile is not None and not isinstance(profile, str):
        problems.append(Problem(file=file, field="profile", message="not a string", fix="profile: profiles/cu130.yaml"))
    serve = doc.get("serve") or {}
    args: Any = serve.get("args", []) if isinstance(serve, dict) else None
    env: Any = serve.get("env", {}) if isinstance(serve, dict) else None
    if not _strings(args):
        problems.append(Problem(file=file, field="serve.args", message="not a list of strings", fix='args: ["--max-num-seqs", "4"]'))
        args = []
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str | int) for k, v in env.items()):
        problems.append(Problem(file=file, field="serve.env", message="not a mapping of strings", fix="env: {NAME: value}"))
        env = {}
    settings, more = parse_settings(doc.get("cluster"), file)
    problems += more
    if problems:
        raise Finding(*problems)
    return ServeSource(
        kind="recipe",
        path=file,
        name=str(name),
        model=str(model),
        profile=profile,
        serve_args=tuple(str(a) for a in args),
        serve_env=tuple(sorted((k, str(v)) for k, v in env.items())),
        cluster=settings,
    )

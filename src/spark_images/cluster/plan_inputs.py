"""The thin edge of `cluster plan`: read the profile or recipe, the lock, a plan file.

Everything here reads files and decides nothing: the values go to the pure
`plan.make_plan`. A profile plans with the Spark defaults; a recipe's
`cluster` section (profiles/cluster.py) overrides them.
"""

from __future__ import annotations

import os
from pathlib import Path

from spark_images.cluster.plan import ClusterPlan, plan_from_json
from spark_images.cluster.recipe import RECIPE_LIMIT, ServeSource, source_of_recipe
from spark_images.core import inputs
from spark_images.core.errors import UsageError
from spark_images.profiles.cluster import spark_defaults
from spark_images.profiles.profile import load_profile, parse_profile
from spark_images.release import lock as lockfile

PLAN_LIMIT = 1024 * 1024


def _is_profile(doc: object) -> bool:
    return isinstance(doc, dict) and "vllm" in doc and "cuda" in doc


def load_source(path: Path, model: str | None) -> ServeSource:
    """A profile (served with the Spark defaults) or a recipe; `model` replaces the one it names."""
    file = inputs.display_path(path)
    if not path.is_file():
        raise UsageError(f"{file}: no such profile or recipe (fix: pass profiles/NAME.yaml or recipes/NAME.yaml)")
    # read once: the document says which it is, and the same text is parsed as that
    text = inputs.read_text(path, what="profile or recipe", limit=RECIPE_LIMIT)
    if _is_profile(inputs.loads_yaml(text, file=file, what="profile or recipe", max_bytes=RECIPE_LIMIT)):
        profile = parse_profile(text, file)
        models = profile.verify.coherence.models if profile.verify.coherence else ()
        return ServeSource(kind="profile", path=file, name=profile.name, model=model or (models[0] if models else None),
                           profile=file, serve_args=profile.serve_args, serve_env=tuple(sorted(profile.serve_env)),
                           cluster=spark_defaults())  # fmt: skip
    recipe = source_of_recipe(text, file)
    if model:
        recipe = ServeSource(**{**recipe.__dict__, "model": model})
    return recipe


def _profile_name(source: ServeSource, source_path: Path) -> str:
    if source.kind == "profile":
        return source.name
    if source.profile is None:
        raise UsageError(f"{source.path}: the recipe names no profile, so no lock entry gives the image "
                         "(fix: --image REPOSITORY@sha256:..., or `profile:` in the recipe)")  # fmt: skip
    candidates = [Path(source.profile), source_path.resolve().parent.parent / source.profile]
    for candidate in candidates:
        if candidate.is_file():
            return load_profile(candidate).name
    raise UsageError(f"{source.path}: profile: {source.profile}: no such file (fix: a path relative to the recipes' folder parent)")


def image_from_lock(source: ServeSource, source_path: Path, lock_path: Path) -> str:
    """The locked image (REPOSITORY@sha256:...) of the profile the source serves."""
    name = _profile_name(source, source_path)
    if not os.path.lexists(lock_path):
        raise UsageError(f"--lock {inputs.display_path(lock_path)}: no such lock file "
                         "(fix: build the profile first, or pass --image REPOSITORY@sha256:...)")  # fmt: skip
    entry = (lockfile.load_lock(lock_path).get("images") or {}).get(name)
    if not isinstance(entry, dict) or not isinstance(entry.get("image"), str):
        raise UsageError(f"{inputs.display_path(lock_path)}: images.{name}: no entry "
                         "(fix: build the profile, or pass --image REPOSITORY@sha256:...)")  # fmt: skip
    return str(entry["image"])


def load_plan(path: Path) -> ClusterPlan:
    """A plan file written by `cluster plan --json`."""
    file = inputs.display_path(path)
    if not path.is_file():
        raise UsageError(f"{file}: no such plan file (fix: `spark-images cluster plan ... --json > plan.json`)")
    return plan_from_json(inputs.load_json(path, what="cluster plan", limit=PLAN_LIMIT), file)

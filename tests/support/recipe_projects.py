"""A project folder whose shipped cu130 profile serves recipes: TMP/profiles/cu130.yaml
(with its requirements lock) and TMP/recipes/NAME.yaml, for the tests of the recipe
gate in tests/recipes and tests/coherence."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]


def write_project(tmp: Path, coherence: Callable[[dict[str, Any]], None], recipes: dict[str, dict[str, Any]]) -> Path:
    """The shipped profile with `coherence(doc["verify"])` applied, and RECIPES written beside it."""
    (tmp / "profiles").mkdir()
    (tmp / "recipes").mkdir()
    shutil.copy(REPO / "profiles" / "cu130.requirements.lock", tmp / "profiles")
    doc = yaml.safe_load((REPO / "profiles" / "cu130.yaml").read_text())
    coherence(doc["verify"])
    path = tmp / "profiles" / "cu130.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    for name, body in recipes.items():
        (tmp / "recipes" / f"{name}.yaml").write_text(yaml.safe_dump(body, sort_keys=False))
    return path

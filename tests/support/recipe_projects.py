"""Project folders made from the shipped cu130 profile (TMP/profiles/cu130.yaml with its
requirements lock): one whose profile serves recipes (and TMP/recipes/NAME.yaml), for
the tests of the recipe gate in recipes/ and coherence/; one whose gate serves a
one-combination matrix `rounds` times, for both halves of coherence/test_coherence_build_rounds."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from support.paths import REPO


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


def rounds_profile(tmp: Path, rounds: int | None) -> Path:
    """TMP/profiles/cu130.yaml: the shipped profile with a one-combination matrix, `rounds` set (or left out)."""
    (tmp / "profiles").mkdir(parents=True)
    shutil.copy(REPO / "profiles" / "cu130.requirements.lock", tmp / "profiles")
    doc = yaml.safe_load((REPO / "profiles" / "cu130.yaml").read_text())
    coherence: dict[str, Any] = {"models": ["org/m"], "moe_backends": ["marlin"], "kv_cache_dtypes": ["auto"]}
    if rounds is not None:
        coherence["rounds"] = rounds
    doc["verify"]["coherence"] = coherence
    path = tmp / "profiles" / "cu130.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path

"""Support for the recipe tests: the CLI as a subprocess, recipes written from a shipped one."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from support.paths import REPO

RECIPES = REPO / "recipes"
DELETE = object()  # write_recipe: drop the key


def run_cli(args: list[str], env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`spark-images ARGS` as a user runs it (a subprocess of the installed package)."""
    return subprocess.run([sys.executable, "-m", "spark_images", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})  # fmt: skip


def shipped(name: str) -> dict[str, Any]:
    return yaml.safe_load((RECIPES / f"{name}.yaml").read_text())


def write_recipe(tmp: Path, base: str, name: str, **changes: Any) -> Path:
    """recipes/BASE.yaml with top-level or dotted changes (`serve__args=[...]`; DELETE drops a key), written to TMP/NAME.yaml."""
    doc = copy.deepcopy(shipped(base))
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = doc
        for key in parents:
            node = node.setdefault(key, {})
        if value is DELETE:
            del node[last]
        else:
            node[last] = value
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path

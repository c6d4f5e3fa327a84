"""`spark-images schema recipe`: the recipe JSON Schema, from the same Field tree `recipe validate` applies.

Checked with tests/unit/spine's checker of exactly the keywords the export emits:
every shipped recipe is valid, and a schema-level mutation is refused by both.
"""

from __future__ import annotations

import importlib.util
import json

import yaml

from support.recipe_support import RECIPES, REPO, run_cli


def _checker():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("spine_schema_checker", REPO / "tests" / "unit" / "spine" / "test_spine_schema.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._errors


def test_shipped_recipes_are_valid_under_the_exported_schema() -> None:
    proc = run_cli(["schema", "recipe"])
    assert proc.returncode == 0, proc.stderr
    schema = json.loads(proc.stdout)
    assert schema["title"] == "spark-images recipe"
    errors = _checker()
    for path in sorted(RECIPES.glob("*.yaml")):
        assert errors(yaml.safe_load(path.read_text()), schema) == [], path
    bad = yaml.safe_load((RECIPES / "gpt-oss-120b.yaml").read_text())
    bad["limits"]["max_num_seqs"] = "four"
    bad["model"]["revison"] = "x"
    assert len(errors(bad, schema)) == 2

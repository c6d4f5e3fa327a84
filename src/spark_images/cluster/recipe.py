"""What a cluster plan serves, from a recipe or a profile (pure).

A recipe is read by the recipes room's own loader (`recipes.model`: the one
schema, strict validation); this module keeps what a two-Spark plan needs of it:
the model, the exact serve arguments (the recipe's own, its revision and its
limits, as the single-Spark gate serves it), its environment and its `cluster`
section (profiles/cluster.py) over the Spark defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

from spark_images.profiles.cluster import ClusterSettings, spark_defaults
from spark_images.recipes import gate as recipe_gate
from spark_images.recipes.model import RECIPE_LIMIT as RECIPE_LIMIT
from spark_images.recipes.model import Recipe, parse_recipe


@dataclass(frozen=True)
class ServeSource:
    """What a plan serves, from a profile or a recipe."""

    kind: str  # "profile" | "recipe"
    path: str
    name: str
    model: str | None
    profile: str | None  # the profile whose lock entry gives the image (a recipe: its first `profiles` name)
    serve_args: tuple[str, ...]
    serve_env: tuple[tuple[str, str], ...]
    cluster: ClusterSettings


def from_recipe(recipe: Recipe) -> ServeSource:
    return ServeSource(
        kind="recipe",
        path=recipe.path,
        name=recipe.name,
        model=recipe.model.reference(),
        profile=f"profiles/{recipe.profiles[0]}.yaml" if recipe.profiles else None,
        serve_args=tuple(recipe_gate.serve_args(recipe)),
        serve_env=recipe.serve_env,
        cluster=recipe.cluster or spark_defaults(),
    )


def source_of_recipe(text: str, file: str) -> ServeSource:
    return from_recipe(parse_recipe(text, file))

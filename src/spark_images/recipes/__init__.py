"""Recipes: one model served on a Spark, as pinned data, checked and fitted before it runs.

Owns: the recipe model and its schema (`model`), the facts read from an
image's own vLLM source (`check.vllm_source`, parsed with `ast`, never imported),
the recipe check (`checker`), the kernel needs of a recipe against the
image's cubin scan (`kernels`), the memory fit (`weights`, `kvcache`, `fit`,
with every documented figure in `defaults`), the hub and local reads of a
model's headers (`hub`, the only module here that does I/O besides
`collect`), and what the gate consumes and decides (`gate`: the served command, which
recipes a profile may list, the verdict and record of a run, its lock line;
`serving` serves them, in the image or as a local process, on the coherence room's machinery). Imports the schema machinery, bounded inputs, and the
check room's one pass over a target (`check.collect.gather`).
"""

from __future__ import annotations

from spark_images.recipes.model import Recipe, load_recipe, parse_recipe, recipe_json_schema

__all__ = ["Recipe", "load_recipe", "parse_recipe", "recipe_json_schema"]

"""`spark-images recipe check RECIPE --image TARGET` and `recipe validate RECIPE...`.

check: the recipe's exact `vllm serve` command against the image's own vLLM
source (flags, environment variables, backend and quantization names, read
with `ast`, never imported) and its cubin scan. Exit 0 nothing wrong, 1
findings, 2 usage (an unreadable recipe or target).
validate: schema and cross-field checks of each recipe; exit 1 when one is invalid.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from spark_images import defaults
from spark_images.cli._common import add_json_flag, emit, target
from spark_images.cli.check import TARGETS
from spark_images.core.errors import EXIT_FINDING, EXIT_OK, Finding, UsageError
from spark_images.core.inputs import display_path
from spark_images.recipes import gate
from spark_images.recipes.model import load_recipe


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser("recipe", help="check a served-model recipe against an image; validate recipes",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="recipe_command", metavar="VERB")
    verbs.required = True
    check = verbs.add_parser("check", help="the recipe's serve command against TARGET's vLLM, without a GPU",
                             description="Read TARGET once and judge the recipe's command. " + TARGETS)
    check.add_argument("recipe", metavar="RECIPE", help="recipes/NAME.yaml")
    check.add_argument("--image", required=True, type=target, metavar="TARGET", help="anything `check` takes")
    check.add_argument("--gpu", default=defaults.GPU, help=f"GPU architecture (default: {defaults.GPU}, the DGX Spark)")
    add_json_flag(check)
    check.set_defaults(handler=run_check)
    validate = verbs.add_parser("validate", help="schema and cross-field checks of recipes")
    validate.add_argument("recipes", nargs="+", metavar="RECIPE")
    add_json_flag(validate)
    validate.set_defaults(handler=run_validate)


def run_check(args: argparse.Namespace) -> int:
    from spark_images.recipes.checker import check_recipe
    from spark_images.recipes.target import read_target

    recipe = load_recipe(args.recipe)  # Finding (exit 1) / UsageError (exit 2) name the file
    facts, found = read_target(args.image, args.gpu)
    inv = found.inventory
    result = check_recipe(recipe, facts, version=inv.vllm_version or inv.version_of("vllm"),
                          libraries=found.libraries, packages=inv.packages)
    argv, env = gate.serve_command(recipe)
    doc: dict[str, Any] = {
        "recipe": recipe.name, "file": recipe.path, "target": found.target, "kind": found.kind, "digest": found.digest,
        "vllm": {"version": inv.vllm_version or inv.version_of("vllm"), "commit": inv.vllm_commit},
        "argv": argv, "env": env, "facts": facts.to_json(),
        "verdict": "ok" if not result.reasons else result.reasons[0].impact,
        "reasons": [r.to_json() for r in result.reasons], "notes": list(result.notes),
    }  # fmt: skip
    lines = [f"{recipe.path} on {found.target} (vLLM {doc['vllm']['version'] or 'unknown'}): {doc['verdict']}"]
    lines += [f"  {r.line()}" for r in result.reasons]
    lines += [f"  note: {n}" for n in result.notes]
    emit(args, doc, "\n".join(lines))
    return EXIT_FINDING if result.reasons else EXIT_OK


def run_validate(args: argparse.Namespace) -> int:
    results: list[dict[str, Any]] = []
    worst = EXIT_OK
    text: list[str] = []
    for given in args.recipes:
        path = display_path(given)
        try:
            recipe = load_recipe(given)
        except (Finding, UsageError) as exc:
            for p in exc.problems:
                print(p.line(), file=sys.stderr)
            results.append({"recipe": path, "status": "invalid", "problems": [p.to_json() for p in exc.problems]})
            text.append(f"{path}: invalid ({len(exc.problems)} problem(s))")
            worst = max(worst, exc.exit_code)
            continue
        results.append({"recipe": path, "status": "valid", "name": recipe.name, "recipe_status": recipe.status})
        text.append(f"{path}: valid ({recipe.name}, {recipe.status})")
    emit(args, {"recipes": results, "exit_code": worst}, "\n".join(text))
    return worst

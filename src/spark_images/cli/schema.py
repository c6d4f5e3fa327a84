"""`spark-images schema [profile|recipe]`: the JSON Schema of a profile (default) or a recipe.

Generated from the one schema in `spark_images.profiles` (the same fields,
types, patterns and defaults `validate` applies), so it cannot drift from
what validate accepts. The toolchain rules (arch lists, known-bad pins, base
image flavour) and the checks written as code are not expressible here:
`spark-images validate` remains the judge. For example, in VS Code with the
YAML extension: `# yaml-language-server: $schema=profile.schema.json`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spark_images import atomic
from spark_images.profiles import profile_json_schema


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "schema",
        help="print the JSON Schema of a profile or a recipe (for editors)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("kind", nargs="?", choices=("profile", "recipe"), default="profile",
                        help="which document: profile (default) or recipe")
    parser.add_argument("-o", "--output", type=Path, metavar="FILE", help="write it to FILE instead of stdout")
    parser.add_argument("--json", action="store_true", help="accepted for symmetry: the output is always JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.kind == "recipe":
        from spark_images.recipes.model import recipe_json_schema

        text = atomic.dumps_json(recipe_json_schema())
    else:
        text = atomic.dumps_json(profile_json_schema())
    if args.output is not None:
        atomic.write_text(args.output, text)
        print(f"wrote {args.output}", file=sys.stderr)
        return 0
    sys.stdout.write(text)
    return 0

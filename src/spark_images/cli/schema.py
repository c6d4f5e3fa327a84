"""`spark-images schema [profile|recipe|lock]`: the JSON Schema of a file people edit or read.

Each is generated from the one declaration its reader checks against
(`profiles.profile`, `recipes.model`, `release.lock`): the same fields, types,
patterns and defaults, so the schema cannot drift from what is accepted. The
toolchain rules and the checks written as code are not expressible here:
`spark-images validate` (and the lock's reader) remain the judge. For example,
in VS Code with the YAML extension: `# yaml-language-server: $schema=profile.schema.json`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from spark_images.core import atomic

KINDS = ("profile", "recipe", "lock")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "schema",
        help="print the JSON Schema of a profile, a recipe or the lock (for editors and checkers)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("kind", nargs="?", choices=KINDS, default="profile",
                        help="which document: profile (default), recipe or lock (images.lock.json)")  # fmt: skip
    parser.add_argument("-o", "--output", type=Path, metavar="FILE", help="write it to FILE instead of stdout")
    parser.add_argument("--json", action="store_true", help="accepted for symmetry: the output is always JSON")
    parser.set_defaults(handler=run)


def schema_of(kind: str) -> dict[str, Any]:
    if kind == "recipe":
        from spark_images.recipes.model import recipe_json_schema

        return recipe_json_schema()
    if kind == "lock":
        from spark_images.release.lock import lock_json_schema

        return lock_json_schema()
    from spark_images.profiles.profile import profile_json_schema

    return profile_json_schema()


def run(args: argparse.Namespace) -> int:
    text = atomic.dumps_json(schema_of(args.kind))
    if args.output is not None:
        atomic.write_text(args.output, text)
        print(f"wrote {args.output}", file=sys.stderr)
        return 0
    sys.stdout.write(text)
    return 0

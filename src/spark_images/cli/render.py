"""`spark-images render PROFILE [-o DIR]`: the Dockerfile and plan.json of a profile.

With `-o DIR` the whole build context is prepared in memory and written into a
temporary directory beside DIR, then renamed into place: a failure leaves DIR
as it was. DIR must be new, empty, or an earlier render (nothing else in it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spark_images.buildline.render import render_dockerfile, write_render
from spark_images.buildline.resolve import resolve_profile
from spark_images.cli._common import add_json_flag, emit
from spark_images.core.inputs import display_path


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("render", help="render the Dockerfile and plan.json of a profile")
    parser.add_argument("profile", metavar="PROFILE", help="profile YAML file")
    parser.add_argument(
        "-o", "--output", type=Path, metavar="DIR",
        help="write the build context (Dockerfile, plan.json, patches, lock) into DIR; "
        "without it the Dockerfile goes to stdout",
    )
    add_json_flag(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    resolved = resolve_profile(args.profile)
    for warning in resolved.warnings:
        print(f"spark-images render: {warning.line()}", file=sys.stderr)
    if args.output is None:
        dockerfile = render_dockerfile(resolved.plan)
        emit(args, {"profile": display_path(args.profile), "dockerfile": dockerfile, "plan": resolved.plan.to_json()}, dockerfile)
        return 0
    dockerfile_path, plan_path = write_render(resolved.plan, args.output, resolved.base_dir)
    emit(
        args,
        {"profile": display_path(args.profile), "dockerfile": display_path(dockerfile_path), "plan": display_path(plan_path)},
        f"wrote {display_path(dockerfile_path)} and {display_path(plan_path)}",
    )
    return 0

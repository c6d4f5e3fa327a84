"""`spark-images audit TARGET`: which upstream vLLM fixes a target contains.

TARGET: a commit SHA (full or short), a release (`v0.22.0` / `0.22.0`), a
profile (`profiles/NAME.yaml`: its vllm.commit, required fixes and patches),
a wheel file, `vllm==X`, a directory, or an image (`docker://NAME`,
`HOST/REPO:TAG`, read from the registry's layers without a daemon or a pull).
States: included, cherry-picked, patched (these count as present),
effect-unproven (in the history, but an empty commit or a marker that could
not be checked), effect-absent, reverted, absent, unknown (cut history).
Exit 1 when an asked (`--fix`) or required fix is not present; 2 for
usage/environment problems.

First releases come from PyPI's release list (the clone's tags only cache
their commits). When an earlier release could not be checked, the first
release is null with `first_release_at_most` and `unchecked_releases`.

--discover [--since REF]: also list merged PRs in REF..TARGET (default: from
the previous release in TARGET's history) that look Spark-relevant but are not
in the knowledge base, each with its evidence line (`discovered` in --json);
`spark-images kb add PR` drafts an entry for one.

History: --repo PATH (any clone of vLLM), else a treeless bare clone cached in
$XDG_CACHE_HOME/spark-images/vllm.git (default ~/.cache), fetched when older
than an hour or when the target is not in it. SPARK_IMAGES_VLLM_GIT_URL
overrides the upstream URL, SPARK_IMAGES_PYPI_SIMPLE the package index used
to turn an untagged release into its commit.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from spark_images.audit import audit_target
from spark_images.audit.report import render_markdown, render_table
from spark_images.audit.resolving import ProfileFacts
from spark_images.cli._common import add_json_flag, emit, target
from spark_images.core.errors import EXIT_FINDING, EXIT_OK, UsageError


def _pr(text: str) -> int:
    value = text.strip().lstrip("#")
    if not value.isdigit() or int(value) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a PR number (e.g. 40082 or #40082)")
    return int(value)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "audit",
        help="which upstream vLLM fixes a commit, release, profile, wheel or image contains",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("target", type=target, metavar="TARGET", help="commit, release, profile .yaml, wheel, vllm==X or image")
    parser.add_argument("--fix", dest="fixes", metavar="N", type=_pr, action="append", nargs="+", default=[],
                        help="only these PRs (repeatable); exit 1 if one is missing")
    parser.add_argument("--repo", metavar="PATH", type=Path, help="a local vLLM clone (default: a cached treeless clone)")
    parser.add_argument("--markdown", action="store_true", help="print Markdown (for CI summaries)")
    parser.add_argument("--discover", action="store_true",
                        help="also list Spark-relevant PRs in the range that the knowledge base lacks")
    parser.add_argument("--since", metavar="REF", help="start of the --discover range (default: the previous release)")
    add_json_flag(parser)
    parser.set_defaults(handler=run)


def profile_facts(path: Path) -> ProfileFacts:
    """A profile as the build plans it (the build's own resolver), for the audit."""
    # imported here: the build line's modules cost ~0.1 s, and only a profile target needs them
    from spark_images.buildline.resolve import resolve_profile

    resolved = resolve_profile(path, read_lock=False)
    plan = resolved.plan
    return ProfileFacts(commit=plan.vllm_commit, required=tuple(plan.required_fixes), patches=plan.patches,
                        strategy=plan.strategy, base_dir=resolved.base_dir)  # fmt: skip


def run(args: argparse.Namespace) -> int:
    if args.json and args.markdown:
        raise UsageError("--json and --markdown: choose one")
    if args.since is not None and not args.discover:
        raise UsageError("--since needs --discover")
    if args.since is not None and (not args.since.strip() or args.since.startswith("-")):
        raise UsageError(f"--since {args.since!r}: not a git revision (give a tag, branch or commit)")
    fixes = [n for group in args.fixes for n in group]
    report = audit_target(args.target, fixes=fixes, repo=args.repo, discover=args.discover, since=args.since,
                          profile_resolver=profile_facts)  # fmt: skip
    text = render_markdown(report) if args.markdown else render_table(report)
    emit(args, report.to_json(), text)
    return EXIT_FINDING if report.missing_required else EXIT_OK

"""`spark-images build PROFILE`: the whole line, from profile to a locked digest.

validate -> audit -> render -> build (push) -> cubins -> coherence -> lock.
Progress goes to stderr; the summary to stdout (or one JSON document with
--json). Exit 0 when every gate passed and the lock was written (a
`candidate` entry), 1 when a gate failed (the summary names the stage and
why), 2 when the environment cannot run the line (no engine, no buildx, no
arm64 emulation, a package index or registry out of reach: the summary quotes
the build's own line and names the remedy, e.g. --ca-cert FILE for TLS).

--push REPO pushes by digest only; no tag is created. Tags move with
`spark-images publish`, after the gates proved the digest.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spark_images.buildline import pipeline, summary
from spark_images.cli._common import add_json_flag, emit
from spark_images.core.errors import UsageError
from spark_images.registry.reference import ImageReference
from spark_images.release import lock


def add_build_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profile", metavar="PROFILE", help="profile YAML, e.g. profiles/cu130.yaml")
    parser.add_argument(
        "--ca-cert",
        metavar="FILE",
        type=Path,
        help="extra CA bundle (PEM) trusted by every download of the build; a secret, never in a layer",
    )
    parser.add_argument(
        "--vllm-repo", "--repo", dest="vllm_repo", metavar="PATH", type=Path,
        help="local vLLM git clone for the audit (default: its cached clone)",
    )
    parser.add_argument(
        "--build-dir", metavar="DIR", type=Path, help="where the context and record go (default build/NAME)"
    )
    parser.add_argument("--quiet", action="store_true", help="do not stream the build progress")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "build",
        help="build, push, inspect and lock the image of a profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_build_flags(parser)
    parser.add_argument(
        "--push", metavar="HOST/NAME",
        help="push to this repository by digest only (no tag: tags move with `spark-images publish`)",
    )
    parser.add_argument(
        "--cache",
        metavar="DIR|REF",
        help="BuildKit cache to import from and export to: a local directory or a registry ref",
    )
    parser.add_argument("--dry-run", action="store_true", help="validate, audit and render only")
    parser.add_argument("--no-cache", action="store_true", help="build without BuildKit's cache")
    parser.add_argument("--keep-oci", action="store_true", help="keep build/NAME/image.oci.tar")
    parser.add_argument(
        "--lock", metavar="FILE", type=Path, default=Path(lock.DEFAULT_LOCK), help="lock file (default %(default)s)"
    )
    add_json_flag(parser)
    parser.set_defaults(handler=run)


def check_inputs(args: argparse.Namespace) -> None:
    if not Path(args.profile).is_file():
        raise UsageError(f"{args.profile}: no such profile file")
    if args.ca_cert is not None and not args.ca_cert.is_file():
        raise UsageError(f"--ca-cert {args.ca_cert}: no such file")


def push_repository(target: str | None) -> ImageReference | None:
    """`--push HOST/NAME` as a repository; a tag or digest in it is a usage error (exit 2)."""
    if target is None:
        return None
    ref = ImageReference.parse(target.strip(), what="--push")
    if ref.tag or ref.digest:
        what = "a digest" if ref.digest else f"the tag {ref.tag!r}"
        raise UsageError(
            f"--push {target}: `build` pushes by digest only and never creates a tag, so {what} has no place "
            f"here (fix: `--push {ref.host}/{ref.repository}`, then `spark-images publish PROFILE --tag TAG` "
            "moves tags once the gates proved the digest)"
        )
    return ImageReference(ref.host, ref.repository)


def stderr_log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    check_inputs(args)
    opts = pipeline.BuildOptions(
        profile=Path(args.profile),
        push=push_repository(args.push),
        cache=args.cache,
        ca_cert=args.ca_cert,
        dry_run=args.dry_run,
        lock_path=args.lock,
        build_dir=args.build_dir,
        vllm_repo=args.vllm_repo,
        no_cache=args.no_cache,
        keep_oci=args.keep_oci,
    )
    log = (lambda _line: None) if args.quiet else stderr_log
    outcome = pipeline.run_build(opts, log)
    doc = outcome.record.to_json()
    text = summary.terminal(doc)
    if outcome.record_path:
        text += f"record: {outcome.record_path}\n"
    if outcome.report_path:
        text += f"report: {outcome.report_path}\n"
    emit(args, doc, text)
    return outcome.exit_code

"""`spark-images verify-repro PROFILE`: build twice without cache, compare digests.

Exit 0 when both builds give one manifest digest, 1 when they differ (the
files and config fields that differ are listed), 2 when the environment
cannot build (no engine, no buildx, no arm64 emulation).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from spark_images.buildline import pipeline
from spark_images.cli._common import add_json_flag, emit
from spark_images.cli.build import add_build_flags, check_inputs, stderr_log


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "verify-repro",
        help="build a profile twice without cache and compare the manifest digests",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_build_flags(parser)
    add_json_flag(parser)
    parser.set_defaults(handler=run)


def text(doc: dict) -> str:
    if "reproducible" not in doc:
        stages = doc.get("stages", {})
        failed = [f"{k}: {v.get('reason', '')}" for k, v in stages.items() if isinstance(v, dict) and v.get("status") in ("failed", "error")]
        return f"verify-repro {doc.get('profile')}: not built ({doc.get('reason') or '; '.join(failed)})\n"
    lines = [f"verify-repro {doc['profile']}: " + ("reproducible" if doc["reproducible"] else "NOT reproducible")]
    for n, digest in enumerate(doc["digests"], start=1):
        lines.append(f"  build {n}: {digest} ({doc['build_seconds'][n - 1]:.1f} s)")
    lines.append(f"  SOURCE_DATE_EPOCH {doc['source_date_epoch']} ({doc['source_date_epoch_from']})")
    for diff in doc.get("differences", []):
        lines.append(f"  differs: {diff}")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    check_inputs(args)
    opts = pipeline.BuildOptions(
        profile=Path(args.profile),
        ca_cert=args.ca_cert,
        build_dir=args.build_dir,
        vllm_repo=args.vllm_repo,
        no_cache=True,
    )
    log = (lambda _line: None) if args.quiet else stderr_log
    outcome = pipeline.verify_repro(opts, log)
    emit(args, outcome.doc, text(outcome.doc))
    return outcome.exit_code

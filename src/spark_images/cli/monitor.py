"""`spark-images monitor PROFILE --pinned A.json --release B.json [--main C.json]`.

Compares `spark-images audit --json` documents of the profile's pinned commit
and of a newer vLLM release (and main), decides whether to bump the profile,
writes the pull request body (--body FILE) and, with --apply, moves the
profile's vLLM pin (and, for the wheel strategy, the release wheel URL and
sha256 read from the package index) to the release. Exit 0 whatever the
decision: read `bump` from the --json document.

Also runnable as `python -m spark_images.cli.monitor ...`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spark_images import atomic, pypi
from spark_images import monitor as rules
from spark_images.cli._common import add_json_flag, emit
from spark_images.errors import EnvironmentProblem, Finding, Problem, UsageError
from spark_images.profiles import load_profile

SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "monitor",
        help="diff audits of the pinned vLLM and a newer release; propose a profile bump",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("profile", metavar="PROFILE", help="profile YAML file (profiles/cu130.yaml)")
    parser.add_argument("--pinned", required=True, type=Path, metavar="FILE",
                        help="`spark-images audit PROFILE --json` output")
    parser.add_argument("--release", required=True, type=Path, metavar="FILE",
                        help="`spark-images audit vX.Y.Z --json` output for the newest release")
    parser.add_argument("--main", type=Path, metavar="FILE", help="`spark-images audit main --json` output")
    parser.add_argument("--release-version", metavar="X.Y.Z",
                        help="the release's version (default: the release audit's target)")
    parser.add_argument("--body", type=Path, metavar="FILE", help="write the pull request body (Markdown) here")
    parser.add_argument("--apply", action="store_true",
                        help="when the decision is to bump, rewrite the profile's vLLM pin")
    add_json_flag(parser)
    parser.set_defaults(handler=run)


def _read_audit(path: Path, option: str) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"{option} {path}: cannot read ({exc.strerror})") from None
    except ValueError as exc:
        raise UsageError(f"{option} {path}: not JSON ({exc}) (fix: pass `spark-images audit TARGET --json` output)") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{option} {path}: not a JSON object")
    return doc


def _release_wheel(version: str) -> tuple[str, str]:
    import requests  # only --apply on a wheel profile needs the network

    base = pypi.index_url()
    try:
        resp = requests.get(f"{base}/vllm/", headers={"Accept": SIMPLE_JSON}, timeout=60)
    except requests.RequestException as exc:
        raise EnvironmentProblem(f"cannot reach the package index {base} ({exc.__class__.__name__})") from None
    if resp.status_code != 200:
        raise EnvironmentProblem(f"{base}/vllm/ answered HTTP {resp.status_code}")
    try:
        doc = resp.json()
    except ValueError:
        raise EnvironmentProblem(f"{base}/vllm/ did not answer PEP 691 JSON") from None
    wheel = rules.pick_aarch64_wheel(doc, version)
    if wheel is None:
        raise Finding(f"{base}/vllm/: no manylinux aarch64 wheel of vLLM {version} (fix: bump by hand, "
                      "or switch the profile to the source strategy)")
    return wheel


def run(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)
    pinned = _read_audit(args.pinned, "--pinned")
    release = _read_audit(args.release, "--release")
    main = _read_audit(args.main, "--main") if args.main else None
    release_version = (args.release_version or str(release.get("target") or "")).removeprefix("v")
    if rules.version_key(release_version) is None:
        raise UsageError(f"release version {release_version!r} is not X.Y.Z (fix: pass --release-version)")
    try:
        release_diff = rules.diff_audits(pinned, release, names=(str(args.pinned), str(args.release)))
        main_diff = rules.diff_audits(pinned, main, names=(str(args.pinned), str(args.main))) if main else None
    except rules.AuditDocError as exc:
        raise UsageError(str(exc)) from None
    decision = rules.decide_bump(release_diff, profile.vllm.version, release_version)
    body = rules.render_pr_body(profile.name, profile.vllm.version, release_version, release_diff, decision, main_diff)
    if args.body:
        atomic.write_text(args.body, body)

    applied = False
    if args.apply and decision.bump:
        commit = release_diff.other_commit
        if len(commit) != 40:
            raise UsageError(f"--release {args.release}: commit {commit!r} is not the full 40-hex commit")
        wheel = _release_wheel(release_version) if profile.build.strategy == "wheel" else None
        path = Path(args.profile)
        try:
            text = rules.bump_profile_text(
                path.read_text(encoding="utf-8"), old_version=profile.vllm.version,
                version=release_version, commit=commit, wheel=wheel,
            )
        except ValueError as exc:
            raise Finding(Problem(str(path), "vllm", str(exc), "bump the profile by hand")) from None
        atomic.write_text(path, text)
        applied = True

    doc = {
        "profile": profile.name,
        "profile_file": str(args.profile),
        "pinned_version": profile.vllm.version,
        "release_version": release_version,
        "bump": decision.bump,
        "decision": decision.to_json(),
        "title": f"{profile.name}: bump vLLM {profile.vllm.version} -> {release_version}",
        "branch": f"upstream-monitor/{profile.name}-vllm-{release_version}",
        "release": release_diff.to_json(),
        "main": main_diff.to_json() if main_diff else None,
        "body": str(args.body) if args.body else None,
        "applied": applied,
    }
    verb = "bump" if decision.bump else "no bump"
    emit(args, doc, f"{profile.name}: {verb}: {decision.reason}" + (f" (rewrote {args.profile})" if applied else ""))
    return 0


def standalone(argv: Sequence[str] | None = None) -> int:
    """`python -m spark_images.cli.monitor`: the subcommand through the one dispatcher
    (so its errors, --json error document and exit codes are those of `spark-images monitor`)."""
    from spark_images.cli import main

    return main(["monitor", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(standalone())

"""`spark-images monitor PROFILE --pinned A.json --release B.json [--release ...] [--main C.json]`.

Compares `spark-images audit --json` documents of the profile's pinned commit
and of every newer vLLM release and rc (--release, repeatable; and main),
decides whether to bump the profile to the newest final release that gains a
fix the pin lacks, writes the pull request body (--body FILE) and, with
--apply, moves the profile's vLLM pin (and, for the wheel strategy, the
release wheel URL and sha256 read from the package index) to it. The
`discovered` lists of the documents (`audit main --discover`) go into the
body. Exit 0 whatever the decision: read `bump` from the --json document.

`spark-images monitor PROFILE --new-releases [--repo PATH] --json`: the
releases (PyPI's finals, vLLM's rc tags) newer than the profile's pin, oldest
first, each with its commit in the history: the list to audit.

Also runnable as `python -m spark_images.cli.monitor ...`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spark_images import pypi
from spark_images.cli._common import add_json_flag, emit
from spark_images.core import atomic
from spark_images.core.errors import Finding, Problem, UsageError
from spark_images.profiles.profile import load_profile
from spark_images.release import monitor as rules


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "monitor",
        help="diff audits of the pinned vLLM and a newer release; propose a profile bump",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("profile", metavar="PROFILE", help="profile YAML file (profiles/cu130.yaml)")
    parser.add_argument("--pinned", type=Path, metavar="FILE",
                        help="`spark-images audit PROFILE --json` output")
    parser.add_argument("--release", type=Path, metavar="FILE", action="append", default=[],
                        help="`spark-images audit vX.Y.Z --json` output of a newer release or rc (repeatable)")
    parser.add_argument("--new-releases", action="store_true",
                        help="list the releases and rcs newer than the pin (to audit), then stop")
    parser.add_argument("--repo", type=Path, metavar="PATH", help="with --new-releases: a local vLLM clone")
    parser.add_argument("--main", type=Path, metavar="FILE", help="`spark-images audit main --json` output")
    parser.add_argument("--release-version", metavar="X.Y.Z",
                        help="the release's version (default: the release audit's target)")
    parser.add_argument("--body", type=Path, metavar="FILE", help="write the pull request body (Markdown) here")
    parser.add_argument("--apply", action="store_true",
                        help="when the decision is to bump, rewrite the profile's vLLM pin")
    parser.add_argument("--github-output", type=Path, metavar="FILE",
                        help="append bump=, branch=, title= and release_version= lines (a workflow's $GITHUB_OUTPUT)")
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
    """The release wheel's URL and sha256, from the index through the one PyPI client
    (`pypi.project_index`: size cap, overall deadline, strict JSON); this module does no HTTP."""
    base = pypi.index_url()
    doc = pypi.project_index("vllm", index=base, what=f"vLLM {version}")
    wheel = rules.pick_aarch64_wheel(doc, version)
    if wheel is None:
        raise Finding(f"{base}/vllm/: no manylinux aarch64 wheel of vLLM {version} (fix: bump by hand, "
                      "or switch the profile to the source strategy)")
    return wheel


def _new_releases(args: argparse.Namespace, pinned_version: str) -> int:
    from spark_images.audit import Auditor, open_history
    from spark_images.audit.releases import parse_tag

    pin = parse_tag(pinned_version)
    if pin is None:
        raise UsageError(f"{args.profile}: vllm.version {pinned_version!r} is not a release version")
    auditor = Auditor(open_history(args.repo))
    rows = [{"version": r.name.version, "tag": r.tag, "kind": r.name.kind, "commit": r.commit,
             "unchecked": r.why_unchecked or None}
            for r in auditor.releases() if r.name.key > pin.key]
    # one `TAG<TAB>COMMIT<TAB>WHY-UNCHECKED` line per release, for `while read` in a workflow step
    text = "\n".join(f"{r['tag']}\t{r['commit'] or '-'}\t{r['unchecked'] or ''}".rstrip() for r in rows)
    if not rows:
        print(f"spark-images monitor: no release newer than {pinned_version}", file=sys.stderr)
    emit(args, rows, text)
    return 0


def _github_output(path: Path, doc: dict[str, Any]) -> None:
    """The decision as `key=value` lines a workflow reads as step outputs (no JSON tool needed)."""
    values = {"bump": "true" if doc["bump"] else "false", "branch": doc["branch"], "title": doc["title"],
              "release_version": doc["release_version"]}
    for key, value in values.items():
        if "\n" in str(value) or "\r" in str(value):
            raise UsageError(f"--github-output: {key} holds a line break; refusing to write it")
    with path.open("a", encoding="utf-8") as out:
        out.write("".join(f"{key}={value}\n" for key, value in values.items()))


def run(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)
    if args.new_releases:
        return _new_releases(args, profile.vllm.version)
    if args.pinned is None:
        raise UsageError("--pinned is required (or --new-releases)")
    if args.release_version and len(args.release) > 1:
        raise UsageError("--release-version names the version of a single --release; with several, each audit's target is used")
    pinned = _read_audit(args.pinned, "--pinned")
    releases = [(path, _read_audit(path, "--release")) for path in args.release]
    main = _read_audit(args.main, "--main") if args.main else None
    named: list[tuple[str, dict[str, Any], str]] = []
    for path, doc in releases:
        version = (args.release_version or str(doc.get("target") or "")).removeprefix("v")
        if rules.version_key(version) is None and (rules.version_key(version.split("rc")[0]) is None or "rc" not in version):
            raise UsageError(f"--release {path}: release version {version!r} is not X.Y.Z or X.Y.ZrcN (fix: pass --release-version)")
        named.append((version, doc, str(path)))
    try:
        chosen, candidates = rules.choose_release(pinned, named, profile.vllm.version)
        main_diff = rules.diff_audits(pinned, main, names=(str(args.pinned), str(args.main))) if main else None
    except rules.AuditDocError as exc:
        raise UsageError(str(exc)) from None
    if chosen is None:  # no new final release today: report rcs, main and discoveries, bump nothing
        release_version = profile.vllm.version
        release_diff = main_diff or rules.diff_audits(pinned, pinned, names=(str(args.pinned), str(args.pinned)))
        decision = rules.Decision(False, "no final release newer than the pin was audited (rcs never bump a profile)")
    else:
        release_version, release_diff, decision = chosen.version, chosen.diff, chosen.decision
    discovered = rules.discovered_of([main, pinned, *(d for _, d in releases)])
    body = rules.render_pr_body(profile.name, profile.vllm.version, release_version, release_diff, decision, main_diff,
                                others=candidates, discovered=discovered)
    if args.body:
        atomic.write_text(args.body, body)

    applied = False
    if args.apply and decision.bump:
        commit = release_diff.other_commit
        if len(commit) != 40:
            raise UsageError(f"--release {release_version}: commit {commit!r} is not the full 40-hex commit")
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
        "candidates": [{"version": c.version, "bump": c.decision.bump, "reason": c.decision.reason,
                        "gained": [g.pr for g in c.diff.gained]} for c in candidates],
        "discovered": discovered,
        "main": main_diff.to_json() if main_diff else None,
        "body": str(args.body) if args.body else None,
        "applied": applied,
    }
    if args.github_output:
        _github_output(args.github_output, doc)
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

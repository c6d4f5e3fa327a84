"""`spark-images validate PROFILE...`: schema, toolchain rules, patches, required fixes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from spark_images.buildline.resolve import resolve_profile
from spark_images.cli._common import add_json_flag, emit
from spark_images.core.errors import EXIT_FINDING, EXIT_OK, EnvironmentProblem, Finding, UsageError
from spark_images.core.inputs import display_path


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "validate",
        help="check profiles against the schema, the Spark toolchain rules and the required fixes",
    )
    parser.add_argument("profiles", nargs="+", metavar="PROFILE", help="profile YAML files")
    parser.add_argument("--no-audit", action="store_true", help="skip the required-fixes audit")
    parser.add_argument("--repo", type=Path, help="a local vLLM clone for the audit")
    add_json_flag(parser)
    parser.set_defaults(handler=run)


def _audit(resolved: Any, repo: Path | None) -> dict[str, Any]:
    """The required-fixes section: passed, failed (with missing PRs) or skipped with the reason."""
    plan = resolved.plan
    if not plan.required_fixes:
        return {"status": "skipped", "reason": "the profile requires no fixes"}
    from spark_images import audit

    try:
        report = audit.check_required(plan.vllm_commit, plan.required_fixes, plan.patches, repo,
                                      strategy=plan.strategy, base_dir=resolved.base_dir)
    except EnvironmentProblem as exc:  # no history here: the stage did not run
        return {"status": "skipped", "reason": "; ".join(exc.lines())}
    missing = [fix.pr for fix in report.missing_required]
    doc: dict[str, Any] = {"status": "failed" if missing else "passed", "report": report.to_json()}
    if missing:
        doc["reason"] = "required fixes absent and not patched: " + ", ".join(f"#{n}" for n in missing)
        doc["missing"] = missing
    return doc


def _unapplied_patches(resolved: Any) -> list[str]:
    """A patch the build never applies is a finding: the wheel strategy installs the
    wheel as built, and its Dockerfile runs no git apply."""
    plan = resolved.plan
    if plan.strategy == "source":
        return []
    return [f"{resolved.profile.path}: patches[{i}]: {ref.path} is never applied: build.strategy {plan.strategy} "
            "installs the wheel as built (fix: set build.strategy: source, or remove the patch)"
            for i, ref in enumerate(plan.patches)]


def run(args: argparse.Namespace) -> int:
    results: list[dict[str, Any]] = []
    text: list[str] = []  # summaries, to stdout
    problems: list[str] = []  # one line per problem, to stderr
    worst = EXIT_OK
    for given in args.profiles:
        path = display_path(given)  # a file name that is not UTF-8 still prints (and serialises)
        entry: dict[str, Any] = {"profile": path}
        try:
            resolved = resolve_profile(given)
        except (Finding, UsageError) as exc:
            status = "invalid" if isinstance(exc, Finding) else "error"
            entry.update(status=status, problems=[p.to_json() for p in exc.problems])
            problems.extend(p.line() for p in exc.problems)
            text.append(f"{path}: {status} ({len(exc.problems)} problem(s))")
            worst = max(worst, exc.exit_code)
            results.append(entry)
            continue
        plan = resolved.plan
        entry.update(
            status="valid",
            name=plan.profile_name,
            arch_list=plan.arch_list,
            cuda_line=plan.cuda_line,
            warnings=[p.to_json() for p in resolved.warnings],
        )
        problems.extend(p.line() for p in resolved.warnings)
        unapplied = _unapplied_patches(resolved)
        if unapplied:
            entry.update(status="invalid", unapplied_patches=unapplied)
            problems.extend(unapplied)
            worst = max(worst, EXIT_FINDING)
        audit_doc = {"status": "skipped", "reason": "--no-audit"} if args.no_audit else _audit(resolved, args.repo)
        entry["audit"] = audit_doc
        if audit_doc["status"] == "failed":
            entry["status"] = "invalid"
            worst = max(worst, EXIT_FINDING)
            problems.append(f"{path}: verify.required_fixes: {audit_doc['reason']} (fix: bump vllm.commit or add a patch)")
        summary = f"{path}: {entry['status']} ({plan.profile_name}: {plan.cuda_line}, TORCH_CUDA_ARCH_LIST={plan.arch_list}, strategy {plan.strategy})"
        audit_line = f"  required fixes: {audit_doc['status']}" + (f" ({audit_doc['reason']})" if audit_doc.get("reason") else "")
        text.extend([summary, audit_line])
        results.append(entry)
    for line in problems:
        print(line, file=sys.stderr)
    emit(args, {"profiles": results, "exit_code": worst}, "\n".join(text))
    return worst

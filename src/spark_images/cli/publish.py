"""`spark-images publish PROFILE --tag T`: point tags at the locked, gated digest.

No rebuild: the manifest the lock names is fetched by digest and PUT under
each tag byte for byte, so every tag resolves to the digest the gates proved.
Then the tags are recorded in the lock entry, which becomes `promoted`. Every
read and check comes first (registry, coherence record, the new lock entry,
the PR body staged next to its destination); only then do tags move, the lock
get rewritten and the PR body land. Refuses (exit 1) when the lock
has no entry for the profile, when a gate did not pass, or when an immutable
tag already points elsewhere; a --coherence record must cover every combination
of the profile's matrix (as `plan` lists it) with a measured speed for the chosen one;
exit 2 when the registry cannot be reached.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from collections.abc import Mapping
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from spark_images import defaults
from spark_images.buildline.resolve import inside_project, resolve_profile
from spark_images.cli._common import add_json_flag, emit
from spark_images.core import inputs
from spark_images.core.errors import EnvironmentProblem, Finding, UsageError
from spark_images.core.inputs import display_path
from spark_images.recipes import gate as recipe_gate
from spark_images.registry import tags as registry_tags
from spark_images.release import lock as lockfile
from spark_images.release import publish as rules


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "publish",
        help="point tags at the locked, gated digest of a profile (no rebuild)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("profile", metavar="PROFILE", help="profile name (cu130) or file (profiles/cu130.yaml)")
    parser.add_argument(
        "--tag", action="append", default=[], metavar="T",
        help="tag to point at the locked digest (repeatable), e.g. cu130",
    )
    parser.add_argument(
        "--immutable", action="store_true",
        help="also create the immutable tag <cuda_line>-<short vLLM commit>-<YYYYMMDD>",
    )
    parser.add_argument(
        "--date", metavar="YYYYMMDD", default=None,
        help="date of the immutable tag (default: today, UTC)",
    )
    parser.add_argument(
        "--coherence", metavar="FILE", default=None,
        help="the Spark job's gate result (build record or `spark-images coherence --json` output): "
        "when it passed on the locked digest, it replaces the entry's skipped coherence gate",
    )
    parser.add_argument("--lock", default=defaults.LOCK_FILE, metavar="FILE", help=f"lock file (default: {defaults.LOCK_FILE})")
    parser.add_argument(
        "--registry-insecure", action="store_true",
        help="speak plain HTTP to the registry even when it is not on loopback",
    )
    parser.add_argument("--dry-run", action="store_true", help="read the registry, print what would change, change nothing")
    parser.add_argument(
        "--pr-body", metavar="FILE", default=None,
        help="write the Markdown for the lock pull request / job summary here",
    )
    add_json_flag(parser)
    parser.set_defaults(handler=run)


def profile_name(arg: str) -> str:
    path = Path(arg)
    return path.stem if path.suffix in (".yaml", ".yml") else arg


def _day(text: str | None) -> date:
    if text is None:
        return datetime.now(UTC).date()
    try:
        return datetime.strptime(text, "%Y%m%d").date()
    except ValueError:
        raise UsageError(f"--date {text!r}: not a date (fix: YYYYMMDD, e.g. 20261201)") from None


def _load_lock(path: Path) -> dict[str, Any]:
    # lock.load_lock treats a missing file as an empty lock; here it is a wrong --lock
    if not os.path.lexists(path):
        raise UsageError(f"{display_path(path)}: no lock file (fix: build and gate the profile first, or pass --lock FILE)")
    # the one reader of locks: bounded and strict (a FIFO or /dev/zero exits 2, bytes that are
    # not UTF-8, NaN, deep nesting or a broken schema exit 1), with the same messages everywhere
    return lockfile.load_lock(path)


def _profile_file(arg: str, entry: Mapping[str, Any], lock_path: Path) -> Path:
    """The profile whose coherence matrix a record must cover: PROFILE when it names a file,
    else the entry's `profile` (relative to the folder that holds profiles/, where the lock lives)."""
    given = Path(arg)
    if given.suffix in (".yaml", ".yml"):
        return given
    rel = entry.get("profile")
    base = lock_path.resolve().parent
    found = inside_project(base, rel) if isinstance(rel, str) and rel else None
    if found is None or not found.is_file():
        raise UsageError(
            f"{display_path(lock_path)}: images.{arg}.profile: {str(rel)[:200]!r} is not a profile file under "
            f"{display_path(base)}, so the coherence matrix the record must cover is unknown "
            "(fix: pass PROFILE as its file, e.g. profiles/cu130.yaml)"
        )
    return found


def _matrix(path: Path) -> tuple[list[rules.Combo], dict[str, rules.Command]]:
    """(model, moe, linear, kv) of every combination `plan` lists for the profile, and the
    exact command of each recipe its gate serves."""
    resolved = resolve_profile(path)
    commands = {r.name: recipe_gate.serve_command(r) for r in resolved.recipes}
    coherence = resolved.plan.coherence
    return ([] if coherence is None else [tuple(c) for c in coherence.combinations]), commands  # type: ignore[return-value]


def _with_gate_result(
    lock: dict[str, Any], profile: str, path: Path, profile_arg: str, lock_path: Path
) -> tuple[dict[str, Any], Mapping[str, Any] | None]:
    """The lock unchanged, and the Spark job's coherence section once it is proved to stand for the entry."""
    images = lock.get("images")
    entry = images.get(profile) if isinstance(images, Mapping) else None
    if not isinstance(entry, Mapping):
        return lock, None  # promotion_problems names the missing entry
    doc = inputs.load_json(path, what="coherence record")
    if not isinstance(doc, Mapping):
        raise UsageError(f"--coherence {display_path(path)}: not a JSON object")
    problems = rules.gate_result_problems(doc, str(entry.get("digest")), display_path(path))
    if problems:
        raise Finding(*problems)
    matrix, commands = _matrix(_profile_file(profile_arg, entry, lock_path))
    problems = rules.matrix_problems(rules.coherence_section(doc) or {}, matrix, display_path(path))
    problems += rules.recipe_problems(rules.coherence_section(doc) or {}, commands, str(entry.get("digest")),
                                      display_path(path))  # fmt: skip
    if problems:
        raise Finding(*problems)
    section = rules.coherence_section(doc) or {}
    return {**lock, "images": {**images, profile: rules.entry_with_coherence(entry, section)}}, section


class _Staged:
    """A file written next to its destination now and renamed into place later (or removed).

    Writing it first proves the destination is writable before any tag moves;
    renaming it last means a failure never leaves a PR body for a promotion
    that did not happen.
    """

    def __init__(self, destination: str, text: str) -> None:
        self.destination = Path(destination)
        if self.destination.is_dir():
            raise UsageError(f"--pr-body {display_path(self.destination)}: is a directory (fix: name a file, e.g. lock-pr.md)")
        parent = self.destination.parent
        if not parent.is_dir():
            raise UsageError(f"--pr-body {display_path(self.destination)}: no directory {display_path(parent)} (fix: create it first)")
        try:
            fd, self.tmp = tempfile.mkstemp(prefix=f".{self.destination.name}.", suffix=".tmp", dir=parent)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as exc:
            raise UsageError(f"--pr-body {display_path(self.destination)}: cannot write ({exc.strerror})") from None

    def commit(self) -> None:
        os.replace(self.tmp, self.destination)

    def discard(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp)


def run(args: argparse.Namespace) -> int:
    profile = profile_name(args.profile)
    tag_list = list(args.tag)
    bad = rules.tag_problems(tag_list)
    if bad:
        raise UsageError(*bad)
    if not tag_list and not args.immutable:
        raise UsageError("name at least one --tag T (or --immutable)")
    day = _day(args.date)
    lock_path = Path(args.lock)
    lock = _load_lock(lock_path)
    section: Mapping[str, Any] | None = None
    if args.coherence:
        lock, section = _with_gate_result(lock, profile, Path(args.coherence), args.profile, lock_path)
    problems = rules.promotion_problems(lock, profile, str(lock_path))
    if problems:
        raise Finding(*problems)
    entry = lock["images"][profile]
    if args.immutable:
        tag_list.append(rules.immutable_tag(str(entry.get("cuda_line") or profile), entry["vllm_commit"], day))
    ref = rules.image_ref(entry)

    # every read and every fallible step first ...
    client = registry_tags.TagClient(ref.host, ref.repository, insecure_http=True if args.registry_insecure else None)
    manifest = client.get_manifest(ref.digest)
    current = {tag: client.tag_digest(tag) for tag in dict.fromkeys(tag_list)}
    steps, refusals = rules.plan_tags(ref.digest, tag_list, current)
    if refusals:
        raise Finding(*refusals)
    try:
        promoted = lockfile.promote(rules.entry_with_tags(entry, list(current)), section)
    except ValueError as exc:  # promotion_problems should have named it; never write half a promotion
        raise Finding(f"{display_path(lock_path)}: images.{profile}: {exc}") from None
    schema = lockfile.entry_problems(promoted, str(lock_path), profile)
    if schema:
        raise Finding(*schema)

    if not args.dry_run:
        lock_dir = lock_path.resolve().parent
        if not os.access(lock_dir, os.W_OK):
            raise UsageError(f"{display_path(lock_path)}: its directory is not writable, so the lock could not be "
                             "updated after the tags move (fix: run where the lock can be written)")  # fmt: skip
        staged = _Staged(args.pr_body, rules.lock_pr_body(profile, promoted, steps)) if args.pr_body else None
        try:
            # ... then the writes: tags, read back, the lock, the PR body
            for step in steps:
                if step.action != "unchanged":
                    client.put_tag(step.tag, manifest)
            # read back: a tag counts as published only once the registry resolves it
            wrong = [f"{t} -> {d}" for t in current if (d := client.tag_digest(t)) != ref.digest]
            if wrong:
                raise EnvironmentProblem(f"{ref.name}: after the PUT the registry resolves {', '.join(wrong)}, not {ref.digest}")
            lockfile.update_entry(lock_path, profile, promoted)
            if staged is not None:
                staged.commit()
        finally:
            if staged is not None:
                staged.discard()
        entry = promoted

    doc = {
        "profile": profile,
        "image": str(ref),
        "repository": ref.name,
        "digest": ref.digest,
        "media_type": manifest.media_type,
        "dry_run": bool(args.dry_run),
        "steps": [s.to_json() for s in steps],
        "lock": display_path(lock_path),
        "lock_tags": list(entry.get("tags") or []),
        "pr_title": rules.lock_pr_title(profile, entry),
    }
    verb = "would " if args.dry_run else ""
    lines = [f"{verb}{s.line(ref.name)}" for s in steps]
    lines.append(
        f"{verb}record tags {', '.join(current)} in {display_path(lock_path)} ({profile})"
        if args.dry_run
        else f"recorded tags {', '.join(entry['tags'])} in {display_path(lock_path)} ({profile})"
    )
    emit(args, doc, "\n".join(lines))
    return 0

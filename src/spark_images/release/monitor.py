"""Upstream monitor: compare audits of the pinned commit and a newer vLLM, decide a bump (pure).

Inputs are `spark-images audit TARGET --json` documents:
`{"target", "commit", "fixes": [{"pr", "state", "first_release", "first_rc",
"title", "symptom", "evidence", "required"?}], "discovered"?: [...]}`. States
present in a target: included, cherry-picked, patched; missing: absent,
reverted, effect-absent; `unknown` (the history was cut) and
`effect-unproven` (in the history, effect not shown) decide nothing.

Every new release and rc is audited; a bump is proposed for the newest final
release that contains knowledge-base fixes the pinned profile lacks and loses
no fix the profile requires (the monitor runs daily, so that is the day the
release appears). The pull request body lists the gained fixes, the
regressions, the patches that became unnecessary, what rcs and main carry but
no release does yet, and the Spark-relevant PRs `audit --discover` found that
the knowledge base lacks.

Also here: the text edit that moves a profile's vLLM pin (and its release
wheel) without disturbing the rest of the YAML, and the choice of the aarch64
wheel from a PyPI simple-index JSON document.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spark_images.profiles.values import HEX40

PRESENT = frozenset({"included", "cherry-picked", "patched"})
UPSTREAM = frozenset({"included", "cherry-picked"})  # present without a local patch
MISSING = frozenset({"absent", "reverted", "effect-absent"})
UNKNOWN = "unknown"
UNDECIDED = frozenset({UNKNOWN, "effect-unproven", "not audited"})

_VERSION = re.compile(r"^v?(\d+(?:\.\d+)*)$")


class AuditDocError(ValueError):
    """An audit document that does not have the documented shape."""


@dataclass(frozen=True)
class FixChange:
    """One knowledge-base fix as seen in the pinned audit and in the other one."""

    pr: int
    title: str
    symptom: str
    before: str  # state in the pinned audit ("not audited" when it lacks the PR)
    after: str  # state in the other audit
    first_release: str | None
    first_rc: str | None
    required: bool
    evidence: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "pr": self.pr,
            "title": self.title,
            "symptom": self.symptom,
            "before": self.before,
            "after": self.after,
            "first_release": self.first_release,
            "first_rc": self.first_rc,
            "required": self.required,
        }


@dataclass(frozen=True)
class AuditDiff:
    """What changes for the fixes when moving from the pinned audit to another."""

    pinned_target: str
    pinned_commit: str
    other_target: str
    other_commit: str
    gained: tuple[FixChange, ...] = ()  # missing before, upstream after
    lost: tuple[FixChange, ...] = ()  # upstream before, missing after
    patch_upstreamed: tuple[FixChange, ...] = ()  # patched before, upstream after: patch can go
    patch_still_needed: tuple[FixChange, ...] = ()  # patched before, missing after
    still_missing: tuple[FixChange, ...] = ()
    unverified: tuple[FixChange, ...] = ()  # `unknown` on either side
    same_commit: bool = False

    def to_json(self) -> dict[str, Any]:
        def many(items: Iterable[FixChange]) -> list[dict[str, Any]]:
            return [c.to_json() for c in items]

        return {
            "pinned": {"target": self.pinned_target, "commit": self.pinned_commit},
            "other": {"target": self.other_target, "commit": self.other_commit},
            "same_commit": self.same_commit,
            "gained": many(self.gained),
            "lost": many(self.lost),
            "patch_upstreamed": many(self.patch_upstreamed),
            "patch_still_needed": many(self.patch_still_needed),
            "still_missing": many(self.still_missing),
            "unverified": many(self.unverified),
        }


def _fixes(doc: Mapping[str, Any], name: str) -> dict[int, Mapping[str, Any]]:
    fixes = doc.get("fixes")
    if not isinstance(fixes, list):
        raise AuditDocError(f"{name}: fixes: missing or not a list (fix: pass `spark-images audit TARGET --json` output)")
    out: dict[int, Mapping[str, Any]] = {}
    for i, fix in enumerate(fixes):
        if not isinstance(fix, Mapping) or not isinstance(fix.get("pr"), int) or not isinstance(fix.get("state"), str):
            raise AuditDocError(f"{name}: fixes[{i}]: needs an integer `pr` and a string `state`")
        out[int(fix["pr"])] = fix
    return out


def _commit(doc: Mapping[str, Any], name: str) -> str:
    commit = doc.get("commit")
    if not isinstance(commit, str) or not commit:
        raise AuditDocError(f"{name}: commit: missing (fix: pass `spark-images audit TARGET --json` output)")
    return commit


def diff_audits(
    pinned: Mapping[str, Any], other: Mapping[str, Any], *, names: tuple[str, str] = ("pinned", "other")
) -> AuditDiff:
    """Sort every fix of either audit into gained / lost / patch / missing / unverified."""
    before, after = _fixes(pinned, names[0]), _fixes(other, names[1])
    buckets: dict[str, list[FixChange]] = {
        k: [] for k in ("gained", "lost", "patch_upstreamed", "patch_still_needed", "still_missing", "unverified")
    }
    for pr in sorted(set(before) | set(after)):
        b, a = before.get(pr), after.get(pr)
        source = a or b or {}
        change = FixChange(
            pr=pr,
            title=str(source.get("title") or ""),
            symptom=str(source.get("symptom") or ""),
            before=str(b["state"]) if b else "not audited",
            after=str(a["state"]) if a else "not audited",
            first_release=source.get("first_release"),
            first_rc=source.get("first_rc"),
            required=bool((b or {}).get("required") or (a or {}).get("required")),
            evidence=tuple(str(e) for e in (a or {}).get("evidence") or ()),
        )
        bucket = _bucket(change.before, change.after)
        if bucket:
            buckets[bucket].append(change)
    pinned_commit, other_commit = _commit(pinned, names[0]), _commit(other, names[1])
    return AuditDiff(
        pinned_target=str(pinned.get("target") or ""),
        pinned_commit=pinned_commit,
        other_target=str(other.get("target") or ""),
        other_commit=other_commit,
        same_commit=_same_commit(pinned_commit, other_commit),
        **{k: tuple(v) for k, v in buckets.items()},
    )


def _bucket(before: str, after: str) -> str | None:
    if before in UNDECIDED or after in UNDECIDED:
        return "unverified"
    if before == "patched":
        return "patch_upstreamed" if after in UPSTREAM else "patch_still_needed"
    if before in UPSTREAM:
        return "lost" if after in MISSING else None
    if after in UPSTREAM:
        return "gained"
    return "still_missing"


def _same_commit(a: str, b: str) -> bool:
    short = min(len(a), len(b))
    return short >= 7 and a[:short] == b[:short]


def version_key(version: str) -> tuple[int, ...] | None:
    """`0.33.0` / `v0.33.0` -> (0, 33, 0); None for anything that is not a final release."""
    m = _VERSION.match(version.strip())
    return tuple(int(p) for p in m.group(1).split(".")) if m else None


@dataclass(frozen=True)
class Decision:
    bump: bool
    reason: str
    blockers: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {"bump": self.bump, "reason": self.reason, "blockers": list(self.blockers)}


def decide_bump(release: AuditDiff, pinned_version: str, release_version: str) -> Decision:
    """Bump when the newer release gains fixes and loses none the profile requires."""
    old, new = version_key(pinned_version), version_key(release_version)
    if new is None:
        return Decision(False, f"{release_version!r} is not a final release version")
    if old is not None and new <= old:
        return Decision(False, f"release {release_version} is not newer than the pinned {pinned_version}")
    if release.same_commit:
        return Decision(False, f"release {release_version} is the pinned commit")
    if not release.gained:
        return Decision(False, f"release {release_version} contains no fix the pinned commit lacks")
    blockers = tuple(
        f"#{c.pr} ({c.title or c.symptom}) is {c.after} in {release_version}"
        for c in release.lost
        if c.required
    )
    if blockers:
        return Decision(False, f"release {release_version} loses fixes the profile requires", blockers)
    gained = ", ".join(f"#{c.pr}" for c in release.gained)
    return Decision(True, f"release {release_version} contains {gained}, which the pinned commit lacks")


@dataclass(frozen=True)
class Candidate:
    """One audited release or rc newer than the pin, with its diff against the pin."""

    version: str
    diff: AuditDiff
    decision: Decision


def choose_release(
    pinned: Mapping[str, Any], releases: Sequence[tuple[str, Mapping[str, Any], str]], pinned_version: str,
) -> tuple[Candidate | None, list[Candidate]]:
    """(the release to bump to, or the newest final when none qualifies; every candidate).

    `releases`: (version, audit document, name for messages). Finals are tried
    newest first; the first that gains a fix and loses no required one wins.
    rcs never bump a profile, but their gains are reported.
    """
    candidates: list[Candidate] = []
    for version, doc, name in releases:
        diff = diff_audits(pinned, doc, names=("pinned", name))
        candidates.append(Candidate(version, diff, decide_bump(diff, pinned_version, version)))
    finals = sorted((c for c in candidates if version_key(c.version) is not None), key=lambda c: version_key(c.version) or ())
    for cand in reversed(finals):
        if cand.decision.bump:
            return cand, candidates
    return (finals[-1] if finals else None), candidates


def discovered_of(docs: Iterable[Mapping[str, Any] | None]) -> list[dict[str, Any]]:
    """The `discovered` entries of the audit documents, once per PR."""
    seen: set[int] = set()
    out: list[dict[str, Any]] = []
    for doc in docs:
        for item in (doc or {}).get("discovered") or []:
            if isinstance(item, Mapping) and isinstance(item.get("pr"), int) and item["pr"] not in seen:
                seen.add(item["pr"])
                out.append({k: item.get(k) for k in ("pr", "title", "commit", "evidence")})
    return out


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(changes: Sequence[FixChange]) -> list[str]:
    lines = ["| PR | fix | pinned | new | first release | first rc |", "|---|---|---|---|---|---|"]
    for c in changes:
        what = _md(c.title or c.symptom or "")
        mark = " (required)" if c.required else ""
        lines.append(
            f"| #{c.pr}{mark} | {what} | {c.before} | {c.after} | {c.first_release or '-'} | {c.first_rc or '-'} |"
        )
    return lines


def render_pr_body(
    profile: str,
    pinned_version: str,
    release_version: str,
    release: AuditDiff,
    decision: Decision,
    main: AuditDiff | None = None,
    *,
    others: Sequence[Candidate] = (),
    discovered: Sequence[Mapping[str, Any]] = (),
) -> str:
    """The Markdown body of the bump pull request (also the job summary)."""
    out = [
        f"## Bump `{profile}`: vLLM {pinned_version} -> {release_version}",
        "",
        f"Decision: **{'bump' if decision.bump else 'no bump'}**: {decision.reason}.",
        "",
        f"- pinned: `{release.pinned_target}` at `{release.pinned_commit}`",
        f"- release: `{release.other_target}` at `{release.other_commit}`",
    ]
    if main is not None:
        out.append(f"- main: `{main.other_target}` at `{main.other_commit}`")
    out.append("")
    sections: list[tuple[str, Sequence[FixChange]]] = [
        ("Fixes the release adds", release.gained),
        ("Regressions: fixes the pinned commit has and the release lacks", release.lost),
        ("Backport patches now upstream (drop them from the profile)", release.patch_upstreamed),
        ("Backport patches still needed (check they apply to the new commit)", release.patch_still_needed),
        ("Still missing in the release", release.still_missing),
        ("Not verified (shallow history, effect unproven, or not audited)", release.unverified),
    ]
    for title, changes in sections:
        if changes:
            out += [f"### {title}", "", *_table(changes), ""]
    if decision.blockers:
        out += ["### Blockers", "", *[f"- {b}" for b in decision.blockers], ""]
    released = {c.pr for c in release.gained}
    for other in others:
        if other.version == release_version:
            continue
        ahead = [c for c in other.diff.gained if c.pr not in released]
        if ahead:
            out += [f"### In {other.version} ({other.decision.reason})", "", *_table(ahead), ""]
    if main is not None:
        unreleased = [c for c in main.gained if c.pr not in released]
        if unreleased:
            out += ["### On main, not yet in a release", "", *_table(unreleased), ""]
    if discovered:
        out += ["### Spark-relevant PRs not in the knowledge base (`audit --discover`)", "",
                "Review each; `spark-images kb add PR` drafts its entry.", ""]
        out += [f"- #{d.get('pr')} `{str(d.get('commit') or '')[:12]}` {_md(str(d.get('title') or ''))}: "
                f"{_md(str(d.get('evidence') or ''))}" for d in discovered]
        out.append("")
    if decision.bump:
        out += [
            "### Before merging",
            "",
            "- [ ] check torch, flashinfer, nvidia-cutlass-dsl and the CUDA base against the "
            "release's `requirements/cuda.txt` and `docker/Dockerfile` (this PR moves only the vLLM pin"
            " and its wheel)",
            "- [ ] update the profile's comments that still cite the old release",
            "- [ ] CI renders, validates and audits the bumped profile; the publish workflow builds and "
            "gates it on the Spark after merge",
            "",
        ]
    return "\n".join(out)


# -- profile text edits --------------------------------------------------------------------


def _set_scalar(line: str, key: str, value: str) -> str | None:
    """`  key: old  # c` -> `  key: "value"  # c`; None when the line is not `key:`."""
    m = re.match(rf"^(\s+{key}:\s*)(\"[^\"]*\"|'[^']*'|[^\s#]+)(.*)$", line)
    if not m:
        return None
    quote = m.group(2)[0] if m.group(2)[0] in "\"'" else ""
    return f"{m.group(1)}{quote}{value}{quote}{m.group(3)}"


def bump_profile_text(
    text: str,
    *,
    old_version: str,
    version: str,
    commit: str,
    wheel: tuple[str, str] | None = None,
) -> str:
    """Move `vllm.version`/`vllm.commit` (and `build.wheel.url`/`sha256`) in profile YAML text.

    Only those scalar lines change (plus the old version in `description`), so
    comments and layout survive. ValueError when a field is not found.
    """
    if not HEX40.match(commit):
        raise ValueError(f"{commit!r} is not a 40-hex commit")
    lines = text.splitlines(keepends=True)
    section = ""
    sub = ""
    done: set[str] = set()
    for i, raw in enumerate(lines):
        body = raw.rstrip("\n")
        if body and not body[0].isspace() and not body.lstrip().startswith("#"):
            section = body.split(":", 1)[0].strip()
            sub = ""
            if section == "description" and old_version:
                lines[i] = raw.replace(old_version, version)
            continue
        indent = len(body) - len(body.lstrip())
        if section == "build" and indent == 2 and body.strip().endswith(":"):
            sub = body.strip()[:-1]
        targets: list[tuple[str, str, str]] = []
        if section == "vllm" and indent == 2:
            targets = [("version", version, "vllm.version"), ("commit", commit, "vllm.commit")]
        elif section == "build" and sub == "wheel" and indent == 4 and wheel is not None:
            targets = [("url", wheel[0], "build.wheel.url"), ("sha256", wheel[1], "build.wheel.sha256")]
        for key, value, name in targets:
            new = _set_scalar(body, key, value)
            if new is not None:
                lines[i] = new + raw[len(body):]
                done.add(name)
    wanted = {"vllm.version", "vllm.commit"} | ({"build.wheel.url", "build.wheel.sha256"} if wheel else set())
    missing = sorted(wanted - done)
    if missing:
        raise ValueError(f"profile text has no {', '.join(missing)} line to change")
    return "".join(lines)


def pick_aarch64_wheel(index_doc: Mapping[str, Any], version: str) -> tuple[str, str] | None:
    """(url, sha256) of vLLM `version`'s linux aarch64 wheel in a PEP 691 simple-index document."""
    prefix = f"vllm-{version}-"
    for entry in index_doc.get("files") or []:
        if not isinstance(entry, Mapping) or entry.get("yanked"):
            continue
        name, url, hashes = entry.get("filename"), entry.get("url"), entry.get("hashes")
        sha = hashes.get("sha256") if isinstance(hashes, Mapping) else None  # a hostile index: any shape
        if not (isinstance(name, str) and isinstance(url, str) and isinstance(sha, str) and sha):
            continue
        if name.startswith(prefix) and name.endswith("_aarch64.whl") and "manylinux" in name:
            return url, sha
    return None

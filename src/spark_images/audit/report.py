"""Render an AuditReport for people: a terminal table and Markdown (pure)."""

from __future__ import annotations

from spark_images.audit.states import AuditReport, FixResult

_COLUMNS = ("PR", "state", "first release", "first rc", "symptom")


def _first(exact: str | None, at_most: str | None, unchecked: tuple[str, ...]) -> str:
    if exact:
        return exact
    if at_most:
        return f"<={at_most}"
    return "?" if unchecked else "-"


def _row(fix: FixResult) -> tuple[str, ...]:
    mark = "*" if fix.required or fix.asked else ""
    return (
        f"#{fix.pr}{mark}",
        fix.state,
        _first(fix.first_release, fix.first_release_at_most, fix.unchecked_releases),
        _first(fix.first_rc, fix.first_rc_at_most, fix.unchecked_releases),
        fix.symptom or fix.title or "",
    )


_LISTED = 8  # releases named in a caveat; a longer run is shown by its ends and its count


def releases_words(tags: tuple[str, ...]) -> str:
    """`v1, v2, v3` or, for a long list (a clone without tags misses dozens),
    `v1, v2, v3 ... v40 (40 releases)`; the JSON keeps every one."""
    if len(tags) <= _LISTED:
        return ", ".join(tags)
    return f"{', '.join(tags[: _LISTED - 2])} ... {tags[-1]} ({len(tags)} releases)"


def first_release_words(fix: FixResult) -> str | None:
    """The caveat, in words, when a first release is only an upper bound (None: exact)."""
    if fix.first_release_at_most is None and fix.first_rc_at_most is None and not fix.unchecked_releases:
        return None
    listed = releases_words(fix.unchecked_releases)
    unproven = f" because {listed} could not be checked in this history" if listed else ""
    if fix.first_release_at_most:
        return f"first release not proven{unproven}: shipped in {fix.first_release_at_most} at the latest"
    if fix.first_release is None and listed:
        return f"first release unknown: not in any release checked here, and {listed} could not be checked"
    if fix.first_rc_at_most:
        return f"first rc not proven{unproven}: in {fix.first_rc_at_most} at the latest"
    return None


def discovered_lines(report: AuditReport) -> list[str]:
    if report.discovered is None:
        return []
    head = f"discovered in {report.discover_range}: {len(report.discovered)} Spark-relevant PR(s) not in the knowledge base"
    lines = ["", head]
    for d in report.discovered:
        lines.append(f"  #{d['pr']} {d['commit'][:12]} {d['title']}")
        lines.append(f"      evidence: {d['evidence']}")
    if report.discovered:
        lines.append("  draft an entry: spark-images kb add PR")
    return lines


def _header(report: AuditReport) -> list[str]:
    lines = [f"target: {report.target}", f"commit: {report.commit}"]
    if report.repository:
        lines.append(f"history: {report.repository}")
    lines += [f"note: {n}" for n in report.notes]
    return lines


def render_table(report: AuditReport, *, evidence: bool = True, width: int = 160) -> str:
    rows = [_COLUMNS, *(_row(f) for f in report.fixes)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS) - 1)]
    out = [*_header(report), ""]
    for r in rows:
        cells = [r[i].ljust(widths[i]) for i in range(len(widths))]
        line = "  ".join([*cells, r[-1]])
        out.append(line if len(line) <= width else line[: width - 3] + "...")
    if evidence:
        out.append("")
        for fix in report.fixes:
            for ev in fix.evidence:
                out.append(f"#{fix.pr}: {ev}")
    caveats = [(fix.pr, words) for fix in report.fixes if (words := first_release_words(fix))]
    if caveats:
        out.append("")
        out += [f"#{pr}: {words}" for pr, words in caveats]
    out += discovered_lines(report)
    missing = report.missing_required
    out.append("")
    if missing:
        out.append("MISSING (required or asked): " + ", ".join(f"#{f.pr} ({f.state})" for f in missing))
    else:
        out.append("* = required or asked; all present" if any(f.required or f.asked for f in report.fixes) else "")
    return "\n".join(out).rstrip() + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(report: AuditReport) -> str:
    out = [
        f"### vLLM fix audit: `{_md(report.target)}`",
        "",
        f"Commit `{report.commit}`" + (f" (history: `{_md(report.repository)}`)" if report.repository else ""),
        "",
    ]
    out += [f"> {_md(n)}" for n in report.notes]
    if report.notes:
        out.append("")
    out += ["| PR | state | first release | first rc | symptom | evidence |", "|---|---|---|---|---|---|"]
    for fix in report.fixes:
        pr = f"#{fix.pr}" + (" (required)" if fix.required else "")
        state = f"**{fix.state}**" if fix.failing else fix.state
        first = _first(fix.first_release, fix.first_release_at_most, fix.unchecked_releases)
        first_rc = _first(fix.first_rc, fix.first_rc_at_most, fix.unchecked_releases)
        words = first_release_words(fix)
        ev = [*fix.evidence, *([words] if words else [])]
        out.append(
            f"| {pr} | {state} | {_md(first)} | {_md(first_rc)} | "
            f"{_md(fix.symptom or fix.title)} | {_md('; '.join(ev))} |"
        )
    if report.discovered:
        out += ["", f"**Spark-relevant PRs not in the knowledge base** ({_md(report.discover_range)}):", ""]
        out += [f"- #{d['pr']} `{d['commit'][:12]}` {_md(d['title'])}: {_md(d['evidence'])}" for d in report.discovered]
    missing = report.missing_required
    out.append("")
    if missing:
        out.append("**Missing required fixes:** " + ", ".join(f"#{f.pr} ({f.state})" for f in missing))
    return "\n".join(out).rstrip() + "\n"

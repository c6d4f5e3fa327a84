"""Render an AuditReport for people: a terminal table and Markdown (pure)."""

from __future__ import annotations

from spark_images.audit.states import AuditReport, FixResult

_COLUMNS = ("PR", "state", "first release", "first rc", "symptom")


def _row(fix: FixResult) -> tuple[str, ...]:
    mark = "*" if fix.required or fix.asked else ""
    return (
        f"#{fix.pr}{mark}",
        fix.state,
        fix.first_release or "-",
        fix.first_rc or "-",
        fix.symptom or fix.title or "",
    )


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
        out.append(
            f"| {pr} | {state} | {fix.first_release or '-'} | {fix.first_rc or '-'} | "
            f"{_md(fix.symptom or fix.title)} | {_md('; '.join(fix.evidence))} |"
        )
    missing = report.missing_required
    out.append("")
    if missing:
        out.append("**Missing required fixes:** " + ", ".join(f"#{f.pr} ({f.state})" for f in missing))
    return "\n".join(out).rstrip() + "\n"

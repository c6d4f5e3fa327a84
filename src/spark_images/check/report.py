"""Reports people read, from the check and diff documents (pure: dicts in, text out).

Terminal text fits WIDTH columns (long reasons wrap, long paths are shortened
in the middle); the Markdown is made for a GitHub job summary or PR comment:
tables, one row per reason, the per-library list collapsed in <details>.
"""

from __future__ import annotations

import textwrap
from typing import Any

from spark_images.core.inputs import short

WIDTH = 100
MARK = {"ready": "✅", "degraded": "⚠️", "broken": "❌"}


def _wrap(text: str, indent: str = "  ", more: str = "      ") -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=more, break_on_hyphens=False) or [indent]


def _facts(doc: dict[str, Any]) -> list[tuple[str, str]]:
    inv = doc["inventory"]
    vllm = inv["vllm"]
    cuda = inv["cuda"]
    rows = [
        ("vllm", f"{vllm['version'] or '-'}" + (f" (commit {vllm['commit']})" if vllm.get("commit") else "")),
        ("torch", f"{inv['torch']['version'] or '-'}" + (f" (CUDA {inv['torch']['cuda']})" if inv["torch"].get("cuda") else "")),
        ("CUDA", f"{cuda['version'] or '-'}" + (f" ({cuda['source']})" if cuda.get("source") else "")),
        ("nvcc", ", ".join(t["path"] for t in cuda["nvcc"]) or "none"),
        ("ptxas", ", ".join(t["path"] for t in cuda["ptxas"]) or "none"),
    ]
    if cuda["triton_ptxas"]:
        rows.append(("triton ptxas", ", ".join(f"{t['path']} ({t['release'] or '?'})" for t in cuda["triton_ptxas"])))
    if cuda.get("triton_ptxas_path"):
        rows.append(("TRITON_PTXAS_PATH", cuda["triton_ptxas_path"]))
    cfg = inv.get("config")
    if cfg:
        rows.append(("entrypoint", " ".join(cfg["entrypoint"] + cfg["cmd"]) or "-"))
        arch = cfg["env"].get("TORCH_CUDA_ARCH_LIST")
        if arch:
            rows.append(("TORCH_CUDA_ARCH_LIST", arch))
    return rows


def _fixes_line(fixes: dict[str, Any]) -> str:
    if fixes.get("status") == "skipped":
        return f"fixes: skipped ({fixes.get('reason', '')})"
    failing = fixes.get("failing", [])
    return f"fixes: {fixes['status']} ({len(fixes.get('included', []))} included, {len(failing)} missing)"


def _lib_row(lib: dict[str, Any], path_width: int) -> str:
    counts = f"{lib['native']:>4}/{lib['fatbins']:<4}"
    return f"  {lib['verdict']:<11} {counts} {short(lib['path'], path_width, middle=True)}"


def render_check_text(doc: dict[str, Any], *, libraries: int = 12) -> str:
    s = doc["device_code"]["summary"]
    head = f"{doc['target']} on {doc['gpu']}: {doc['verdict'].upper()}"
    lines = [short(head, WIDTH, middle=True)]
    if doc.get("digest"):
        lines.append(f"  digest {doc['digest']}")
    for key, value in _facts(doc):
        lines.extend(_wrap(f"{key + ':':<21}{value}", "  ", " " * 23))
    lines.append(f"reasons ({len(doc['reasons'])}):" if doc["reasons"] else "reasons: none")
    for reason in doc["reasons"]:
        lines.extend(_wrap(reason["line"]))
    lines.append(
        f"device code: {s['libraries']} libraries, {s['native']} of {s['fatbins']} fatbins native, "
        f"{s['jit_only']} JIT-only, {s['missing']} missing"
    )
    if s.get("embedded"):
        lines.append(f"  + {s['embedded']} fatbins embedded outside .nv_fatbin in {s['embedded_in']} files (not counted)")
    libs = doc["device_code"]["libraries"]
    for lib in libs[:libraries]:
        lines.append(_lib_row(lib, WIDTH - 24))
    if len(libs) > libraries:
        lines.append(f"  ... {len(libs) - libraries} more (--json or --markdown lists all)")
    lines.extend(_wrap(_fixes_line(doc["fixes"]), "", "  "))
    for item in doc.get("unreadable", [])[:5]:
        lines.extend(_wrap(f"unreadable: {item['path']}: {item['error']}", "", "  "))
    return "\n".join(line.rstrip() for line in lines) + "\n"


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_check_markdown(doc: dict[str, Any]) -> str:
    verdict = doc["verdict"]
    out = [f"## {MARK.get(verdict, '')} `{_md(doc['target'])}` on {doc['gpu']}: **{verdict}**", ""]
    if doc.get("digest"):
        out += [f"Digest: `{doc['digest']}`", ""]
    if doc["reasons"]:
        out += ["| impact | rule / library | reason | fix |", "|---|---|---|---|"]
        for r in doc["reasons"]:
            out.append(f"| {r['impact']} | `{_md(r['rule'] or r['subject'])}` | {_md(r['message'])} | {_md(r['fix'])} |")
    else:
        out.append("No reasons: every rule passed.")
    out += ["", "| fact | value |", "|---|---|"]
    out += [f"| {_md(k)} | {_md(v)} |" for k, v in _facts(doc)]
    pkgs = doc["inventory"]["packages"]
    out += ["", f"<details><summary>Packages ({len(pkgs)})</summary>", "",
            "| package | version | location |", "|---|---|---|"]  # fmt: skip
    out += [f"| {_md(p['name'])} | {_md(p['version'])} | `{_md(p['location'])}` |" for p in pkgs]
    s = doc["device_code"]["summary"]
    out += ["", "</details>", "",
            f"<details><summary>Device code: {s['libraries']} libraries, {s['native']} of {s['fatbins']} "
            f"fatbins native</summary>", "",
            "| library | verdict | native | JIT-only | missing | SASS | PTX |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for lib in doc["device_code"]["libraries"]:
        out.append(
            f"| `{_md(lib['path'])}` | {lib['verdict']} | {lib['native']} | {lib['jit_only']} | {lib['missing']} "
            f"| {_md(' '.join(lib.get('sass', [])))} | {_md(' '.join(lib.get('ptx', [])))} |"
        )
    out += ["", "</details>", "", _md(_fixes_line(doc["fixes"]))]
    failing = doc["fixes"].get("failing") or []
    if failing:
        out += ["", "| fix | state | title |", "|---|---|---|"]
        out += [f"| #{f['pr']} | {f['state']} | {_md(f.get('title', ''))} |" for f in failing]
    return "\n".join(out) + "\n"


def _count_cell(c: dict[str, Any]) -> str:
    if not c["present"]:
        return "absent"
    return f"{c['native']}/{c['fatbins']} native, {c['jit_only']} JIT, {c['missing']} missing"


def render_diff_text(diff: dict[str, Any]) -> str:
    a, b = diff["a"], diff["b"]
    lines = [short(f"{a['target']} ({a['verdict']}) -> {b['target']} ({b['verdict']})", WIDTH, middle=True)]
    p = diff["packages"]
    lines.append(f"packages: {len(p['added'])} added, {len(p['removed'])} removed, {len(p['changed'])} re-versioned")
    lines += [f"  + {x['name']} {x['version']}" for x in p["added"]]
    lines += [f"  - {x['name']} {x['version']}" for x in p["removed"]]
    lines += [f"  ~ {x['name']} {x['from']} -> {x['to']}" for x in p["changed"]]
    lines.append(f"device code on {diff['gpu']} (native/fatbins, before -> after):")
    for lib in diff["libraries"]:
        row = f"  {lib['change']:<14} {_count_cell(lib['before'])} -> {_count_cell(lib['after'])}"
        lines.append(row)
        lines.append(f"      {short(lib['path'], WIDTH - 6, middle=True)}")
    fixes = diff["fixes"]
    if fixes["status"] == "skipped":
        lines.extend(_wrap(f"fixes: skipped ({fixes['reason']})", "", "  "))
    else:
        lines.append(f"fixes: gained {fixes['gained'] or 'none'}, lost {fixes['lost'] or 'none'}")
    lines.append(f"rules newly failing: {len(diff['reasons']['new'])}")
    for r in diff["reasons"]["new"]:
        lines.extend(_wrap(r["line"]))
    lines.append(f"resolved: {len(diff['reasons']['resolved'])}")
    for r in diff["reasons"]["resolved"]:
        lines.extend(_wrap(r["line"]))
    return "\n".join(line.rstrip() for line in lines) + "\n"


def render_diff_markdown(diff: dict[str, Any]) -> str:
    a, b = diff["a"], diff["b"]
    out = [f"## `{_md(a['target'])}` → `{_md(b['target'])}`", "",
           f"Verdict: {MARK.get(a['verdict'], '')} **{a['verdict']}** → {MARK.get(b['verdict'], '')} **{b['verdict']}**",
           "", "| package | before | after |", "|---|---|---|"]  # fmt: skip
    p = diff["packages"]
    out += [f"| {_md(x['name'])} | - | {_md(x['version'])} |" for x in p["added"]]
    out += [f"| {_md(x['name'])} | {_md(x['version'])} | - |" for x in p["removed"]]
    out += [f"| {_md(x['name'])} | {_md(x['from'])} | {_md(x['to'])} |" for x in p["changed"]]
    out += ["", f"<details open><summary>Device code on {diff['gpu']}: {len(diff['libraries'])} libraries changed or named</summary>", "",
            "| library | change | before | after |", "|---|---|---|---|"]  # fmt: skip
    for lib in diff["libraries"]:
        out.append(f"| `{_md(lib['path'])}` | {lib['change']} | {_count_cell(lib['before'])} | {_count_cell(lib['after'])} |")
    out += ["", "</details>", ""]
    fixes = diff["fixes"]
    if fixes["status"] == "skipped":
        out.append(f"Fixes: skipped ({_md(fixes['reason'])})")
    else:
        out.append(f"Fixes gained: {fixes['gained'] or 'none'}; lost: {fixes['lost'] or 'none'}")
    out += ["", "| | impact | rule / library | reason |", "|---|---|---|---|"]
    out += [f"| new | {r['impact']} | `{_md(r['rule'] or r['subject'])}` | {_md(r['message'])} |" for r in diff["reasons"]["new"]]
    out += [f"| resolved | {r['impact']} | `{_md(r['rule'] or r['subject'])}` | {_md(r['message'])} |" for r in diff["reasons"]["resolved"]]
    return "\n".join(out) + "\n"

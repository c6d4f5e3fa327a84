"""A build record as a terminal summary or a Markdown report (pure).

Both render from `BuildRecord.to_json()` alone, so a report can be rebuilt
from `build/NAME/record.json` at any time.
"""

from __future__ import annotations

from typing import Any

from spark_images.buildline.record import STAGE_ORDER

MARK = {"passed": "ok", "failed": "FAILED", "skipped": "skipped", "error": "ERROR"}


def _detail(name: str, section: dict[str, Any]) -> str:
    if section.get("reason"):
        return str(section["reason"])
    if name == "build" and section.get("digest"):
        ref = section.get("image") or section["digest"]
        secs = section.get("seconds")
        return f"{ref}" + (f" ({secs:.1f} s)" if isinstance(secs, int | float) else "")
    if name == "audit" and "fixes_included" in section:
        return f"fixes included: {', '.join(f'#{n}' for n in section['fixes_included']) or 'none'}"
    if name == "lock" and section.get("path"):
        state = f" ({section['state']})" if section.get("state") else ""
        return f"{section['path']}: {section.get('image', '')}{state}"
    if name == "cubins" and section.get("verdict"):
        return f"verdict {section['verdict']}"
    if name == "verdict" and section.get("verdict"):
        reasons = section.get("reasons") or []
        return f"{section['verdict']}" + (f" ({len(reasons)} reason{'s' if len(reasons) != 1 else ''})" if reasons else "")
    if name == "render" and section.get("dockerfile"):
        return str(section["dockerfile"])
    return ""


def rows(doc: dict[str, Any]) -> list[tuple[str, str, str]]:
    out = []
    for name in STAGE_ORDER:
        section = doc.get(name)
        if isinstance(section, dict) and "status" in section:
            out.append((name, str(section["status"]), _detail(name, section)))
    return out


def terminal(doc: dict[str, Any]) -> str:
    table = rows(doc)
    width = max((len(n) for n, _, _ in table), default=8)
    lines = [f"spark-images build {doc.get('profile', '')}"]
    for name, status, detail in table:
        mark = MARK.get(status, status)
        lines.append(f"  {name:<{width}}  {mark:<7}  {detail}".rstrip())
    verdict = doc.get("result", {})
    if verdict:
        lines.append(f"result: {verdict.get('status')}" + (f" ({verdict['reason']})" if verdict.get("reason") else ""))
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(doc: dict[str, Any]) -> str:
    lines = [f"## spark-images build `{doc.get('profile', '')}`", ""]
    result = doc.get("result", {})
    if result:
        lines += [f"**Result: {result.get('status')}**" + (f" — {_cell(result['reason'])}" if result.get("reason") else ""), ""]
    lines += ["| stage | status | detail |", "|---|---|---|"]
    for name, status, detail in rows(doc):
        lines.append(f"| {name} | {status} | {_cell(detail)} |")
    image = doc.get("build", {}) if isinstance(doc.get("build"), dict) else {}
    if image.get("digest"):
        lines += ["", f"Image: `{image.get('image') or image['digest']}`"]
    plan = doc.get("validate", {}).get("plan") if isinstance(doc.get("validate"), dict) else None
    if isinstance(plan, dict):
        lines += [
            "",
            f"vLLM {plan.get('vllm_version')} @ `{plan.get('vllm_commit')}`, CUDA {plan.get('cuda_version')} "
            f"({plan.get('cuda_line')}), TORCH_CUDA_ARCH_LIST `{plan.get('arch_list')}`",
        ]
    return "\n".join(lines) + "\n"

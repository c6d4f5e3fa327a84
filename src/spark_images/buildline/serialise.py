"""The build line's outputs, serialised from the stage results at the end (pure).

- the record's sections (`build/NAME/record.json`, and from it the terminal
  summary and the Markdown report); its `verdict` section is the `check` of
  the built archive (`CheckResult.to_json()`), with the status its verdict
  gives (`gates.verdict_status`); its `lock` section is the lock stage's
  `Locked` (where the entry went and in which state, or why it was not written);
- the lock entry (`images.lock.json`), always a candidate, with one line per
  recipe the gate served ("recipe X passed on D at T tok/s") or skipped;
- the audit predicate (`build/NAME/audit-predicate.json`): what the audit
  found, for an attestation of the digest. What the audit found never goes
  into the image: its labels come from the plan alone, so one plan gives one
  digest whether or not the vLLM history was at hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from spark_images.buildline import gates, summary
from spark_images.buildline.gates import Stop
from spark_images.buildline.record import stage
from spark_images.buildline.stages import (
    FAILED,
    PASSED,
    SKIPPED,
    Audited,
    Built,
    Gated,
    Locked,
    Rendered,
    Scanned,
    StageError,
    Validated,
)
from spark_images.release import lock

AUDIT_PREDICATE_TYPE = "https://github.com/spark-images/spark-images/audit-predicate/v1"


@dataclass
class Results:
    """What the line has so far; each field is set once, by its stage."""

    validated: Validated | None = None
    audited: Audited | None = None
    rendered: Rendered | None = None
    built: Built | None = None
    scanned: Scanned | None = None
    gated: Gated | None = None
    locked: Locked | None = None
    error: StageError | None = None
    stop: Stop | None = None
    dry_run: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. result timings


def validate_section(v: Validated) -> dict[str, Any]:
    return stage(PASSED, plan=v.plan.to_json(), warnings=list(v.warnings))


def audit_section(a: Audited, stop: Stop | None = None) -> dict[str, Any]:
    required = list(a.required)
    if a.report is None:
        return stage(SKIPPED, f"not run: {a.reason}", required=required, fixes_included=list(a.fixes_included),
                     fixes_included_source=a.source)  # fmt: skip
    report = a.report.to_json()
    if stop is not None:
        return stage(FAILED, stop.reason, required=required, missing=list(a.missing), report=report)
    return stage(PASSED, required=required, fixes_included=list(a.fixes_included), report=report)


def render_section(r: Rendered) -> dict[str, Any]:
    return stage(PASSED, dockerfile=str(r.dockerfile), context=str(r.context))


def build_fields(b: Built) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "source_date_epoch": b.source_date_epoch,
        "source_date_epoch_from": b.source_date_epoch_from,
        "created": lock.rfc3339(b.source_date_epoch),
        "platform": b.platform,
        "ca_cert": b.ca_cert,
        "cache": b.cache,
        "digest": b.digest,
        "config_digest": b.config_digest,
        "emulated": b.emulated,
        "build_seconds": round(b.build_seconds, 3),
        "local_image": b.local_image,
        "pushed": b.pushed,
        "repository": b.repository,
        "image": b.ref,
        "seconds": round(b.seconds, 3),
    }
    if b.pushed:
        doc["registry_digest"] = b.registry_digest
    if b.kept_oci is not None:
        doc["oci_archive"] = str(b.kept_oci)
    return doc


def cubins_section(s: Scanned, stop: Stop | None = None) -> dict[str, Any]:
    """The cubin gate: its status, the report's JSON (`CubinReport.to_json()`), then what was asked of it."""
    doc: dict[str, Any] = {"status": FAILED if stop is not None else PASSED}
    if stop is not None:
        doc["reason"] = stop.reason
    if s.report is not None:
        doc.update({k: v for k, v in s.report.to_json().items() if k not in ("status", "reason")})
    doc.update(required=list(s.key.globs), key=s.key.to_json(), target=s.target)
    return doc


def verdict_section(s: Scanned) -> dict[str, Any] | None:
    """`check` of the built image: its JSON, with the stage status its verdict gives.

    The status follows the verdict alone (`gates.verdict_status`), whichever
    gate stopped the line: broken is `failed` with the broken reasons,
    degraded `passed` with the degraded reasons as `warnings`.
    """
    if s.check is None:
        return None
    found = gates.verdict_status(s.check)
    head: dict[str, Any] = {"status": found.status}
    if found.reason:
        head["reason"] = found.reason
    return {**head, "warnings": list(found.warnings), **s.check.to_json()}


def lock_section(k: Locked) -> dict[str, Any]:
    """The lock stage: where the entry went and in which state, or why it was not written."""
    if k.status != PASSED:
        return stage(k.status, k.reason)
    return stage(PASSED, k.reason, path=str(k.path), image=k.image, state=k.state)


def markdown(doc: dict[str, Any]) -> str:
    """The Markdown report: the stage table, then the check's verdict of the built image."""
    from spark_images.check.report import render_check_markdown

    text = summary.markdown(doc)
    verdict = doc.get("verdict")
    if isinstance(verdict, dict) and verdict.get("verdict"):
        text = text.rstrip("\n") + "\n\n" + render_check_markdown(verdict)
    return text


def sections(r: Results) -> dict[str, Any]:
    """The record's stage sections, in line order."""
    out: dict[str, Any] = {}
    stop = r.stop
    if r.validated is not None:
        out["validate"] = validate_section(r.validated)
    if r.audited is not None:
        out["audit"] = audit_section(r.audited, stop if stop and stop.stage == "audit" else None)
    if r.rendered is not None:
        out["render"] = render_section(r.rendered)
    if r.dry_run:
        for name in ("build", "cubins", "coherence", "lock"):
            out[name] = stage(SKIPPED, "dry run")
    if r.built is not None:
        out["build"] = stage(PASSED, **build_fields(r.built))
    if r.scanned is not None:
        out["cubins"] = cubins_section(r.scanned, stop if stop and stop.stage == "cubins" else None)
        verdict = verdict_section(r.scanned)
        if verdict is not None:
            out["verdict"] = verdict
    if r.gated is not None:
        out["coherence"] = dict(r.gated.section)
    if r.locked is not None:
        out["lock"] = lock_section(r.locked)
    if r.error is not None:
        out[r.error.stage] = stage(r.error.status, r.error.reason, **r.error.details)  # type: ignore[arg-type]
    return out


def lock_entry(v: Validated, a: Audited, b: Built, s: Scanned, g: Gated, tags: list[str]) -> dict[str, Any]:
    plan_doc = v.plan.to_json()
    audit = {"status": a.status, **({"reason": f"not run: {a.reason}"} if a.report is None else {})}
    cubins: dict[str, Any] = {"verdict": s.verdict, "gpu": s.key.gpu, "key": s.key.to_json()}
    return lock.make_entry(
        profile_path=v.plan.profile_path,
        repository=b.repository,
        digest=b.digest,
        plan=plan_doc,
        fixes_included=list(a.fixes_included),
        fixes_required=list(v.plan.required_fixes),
        audit=audit,
        cubins=cubins,
        coherence={"status": g.status, **({"reason": g.reason} if g.reason else {})},
        source_date_epoch=b.source_date_epoch,
        tags=tags,
        recipes=[run.lock() for run in g.recipes],
    )


def audit_predicate(v: Validated, a: Audited, b: Built | None) -> dict[str, Any]:
    """What the audit found about the image's vLLM commit: an in-toto predicate body.

    Ready for `cosign attest --type AUDIT_PREDICATE_TYPE --predicate FILE IMAGE@DIGEST`
    (or actions/attest's predicate-path); `image` repeats the subject for a reader.
    """
    return {
        "image": {"name": b.repository, "digest": b.digest} if b is not None else None,
        "profile": v.plan.profile_name,
        "vllm_commit": v.plan.vllm_commit,
        "status": a.status,
        "reason": a.reason,
        "fixes_required": list(a.required),
        "fixes_included": list(a.fixes_included),
        "fixes_included_source": a.source,
        "report": a.report.to_json() if a.report is not None else None,
    }

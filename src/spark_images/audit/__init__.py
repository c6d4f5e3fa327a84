"""Upstream fix audit: which Spark-relevant vLLM PRs a commit, release,
profile, wheel or image contains, and which release first shipped each.

Public API (other rooms call these):
- `check_required(commit, required, patches, repo) -> AuditReport`
  (`patches`: the plan's PatchRefs, or patch files; raises EnvironmentProblem
  when history is unavailable)
- `audit_target(target, fixes=(), repo=None) -> AuditReport`
- `AuditReport.to_json()`, `.missing_required`, `.included_prs()`
"""

from __future__ import annotations

from spark_images.audit.auditor import Auditor, audit_target, check_required
from spark_images.audit.clone import open_history
from spark_images.audit.knowledge import KnowledgeBase, load_knowledge, parse_knowledge
from spark_images.audit.states import STATES, AuditReport, FixResult

__all__ = [
    "STATES",
    "AuditReport",
    "Auditor",
    "FixResult",
    "KnowledgeBase",
    "audit_target",
    "check_required",
    "load_knowledge",
    "open_history",
    "parse_knowledge",
]

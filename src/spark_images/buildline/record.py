"""BuildRecord: one JSON document per build that every stage adds a section to.

`build/NAME/record.json`. Sections: validate, audit, render, build, cubins,
verdict, coherence, lock, result. Each stage section has at least `status` in
{"passed", "failed", "skipped", "error"} and, for skipped/failed, `reason`.
The `verdict` section's status follows the `check` verdict it carries
(`gates.verdict_status`): broken is failed, degraded is passed with `warnings`.
The line serialises it from the stage results at the end (`serialise`); it
is an output, not what stages read. Reports (terminal, Markdown, JSON) are
rendered from the record alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from spark_images.core import atomic
from spark_images.core.errors import Problem, UsageError

StageStatus = Literal["passed", "failed", "skipped", "error"]
STAGE_ORDER: tuple[str, ...] = ("validate", "audit", "render", "build", "cubins", "verdict", "coherence", "lock")


def stage(status: StageStatus, reason: str = "", **details: Any) -> dict[str, Any]:
    """A stage section: status, optional reason, then stage-specific details."""
    doc: dict[str, Any] = {"status": status}
    if reason:
        doc["reason"] = reason
    doc.update(details)
    return doc


@dataclass
class BuildRecord:
    profile: str
    sections: dict[str, Any] = field(default_factory=dict)

    def set(self, name: str, section: dict[str, Any]) -> None:
        self.sections[name] = section

    def status(self, name: str) -> str | None:
        section = self.sections.get(name)
        return section.get("status") if isinstance(section, dict) else None

    def to_json(self) -> dict[str, Any]:
        return {"profile": self.profile, "record_version": 1, **self.sections}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> BuildRecord:
        body = {k: v for k, v in doc.items() if k not in ("profile", "record_version")}
        return cls(profile=str(doc.get("profile", "")), sections=body)

    def save(self, path: str | Path) -> Path:
        return atomic.write_json(path, self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> BuildRecord:
        """The record at `path`; UsageError naming the file when it is not one (OSError passes)."""
        try:
            doc = json.loads(Path(path).read_text(encoding="utf-8"))
        except ValueError as exc:  # bad UTF-8 too
            doc, why = None, f"not JSON ({exc.__class__.__name__})"
        else:
            why = f"a JSON {type(doc).__name__}, not an object"
        if not isinstance(doc, dict):
            raise UsageError(
                Problem(
                    file=str(path),
                    field="",
                    message=f"not a build record: {why}",
                    fix="name a record.json written by spark-images, or a path that does not exist yet",
                )
            )
        return cls.from_json(doc)

"""The cubin inspector: which GPUs can run the device code a target carries.

`scan_target(target, gpu="sm_121", required=()) -> CubinReport` is the entry
point for the CLI and the build pipeline (the record's `cubins` section is
`report.to_json()`; `report.verdict` and `report.missing_required` decide the
gate). `scan_members(members, gpu, required=())` classifies members a caller
already reads (`check`, and through it the build line: one read of the target
for both). `fatbin` parses bytes, `verdict` classifies, `report` rolls up, `sift`
answers for a big library with no fatbin magic from its pieces as a layer streams
them, so it is never copied (all pure); `scan` does the I/O through
`spark_images.readers.artifacts`.
"""

from __future__ import annotations

from spark_images.cubins.report import CubinReport, record_section
from spark_images.cubins.scan import scan_members, scan_target

__all__ = ["CubinReport", "record_section", "scan_members", "scan_target"]

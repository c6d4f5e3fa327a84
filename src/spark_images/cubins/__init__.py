"""The cubin inspector: which GPUs can run the device code a target carries.

`scan_target(target, gpu="sm_121", required=()) -> CubinReport` is the entry
point for the CLI and the build pipeline (the record's `cubins` section is
`report.to_json()`; `report.verdict` and `report.missing_required` decide the
gate). `fatbin` parses bytes, `verdict` classifies, `report` rolls up (all
pure); `scan` does the I/O through `spark_images.artifacts`.
"""

from __future__ import annotations

from spark_images.cubins.report import CubinReport, record_section
from spark_images.cubins.scan import scan_target

__all__ = ["CubinReport", "record_section", "scan_target"]

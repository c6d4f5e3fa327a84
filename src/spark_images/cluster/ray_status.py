"""What `ray status` prints, as numbers: active nodes and GPUs (pure).

The autoscaler summary (Ray 2.x) lists each active node under `Active:` as
`COUNT NODE_ID` (` 1 node_3f2a...`) and the cluster's resources under
`Usage:` as `USED/TOTAL NAME` (` 0.0/2.0 GPU`). A section Ray leaves out (no
GPU at all) reads as zero.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ACTIVE_NODE = re.compile(r"^\s*(\d+)\s+(node_\S+|\S+)\s*$")
_GPU = re.compile(r"^\s*([0-9.]+)/([0-9.]+)\s+GPU\s*$")
_SECTION_END = ("Pending:", "Recent failures:", "Idle:", "Resources", "Usage:", "Total Usage:")


@dataclass(frozen=True)
class RayStatus:
    nodes: int
    gpus: float
    node_ids: tuple[str, ...]

    def summary(self) -> str:
        gpus = int(self.gpus) if self.gpus == int(self.gpus) else self.gpus
        return f"{self.nodes} node{'s' if self.nodes != 1 else ''}, {gpus} GPU{'s' if gpus != 1 else ''}"


def parse_ray_status(text: str) -> RayStatus | None:
    """None when the text is not an autoscaler summary (Ray not up, an error)."""
    if "Node status" not in text:
        return None
    nodes, ids, gpus = 0, [], 0.0
    in_active = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped == "Active:":
            in_active = True
            continue
        if in_active and (not stripped or stripped.startswith(_SECTION_END) or stripped.startswith("-")):
            in_active = False
        if in_active:
            match = _ACTIVE_NODE.match(line)
            if match:  # "(no active nodes)" does not match: it has no count
                nodes += int(match.group(1))
                ids.append(match.group(2))
            continue
        gpu = _GPU.match(line)
        if gpu:
            gpus = float(gpu.group(2))
    return RayStatus(nodes=nodes, gpus=gpus, node_ids=tuple(ids))

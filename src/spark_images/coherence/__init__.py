"""The coherence gate: does an image serve coherent text on a Spark, and how fast?

Pure cores: `probes` (known-answer questions and checkers), `scoring`
(degeneracy metrics), `signatures` (log lines, backends), `speed`, `compare`,
`verdict`. Edges: `client` (HTTP), `gpu` (nvidia-smi), `runner`
(orchestration; containers through `spark_images.engine.containers`).
"""

from __future__ import annotations

from spark_images.coherence.runner import GateOptions, gate_endpoint, gate_image

__all__ = ["GateOptions", "gate_endpoint", "gate_image"]

"""The coherence gate: does an image serve coherent text on a Spark, and how fast?

Pure cores: `probes` (known-answer questions and checkers), `scoring`
(degeneracy metrics), `signatures` (log lines, backends), `speed`, `rounds`, `compare`,
`verdict`, `judge`. Edges: `client` (HTTP), `gpu` (nvidia-smi), `checks` (the checks
on a running server), `container` (one combination served in a container,
through `spark_images.engine.containers`), `runner` (the gate: every
combination, the A/B, the record section) and `local` (vLLM as a child process:
`--serve`, `--recipe`).
"""

from __future__ import annotations

from spark_images.coherence.checks import GateOptions
from spark_images.coherence.runner import gate_endpoint, gate_image

__all__ = ["GateOptions", "gate_endpoint", "gate_image"]

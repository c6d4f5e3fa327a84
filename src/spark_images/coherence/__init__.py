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

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark_images.coherence.checks import GateOptions
    from spark_images.coherence.runner import gate_endpoint, gate_image

__all__ = ["GateOptions", "gate_endpoint", "gate_image"]

# The gate's names load on first use: a pure core (`signatures`, `verdict`) is
# imported by verbs that never serve (`cluster plan`, `recipe`), and must not
# pay for the HTTP client and the checks (~0.17 s per process).
_LAZY = {"GateOptions": "checks", "gate_endpoint": "runner", "gate_image": "runner"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value

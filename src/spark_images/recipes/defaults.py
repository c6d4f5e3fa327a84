"""Every figure and default the memory fit uses, each with where it comes from (one place).

Figures are GiB (2**30 bytes). A reserve marked `measured: False` is a
documented placeholder, not a Spark measurement: the gate's own boot log
(vLLM prints its CUDA-graph and activation memory) is what replaces it.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1 << 30


@dataclass(frozen=True)
class Figure:
    name: str
    gib: float
    source: str
    measured: bool = True

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "gib": self.gib, "source": self.source, "measured": self.measured}


SPEC_POOL = Figure("spec", 128e9 / GiB, "DGX Spark / GB10 specification: 128 GB unified LPDDR5x")
DEVICE_TOTAL = Figure(
    "device total", 119.0,
    "the 128 GB spec leaves about 119 GiB after the CMA reservation: the total vLLM's "
    "--gpu-memory-utilization is a share of (4x GX10 cluster infrastructure notes, blog.muts.link/resources/INFRA.html)",
)
USABLE = Figure(
    "usable", 111.0,
    "about 111 GiB usable by vLLM in a container once kernel slab and driver overhead are taken "
    "(same infrastructure notes)",
)
RESERVES: tuple[Figure, ...] = (
    Figure("host headroom", 15.0,
           "at least 15 GiB of host headroom outside vLLM's reservation for the OS, page cache, container "
           "runtime and API server (vLLM-on-DGX-Spark technical guide, scorecard: unified-memory arithmetic)"),
    Figure("cuda graphs", 1.0,
           "placeholder: vLLM logs 'Graph capturing finished ... took X GiB' at boot; no Spark figure is "
           "published, so the gate's boot log replaces it", measured=False),
    Figure("activations", 2.0,
           "placeholder: vLLM's profiling run reserves the peak activation tensors (its mem_utils docstring "
           "example uses 2 GiB); the gate's boot log replaces it", measured=False),
)
TIGHT_SHARE = 0.9  # a need above 90% of the budget is `tight`: KV growth and a second process have no room
GGUF_HEADER_LIMIT = 64 << 20  # bytes of a GGUF header we read (SmolLM2's is ~2.5 MB; vocabularies dominate)
SAFETENSORS_HEADER_LIMIT = 100 << 20  # the format's own cap on a header (safetensors MAX_HEADER_SIZE)
JSON_LIMIT = 32 << 20  # config.json / index bytes

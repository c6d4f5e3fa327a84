"""The recipe check's read of a target: the check room's one pass, plus vLLM's own .py sources (I/O edge).

TARGET is anything `check` takes. `check.collect.gather` reads it once; a
`SourceSink` rides along and keeps the few vLLM source files `vllm_source`
parses (at most SOURCE_LIMIT bytes each), and the cubin scan lists kernels so
`kernels` can see which Marlin instantiations are native.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spark_images import defaults
from spark_images.check.collect import Gathered, gather
from spark_images.check.inventory import site_relative
from spark_images.check.vllm_source import SOURCE_FILES, VllmFacts, parse_facts

SOURCE_LIMIT = 4 << 20  # bytes of one source file; arg_utils.py is ~150 KB


@dataclass
class SourceSink:
    """Keeps vLLM's wanted .py files by site-relative path (the first copy of each)."""

    texts: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def wants(self, path: str) -> bool:
        return path.endswith(".py") and site_relative(path) in SOURCE_FILES

    def add(self, path: str, data: bytes) -> None:
        rel = site_relative(path)
        if rel in self.texts:
            return
        if len(data) > SOURCE_LIMIT:
            self.problems.append(f"{path}: {len(data)} bytes, over the {SOURCE_LIMIT} read")
            return
        self.texts[rel] = bytes(data).decode("utf-8", "replace")


def read_target(target: str, gpu: str = defaults.GPU) -> tuple[VllmFacts, Gathered]:
    """The vLLM facts and the check's gathered inventory and libraries (kernels listed)."""
    sink = SourceSink()
    found = gather(target, gpu, also=sink, kernels=True)
    facts = parse_facts(sink.texts)
    facts.problems.extend(sink.problems)
    return facts, found

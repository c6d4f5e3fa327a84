"""The check's collector fed files by hand, as its one pass over an image feeds it.

For the rule tests of both trees: unit/check/test_check_rules.py (facts laid out
by hand) and integration/check/test_check_rules_pypi.py (real ptxas binaries),
unit/recipes/test_removed_env_from_envs.py and its integration half (a real envs.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spark_images.check import rules
from spark_images.check.inventory import Collector, ImageConfig

SITE = "opt/venv/lib/python3.12/site-packages"
# the image config's environment of the removed-env-var tests
IMAGE_ENV = (("VLLM_NVFP4_GEMM_BACKEND", "marlin"), ("VLLM_USE_FLASHINFER_MOE_MXFP4_BF16", "1"),
             ("VLLM_HOST_IP", "10.0.0.1"), ("NCCL_DEBUG", "INFO"))  # fmt: skip


def metadata(name: str, version: str) -> bytes:
    return f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: x\n\nlong description\nName: not-this\n".encode()


def collect(files: dict[str, bytes], config: ImageConfig | None = None) -> Any:
    c = Collector(config)
    for path, data in files.items():
        assert c.wants(path), path
        c.add(path, data)
    return c.finish()


def reason_keys(inv: Any, libs: list[dict[str, Any]] | None = None) -> dict[str, rules.Reason]:
    return {r.key(): r for r in rules.apply(inv, libs or [], {"status": "skipped"}, "sm_121")}


def removed_env_vars(envs: Path | None) -> set[str]:
    """The variables of IMAGE_ENV that the removed-env-var rule flags, judged by this envs.py (or none)."""
    collector = Collector(ImageConfig(env=IMAGE_ENV))
    if envs is not None:
        path = "usr/local/lib/python3.12/dist-packages/vllm/envs.py"
        assert collector.wants(path)
        collector.add(path, envs.read_bytes())
    inv = collector.finish()
    return {r.subject for r in rules.apply(inv, [], {}, "sm_121") if r.rule == "removed-env-var"}

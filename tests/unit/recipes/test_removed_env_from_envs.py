"""`check`'s removed-env-var rule reads the image's own vllm/envs.py (the hand table is only the fallback).

The inventory is fed the real envs.py of the 0.22.0 and 0.33.0 wheels, as the
check's one pass over an image feeds it, with the image config's environment.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from spark_images.check.inventory import Collector, ImageConfig
from spark_images.check.rules import apply

ENV = (("VLLM_NVFP4_GEMM_BACKEND", "marlin"), ("VLLM_USE_FLASHINFER_MOE_MXFP4_BF16", "1"), ("VLLM_HOST_IP", "10.0.0.1"),
       ("NCCL_DEBUG", "INFO"))  # fmt: skip


def _flagged(envs: Path | None) -> set[str]:
    collector = Collector(ImageConfig(env=ENV))
    if envs is not None:
        path = "usr/local/lib/python3.12/dist-packages/vllm/envs.py"
        assert collector.wants(path)
        collector.add(path, envs.read_bytes())
    inv = collector.finish()
    return {r.subject for r in apply(inv, [], {}, "sm_121") if r.rule == "removed-env-var"}


def test_the_image_envs_py_decides(vllm_site: Callable[[str], Path]) -> None:
    # 0.33.0 defines neither backend variable; it keeps VLLM_HOST_IP; NCCL_* is not vLLM's to judge
    assert _flagged(vllm_site("0.33.0") / "vllm" / "envs.py") == {"VLLM_NVFP4_GEMM_BACKEND", "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16"}
    # 0.22.0 still defines both (deprecated): nothing is ignored there
    assert _flagged(vllm_site("0.22.0") / "vllm" / "envs.py") == set()


def test_without_envs_py_the_hand_table_is_the_fallback() -> None:
    assert _flagged(None) == {"VLLM_NVFP4_GEMM_BACKEND"}

"""`check`'s removed-env-var rule reads the image's own vllm/envs.py (the hand table is only the fallback).

The inventory is fed the real envs.py of the 0.22.0 and 0.33.0 wheels, as the
check's one pass over an image feeds it, with the image config's environment.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from support.check_facts import removed_env_vars


def test_the_image_envs_py_decides(vllm_site: Callable[[str], Path]) -> None:
    # 0.33.0 defines neither backend variable; it keeps VLLM_HOST_IP; NCCL_* is not vLLM's to judge
    assert removed_env_vars(vllm_site("0.33.0") / "vllm" / "envs.py") == {"VLLM_NVFP4_GEMM_BACKEND", "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16"}
    # 0.22.0 still defines both (deprecated): nothing is ignored there
    assert removed_env_vars(vllm_site("0.22.0") / "vllm" / "envs.py") == set()

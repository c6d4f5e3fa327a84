"""`check`'s removed-env-var rule without the image's vllm/envs.py: the hand table is the fallback.

With the real envs.py of the 0.22.0 and 0.33.0 wheels the image's own file
decides: tests/integration/recipes/test_removed_env_from_envs_pypi.py.
"""

from __future__ import annotations

from support.check_facts import removed_env_vars


def test_without_envs_py_the_hand_table_is_the_fallback() -> None:
    assert removed_env_vars(None) == {"VLLM_NVFP4_GEMM_BACKEND"}

"""`spark-images recipe check`: its usage errors exit 2, with no image to read.

The check against site-packages made from the real vLLM wheels:
tests/integration/recipes/test_recipe_check_pypi.py.
"""

from __future__ import annotations

from pathlib import Path

from support.recipe_support import RECIPES, run_cli


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    proc = run_cli(["recipe", "check", str(RECIPES / "gpt-oss-120b.yaml"), "--image", str(tmp_path / "none")])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    proc = run_cli(["recipe", "check", str(tmp_path / "none.yaml"), "--image", str(tmp_path)])
    assert proc.returncode == 2 and "no such recipe file" in proc.stderr
    proc = run_cli(["recipe", "check", str(RECIPES / "gpt-oss-120b.yaml")])
    assert proc.returncode == 2

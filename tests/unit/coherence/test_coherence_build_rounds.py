"""The gate's `verify.coherence.rounds` stays out of the image: the build context does not change.

plan.json is copied into the build context, so a setting that only the gate
reads must stay out of it: two profiles that differ only in `rounds` render
the same Dockerfile and the same build context, byte for byte, while the plan
the gate reads carries each one's rounds. That the build's gate serves them is
tests/integration/coherence/test_coherence_build_rounds_engine.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from spark_images.buildline.resolve import resolve_profile
from support.recipe_projects import rounds_profile


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_profiles_differing_only_in_rounds_render_the_same_build_context(tmp_path: Path) -> None:
    contexts = {}
    for rounds in (None, 1, 3):
        profile = rounds_profile(tmp_path / f"r{rounds}", rounds)
        assert resolve_profile(profile).plan.coherence.rounds == (rounds or 1)  # the gate gets it
        out = tmp_path / f"ctx{rounds}"
        proc = subprocess.run([sys.executable, "-m", "spark_images", "render", str(profile), "-o", str(out)],
                              capture_output=True, text=True, check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        contexts[rounds] = _tree(out)
    assert {"Dockerfile", "plan.json"} <= set(contexts[3])
    assert contexts[None] == contexts[1] == contexts[3]
    assert b"rounds" not in contexts[3]["plan.json"]

"""The shipped profiles' `build.source_date_epoch` against the vLLM history.

A pinned epoch is what lets the main job run without github.com, so it must be
the very value the history gives: the pinned commit's committer time. Checked
against the real history whenever it is reachable (`history`, never required).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_images.buildline.resolve import resolve_profile

PROFILES = sorted((Path(__file__).resolve().parents[3] / "profiles").glob("*.yaml"))


@pytest.mark.history
@pytest.mark.slow
@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.stem)
def test_a_pinned_epoch_is_the_commit_time_in_the_history(profile: Path, vllm_history_reachable: None) -> None:
    from spark_images.audit import open_history

    plan = resolve_profile(profile).plan
    if plan.source_date_epoch is None:
        pytest.skip(f"{profile.name} pins no build.source_date_epoch")
    history = open_history(None)
    committed = int(history.repo.git("show", "-s", "--format=%ct", plan.vllm_commit).decode().split()[-1])
    assert plan.source_date_epoch == committed, f"{profile.name}: pin {plan.source_date_epoch}, history {committed}"

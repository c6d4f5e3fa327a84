"""The plan carries the Spark gate's matrix, so nothing after planning reads the Profile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_images.buildline.resolve import resolve_profile
from spark_images.coherence import verdict
from spark_images.profiles import profile as profiles

REPO = Path(__file__).resolve().parents[3]
PROFILES = sorted((REPO / "profiles").glob("*.yaml"))


@pytest.mark.parametrize("profile", PROFILES, ids=[p.stem for p in PROFILES])
def test_the_plan_matrix_is_the_one_the_gate_runs(profile: Path) -> None:
    resolved = resolve_profile(profile)
    settings, matrix = resolved.profile.verify.coherence, resolved.plan.coherence
    assert settings is not None and matrix is not None
    expected = verdict.combinations(settings.models, settings.moe_backends, settings.linear_backends, settings.kv_cache_dtypes)
    assert [tuple(c.to_json()[k] for k in ("model", "moe_backend", "linear_backend", "kv_cache_dtype")) for c in expected] == list(
        matrix.combinations
    )
    assert matrix.models == settings.models and matrix.kv_cache_dtypes == settings.kv_cache_dtypes
    doc = json.loads(json.dumps(resolved.plan.to_json()))
    assert doc["coherence"]["combinations"] == [c.to_json() for c in expected]


def test_the_defaults_come_from_one_place(tmp_path: Path) -> None:
    text = (REPO / "profiles" / "cu130.yaml").read_text()
    text = text.replace("    moe_backends: [auto, flashinfer_b12x, marlin]\n", "").replace("    kv_cache_dtypes: [auto, fp8]\n", "")
    (tmp_path / "profiles").mkdir()
    for lock in (REPO / "profiles").glob("*.lock"):
        (tmp_path / "profiles" / lock.name).write_text(lock.read_text())
    path = tmp_path / "profiles" / "cu130.yaml"
    path.write_text(text)
    matrix = resolve_profile(path).plan.coherence
    assert matrix is not None
    assert matrix.moe_backends == profiles.DEFAULT_MOE_BACKENDS
    assert matrix.kv_cache_dtypes == profiles.DEFAULT_KV_CACHE_DTYPES
    assert len(matrix.combinations) == len(matrix.models)

"""`build --cache WHERE`: registry or local directory, decided by the one reference grammar."""

from __future__ import annotations

import pytest

from spark_images.engine import build as engine_build
from spark_images.registry.reference import BadReference


@pytest.mark.parametrize(
    ("where", "kind"),
    [
        ("localhost:5000/cache", "registry"),
        ("localhost/cache", "registry"),  # localhost is a host, as for docker
        ("[::1]:5000/cache/cu130", "registry"),
        ("main/x", "local"),  # no dot, port or localhost: a relative directory, never a registry
        ("build/cache", "local"),
        ("~/cache", "local"),
        ("../ghcr.io/o/c", "local"),
    ],
)
def test_registry_or_directory(where: str, kind: str) -> None:
    spec_from, spec_to = engine_build.cache_specs(where, False)
    assert spec_from.startswith(f"type={kind},") and spec_to.startswith(f"type={kind},")
    assert spec_to.endswith(",mode=max,ignore-error=true") and where in spec_from


@pytest.mark.parametrize("where", ["ghcr.io/Owner/cache", "ghcr.io/o/c:bad tag", "127.0.0.1:5000/c\n"])
def test_a_registry_ref_that_does_not_parse_is_one_line(where: str) -> None:
    with pytest.raises(BadReference) as caught:
        engine_build.cache_specs(where, False)
    (line,) = caught.value.lines()
    assert line.startswith("--cache ") and "\n" not in line and "fix:" in line


def test_type_specs_pass_through() -> None:
    spec = "type=gha,scope=cu130"
    assert engine_build.cache_specs(spec, False) == (spec, spec)

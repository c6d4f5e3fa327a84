"""The registry-host rule of the one reference grammar (registry/reference.py).

A first component is a registry host only if it holds a `.` or a `:`, is
bracketed (IPv6), or is `localhost` (the distribution library's rule), so a
git revision such as `main/x` or `HEAD~1/x` is never taken for a registry.
"""

from __future__ import annotations

import pytest

from spark_images.registry.reference import ImageReference, names_registry

HOSTS = {
    "localhost/x": "localhost",
    "localhost:5000/x": "localhost:5000",
    "a.b/x": "a.b",
    "registry:5000/x": "registry:5000",
    "127.0.0.1:5000/spark/vllm": "127.0.0.1:5000",
    "[::1]:5000/x": "[::1]:5000",
    "ghcr.io/o/a__b:tag": "ghcr.io",
}
NOT_HOSTS = ["main/x", "main/x:tag", "origin/main", "feature/x", "HEAD~1/x", "x", "main/", "/x",
             "localhostx/y", "Localhost/x"]


@pytest.mark.parametrize("text", sorted(HOSTS))
def test_a_host_is_a_dot_a_port_brackets_or_localhost(text: str) -> None:
    assert names_registry(text)
    ref = ImageReference.parse_or_none(text)
    assert ref is not None and ref.host == HOSTS[text]


@pytest.mark.parametrize("text", NOT_HOSTS)
def test_a_plain_first_component_is_not_a_host(text: str) -> None:
    assert not names_registry(text)
    assert ImageReference.parse_or_none(text) is None
    assert "registry host" in (ImageReference.problem(text) or "")


@pytest.mark.parametrize("text", ["a.b/x\n", "a.b/x:t\n", f"a.b/x@sha256:{'a' * 64}\n"])
def test_a_trailing_newline_never_parses(text: str) -> None:
    assert ImageReference.parse_or_none(text) is None

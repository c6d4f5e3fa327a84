"""How far inflation may run ahead of the walk: AHEAD_LOCAL_BYTES from an archive on disk,
AHEAD_BYTES for layers that are downloaded (the registry check's peak RSS goal is 512 MiB)."""

from __future__ import annotations

import gzip
from collections.abc import Iterable
from pathlib import Path

import pytest

from spark_images.readers import images, layers
from spark_images.readers.common import Progress
from support.oci_blobs import image_archive, layer_tar


def _budgets(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    seen: list[int] = []
    real = layers.run_ahead

    def spy(items: Iterable[bytes], *args: object, budget: int = 0, **kwargs: object) -> object:
        seen.append(budget)
        return real(items, *args, budget=budget, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(layers, "run_ahead", spy)
    return seen


def test_an_archive_on_disk_is_inflated_further_ahead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _budgets(monkeypatch)
    archive = image_archive(tmp_path / "image.tar", [{"usr/lib/libx.so": b"\x7fELF" + bytes(4096)}], oci=True)
    got = [m.path for m in images.archive_members(archive, lambda _p: True, Progress(enabled=False))]
    assert got == ["usr/lib/libx.so"]
    assert seen == [layers.AHEAD_LOCAL_BYTES]
    assert layers.AHEAD_LOCAL_BYTES > layers.AHEAD_BYTES


def test_downloaded_layers_keep_the_small_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _budgets(monkeypatch)
    blob = gzip.compress(layer_tar({"usr/lib/liby.so": b"\x7fELF" + bytes(100)}))
    got = [m.path for m in layers.read_layers([("sha256:" + "0" * 64, lambda: [blob])], lambda _p: True, "test")]
    assert got == ["usr/lib/liby.so"]
    assert seen == [layers.AHEAD_BYTES]

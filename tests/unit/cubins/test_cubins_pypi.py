"""Picking the linux aarch64 wheel out of a simple-API file list (pure; no network)."""

from __future__ import annotations

from typing import Any

from spark_images import pypi

WHEEL = "vllm-0.33.0-cp38-abi3-manylinux_2_28_aarch64.whl"


def record(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "filename": WHEEL,
        "url": f"https://files.example/{WHEEL}",
        "size": 1234,
        "hashes": {"sha256": "ab" * 32},
    }
    doc.update(over)
    return doc


def test_the_aarch64_wheel_of_the_version_is_picked() -> None:
    files = [
        record(filename="vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"),
        record(filename="vllm-0.32.0-cp38-abi3-manylinux_2_28_aarch64.whl"),
        record(),
    ]
    wheel = pypi.pick_wheel(files, "vllm", "0.33.0")
    assert wheel is not None
    assert (wheel.filename, wheel.size, wheel.sha256) == (WHEEL, 1234, "ab" * 32)


def test_malformed_records_are_skipped_not_a_traceback() -> None:
    files: list[Any] = [
        "not a record",
        None,
        record(url=None),
        record(hashes=["sha256"]),
        record(size="1234"),
    ]
    assert pypi.pick_wheel(files, "vllm", "0.33.0") is None
    assert pypi.pick_wheel([*files, record()], "vllm", "0.33.0") is not None

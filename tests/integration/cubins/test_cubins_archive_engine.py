"""The image archive the real engine writes (`buildx --output type=oci,dest=FILE`), scanned in place.

The archive reader on archives laid out by hand: tests/unit/cubins/test_cubins_archive.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from spark_images.cubins import scan_target
from spark_images.readers import artifacts
from support.paths import ORACLE_BIN

pytestmark = [pytest.mark.engine, pytest.mark.slow]

LIB121 = (ORACLE_BIN / "lib/libsm121a.so").read_bytes()
LIB90 = (ORACLE_BIN / "lib/libsm90.so").read_bytes()


def test_the_archive_buildx_writes(docker_engine: None, tmp_path: Path) -> None:
    """`buildx --output type=oci,dest=FILE` on the real engine, scanned in place."""
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "libsm121a.so").write_bytes(LIB121)
    (ctx / "libsm90.so").write_bytes(LIB90)
    (ctx / "Dockerfile").write_text(
        "FROM scratch\nCOPY libsm121a.so /usr/lib/python3/dist-packages/vllm/_C.abi3.so\n"
        "COPY libsm90.so /opt/x/libsm90.so\n"
    )
    dest = tmp_path / "image.oci.tar"
    subprocess.run(
        ["docker", "buildx", "build", "--platform", "linux/arm64", "--output", f"type=oci,dest={dest}", str(ctx)],
        check=True, capture_output=True, timeout=600,
    )
    assert artifacts.target_kind(str(dest)) == artifacts.KIND_OCI_ARCHIVE
    report = scan_target(str(dest), required=("vllm/_C*.so",))
    libs = {lib.path: lib.verdict for lib in report.libraries}
    assert libs == {"usr/lib/python3/dist-packages/vllm/_C.abi3.so": "native", "opt/x/libsm90.so": "missing"}
    assert report.verdict == "partial" and report.missing_required == []
    digest = artifacts.image_digest(str(dest))
    assert digest is not None and digest.startswith("sha256:")

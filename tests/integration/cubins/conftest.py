"""Fixtures of the cubin inspector tests: nvcc-compiled libraries, cached per session.

`fixture_bins` runs tests/data/cubins/kernels/build.sh with the local nvcc once
and keeps the output under the test cache keyed by the nvcc version and a
hash of the kernel sources and script, so a rerun costs nothing and a change
to either rebuilds. `oracle_bins` are the committed binaries built by the
same script on a machine with cuobjdump (see tests/data/cubins/oracle/README.md).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from support.cache_lock import cache_lock
from support.paths import DATA, ORACLE

KERNELS = DATA / "cubins" / "kernels"
TEST_CACHE = Path(
    os.environ.get("SPARK_IMAGES_TEST_CACHE", Path.home() / ".cache" / "spark-images-test")
)


def _sources_hash() -> str:
    digest = hashlib.sha256()
    for path in sorted(KERNELS.iterdir()):
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="session")
def fixture_bins(nvcc: str) -> Path:
    """Directory with lib/*.so, cubins/*.cubin, fatbin/*.fatbin compiled by the local nvcc."""
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256(version.encode()).hexdigest()[:12] + "-" + _sources_hash()
    out = TEST_CACHE / "cubin-fixtures" / key
    with cache_lock(f"cubin-fixtures-{key}"):  # one nvcc build, whichever worker comes first
        if (out / "lib" / "libmixed.so").is_file():
            return out
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=out.parent))
        env = {**os.environ, "NVCC": nvcc}
        proc = subprocess.run(
            ["bash", str(KERNELS / "build.sh"), str(tmp)], capture_output=True, text=True, env=env
        )
        if proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            pytest.fail(f"fixture build failed:\n{proc.stderr[-4000:]}")
        try:
            tmp.rename(out)
        except OSError:  # another session won the race
            shutil.rmtree(tmp, ignore_errors=True)
        return out


@pytest.fixture(scope="session")
def oracle_bins() -> Path:
    return ORACLE / "bin"


def strip_section_headers(data: bytes) -> bytes:
    """An ELF with its section header table gone (e_shoff/e_shnum/e_shstrndx zeroed), as sstrip leaves it."""
    buf = bytearray(data)
    buf[40:48] = b"\0" * 8  # e_shoff
    buf[60:64] = b"\0" * 4  # e_shnum, e_shstrndx
    return bytes(buf)


@pytest.fixture()
def headerless(tmp_path: Path):  # type: ignore[no-untyped-def]
    def make(src: Path) -> Path:
        dst = tmp_path / f"headerless-{src.name}"
        dst.write_bytes(strip_section_headers(src.read_bytes()))
        return dst

    return make

"""Image archives on disk: an OCI layout tar (what `buildx --output type=oci,dest=FILE`
writes) and a docker-save tar, read in place by the one archive reader.

The archive the real buildx writes: tests/integration/cubins/test_cubins_archive_engine.py."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import zstandard

from spark_images.cubins import scan_target
from spark_images.readers import artifacts
from support.oci_blobs import digest_of
from support.oci_blobs import layer_tar as layer
from support.paths import ORACLE_BIN

LIB121 = (ORACLE_BIN / "lib/libsm121a.so").read_bytes()
LIB90 = (ORACLE_BIN / "lib/libsm90.so").read_bytes()
OCI = "application/vnd.oci.image"


def write_tar(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def layers() -> list[bytes]:
    bottom = gzip.compress(layer({
        "usr/lib/libgone.so": LIB90,
        "usr/lib/libkeep.so": LIB121,
        "usr/lib/libalias.so": "usr/lib/libkeep.so",  # hard link within the layer
        "opt/old/libold.so": LIB90,
    }))
    top = zstandard.ZstdCompressor().compress(layer({
        "usr/lib/.wh.libgone.so": b"",
        "opt/old/.wh..wh..opq": b"",
        "opt/old/libnew.so": LIB121,
    }))
    return [bottom, top]


def oci_layout(path: Path) -> str:
    """An OCI layout tar with an index -> (amd64, attestation, arm64) index; returns the arm64 digest."""
    blobs = layers()
    config = json.dumps({"architecture": "arm64", "os": "linux"}).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": f"{OCI}.manifest.v1+json",
        "config": {"mediaType": f"{OCI}.config.v1+json", "digest": digest_of(config), "size": len(config)},
        "layers": [{"mediaType": f"{OCI}.layer.v1.tar+gzip", "digest": digest_of(b), "size": len(b)} for b in blobs],
    }).encode()
    inner = json.dumps({"schemaVersion": 2, "mediaType": f"{OCI}.index.v1+json", "manifests": [
        {"mediaType": f"{OCI}.manifest.v1+json", "digest": digest_of(b"amd64"), "size": 5,
         "platform": {"os": "linux", "architecture": "amd64"}},
        {"mediaType": f"{OCI}.manifest.v1+json", "digest": digest_of(b"att"), "size": 3,
         "platform": {"os": "unknown", "architecture": "unknown"},
         "annotations": {"vnd.docker.reference.type": "attestation-manifest"}},
        {"mediaType": f"{OCI}.manifest.v1+json", "digest": digest_of(manifest), "size": len(manifest),
         "platform": {"os": "linux", "architecture": "arm64"}},
    ]}).encode()
    top = json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": f"{OCI}.index.v1+json", "digest": digest_of(inner), "size": len(inner),
         "annotations": {"org.opencontainers.image.ref.name": "latest"}}]}).encode()
    members = {"oci-layout": b'{"imageLayoutVersion": "1.0.0"}', "index.json": top}
    for blob in (config, manifest, inner, *blobs):
        members[f"blobs/sha256/{digest_of(blob)[7:]}"] = blob
    write_tar(path, members)
    return digest_of(manifest)


def docker_save(path: Path) -> None:
    blobs = layers()
    names = [f"blobs/sha256/{digest_of(b)[7:]}" for b in blobs]
    manifest = json.dumps([{"Config": "config.json", "RepoTags": ["x:1"], "Layers": names}]).encode()
    write_tar(path, {"manifest.json": manifest, "config.json": b"{}", **dict(zip(names, blobs, strict=True))})


EXPECTED = {"opt/old/libnew.so": LIB121, "usr/lib/libalias.so": LIB121, "usr/lib/libkeep.so": LIB121}


@pytest.mark.parametrize("form", ["oci", "docker-save"])
def test_an_archive_reads_as_the_merged_file_system(tmp_path: Path, form: str) -> None:
    path = tmp_path / "image.tar"
    digest = oci_layout(path) if form == "oci" else docker_save(path)
    assert artifacts.target_kind(str(path)) == artifacts.KIND_OCI_ARCHIVE
    found = dict(artifacts.iter_files(str(path), lambda p: p.endswith(".so")))
    assert found == EXPECTED  # whiteouts honoured, the hard link resolved within its layer
    spooled = {m.path: bytes(m.data[:]) for m in artifacts.iter_members(str(path), lambda p: p.endswith(".so"), spool_over=0)
               if m.data is not None}
    assert spooled == EXPECTED
    report = scan_target(str(path), required=("usr/lib/libalias.so",))
    assert report.verdict == "native" and report.missing_required == []
    assert artifacts.image_digest(str(path)) == digest


def test_a_hard_link_to_a_file_not_kept_is_reported(tmp_path: Path) -> None:
    blob = gzip.compress(layer({"etc/data.bin": b"x" * 100, "usr/lib/libx.so": "etc/data.bin"}))
    names = [f"blobs/sha256/{digest_of(blob)[7:]}"]
    path = tmp_path / "image.tar"
    write_tar(path, {"manifest.json": json.dumps([{"Layers": names}]).encode(), names[0]: blob})
    (member,) = artifacts.iter_members(str(path), lambda p: p.endswith(".so"))
    assert member.data is None and "hard link to etc/data.bin" in member.error


def test_a_plain_tar_is_not_an_image(tmp_path: Path) -> None:
    path = tmp_path / "libs.tar"
    write_tar(path, {"lib/libsm121a.so": LIB121})
    proc = subprocess.run(
        [sys.executable, "-m", "spark_images", "cubins", str(path)], capture_output=True, text=True, timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert str(path) in proc.stderr and "index.json" in proc.stderr and "Traceback" not in proc.stderr


def _broken_gzip_layers() -> dict[str, bytes]:
    good = gzip.compress(layer({"usr/lib/libsm121a.so": LIB121}), 6)
    bad_crc = bytearray(good)
    bad_crc[-8] ^= 0xFF  # the trailer's CRC-32 of the inflated bytes
    bad_block = bytearray(good)
    bad_block[10] ^= 0xFF  # the first byte of the deflate stream: its block header
    return {"bad CRC": bytes(bad_crc), "bad deflate block": bytes(bad_block), "cut short": good[: len(good) // 2]}


@pytest.mark.parametrize("case", sorted(_broken_gzip_layers()))
def test_a_broken_gzip_layer_with_a_true_digest_is_one_clear_line(case: str, tmp_path: Path) -> None:
    """The layer's digest matches its bytes, so only the inflater can tell: ISA-L's own error
    (and zlib's, for a stream that ends early) must come out as one line naming the layer, exit 2."""
    blob = _broken_gzip_layers()[case]
    names = [f"blobs/sha256/{digest_of(blob)[7:]}"]
    path = tmp_path / "image.tar"
    write_tar(path, {"manifest.json": json.dumps([{"Layers": names}]).encode(), names[0]: blob})
    proc = subprocess.run(
        [sys.executable, "-m", "spark_images", "cubins", str(path)], capture_output=True, text=True, timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unreadable" in lines[0] and digest_of(blob) in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr

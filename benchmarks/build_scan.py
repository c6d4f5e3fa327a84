"""The cubin stage of a build: scan of the built OCI archive against the alternatives.

    .venv/bin/python benchmarks/build_scan.py ARCHIVE [--ref HOST/NAME@sha256:...] [--local NAME] [--runs 3]

ARCHIVE is an OCI archive `spark-images build --keep-oci` left in
build/NAME/image.oci.tar. Measured, in this one process:
- plain: read and decompress every layer of the archive (stdlib tarfile +
  zlib / zstandard), nothing parsed: the floor for any scan of those bytes;
- archive: `cubins.scan_target(ARCHIVE)`, the cubin inspector alone;
- stage: `check.gather(ARCHIVE)`, what the build line does now (the check
  and the cubin gate from one read of the archive);
- registry (with --ref): the same scan of the pushed image, downloaded back
  over the distribution API (what the line did before when it pushed);
- docker (with --local): the same scan through `docker save` (what the line
  did before when it did not push).
Prints medians and the archive/plain ratio (goal: at most 1.2).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tarfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spark_images import check, cubins
from spark_images.readers.common import READER_SWITCH_INTERVAL

GLOBS = ("vllm/_C*.so",)


def plain_read(archive: Path, gzip_module: Any = zlib) -> int:
    """Bytes of every layer, decompressed and discarded (gzip by `gzip_module`: zlib, or isal_zlib)."""
    total = 0
    with tarfile.open(archive, "r:") as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        desc = index["manifests"][0]
        manifest = json.load(tar.extractfile(f"blobs/sha256/{desc['digest'].split(':')[1]}"))  # type: ignore[arg-type]
        for layer in manifest["layers"]:
            blob = tar.extractfile(f"blobs/sha256/{layer['digest'].split(':')[1]}")
            assert blob is not None
            if layer["mediaType"].endswith("zstd"):
                import zstandard

                reader = zstandard.ZstdDecompressor().stream_reader(blob)
                while chunk := reader.read(1 << 20):
                    total += len(chunk)
                continue
            inflater = gzip_module.decompressobj(47)
            while chunk := blob.read(1 << 20):
                total += len(inflater.decompress(chunk))
    return total


def timed(fn: Callable[[], object], runs: int) -> float:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> int:
    sys.setswitchinterval(READER_SWITCH_INTERVAL)  # as the CLI does: the reader threads get the GIL back sooner
    ap = argparse.ArgumentParser()
    ap.add_argument("archive", type=Path)
    ap.add_argument("--ref", help="the same image in a registry, HOST/NAME@sha256:...")
    ap.add_argument("--local", help="the same image in the local engine, NAME:TAG")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    size = args.archive.stat().st_size
    print(f"archive {args.archive}: {size / 2**30:.2f} GiB, {plain_read(args.archive) / 2**30:.2f} GiB uncompressed")
    plain = timed(lambda: plain_read(args.archive), args.runs)
    archive = timed(lambda: cubins.scan_target(str(args.archive), "sm_121", GLOBS), args.runs)
    stage = timed(lambda: check.gather(str(args.archive), "sm_121", required=GLOBS), args.runs)
    print(f"plain read + decompress:        median {plain:.2f} s")
    print(f"scan of the OCI archive:        median {archive:.2f} s (ratio {archive / plain:.2f}; goal <= 1.2)")
    print(f"the build's stage (check+scan): median {stage:.2f} s (ratio {stage / plain:.2f}; one read for both)")
    if args.ref:
        registry = timed(lambda: cubins.scan_target(args.ref, "sm_121", GLOBS), args.runs)
        print(f"scan of the registry image:     median {registry:.2f} s (the archive saves {registry - archive:.2f} s)")
    if args.local:
        docker = timed(lambda: cubins.scan_target(f"docker://{args.local}", "sm_121", GLOBS), args.runs)
        print(f"scan through docker save:       median {docker:.2f} s (the archive saves {docker - archive:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

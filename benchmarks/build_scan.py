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
The three are timed in rounds (plain, archive, stage, then again), so that a
host whose speed drifts (a shared VM's does by 5-10% within a minute) moves
each ratio's two sides together. Prints each median, the median of the
rounds' ratios with their spread (goal: at most 1.2), and the CPU floor: the
scan's CPU per run (threads and the side hasher together) spread over this
host's cores, against plain. No overlap of the threads can bring the ratio
below that floor; only less CPU can.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tarfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spark_images import check, cubins
from spark_images.readers.common import tune_process_for_reading

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
    """Median wall time of `runs` calls."""
    return statistics.median(wall for wall, _cpu in timed_rounds({"fn": fn}, runs)["fn"])


def timed_rounds(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[tuple[float, float]]]:
    """(wall, CPU) of each function in each of `rounds` rounds, the functions in turn within a round."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            c0, t0 = _cpu_seconds(), time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0, _cpu_seconds() - c0))
    return times


def ratio_line(times: list[tuple[float, float]], base: list[tuple[float, float]]) -> str:
    """The median of the rounds' ratios against `base`, with the lowest and highest."""
    ratios = sorted(wall / plain for (wall, _), (plain, _) in zip(times, base, strict=True))
    return f"ratio {statistics.median(ratios):.2f}, rounds {ratios[0]:.2f}-{ratios[-1]:.2f}"


def _cpu_seconds() -> float:
    """User and system CPU of this process and its waited-for children (the side hasher)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> int:
    tune_process_for_reading()  # as the CLI does
    ap = argparse.ArgumentParser()
    ap.add_argument("archive", type=Path)
    ap.add_argument("--ref", help="the same image in a registry, HOST/NAME@sha256:...")
    ap.add_argument("--local", help="the same image in the local engine, NAME:TAG")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    size = args.archive.stat().st_size
    print(f"archive {args.archive}: {size / 2**30:.2f} GiB, {plain_read(args.archive) / 2**30:.2f} GiB uncompressed")
    rounds = timed_rounds(
        {
            "plain": lambda: plain_read(args.archive),
            "scan": lambda: cubins.scan_target(str(args.archive), "sm_121", GLOBS),
            "stage": lambda: check.gather(str(args.archive), "sm_121", required=GLOBS),
        },
        args.runs,
    )
    plain, archive, stage = (statistics.median(wall for wall, _ in rounds[name]) for name in ("plain", "scan", "stage"))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    print(f"plain read + decompress:        median {plain:.2f} s")
    print(f"scan of the OCI archive:        median {archive:.2f} s ({ratio_line(rounds['scan'], rounds['plain'])}; goal <= 1.2)")
    print(f"the build's stage (check+scan): median {stage:.2f} s ({ratio_line(rounds['stage'], rounds['plain'])}; goal <= 1.2)")
    for name in ("scan", "stage"):
        cpu = statistics.median(c for _, c in rounds[name])
        floor = cpu / cores / plain
        print(f"CPU floor of the {name:5s}:         {cpu:.2f} s of CPU on {cores} cores (ratio {floor:.2f} at best)")
    if args.ref:
        registry = timed(lambda: cubins.scan_target(args.ref, "sm_121", GLOBS), args.runs)
        print(f"scan of the registry image:     median {registry:.2f} s (the archive saves {registry - archive:.2f} s)")
    if args.local:
        docker = timed(lambda: cubins.scan_target(f"docker://{args.local}", "sm_121", GLOBS), args.runs)
        print(f"scan through docker save:       median {docker:.2f} s (the archive saves {docker - archive:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

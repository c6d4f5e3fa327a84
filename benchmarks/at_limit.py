"""Speed at the limit: one >= 2 GB image and tree, scanned against their baselines in one run.

    .venv/bin/python benchmarks/at_limit.py [--gib 2.6] [--runs 2] [--cache DIR] [--profile] [--clean]

Generates once, deterministically (seeded; same bytes every time), under
~/.cache/spark-images-test/bench-at-limit (or --cache):
- tree/: a site-packages-like directory of about --gib GiB: big shared
  libraries whose .nv_fatbin sections are the real fatbins of
  tests/data/cubins/oracle (sm_121a, sm_120, sm_90, PTX-only, LZ4- and
  ZSTD-compressed, mixed), repeated in a seeded order to hundreds of MiB, with
  incompressible host code beside them (8% fatbins, ~10k entries in all); large non-ELF files (weights-like
  data, half incompressible, half compressible); thousands of Python sources
  and small libraries (the fixture libraries, some without device code);
- image.oci.tar: the same files as an OCI image archive (gzip layers, linux/arm64),
  as buildx --output type=oci writes it.
The libraries are linked by the host's gcc (`.incbin` of the section bytes);
ELF machine does not matter to the scan.

Measured in this one process, alternating, best of --runs:
- image: `cubins.scan_target(ARCHIVE)` and `check.gather(ARCHIVE)` (the build
  line's stage) / reading and gunzipping every layer blob (build_scan.plain_read).
  Goal <= 1.2.
- tree: `spark-images check TREE --no-audit`, whole child process / `cat` of
  every file of TREE to /dev/null, whole child process. Goal <= 1.5. Also the
  in-process `scan_target(TREE)` / reading every file.
Prints /proc/loadavg before and after. With --profile, one cProfile run of
each scan first (top functions by cumulative and internal time).
With --before SRC (the `src` folder of an older checkout, e.g. from
`git archive`), that code's scans are timed too, in this same process and
alternating with today's (its modules swapped into sys.modules around each
call; the whole-process check runs with PYTHONPATH=SRC).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gzip
import hashlib
import io
import json
import os
import pstats
import random
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import build_scan  # beside this script
import cubins as cubins_bench  # beside this script: the child runner
from isal import isal_zlib

from spark_images import check, cubins
from spark_images.cubins import elf
from spark_images.readers.common import tune_process_for_reading

ROOT = Path(__file__).resolve().parents[1]
ORACLE_LIB = ROOT / "tests" / "data" / "cubins" / "oracle" / "bin" / "lib"
SITE = "usr/local/lib/python3.12/dist-packages"
MiB = 1 << 20
SEED = 20261202
VERSION = 1  # bump when the generated content changes
GLOBS = ("vllm/_C*.so",)
FATBIN_SHARE = 0.08


def _fatbin_sections() -> list[bytes]:
    """The .nv_fatbin section of every oracle library that has one."""
    out = []
    for lib in sorted(ORACLE_LIB.glob("*.so")):
        data = lib.read_bytes()
        hdr = elf.read_header(data)
        for sec in elf.sections(data, hdr):
            if sec.name == ".nv_fatbin" and sec.size:
                out.append(data[sec.offset : sec.offset + sec.size])
    return out


def _pad8(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 8)


def _big_library(dest: Path, fatbin_mib: int, host_mib: int, rng: random.Random, work: Path) -> None:
    """A shared library with `fatbin_mib` MiB of real fatbins in .nv_fatbin and `host_mib` of host bytes."""
    pieces = [_pad8(p) for p in _fatbin_sections()]
    fat = work / f"{dest.name}.fatbin.bin"
    host = work / f"{dest.name}.host.bin"
    with fat.open("wb") as out:
        written = 0
        while written < fatbin_mib * MiB:
            piece = pieces[rng.randrange(len(pieces))]
            out.write(piece)
            written += len(piece)
    with host.open("wb") as out:
        for _ in range(host_mib):
            out.write(rng.randbytes(MiB))
    src = work / f"{dest.name}.s"
    src.write_text(
        f'.section .nv_fatbin,"a"\n.balign 8\n.incbin "{fat}"\n'
        f'.section .rodata.host,"a"\n.balign 16\n.incbin "{host}"\n'
        ".text\n.globl spark_bench_entry\nspark_bench_entry:\n ret\n"
    )
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-shared", "-nostdlib", "-o", str(dest), str(src)], check=True)
    for path in (fat, host, src):
        path.unlink()


def _python_source(rng: random.Random, n: int) -> bytes:
    words = ["def", "return", "self", "tensor", "kernel", "import", "torch", "class", "layer", "None", "cache",
             "config", "attention", "weight", "for", "in", "if", "else", "dtype", "device"]  # fmt: skip
    lines = [f"# generated module {n}\n"]
    for i in range(rng.randrange(60, 260)):
        lines.append(f"def f_{n}_{i}(x):\n    " + " ".join(rng.choice(words) for _ in range(rng.randrange(4, 14))) + "\n")
    return "".join(lines).encode()


def generate_tree(tree: Path, gib: float) -> None:
    """The tree, about `gib` GiB, seeded: the same bytes on every machine with the same fixtures."""
    rng = random.Random(SEED)
    work = tree.parent / "work"
    work.mkdir(parents=True, exist_ok=True)
    site = tree / SITE
    total = int(gib * 1024) * MiB
    # big libraries: about 45% of the bytes, 8% of each in fatbins. The oracle's cubins are
    # ~10 KiB; real ones are far larger, so a higher share would give ~100x the entries
    # per MiB of a real library. 8% gives ~10k entries in all (vLLM + torch + FlashInfer order).
    libs = [("vllm/_C.abi3.so", 0.17), ("torch/lib/libtorch_cuda.so", 0.18), ("flashinfer/data/libflashinfer.so", 0.10)]
    for rel, share in libs:
        size_mib = int(total * share / MiB)
        _big_library(site / rel, int(size_mib * FATBIN_SHARE), size_mib - int(size_mib * FATBIN_SHARE), rng, work)
    # large non-ELF files: about 40% (weights-like blobs, a tokenizer, a wheel cache)
    blobs = [("vllm/model_executor/data/weights.bin", 0.20, 1.0), ("triton/backends/nvidia/lib/data.bin", 0.10, 1.0),
             ("nvidia/cudnn/include/big_header.h", 0.05, 0.0), ("transformers/data/tokenizer.json", 0.05, 0.5)]  # fmt: skip
    for rel, share, noise in blobs:
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as out:
            for _ in range(int(total * share / MiB)):
                if rng.random() < noise:
                    out.write(rng.randbytes(MiB))
                else:
                    out.write((_python_source(rng, 0) * 64)[:MiB])
    # many small files: the rest (python sources, small libraries with and without device code)
    small = sorted(ORACLE_LIB.glob("*.so"))
    written = sum(p.stat().st_size for p in site.rglob("*") if p.is_file())
    n = 0
    while written < total:
        pkg = site / f"pkg{n % 97:02d}" / f"sub{n % 13}"
        pkg.mkdir(parents=True, exist_ok=True)
        if n % 50 == 0:
            lib = small[(n // 50) % len(small)]
            data = lib.read_bytes()
            (pkg / f"_ext{n}.so").write_bytes(data)
        else:
            data = _python_source(rng, n)
            (pkg / f"mod{n}.py").write_bytes(data)
        written += len(data)
        n += 1
    work.rmdir()


class _Hashing(io.RawIOBase):
    """A write-only stream that hashes and counts what passes into `out`."""

    def __init__(self, out: io.RawIOBase | io.BufferedIOBase | gzip.GzipFile) -> None:
        self.out, self.sha, self.size = out, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.size

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.sha.update(data)
        self.size += len(data)
        self.out.write(data)
        return len(data)


def _layer(tree: Path, paths: list[Path], dest: Path) -> tuple[str, str, int]:
    """Write the gzip layer of `paths` (sorted, mtime 0) to dest: (blob digest, diff id, blob size)."""
    with dest.open("wb") as raw:
        blob = _Hashing(raw)  # type: ignore[arg-type]
        with gzip.GzipFile(fileobj=blob, mode="wb", compresslevel=1, mtime=0) as gz:
            plain = _Hashing(gz)
            with tarfile.open(fileobj=plain, mode="w", format=tarfile.PAX_FORMAT) as tar:
                dirs: set[str] = set()
                for path in paths:
                    rel = path.relative_to(tree).as_posix()
                    parts = rel.split("/")[:-1]
                    for i in range(1, len(parts) + 1):
                        d = "/".join(parts[:i])
                        if d not in dirs:
                            dirs.add(d)
                            info = tarfile.TarInfo(d)
                            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
                            tar.addfile(info)
                    info = tarfile.TarInfo(rel)
                    info.size, info.mtime = path.stat().st_size, 0
                    info.mode = 0o755 if rel.endswith(".so") else 0o644
                    with path.open("rb") as fh:
                        tar.addfile(info, fh)
    return "sha256:" + blob.sha.hexdigest(), "sha256:" + plain.sha.hexdigest(), blob.size


def generate_archive(tree: Path, archive: Path) -> None:
    """The tree as an OCI archive: one layer per top-level package group (bottom first), gzip level 1."""
    files = sorted(p for p in tree.rglob("*") if p.is_file())
    groups: dict[str, list[Path]] = {}
    for path in files:
        top = path.relative_to(tree / SITE).parts[0]
        groups.setdefault("small" if top.startswith("pkg") else top, []).append(path)
    part = archive.with_suffix(".part")
    blobs: list[dict[str, object]] = []
    diff_ids: list[str] = []
    with tarfile.open(part, "w", format=tarfile.PAX_FORMAT) as out:

        def put(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            out.addfile(info, io.BytesIO(data))

        put("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        for key in sorted(groups):
            layer = archive.with_name("layer.part")
            digest, diff_id, size = _layer(tree, groups[key], layer)
            info = out.gettarinfo(str(layer), arcname=f"blobs/sha256/{digest[7:]}")
            info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = 0, 0, 0, "", "", 0o644
            with layer.open("rb") as fh:
                out.addfile(info, fh)
            layer.unlink()
            blobs.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest, "size": size})
            diff_ids.append(diff_id)
        config = json.dumps({"architecture": "arm64", "os": "linux", "config": {"Env": ["PATH=/usr/bin"]},
                             "rootfs": {"type": "layers", "diff_ids": diff_ids}}, sort_keys=True).encode()  # fmt: skip
        cdigest = "sha256:" + hashlib.sha256(config).hexdigest()
        put(f"blobs/sha256/{cdigest[7:]}", config)
        manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                               "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cdigest,
                                          "size": len(config)}, "layers": blobs}, sort_keys=True).encode()  # fmt: skip
        mdigest = "sha256:" + hashlib.sha256(manifest).hexdigest()
        put(f"blobs/sha256/{mdigest[7:]}", manifest)
        index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                 "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": mdigest,
                                "size": len(manifest), "platform": {"architecture": "arm64", "os": "linux"}}]}  # fmt: skip
        put("index.json", json.dumps(index, sort_keys=True).encode())
    part.rename(archive)


def ensure(cache: Path, gib: float) -> tuple[Path, Path]:
    root = cache / f"v{VERSION}-{gib:g}gib"
    tree, archive = root / "tree", root / "image.oci.tar"
    if not (root / "tree.done").is_file():
        shutil.rmtree(tree, ignore_errors=True)
        print(f"generating {tree} (once) ...", flush=True)
        generate_tree(tree, gib)
        (root / "tree.done").write_text("")
    if not archive.is_file():
        print(f"generating {archive} (once) ...", flush=True)
        generate_archive(tree, archive)
    return tree, archive


def read_tree(tree: Path) -> int:
    total = 0
    for path in sorted(tree.rglob("*")):
        if path.is_file():
            with path.open("rb") as fh:
                while chunk := fh.read(MiB):
                    total += len(chunk)
    return total


def _ours() -> dict[str, ModuleType]:
    return {k: m for k, m in sys.modules.items() if k == "spark_images" or k.startswith("spark_images.")}


def load_before(src: Path) -> dict[str, ModuleType]:
    """The older code's modules (check and cubins with what they import), imported beside today's."""
    ours = _ours()
    for key in ours:
        del sys.modules[key]
    sys.path.insert(0, str(src))
    try:
        import importlib

        for name in ("spark_images.check", "spark_images.cubins", "spark_images.check.collect"):
            importlib.import_module(name)
        theirs = _ours()
        assert str(theirs["spark_images"].__file__).startswith(str(src)), theirs["spark_images"].__file__
    finally:
        sys.path.remove(str(src))
        for key in _ours():
            del sys.modules[key]
        sys.modules.update(ours)
    return theirs


@contextlib.contextmanager
def using(mods: dict[str, ModuleType]) -> Iterator[dict[str, ModuleType]]:
    """`mods` in sys.modules while the block runs (functions import lazily from there)."""
    ours = _ours()
    for key in ours:
        del sys.modules[key]
    sys.modules.update(mods)
    try:
        yield mods
    finally:
        for key in _ours():
            del sys.modules[key]
        sys.modules.update(ours)


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()


def profile(label: str, fn: object) -> None:
    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.runcall(fn)  # type: ignore[arg-type]
    print(f"--- cProfile: {label} ({time.perf_counter() - start:.2f} s under the profiler)")
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(14)


def main() -> int:
    tune_process_for_reading()  # as the CLI does
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.6)
    ap.add_argument("--runs", type=int, default=2, help="timed runs; 0 only generates the content")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "spark-images-test" / "bench-at-limit")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--clean", action="store_true", help="delete the generated tree and archive afterwards")
    ap.add_argument("--before", type=Path, help="the src folder of older code to time beside today's")
    args = ap.parse_args()
    before = load_before(args.before.resolve()) if args.before else None
    tree, archive = ensure(args.cache, args.gib)
    site = str(tree / SITE)
    files = [str(p) for p in sorted((tree / SITE).rglob("*")) if p.is_file()]
    print(f"archive {archive}: {archive.stat().st_size / 2**30:.2f} GiB; tree {site}: "
          f"{sum(os.path.getsize(f) for f in files) / 2**30:.2f} GiB in {len(files)} files")  # fmt: skip
    if args.profile:
        profile("scan_target(archive)", lambda: cubins.scan_target(str(archive), "sm_121", GLOBS))
        profile("check.gather(tree)", lambda: check.gather(site, "sm_121", required=GLOBS))
    if args.runs < 1:
        return 0
    print(f"load before: {loadavg()}", flush=True)
    cat = ["sh", "-c", 'find "$1" -type f -exec cat {} + > /dev/null', "cat", site]
    check_cli = [sys.executable, "-c", cubins_bench.RUN_CLI, "check", site, "--json", "--no-audit"]
    best: dict[str, float] = {}

    def note(key: str, seconds: float) -> None:
        best[key] = min(best.get(key, float("inf")), seconds)

    reports: list[object] = []
    image_measures: list[tuple[str, Callable[[], object]]] = [
        ("plain", lambda: build_scan.plain_read(archive)),
        ("plain_isal", lambda: build_scan.plain_read(archive, isal_zlib)),
        ("scan_archive", lambda: reports.append(cubins.scan_target(str(archive), "sm_121", GLOBS))),
        ("gather_archive", lambda: check.gather(str(archive), "sm_121", required=GLOBS)),
    ]
    for run in range(args.runs):  # alternate, so page cache and CPU state are shared fairly
        # and swap the order every other run (plain, ISA-L, scan, gather; then ISA-L, plain,
        # gather, scan): a walk right after another walk reuses memory the kernel has just freed,
        # and one after the single-threaded gunzip ran 0.6-0.9 s slower on a VM whose kernel hands
        # free pages back to its host (free page reporting: touching them again faults in the host)
        order = image_measures if run % 2 == 0 else [image_measures[i] for i in (1, 0, 3, 2)]
        for key, measure in order:
            t0 = time.perf_counter()
            measure()
            note(key, time.perf_counter() - t0)
        report = reports[-1]
        t0 = time.perf_counter()
        read_tree(tree / SITE)
        note("read_tree", time.perf_counter() - t0)
        t0 = time.perf_counter()
        cubins.scan_target(site, "sm_121", GLOBS)
        note("scan_tree", time.perf_counter() - t0)
        note("cat", cubins_bench.run_child(cat)[0])
        wall, rss, out = cubins_bench.run_child(check_cli)
        note("check_tree", wall)
        verdict = json.loads(out).get("verdict")
        if before is not None:
            with using(before) as old:
                t0 = time.perf_counter()
                old["spark_images.cubins"].scan_target(str(archive), "sm_121", GLOBS)
                note("before_scan_archive", time.perf_counter() - t0)
                t0 = time.perf_counter()
                old["spark_images.check"].gather(str(archive), "sm_121", required=GLOBS)
                note("before_gather_archive", time.perf_counter() - t0)
                t0 = time.perf_counter()
                old["spark_images.cubins"].scan_target(site, "sm_121", GLOBS)
                note("before_scan_tree", time.perf_counter() - t0)
            note("before_check_tree", cubins_bench.run_child(["env", f"PYTHONPATH={args.before.resolve()}", *check_cli])[0])
    print(f"load after:  {loadavg()}")
    libs = len(report.libraries) if hasattr(report, "libraries") else "?"
    print(f"archive scan found {libs} libraries; tree check verdict {verdict}; check peak RSS {rss / MiB:.0f} MiB")
    b = best
    rows = [
        ("image: read + gunzip layers (zlib)", b["plain"], None, None),
        ("image: read + gunzip layers (ISA-L)", b["plain_isal"], None, None),
        ("image: cubins scan_target(archive)", b["scan_archive"], b["scan_archive"] / b["plain"], 1.2),
        ("image: check.gather(archive) (build stage)", b["gather_archive"], b["gather_archive"] / b["plain"], 1.2),
        ("  the same against ISA-L's gunzip", b["gather_archive"], b["gather_archive"] / b["plain_isal"], None),
        ("tree: read every file (in process)", b["read_tree"], None, None),
        ("tree: cubins scan_target(tree)", b["scan_tree"], b["scan_tree"] / b["read_tree"], None),
        ("tree: cat of every file (process)", b["cat"], None, None),
        ("tree: spark-images check (process)", b["check_tree"], b["check_tree"] / b["cat"], 1.5),
    ]
    if before is not None:
        rows += [
            ("before: cubins scan_target(archive)", b["before_scan_archive"], b["before_scan_archive"] / b["plain"], 1.2),
            ("before: check.gather(archive)", b["before_gather_archive"], b["before_gather_archive"] / b["plain"], 1.2),
            ("before: cubins scan_target(tree)", b["before_scan_tree"], b["before_scan_tree"] / b["read_tree"], None),
            ("before: spark-images check (process)", b["before_check_tree"], b["before_check_tree"] / b["cat"], 1.5),
        ]
    for label, seconds, ratio, goal in rows:
        extra = f"   ratio {ratio:.2f}" + (f" (goal <= {goal}) {'OK' if ratio <= goal else 'OVER'}" if goal else "") if ratio else ""
        print(f"  {label:44s} {seconds:7.2f} s{extra}")
    if args.clean:
        shutil.rmtree(tree.parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())

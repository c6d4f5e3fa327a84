"""Build-line benchmark: render time, line overhead over plain buildx, repro.

Run after .ci/engine-up.sh, from the repository root:

    .venv/bin/python benchmarks/build.py [--runs 3] [--repro]

It sets up the test project of the build tests (tests/support/build_helpers.py) (the CUDA test base pinned in the
loopback registry, a small vLLM wheel served over HTTP), then measures, in
this one process:
- render: validate + plan + render of profiles/cu130.yaml and cu129.yaml;
- a cached, no-change `spark-images build --push` against a plain
  `docker buildx build` of the same rendered Dockerfile, same arguments and
  the same OCI export (the baseline): the difference is the line's overhead;
- with --repro: `spark-images verify-repro` (two builds without cache) and
  whether both digests, and the cached build's, are one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the test helpers, as `support.*`

from spark_images.buildline import plan, render  # noqa: E402
from spark_images.profiles import profile as profiles  # noqa: E402
from support import build_helpers as h  # noqa: E402

REGISTRY = os.environ.get("SPARK_IMAGES_TEST_REGISTRY", "127.0.0.1:5000")


def timed(fn, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def render_once(profile: Path, out: Path) -> None:
    prof = profiles.load_profile(profile)
    texts = {p: (ROOT / p).read_text() for p in prof.patches}
    render.write_render(plan.make_plan(prof, texts), out, ROOT)


def setup(work: Path) -> tuple[h.LineProject, str]:
    """The test project: base pushed to the registry, wheel served, profile written."""
    if subprocess.run(["docker", "image", "inspect", h.CUDA_BASE], capture_output=True).returncode != 0:
        sys.exit(f"run the build tests once first (they make {h.CUDA_BASE})")
    remote = f"{REGISTRY}/{h.CUDA_BASE}"
    h._docker("tag", h.CUDA_BASE, remote)
    h._docker("push", "--quiet", remote)
    import requests

    name, tag = h.CUDA_BASE.split(":")
    digest = requests.head(
        f"http://{REGISTRY}/v2/{name}/manifests/{tag}",
        headers={"Accept": "application/vnd.oci.image.index.v1+json"},
        timeout=30,
    ).headers["Docker-Content-Digest"]
    wheels = work / "wheels"
    wheels.mkdir()
    lib = h.compile_library("nvcc", ["-gencode=arch=compute_121a,code=sm_121a"], work / "_C.abi3.so")
    wheel, sha = h.make_vllm_wheel(wheels, lib, h.TEST_COMMIT)
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "0", "--bind", "0.0.0.0", "--directory", str(wheels)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert server.stdout is not None
    port = server.stdout.readline().split(" port ")[1].split(" ")[0]
    root = work / "project"
    (root / "profiles").mkdir(parents=True)
    # the CUDA torch stand-in, as in the build tests: the image's verdict must not be broken
    torch, torch_sha = h.make_torch_wheel(wheels / "torch-cuda", lib)
    lock = h.requirements_lock(f"http://{h._bridge_gateway()}:{port}/torch-cuda/{torch.name}", torch_sha)
    (root / "profiles" / "test.requirements.lock").write_text(lock)
    text = (h.DATA / "profile.yaml.in").read_text()
    for key, value in {
        "@NAME@": "bench", "@COMMIT@": h.TEST_COMMIT, "@BASE@": f"{remote}@{digest}",
        "@WHEEL_URL@": f"http://{h._bridge_gateway()}:{port}/{wheel.name}", "@WHEEL_SHA256@": sha,
        "@REQUIRED@": "[]", "@REGISTRY@": REGISTRY,
    }.items():  # fmt: skip
        text = text.replace(key, value)
    (root / "profiles" / "bench.yaml").write_text(text)
    project = h.LineProject(root, root / "profiles" / "bench.yaml", root / "images.lock.json", sha)
    setup.server = server  # type: ignore[attr-defined]
    return project, f"{REGISTRY}/spark-images-test/bench"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--repro", action="store_true", help="also run verify-repro (two no-cache builds)")
    args = ap.parse_args()
    ca = str(h.CA_BUNDLE)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in ("cu130", "cu129"):
            times = timed(lambda n=name: render_once(ROOT / "profiles" / f"{n}.yaml", work / f"r-{n}"), 20)
            print(f"render {name}: median {statistics.median(times) * 1000:.1f} ms (20 runs, validate+plan+render)")
        project, repo = setup(work)
        line_args = ["build", "profiles/bench.yaml", "--push", repo, "--ca-cert", ca, "--lock", str(project.lock), "--quiet"]

        def line() -> None:
            proc = project.run(*line_args)
            if proc.returncode != 0:
                sys.exit(f"line failed: {proc.stdout}{proc.stderr[-2000:]}")

        line()  # warm: the first build fills the cache
        record = json.loads((project.root / "build" / "bench" / "record.json").read_text())
        digest = record["build"]["digest"]
        ctx = project.root / "build" / "bench" / "context"
        plain_cmd = [
            "docker", "buildx", "build", str(ctx), "--platform", "linux/arm64", "--provenance", "false",
            "--secret", f"id=cacert,src={ca}", "--build-arg", f"SOURCE_DATE_EPOCH={h.TEST_EPOCH}",
            "--build-arg", f"IMAGE_CREATED={record['build']['created']}", "--build-arg", "FIXES_INCLUDED=",
            "--output", f"type=oci,dest={work / 'plain.tar'},rewrite-timestamp=true", "--progress", "quiet",
        ]  # fmt: skip

        def plain() -> None:
            subprocess.run(plain_cmd, check=True, capture_output=True, env=h.cli_env())

        plain_t = timed(plain, args.runs)
        line_t = timed(line, args.runs)
        p, q = statistics.median(plain_t), statistics.median(line_t)
        print(f"cached no-change rebuild, plain buildx (same Dockerfile, same OCI export): median {p:.2f} s")
        print(f"cached no-change rebuild, spark-images build --push (whole line):       median {q:.2f} s")
        print(f"line overhead: {q - p:.2f} s (ratio {q / p:.2f}x; goal: under 2 s)")
        record = json.loads((project.root / "build" / "bench" / "record.json").read_text())
        print(f"line timings of the last run: {record['result']['timings']}")
        if args.repro:
            proc = project.run("verify-repro", "profiles/bench.yaml", "--ca-cert", ca, "--json", "--quiet")
            doc = json.loads(proc.stdout)
            same = doc.get("reproducible") and doc["digests"][0] == digest
            print(f"double build without cache: {doc.get('digests')} build s {doc.get('build_seconds')}")
            print(f"digest equality (two no-cache builds and the cached build): {bool(same)}")
        setup.server.terminate()  # type: ignore[attr-defined]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

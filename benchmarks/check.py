"""`spark-images check` / `diff` speed and memory on images of more than 2 GB.

Three measurements, each in child processes (peak RSS is the child's own),
best of REPEAT alternating runs:

  check : `spark-images check REF` / downloading every layer blob of REF from
          the registry and gunzipping it (the bare cost of getting the bytes:
          single thread, no digest check, no tar parsing). Target <= 1.3.
  rss   : peak RSS of that check. Target <= 512 MiB.
  diff  : `spark-images diff A B` / one `check A`, A and B both > 2 GB of
          layer content. Target <= 2.5.

Images (built and pushed to the loopback registry once, then reused), from
real PyPI wheels laid into site-packages the way the check tests do it
(tests/support/check_fixtures.py builds them):
  A: vllm 0.22.0 + flashinfer-python + flashinfer-cubin 0.6.11.post2
  B: vllm 0.33.0 + the same FlashInfer pair
The fix audit is left out (--no-audit): it reads git history, not the image.

Run: .venv/bin/python benchmarks/check.py [--registry 127.0.0.1:5000] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the check fixtures and the helpers they import, as `support.*`

import cubins as cubins_bench  # noqa: E402  (beside this script: baseline download, child runner)

from support.check_fixtures import FLASHINFER_A, VLLM_A, VLLM_B, build_and_push, fetch_wheel  # noqa: E402

BASE = "spark-images-test/base:bookworm-arm64"  # tests/conftest.py's arm64_base (made there)


def images(registry: str) -> tuple[str, str]:
    flashinfer = [fetch_wheel("flashinfer-python", FLASHINFER_A), fetch_wheel("flashinfer-cubin", FLASHINFER_A)]
    a = build_and_push(BASE, [fetch_wheel(*VLLM_A, platform="aarch64"), *flashinfer], {}, registry, "a")[1]
    b = build_and_push(BASE, [fetch_wheel(*VLLM_B, platform="aarch64"), *flashinfer], {}, registry, "bench-b")[1]
    return a, b


def cli(*args: str) -> list[str]:
    return [sys.executable, "-c", cubins_bench.RUN_CLI, *args]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--registry", default="127.0.0.1:5000")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    a, b = images(args.registry)
    host, _, rest = a.partition("/")
    repo, _, tag = rest.rpartition(":")
    baseline = [sys.executable, "-c", cubins_bench.BASELINE_DOWNLOAD + cubins_bench.PEAK_RSS, host, repo, tag]
    base = check = diff = float("inf")
    rss_check = rss_diff = 0
    inflated = 0
    doc: dict[str, object] = {}
    for _ in range(args.repeat):  # alternate, so page cache and CPU state are shared fairly
        t, _rss, out = cubins_bench.run_child(baseline)
        base, inflated = min(base, t), int(out.strip())
        t, rss, out = cubins_bench.run_child(cli("check", a, "--json", "--no-audit"))
        check, rss_check, doc = min(check, t), max(rss_check, rss), json.loads(out)
        t, rss, _out = cubins_bench.run_child(cli("diff", a, b, "--json", "--no-audit"))
        diff, rss_diff = min(diff, t), max(rss_diff, rss)
    mib = 2**20
    r_check, r_diff = check / base, diff / check
    print(f"image A {a}: {inflated / mib:.0f} MiB of layer content, verdict {doc.get('verdict')}")
    print(f"  download+gunzip layers : {base:6.2f} s")
    print(f"  check                  : {check:6.2f} s   ratio {r_check:.2f} (target <= 1.3) "
          f"{'OK' if r_check <= 1.3 else 'OVER'}")  # fmt: skip
    print(f"  check peak RSS         : {rss_check / mib:6.0f} MiB (target <= 512) {'OK' if rss_check <= 512 * mib else 'OVER'}")
    print(f"  diff A B               : {diff:6.2f} s   / check {r_diff:.2f} (target <= 2.5) "
          f"{'OK' if r_diff <= 2.5 else 'OVER'}; peak RSS {rss_diff / mib:.0f} MiB")  # fmt: skip


if __name__ == "__main__":
    main()

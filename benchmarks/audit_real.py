"""The audit of the knowledge base's fixes on a real vLLM history, as a whole process.

    .venv/bin/python benchmarks/audit_real.py HISTORY [--at REF] [--runs 5]

HISTORY is a clone of vLLM (bare or not). Measured, in turn within each round:
- ours: `spark-images audit REF --repo HISTORY --json`, every fix of the
  knowledge base, first releases included (PyPI's list and each release's
  commit, from the cache that the first, untimed run filled: warm);
- naive: per fix, `git log -1 --grep '(#N)$' REF`, what people script to ask
  whether a PR is in a commit (it misses cherry-picks, reverts and changes
  that landed under another title, and names no first release).
Prints each median with the load before and after. Goal: ours <= 1 s warm.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from spark_images.audit import load_knowledge


def _cli() -> list[str]:
    found = shutil.which("spark-images", path=str(Path(sys.executable).parent)) or shutil.which("spark-images")
    return [found] if found else [sys.executable, "-m", "spark_images"]


def ours(history: Path, ref: str) -> dict:
    proc = subprocess.run([*_cli(), "audit", ref, "--repo", str(history), "--json"], capture_output=True, text=True,
                          check=False)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"audit exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout)


def naive(history: Path, ref: str, prs: list[int]) -> int:
    found = 0
    for pr in prs:
        out = subprocess.run(["git", "-C", str(history), "log", "-1", "--format=%H", f"--grep=(#{pr})$", ref],
                             capture_output=True, text=True, check=True).stdout
        found += bool(out.strip())
    return found


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("history", type=Path)
    ap.add_argument("--at", default="HEAD", help="the commit to audit (default: HEAD)")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    ref = subprocess.run(["git", "-C", str(args.history), "rev-parse", "--verify", f"{args.at}^{{commit}}"],
                         capture_output=True, text=True, check=True).stdout.strip()
    count = subprocess.run(["git", "-C", str(args.history), "rev-list", "--count", ref], capture_output=True, text=True,
                           check=True).stdout.strip()
    prs = load_knowledge().prs()
    load_before = os.getloadavg()
    first = ours(args.history, ref)  # fills the caches: the main index, PyPI's list and release commits
    times: dict[str, list[float]] = {"ours": [], "naive": []}
    for _ in range(args.runs):
        t0 = time.perf_counter()
        doc = ours(args.history, ref)
        times["ours"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        naive_found = naive(args.history, ref, prs)
        times["naive"].append(time.perf_counter() - t0)
    load_after = os.getloadavg()
    if [f["state"] for f in doc["fixes"]] != [f["state"] for f in first["fixes"]]:
        raise SystemExit("the warm audit answered differently from the first")
    states: dict[str, int] = {}
    for fix in doc["fixes"]:
        states[fix["state"]] = states.get(fix["state"], 0) + 1
    print(f"history {args.history}: {count} commits reachable from {ref[:12]}; {len(prs)} fixes")
    print(f"load {load_before[0]:.2f} / {load_before[1]:.2f} before, {load_after[0]:.2f} / {load_after[1]:.2f} after")
    print(f"ours, whole process, warm: median {statistics.median(times['ours']):.3f} s "
          f"(runs {min(times['ours']):.3f}-{max(times['ours']):.3f}; goal <= 1 s); states {states}")
    print(f"naive git log --grep per fix: median {statistics.median(times['naive']):.3f} s "
          f"({naive_found} of {len(prs)} titles found; no cherry-picks, reverts, changes or first releases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

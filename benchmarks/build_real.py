"""The real cu130 image's build time, split by stage, against the 5727 s baseline.

    .venv/bin/python benchmarks/build_real.py [--log FILE] [--no-cache]

The goal is judged on the build line's wall time, from acceptance.json beside the log.

Without --log it runs the acceptance build (.ci/acceptance.py: the 197-pin lock
and the vLLM 0.29.0 wheel through `spark-images build`, on the local stand-in
base) and reads its BuildKit progress; with --log it reads a progress log of
an earlier run. The baseline is the one build of the same lock made before the
native installer stage, on a 2-core x86-64 host, everything under qemu:
5727 s = deps install 4479 s + vLLM wheel 451 s + export 629 s (+ the rest).

Seconds come from BuildKit's own `#N DONE 12.3s` lines, summed per Dockerfile
stage (`[installer 3/6] RUN ...` belongs to `installer`); a CACHED step counts 0.
The host's load average is printed beside the figures: the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = {"deps (qemu pip install of the lock)": 4479.0, "vLLM wheel (qemu pip install)": 451.0, "export": 629.0}
BASELINE_TOTAL = 5727.0
GOAL_SECONDS = 15 * 60

_HEADER = re.compile(r"^#(\d+) \[(?:linux/\S+ )?([A-Za-z0-9_.-]+) +\d+/\d+\] ")
_OTHER = re.compile(r"^#(\d+) (exporting|writing|naming|sending|copying|rewriting)\b")
_DONE = re.compile(r"^#(\d+) DONE (\d+(?:\.\d+)?)s")


def stage_seconds(lines: Iterable[str]) -> dict[str, float]:
    """{stage: seconds} from a plain progress log; exports are summed as `export`."""
    names: dict[str, str] = {}
    totals: dict[str, float] = {}
    for raw in lines:
        line = raw.strip()
        header = _HEADER.match(line)
        if header:
            names.setdefault(header.group(1), header.group(2))
            continue
        other = _OTHER.match(line)
        if other:
            names.setdefault(other.group(1), "export")
            continue
        done = _DONE.match(line)
        if done and done.group(1) in names:
            name = names[done.group(1)]
            totals[name] = round(totals.get(name, 0.0) + float(done.group(2)), 1)
    return totals


def report(totals: dict[str, float], wall: dict[str, float] | None = None) -> str:
    """The stages' seconds, and the goal judged on the build line's wall time when known.

    Stage seconds are sums of BuildKit's step times: the installer stages (one per
    lock layer) and the toolchain run side by side, so their sum is no wall time.
    `wall` is the acceptance record's `seconds` (build_line: the whole `spark-images
    build`, its engine load and archive scan included; check: `spark-images check`).
    """
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    rows = [f"real cu130 image, by stage (host: {os.cpu_count()} CPUs, load average {load})"]
    rows.append(f"  {'stage':<40} {'now':>9}")
    for name, seconds in totals.items():
        rows.append(f"  {name:<40} {seconds:>8.1f}s")
    total = sum(totals.values())
    rows.append(f"  {'sum of the stages':<40} {total:>8.1f}s  (installer stages and toolchain run side by side)")
    built, checked = (wall or {}).get("build_line"), (wall or {}).get("check")
    if built:
        rows.append(f"  {'build line, wall (spark-images build)':<40} {built:>8.1f}s")
        if checked:
            rows.append(f"  {'check of the archive, wall':<40} {checked:>8.1f}s")
    rows.append(f"baseline (all under qemu): {BASELINE_TOTAL:.0f} s")
    for name, seconds in BASELINE.items():
        rows.append(f"  {name:<40} {seconds:>8.1f}s")
    judged = built or total
    if judged:
        what = "build line" if built else "sum of the stages (no record: the wall time is unknown)"
        rows.append(f"speed-up {BASELINE_TOTAL / judged:.1f}x ({what}); goal <= {GOAL_SECONDS} s: "
                    f"{'met' if judged <= GOAL_SECONDS else 'NOT met'}")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", type=Path, help="a BuildKit progress log of an earlier acceptance build")
    parser.add_argument("--no-cache", action="store_true", help="build without the layer cache (the fair figure)")
    args = parser.parse_args(argv)
    log = args.log
    if log is None:
        out = ROOT / "build" / "acceptance"
        cmd = [sys.executable, str(ROOT / ".ci" / "acceptance.py"), "--out", str(out)]
        subprocess.run([*cmd, *(["--no-cache"] if args.no_cache else [])], check=False)
        log = out / "build.log"
    record = log.with_name("acceptance.json")
    wall = json.loads(record.read_text(encoding="utf-8")).get("seconds") if record.is_file() else None
    print(report(stage_seconds(log.read_text(encoding="utf-8", errors="replace").splitlines()), wall))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

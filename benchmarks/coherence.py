"""Coherence scoring and log scanning speed, as ratios against plain baselines.

The gate scores every answer and scans every log line of a server that may log
tens of thousands of lines while it starts; both must stay negligible next to
the requests themselves. Baselines measured in the same run:
- scoring an answer / zlib-compressing it (the cheapest metric it contains);
- scanning a log line / one regex search of that line.

    python benchmarks/coherence.py [--repeat N]
"""

from __future__ import annotations

import argparse
import re
import zlib

from _timing import best_of  # beside this script

from spark_images.coherence.scoring import score_text
from spark_images.coherence.signatures import scan_line

ANSWER = (
    "The capital of France is Paris. It lies on the Seine, in the north of the country, "
    "and has been the seat of government for most of the last thousand years. "
) * 8
LOOP = "lockhandlehandle" * 60
LOG = [
    "INFO 12-01 04:10:11 [gpu_model_runner.py:2012] Model loading took 17.5 GiB and 41.3 seconds",
    "INFO 12-01 04:10:12 [fused_moe.py:88] Using 'FLASHINFER_CUTLASS' NvFp4 MoE backend out of potential backends",
    "WARNING 12-01 04:10:13 [envs.py:101] Unknown vLLM environment variable detected: VLLM_FLASHINFER_MOE_BACKEND",
    "INFO 12-01 04:10:14 [core.py:99] Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%",
] * 250


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    for name, text in (("coherent answer", ANSWER), ("token loop", LOOP)):
        base = best_of(lambda text=text: [zlib.compress(text.encode()) for _ in range(100)], args.repeat) / 100
        ours = best_of(lambda text=text: [score_text(text) for _ in range(100)], args.repeat) / 100
        print(f"score {name:16s} {len(text):5d} chars: {ours * 1e3:7.3f} ms  zlib {base * 1e3:7.3f} ms  ratio {ours / base:6.1f}x")
    pattern = re.compile(r"No compiled nvfp4 mm kernel")
    base = best_of(lambda: [pattern.search(line) for line in LOG], args.repeat) / len(LOG)
    ours = best_of(lambda: [scan_line(line) for line in LOG], args.repeat) / len(LOG)
    print(f"scan log line: {ours * 1e6:7.2f} us  one regex {base * 1e6:7.2f} us  ratio {ours / base:6.1f}x"
          f"  ({1 / ours:,.0f} lines/s)")


if __name__ == "__main__":
    main()

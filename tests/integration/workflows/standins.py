"""What a GitHub runner has that this machine cannot: stand-ins, each saying what it replaces.

- `gh` (GitHub's CLI): github.com is unreachable here. The stand-in answers
  `gh release view --repo R --json tagName --jq .tagName` with the release tag
  the test chose and records `gh pr create` (its arguments and a copy of the
  `--body-file`), refusing a call without GH_TOKEN or without the body file, as
  the real one fails. Every call is logged for the test to assert on.
- The DGX Spark runner's GPU: no sm_121 GPU exists here. `nvidia-smi` answers
  the gate's one query (`--query-gpu=compute_cap`) with 12.1, as a GB10 does,
  and `docker` is the real client with `--gpus VALUE` removed, because this
  engine has no NVIDIA runtime to hand a GPU to the container. Everything else
  (pull by digest, run, logs, ports, clean-up) is the real engine.
- The image's `vllm`: the stand-in server of tests/support/fake_vllm.py, put
  into the test's vllm wheel as its `vllm` console script, so the gate serves
  the very digest the build pushed (see `standin_vllm_wheel`).
"""

from __future__ import annotations

import hashlib
import shutil
import zipfile
from pathlib import Path

from support.coherence_fakes import FAKE_PATH

FAKE_VLLM = FAKE_PATH


def _script(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)


def github_cli(bin_dir: Path, log_dir: Path, release_tag: str) -> Path:
    """A `gh` stand-in in bin_dir (see the module docstring); returns bin_dir."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    _script(bin_dir / "gh", f"""#!/usr/bin/env bash
# stand-in for GitHub's gh (github.com is unreachable in the tests)
set -euo pipefail
printf '%q ' "$@" >> {log_dir}/gh.log; echo >> {log_dir}/gh.log
if [ -z "${{GH_TOKEN:-}}" ]; then echo "gh: To use GitHub CLI in a GitHub Actions workflow, set the GH_TOKEN environment variable." >&2; exit 4; fi
case "$1 $2" in
  "release view") echo {release_tag} ;;
  "pr create")
    body=""; args=("$@")
    for i in "${{!args[@]}}"; do [ "${{args[$i]}}" = --body-file ] && body="${{args[$((i+1))]}}"; done
    [ -f "$body" ] || {{ echo "gh: open $body: no such file or directory" >&2; exit 1; }}
    n=$(ls {log_dir} | grep -c '^pr-' || true)
    cp "$body" "{log_dir}/pr-$n.md"
    printf '%q ' "$@" > "{log_dir}/pr-$n.args"
    echo "https://github.com/spark-images/spark-images/pull/$((n+1))" ;;
  *) echo "gh stand-in: $1 $2 is not handled" >&2; exit 1 ;;
esac
""")
    return bin_dir


def spark_runner(bin_dir: Path) -> Path:
    """`nvidia-smi` and a `docker` without `--gpus` in bin_dir (see the module docstring)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    docker = shutil.which("docker")
    assert docker, "no docker client"
    _script(bin_dir / "nvidia-smi", """#!/usr/bin/env bash
# stand-in for a DGX Spark's nvidia-smi (GB10: compute capability 12.1)
if [ "$*" = "--query-gpu=compute_cap --format=csv,noheader" ]; then echo 12.1; exit 0; fi
echo "nvidia-smi stand-in: only the compute_cap query is answered" >&2; exit 9
""")
    _script(bin_dir / "docker", f"""#!/usr/bin/env bash
# the real docker client; --gpus dropped: this engine has no NVIDIA runtime
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --gpus) shift 2 ;;
    --gpus=*) shift ;;
    *) args+=("$1"); shift ;;
  esac
done
exec {docker} "${{args[@]}}"
""")
    return bin_dir


def standin_vllm_wheel(wheel: Path) -> tuple[Path, str]:
    """The wheel made by build_helpers.make_vllm_wheel plus the stand-in server as `vllm`.

    Adds `vllm/_standin_server.py` (tests/support/fake_vllm.py and a console entry)
    and `entry_points.txt`, rewrites RECORD, and writes the wheel in place of the
    original name's sibling. Returns (path, sha256).
    """
    with zipfile.ZipFile(wheel) as zf:
        files = {info.filename: zf.read(info) for info in zf.infolist()}
    dist = next(n.split("/", 1)[0] for n in files if n.endswith(".dist-info/METADATA"))
    server = FAKE_VLLM.read_bytes() + b"\n\ndef console() -> int:\n    return main(sys.argv[1:])\n"
    files["vllm/_standin_server.py"] = server
    files[f"{dist}/entry_points.txt"] = b"[console_scripts]\nvllm = vllm._standin_server:console\n"
    from support.build_helpers import wheel_archive

    data = wheel_archive(files, dist)
    digest = hashlib.sha256(data).hexdigest()
    version = wheel.name.split("-")[1].split("+")[0]
    out = wheel.with_name(f"vllm-{version}+standin{digest[:8]}-py3-none-any.whl")
    out.write_bytes(data)
    return out, digest

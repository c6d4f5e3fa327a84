"""Two builds of the real cu130 plan, varied the way reprotest varies a build, must
give one manifest digest (the acceptance build, .ci/acceptance.py, both times).

Varied between the two runs: the checkout path (the second run builds from a copy
of the tracked files elsewhere), the umask (022 / 077), TZ, the locale, the user
name and HOME the CLI sees, and the build directory. Both run without BuildKit's
layer cache, so every step runs again. Not varied: the uid (the engine's socket
is root's) and the kernel, which BuildKit's containers do not see.

    python .ci/reprotest.py      exit 0: one digest; 1: two digests
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VARIATIONS = (
    {"umask": 0o022, "env": {"TZ": "UTC", "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8", "USER": "root"}},
    {"umask": 0o077, "env": {"TZ": "Pacific/Chatham", "LC_ALL": "fr_FR.UTF-8", "LANG": "fr_FR.UTF-8", "USER": "builder2"}},
)


def checkout_copy(dest: Path) -> Path:
    """The tracked files of this checkout, copied to another path."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout.split(b"\0")
    for name in filter(None, files):
        src, dst = ROOT / name.decode(), dest / name.decode()
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(os.readlink(src))
        elif src.is_file():
            dst.write_bytes(src.read_bytes())
            dst.chmod(src.stat().st_mode & 0o777)
    return dest


def one_build(tree: Path, out: Path, variation: dict) -> str | None:
    # the stand-in base is an input, as the pinned nvidia/cuda base is: both builds take
    # the one the test cache holds (a new HOME would debootstrap another, other bytes)
    cache = os.environ.get("SPARK_IMAGES_TEST_CACHE") or str(Path.home() / ".cache" / "spark-images-test")
    env = {**os.environ, **variation["env"], "HOME": str(out / "home"), "SPARK_IMAGES_TEST_CACHE": cache}
    (out / "home").mkdir(parents=True, exist_ok=True)
    old = os.umask(variation["umask"])
    try:
        subprocess.run([sys.executable, str(tree / ".ci" / "acceptance.py"), "--no-cache", "--out", str(out)], env=env, check=False)
    finally:
        os.umask(old)
    try:
        return json.loads((out / "acceptance.json").read_text())["digest"]
    except (OSError, ValueError, KeyError):
        return None


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="spark-images-reprotest-"))
    # one stand-in base for both builds, as both builds of a profile pull one pinned base
    # (the stand-in is a fixture: BuildKit remakes it with other bytes once its cache is gone)
    base = subprocess.run(["bash", str(ROOT / ".ci" / "standin-base.sh")], check=True, stdout=subprocess.PIPE, text=True)
    os.environ["SPARK_IMAGES_STANDIN_BASE"] = base.stdout.strip().splitlines()[-1]
    digests = [
        one_build(ROOT, work / "first", VARIATIONS[0]),
        one_build(checkout_copy(work / "elsewhere" / "spark-images"), work / "second-build-dir", VARIATIONS[1]),
    ]
    print(json.dumps({"digests": digests, "same": digests[0] is not None and digests[0] == digests[1], "work": str(work)}))
    return 0 if digests[0] is not None and digests[0] == digests[1] else 1


if __name__ == "__main__":
    sys.exit(main())

"""The cluster tests' images, built the way .ci/engine-up.sh builds images (nothing can be pulled).

- an amd64 Debian bookworm minbase rootfs (python3, venv, pip, CA certificates,
  openssh-server), debootstrapped once by rootfs-amd64.sh and cached as a
  tarball under the test cache;
- the Ray node image: `FROM scratch` + the rootfs, Ray from PyPI installed in a
  build step (the wheels are downloaded by pip on this host and cached, then
  installed offline: the build container need not reach PyPI), the `vllm` and
  `nvidia-smi` stand-ins (stand_ins/); pushed to the loopback registry to get a
  manifest digest, as a published image has;
- the sshd image: the same rootfs running sshd, a Docker host reached over SSH.

Each image is tagged with the hash of everything that goes into it, so an
unchanged input is never rebuilt.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from support.cache_lock import cache_lock, tag_lock

HERE = Path(__file__).resolve().parent
RAY_VERSION = "2.60.0"  # PyPI's ray, the newest release with a cp311 manylinux x86_64 wheel
PACKAGES = "python3,python3-venv,python3-pip,ca-certificates,openssh-server"
BUILD_TIMEOUT_S = 1200


def _run(argv: list[str], timeout: float = BUILD_TIMEOUT_S) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])}... failed: {proc.stderr.strip()[-800:]}")
    return proc.stdout


def amd64_rootfs(cache: Path) -> Path:
    key = hashlib.sha256(PACKAGES.encode()).hexdigest()[:12]
    tar = cache / f"rootfs-amd64-{key}.tar"
    # xdist workers reach here at once (the Ray and sshd images are separate session
    # fixtures): the first debootstraps, the others wait and find the tarball
    with cache_lock(f"rootfs-amd64-{key}"):
        if not tar.is_file():
            cache.mkdir(parents=True, exist_ok=True)
            _run(["bash", str(HERE / "rootfs-amd64.sh"), str(tar), PACKAGES])
    return tar


def ray_wheels(cache: Path) -> Path:
    """Ray and its dependencies for CPython 3.11 on manylinux x86_64, by pip from PyPI."""
    folder = cache / f"ray-wheels-{RAY_VERSION}-cp311"
    done = folder / ".complete"
    with cache_lock(f"ray-wheels-{RAY_VERSION}"):
        if done.is_file():
            return folder
        _run([sys.executable, "-m", "pip", "download", "--quiet", f"ray=={RAY_VERSION}", "-d", str(folder),
              "--python-version", "3.11", "--only-binary=:all:", "--platform", "manylinux2014_x86_64"])  # fmt: skip
        done.write_text("")
    return folder


def _content_key(paths: list[Path], extra: str) -> str:
    digest = hashlib.sha256(extra.encode())
    for path in paths:
        for item in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if item.is_file():
                digest.update(item.name.encode())
                digest.update(str(item.stat().st_size).encode() if item.suffix in (".tar", ".whl") else item.read_bytes())
    return digest.hexdigest()[:16]


def _link(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy(src, dest)


def _build(context: Path, tag: str) -> None:
    with tag_lock(tag):
        probe = subprocess.run(["docker", "image", "inspect", tag], capture_output=True, check=False)
        if probe.returncode != 0:
            _run(["docker", "buildx", "build", "--platform", "linux/amd64", "--load", "-t", tag, str(context)])


def pushed_digest(tag: str) -> str:
    """Push TAG to its registry; REPOSITORY@sha256:... of what the registry holds."""
    with tag_lock(tag):
        _run(["docker", "push", "--quiet", tag], timeout=600)
    repo = tag.rpartition(":")[0]
    out = _run(["docker", "image", "inspect", "--format", "{{range .RepoDigests}}{{println .}}{{end}}", tag])
    digests = [line.strip() for line in out.splitlines() if line.strip().startswith(f"{repo}@")]
    if not digests:
        raise RuntimeError(f"{tag}: no repo digest after push")
    return digests[0]


RAY_DOCKERFILE = """\
FROM scratch
ADD rootfs.tar /
COPY wheels /tmp/wheels
RUN python3 -m venv /opt/ray && /opt/ray/bin/pip install --quiet --no-index --find-links /tmp/wheels ray=={version} \\
 && rm -rf /tmp/wheels /root/.cache
ENV PATH=/opt/ray/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
COPY vllm nvidia-smi /usr/local/bin/
LABEL io.spark-images.test.variant="{variant}"
"""


def ray_image(cache: Path, workdir: Path, registry: str, variant: str) -> str:
    """The Ray node image of this variant, pushed: REPOSITORY@sha256:... (variants differ only by a label)."""
    rootfs, wheels = amd64_rootfs(cache), ray_wheels(cache)
    dockerfile = RAY_DOCKERFILE.format(version=RAY_VERSION, variant=variant)
    key = _content_key([rootfs, wheels, HERE / "stand_ins"], dockerfile)
    tag = f"{registry}/spark-images-test/cluster-ray:{key}"
    context = workdir / f"ray-{variant}"
    context.mkdir(parents=True, exist_ok=True)
    (context / "Dockerfile").write_text(dockerfile)
    _link(rootfs, context / "rootfs.tar")
    shutil.copytree(wheels, context / "wheels", dirs_exist_ok=True)
    for stand_in in ("vllm", "nvidia-smi"):
        shutil.copy2(HERE / "stand_ins" / stand_in, context / stand_in)
    _build(context, tag)
    return pushed_digest(tag)


SSHD_DOCKERFILE = """\
FROM scratch
ADD rootfs.tar /
RUN mkdir -p /run/sshd /root/.ssh && chmod 700 /root/.ssh && ssh-keygen -A
CMD ["/usr/sbin/sshd", "-D", "-e"]
"""


def sshd_image(cache: Path, workdir: Path) -> str:
    rootfs = amd64_rootfs(cache)
    tag = f"spark-images-test/cluster-sshd:{_content_key([rootfs], SSHD_DOCKERFILE)}"
    context = workdir / "sshd"
    context.mkdir(parents=True, exist_ok=True)
    (context / "Dockerfile").write_text(SSHD_DOCKERFILE)
    _link(rootfs, context / "rootfs.tar")
    _build(context, tag)
    return tag

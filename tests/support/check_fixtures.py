"""Fixtures of the check tests (image_b serves the recipe tests too): three real vLLM images
on the real engine and registry, and the PyPI wheels they are made of (`fetch_wheel`).

(a) vllm 0.22.0 + flashinfer-python + the matching flashinfer-cubin, no nvcc;
(b) vllm 0.33.0 + nvidia-cutlass-dsl 4.5.0, with VLLM_USE_FLASHINFER_MOE_FP4 set;
(c) an image built by our own profile template through the build line
    (the build line's fixtures, build_fixtures.py: the CUDA 13.0 test base with nvcc).

(a) and (b) hold real PyPI wheels "installed" the way `pip install --no-deps`
installs a pure wheel: the wheel's files land unchanged in site-packages.
The wheels are unpacked on the host (cached, sha256-checked) and COPYed in,
because pip under qemu would take minutes for the same files.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import ssl
import subprocess
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from spark_images import pypi
from support.build_helpers import CA_BUNDLE, LineProject, _QuietHandler
from support.cache_lock import cache_lock, tag_lock
from support.loopback import Loopback

TEST_CACHE = Path(os.environ.get("SPARK_IMAGES_TEST_CACHE", Path.home() / ".cache" / "spark-images-test"))
WHEELS = TEST_CACHE / "wheels"
UNPACKED = TEST_CACHE / "check-unpacked"
SITE = "/usr/local/lib/python3.11/dist-packages"
SM121 = ["-gencode=arch=compute_121a,code=sm_121a"]

VLLM_A = ("vllm", "0.22.0")
FLASHINFER_A = "0.6.11.post2"  # vllm 0.22.0 pins flashinfer-python and -cubin to this
VLLM_B = ("vllm", "0.33.0")
CUTLASS_BAD = ("nvidia-cutlass-dsl", "4.5.0")


def fetch_wheel(name: str, version: str, platform: str = "any") -> Path:
    """The PyPI wheel `name==version` for `platform` (any / aarch64), cached and sha256-checked."""
    if platform != "any":  # the project's own cache (shared with the cubin tests)
        return pypi.download(pypi.resolve(f"{name}=={version}"))
    return fetch_file(name, lambda filename: filename.endswith("-py3-none-any.whl") and filename.split("-")[1] == version)


def fetch_file(name: str, wanted: str | Callable[[str], bool]) -> Path:
    """The file of project `name` on PyPI called `wanted` (or the first the predicate accepts),
    cached under the test cache and sha256-checked against the index."""
    resp = requests.get(
        f"{pypi.index_url()}/{pypi.normalize(name)}/", headers={"Accept": pypi.SIMPLE_JSON}, timeout=60
    )
    resp.raise_for_status()
    accepts = wanted if callable(wanted) else wanted.__eq__
    with cache_lock(f"wheel-{pypi.normalize(name)}-{wanted if isinstance(wanted, str) else 'any'}"):  # one writer of the .part file
        for item in resp.json()["files"]:
            filename = item["filename"]
            if not accepts(filename):
                continue
            sha = item["hashes"]["sha256"]
            dest = WHEELS / filename
            if dest.is_file() and _sha256(dest) == sha:
                return dest
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_suffix(".part")
            digest = hashlib.sha256()
            with requests.get(item["url"], stream=True, timeout=(15, 600)) as r, tmp.open("wb") as out:
                r.raise_for_status()
                for chunk in r.iter_content(1 << 20):
                    out.write(chunk)
                    digest.update(chunk)
            if digest.hexdigest() != sha:
                pytest.fail(f"{filename}: sha256 mismatch")
            tmp.replace(dest)
            return dest
    pytest.fail(f"no file {wanted if isinstance(wanted, str) else ''} of {name} on PyPI")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def unpacked(wheel: Path) -> Path:
    """The wheel's files as pip --no-deps lays them into site-packages (cached per wheel)."""
    with cache_lock(f"unpacked-{wheel.name}"):  # one writer of the .tmp tree
        out = UNPACKED / wheel.name
        if (out / ".complete").is_file():
            return out / "site"
        tmp = out.with_name(out.name + ".tmp")
        subprocess.run(["rm", "-rf", str(tmp)], check=True)
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(tmp / "site")
        (tmp / ".complete").write_text(wheel.name)
        subprocess.run(["rm", "-rf", str(out)], check=True)
        tmp.rename(out)
        return out / "site"


def build_and_push(base: str, wheels: list[Path], env: dict[str, str], registry: str, name: str) -> tuple[str, str]:
    """(local name, registry reference) of an arm64 image: base + the wheels' files in site-packages."""
    contexts = {f"w{i}": unpacked(w) for i, w in enumerate(wheels)}
    lines = [f"FROM {base}"]
    lines += [f"COPY --from={ctx} / {SITE}/" for ctx in contexts]
    lines += [f"ENV {k}={v}" for k, v in env.items()]
    lines.append('LABEL org.opencontainers.image.title="spark-images check test"')
    text = "\n".join(lines) + "\n"
    tag = hashlib.sha256((text + "".join(w.name for w in wheels)).encode()).hexdigest()[:12]
    local = f"spark-images-test/check-{name}:{tag}"
    remote = f"{registry}/spark-images-test/check-{name}:{tag}"
    with cache_lock(f"check-image-{name}"):  # one build context dir, one build and push
        have_local = subprocess.run(["docker", "image", "inspect", local], capture_output=True).returncode == 0
        have_remote = requests.head(
            f"http://{registry}/v2/spark-images-test/check-{name}/manifests/{tag}",
            headers={"Accept": "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, "
                               "application/vnd.docker.distribution.manifest.v2+json"},
            timeout=30,
        ).status_code == 200
        if not (have_local and have_remote):
            ctx = TEST_CACHE / "check-context" / name
            ctx.mkdir(parents=True, exist_ok=True)
            (ctx / "Dockerfile").write_text(text)
            cmd = ["docker", "buildx", "build", "--platform", "linux/arm64", "--load", "-t", local, "-t", remote]
            for ctx_name, path in contexts.items():
                cmd += ["--build-context", f"{ctx_name}={path}"]
            proc = subprocess.run([*cmd, str(ctx)], capture_output=True, text=True, timeout=1800)
            assert proc.returncode == 0, proc.stderr[-3000:]
        proc = subprocess.run(["docker", "push", "-q", remote], capture_output=True, text=True, timeout=1800)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return local, remote


@pytest.fixture(scope="session")
def image_a(arm64_base: str, local_registry: str, pypi_reachable: None) -> tuple[str, str]:
    wheels = [
        fetch_wheel(*VLLM_A, platform="aarch64"),
        fetch_wheel("flashinfer-python", FLASHINFER_A),
        fetch_wheel("flashinfer-cubin", FLASHINFER_A),
    ]
    return build_and_push(arm64_base, wheels, {}, local_registry, "a")


@pytest.fixture(scope="session")
def image_b(arm64_base: str, local_registry: str, pypi_reachable: None) -> tuple[str, str]:
    wheels = [fetch_wheel(*VLLM_B, platform="aarch64"), fetch_wheel(*CUTLASS_BAD)]
    return build_and_push(arm64_base, wheels, {"VLLM_USE_FLASHINFER_MOE_FP4": "1"}, local_registry, "b")


@pytest.fixture(scope="session")
def https_wheels(wheel_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(base URL, CA bundle) of an HTTPS server for the build's wheel directory.

    Profiles accept only https (or file) wheel URLs, so the test wheel is
    served over TLS with a certificate made now for the bridge gateway's
    address; the bundle (host CAs + that certificate) goes to `build --ca-cert`.
    """
    if shutil.which("openssl") is None:
        pytest.skip("openssl unavailable to make a certificate")
    gateway = wheel_server.url.split("//", 1)[1].rsplit(":", 1)[0]
    work = tmp_path_factory.mktemp("tls")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={gateway}",
         "-addext", f"subjectAltName=IP:{gateway}", "-keyout", str(work / "k.pem"), "-out", str(work / "c.pem")],
        check=True, capture_output=True,
    )  # fmt: skip
    bundle = work / "bundle.pem"
    bundle.write_text((CA_BUNDLE.read_text() if CA_BUNDLE.is_file() else "") + (work / "c.pem").read_text())
    handler = functools.partial(_QuietHandler, directory=str(wheel_server.directory))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(work / "c.pem", work / "k.pem")
    with Loopback(handler, bind="0.0.0.0", tls=context) as server:
        yield f"https://{gateway}:{server.port}", bundle


@pytest.fixture(scope="session")
def image_c(
    make_project: Callable[..., LineProject], wheel_server: Any, https_wheels: tuple[str, Path], local_registry: str
) -> tuple[str, str]:
    """Built by `spark-images build` from tests/data/build/profile.yaml.in (our template)."""
    project = make_project("check-c", SM121)
    url, bundle = https_wheels
    for path in (project.profile, project.root / "profiles" / "test.requirements.lock"):  # vllm's URL, torch's
        path.write_text(path.read_text().replace(wheel_server.url, url))
    # every worker builds this fixture, and the build loads it as spark-images/check-c:build: two
    # loads of that tag at once leave one build with the other's image ID (its gate then fails)
    with tag_lock("spark-images/check-c:build"):
        proc = project.run(
            "build", "profiles/check-c.yaml", "--push", f"{local_registry}/spark-images-test/check-c", "--ca-cert", str(bundle)
        )
    record_path = project.root / "build" / "check-c" / "record.json"
    assert record_path.is_file(), proc.stdout[-2000:] + proc.stderr[-3000:]
    record = json.loads(record_path.read_text())
    digest = record["build"]["digest"]
    assert digest and "local_image" in record["build"], str(record["build"].get("reason")) + proc.stderr[-3000:]
    return record["build"]["local_image"], f"{local_registry}/spark-images-test/check-c@{digest}"

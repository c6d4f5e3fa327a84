"""Helpers of the build-line tests: a CUDA test base, small wheels, a wheel server.

Everything here is real: the base is the debootstrapped arm64 Debian image
plus the real aarch64 nvcc/ptxas from PyPI's nvidia-cuda-nvcc wheel (checked
by sha256), the wheel's library is compiled by the real nvcc, and the wheel
is served over HTTPS to the build containers on the engine's bridge gateway,
by a server whose certificate a test CA signed (made here with the real
openssl). Profiles accept https or file URLs only, so the build reaches the
wheel exactly as a user's build reaches a private index: trusting that CA
through `--ca-cert`, whose bundle is the host's own plus the test CA.

One honest limit: the host's nvcc is x86_64, so the test library's host code
is x86_64 while the image is arm64. The cubin gate reads GPU code only (the
.nv_fatbin section), which is what it would read in a real aarch64 library.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import os
import signal
import ssl
import subprocess
import sys
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:  # benchmarks import this file outside pytest
    sys.path.insert(0, str(TESTS))

from support.cache_lock import cache_lock  # noqa: E402
from support.paths import DATA as TEST_DATA  # noqa: E402

DATA = TEST_DATA / "build"
CACHE = Path(os.environ.get("SPARK_IMAGES_CACHE", Path.home() / ".cache" / "spark-images"))
NVCC_WHEEL = "nvidia_cuda_nvcc-13.0.88-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl"
NVCC_WHEEL_URL = (
    "https://files.pythonhosted.org/packages/9f/06/996d5cdc5ea45fb4a6111a1be4f0caf6556c0cb1bf9684a7252d8771797a/"
    + NVCC_WHEEL
)
NVCC_WHEEL_SHA256 = "c7ff28f86a24effdc6c034fa15230c549a273e4771b10a7fec14996f8cf3307f"
CUDA_BASE = "spark-images-test/cuda:13.0-devel-bookworm-2p"  # linux/arm64 + linux/amd64
# The amd64 half of the test base (.ci/standin-rootfs.sh amd64, run by .ci/engine-up.sh)
AMD64_ROOTFS = Path(os.environ.get("SPARK_IMAGES_TEST_CACHE", Path.home() / ".cache" / "spark-images-test")) / "noble-amd64.tar"
TEST_COMMIT = "98dff2a81d747d1dba01a47f939f48c3526d4206"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
TEST_CA_DIR = CACHE / "test-ca"
# One SOURCE_DATE_EPOCH for every test build (no vLLM history is reachable in tests).
TEST_EPOCH = "1767225600"  # 2026-01-01T00:00:00Z
CLI = "import sys; from spark_images.cli import main; sys.exit(main(sys.argv[1:]))"


def ctrl_c_as_at_a_terminal() -> None:
    """preexec_fn of a child the test interrupts: SIGINT handled by default, as at a terminal.

    A suite started in the background (`cmd &` in a script) inherits SIGINT
    ignored, and Python then installs no KeyboardInterrupt handler: the child
    would never see the Ctrl-C the test sends it.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _docker(*args: str) -> str:
    """stdout of `docker ARGS`; a failure's stderr goes into the test's report (tests/conftest.py)."""
    return subprocess.run(["docker", *args], check=True, capture_output=True, text=True).stdout.strip()


def _download(url: str, sha256: str, dest: Path) -> Path:
    with cache_lock(f"download-{dest.name}"):  # one download, one writer of its .part
        if dest.is_file() and hashlib.sha256(dest.read_bytes()).hexdigest() == sha256:
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        # urllib trusts the system CA store (a TLS proxy's CA included), as pip does
        with urllib.request.urlopen(url, timeout=300) as resp:
            data = resp.read()
        if hashlib.sha256(data).hexdigest() != sha256:
            pytest.fail(f"{url}: sha256 mismatch")
        tmp = dest.with_suffix(".part")
        tmp.write_bytes(data)
        tmp.replace(dest)
        return dest


@dataclass(frozen=True)
class WheelServer:
    directory: Path
    url: str  # as the build containers reach it


def _bridge_gateway() -> str:
    return _docker("network", "inspect", "bridge", "--format", "{{(index .IPAM.Config 0).Gateway}}")


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _test_ca_bundle() -> Path:
    """The host's CA bundle plus a test CA (made once, cached): what `--ca-cert` gets."""
    key, cert, bundle = TEST_CA_DIR / "ca.key", TEST_CA_DIR / "ca.pem", TEST_CA_DIR / "bundle.pem"
    with cache_lock("test-ca"):  # a second worker must not make a second CA over the first
        return _ca_bundle_locked(key, cert, bundle)


def _ca_bundle_locked(key: Path, cert: Path, bundle: Path) -> Path:
    if not cert.is_file():
        TEST_CA_DIR.mkdir(parents=True, exist_ok=True)
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                 "-days", "3650", "-subj", "/CN=spark-images test CA",
                 "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")  # fmt: skip
    host = HOST_CA_BUNDLE.read_text() if HOST_CA_BUNDLE.is_file() else ""
    text = host + ("" if host.endswith("\n") or not host else "\n") + cert.read_text()
    if not bundle.is_file() or bundle.read_text() != text:
        tmp = bundle.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(bundle)
    return bundle


CA_BUNDLE = _test_ca_bundle()


def server_tls_context(ip: str, workdir: Path) -> ssl.SSLContext:
    """A TLS context for a server at `ip`, its certificate signed by the test CA."""
    key, csr, cert = workdir / "server.key", workdir / "server.csr", workdir / "server.pem"
    ext = workdir / "server.ext"
    ext.write_text(f"subjectAltName=IP:{ip},IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={ip}")
    with cache_lock("test-ca"):  # -CAcreateserial rewrites the CA's serial file
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(TEST_CA_DIR / "ca.pem"), "-CAkey", str(TEST_CA_DIR / "ca.key"),
                 "-CAcreateserial", "-out", str(cert), "-days", "30", "-extfile", str(ext))  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    return context


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def compile_library(nvcc: str, arch_flags: list[str], out: Path) -> Path:
    """A shared library made by the real nvcc from tests/data/build/kernel.cu."""
    subprocess.run(
        [nvcc, "-shared", "-Xcompiler", "-fPIC", *arch_flags, "-o", str(out), str(DATA / "kernel.cu")],
        check=True,
        capture_output=True,
    )
    return out


def wheel_archive(files: dict[str, bytes], dist: str) -> bytes:
    """The bytes of a wheel of `files` (a RECORD added): a deterministic zip, fixed dates and modes."""
    files = {name: data for name, data in files.items() if name != f"{dist}/RECORD"}
    record = "".join(
        f"{name},sha256={_b64(hashlib.sha256(data).digest())},{len(data)}\n" for name, data in files.items()
    )
    files[f"{dist}/RECORD"] = (record + f"{dist}/RECORD,,\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(files):
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, files[name])
    return buf.getvalue()


def make_vllm_wheel(out_dir: Path, library: Path, commit: str, version: str = "0.29.0") -> tuple[Path, str]:
    """A minimal `vllm` wheel (deterministic zip): _version.py naming the commit, the library."""
    files = {
        "vllm/__init__.py": b"from vllm._version import __version__\n\n\ndef probe() -> None:\n    print(__version__)\n",
        "vllm/_version.py": f"__version__ = version = '{version}'\n__commit_id__ = 'g{commit[:9]}'\n".encode(),
        "vllm/_C.abi3.so": library.read_bytes(),
    }
    dist = f"vllm-{version}.dist-info"
    files[f"{dist}/METADATA"] = f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n".encode()
    # a console script: pip writes it with the installing interpreter in its shebang
    files[f"{dist}/entry_points.txt"] = b"[console_scripts]\nvllm-test-probe = vllm:probe\n"
    files[f"{dist}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: spark-images-tests\nRoot-Is-Purelib: false\nTag: py3-none-any\n"
    data = wheel_archive(files, dist)
    digest = hashlib.sha256(data).hexdigest()
    path = out_dir / f"vllm-{version}+{digest[:8]}-py3-none-any.whl"
    path.write_bytes(data)
    return path, digest


TORCH_VERSION = "2.13.0"  # tests/data/build/profile.yaml.in's torch.version
TORCH_LIBRARY = "torch/lib/libtorch_cuda.so"
TORCH_WHEEL = f"torch-{TORCH_VERSION}-cp311-cp311-manylinux_2_28_aarch64.whl"


def make_torch_wheel(out_dir: Path, library: Path | None, cuda: str | None = "13.0") -> tuple[Path, str]:
    """A stand-in for PyPI's torch 2.13.0 aarch64 wheel, the CUDA 13.0 build (`cuda=None`,
    `library=None`: a CPU-only torch), as a real wheel file at out_dir/TORCH_WHEEL.

    The real wheel is gigabytes: it cannot be built into each test image in minutes.
    This one holds exactly what `check` reads to prove a CUDA torch, in the real
    wheel's layout, and `pip install` unpacks it as it unpacks the real one:
    - torch-2.13.0.dist-info/METADATA (the version, as in the profile's pin), WHEEL
      and RECORD (every file's sha256);
    - torch/version.py, the file torch's build generates, with `cuda: Optional[str]
      = '13.0'` (or `= None`, as in a CPU-only build): what `torch.version.cuda` reads;
    - torch/lib/libtorch_cuda.so, compiled by the real nvcc like the test's vllm/_C
      (`library`): real fatbins whose sm_121a cubins the check classifies from their
      own ELF headers, as it does those of the real libtorch_cuda.so.
    It has none of torch's Python API: `import torch` gives the version module only.
    The host code is x86_64 (see the module doc); the check reads the device code only.
    """
    version_py = (
        "from typing import Optional\n\n"
        "__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'xpu']\n"
        f"__version__ = '{TORCH_VERSION}'\n"
        "debug = False\n"
        f"cuda: Optional[str] = {cuda!r}\n"
        "git_version = 'spark-images-test'\n"
        "hip: Optional[str] = None\n"
        "xpu: Optional[str] = None\n"
    )
    files = {
        "torch/__init__.py": b"from torch import version\nfrom torch.version import __version__\n",
        "torch/version.py": version_py.encode(),
    }
    if library is not None:
        files[TORCH_LIBRARY] = library.read_bytes()
    dist = f"torch-{TORCH_VERSION}.dist-info"
    files[f"{dist}/METADATA"] = f"Metadata-Version: 2.1\nName: torch\nVersion: {TORCH_VERSION}\n".encode()
    files[f"{dist}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: spark-images-tests\nRoot-Is-Purelib: false\n"
                              b"Tag: cp311-cp311-manylinux_2_28_aarch64\n")  # fmt: skip
    data = wheel_archive(files, dist)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / TORCH_WHEEL
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


def requirements_lock(torch_url: str, torch_sha256: str) -> str:
    """tests/data/build/test.requirements.lock plus the torch stand-in (`make_torch_wheel`) by URL and sha256."""
    return (DATA / "test.requirements.lock").read_text() + (
        "# torch: the test's stand-in wheel (tests/support/build_helpers.py make_torch_wheel),\n"
        "# served by the test's wheel server\n"
        f"torch @ {torch_url} \\\n"
        f"    --hash=sha256:{torch_sha256}\n"
    )


def _b64(raw: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@dataclass(frozen=True)
class LineProject:
    """A scratch project directory the CLI runs in (profiles/, lock, build/)."""

    root: Path
    profile: Path
    lock: Path
    wheel_sha256: str

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: int = 900) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", CLI, *args],
            cwd=self.root,
            env=cli_env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, "SOURCE_DATE_EPOCH": TEST_EPOCH}
    env.update(extra or {})
    return env



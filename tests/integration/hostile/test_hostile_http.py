"""Misbehaving registries and package indexes, driven through the CLI.

Each case starts a loopback server (tests/integration/hostile/servers.py) that misbehaves
on one endpoint (manifest, token, layer blob, simple page, wheel) in one way
(endless or dripping bodies, huge Content-Length, 429 storms, redirect loops,
malformed or hostile JSON, lying sizes and hashes, tokens no header can
carry) and runs `spark-images cubins` against it. Every case must end with
exit 2, a line naming the server, no traceback and no internal error, within
the wall and memory bounds of the harness. The overall deadline of metadata
calls is lowered to a few seconds (SPARK_IMAGES_HTTP_TIMEOUT) so that a
dripping server is given up on quickly; the default is the same mechanism.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from harness import assert_clean_failure, run_cli, tree_digest
from hostile_cases import BODY_CASES, Image, lock_entry, registry_cases, registry_route
from servers import Hostile, Req, Route

from support.oci_blobs import digest_of

pytestmark = pytest.mark.processes  # every case runs the CLI as a process under a clock

DEADLINE_S = "4"
WALL_S = 30.0
IMAGE = Image()
REPO = "spark/img"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"SPARK_IMAGES_HTTP_TIMEOUT": DEADLINE_S, "SPARK_IMAGES_CACHE": str(tmp_path / "cache"),
            "NO_PROXY": "*", **extra}  # fmt: skip


def test_the_well_behaved_registry_is_read(tmp_path: Path) -> None:
    """The baseline every hostile case departs from works, with and without a bearer token."""
    for bearer in (False, True):
        with Hostile(registry_route(IMAGE, REPO, "", None, bearer=bearer)) as server:
            result = run_cli(["cubins", f"{server.host}/{REPO}:v1", "--json"], env=_env(tmp_path))
        assert result.rc in (0, 1), result.stderr
        assert "Traceback" not in result.stderr
        assert json.loads(result.stdout)


@pytest.mark.parametrize(("slot", "route"), [pytest.param(s, r, id=i) for i, s, r in registry_cases(IMAGE)])
def test_hostile_registry(slot: str, route: Route, tmp_path: Path) -> None:
    with Hostile(registry_route(IMAGE, REPO, slot, route, bearer=slot == "token")) as server:
        result = run_cli(["cubins", f"{server.host}/{REPO}:v1"], env=_env(tmp_path), timeout=WALL_S + 10)
    assert_clean_failure(result, rc=2, names=[server.host], wall_s=WALL_S, max_lines=3)


# the right manifest bytes under a type that is not a manifest's: a proxy's error page, a file server
WRONG_TYPES = ["text/plain", "text/html; charset=utf-8", "application/json", "application/octet-stream",
               "application/vnd.oci.image.manifest.v1+json-x"]


@pytest.mark.parametrize("content_type", WRONG_TYPES)
@pytest.mark.parametrize("command", ["cubins", "publish"])
def test_a_manifest_served_as_another_type_is_refused(content_type: str, command: str, tmp_path: Path) -> None:
    def wrong(req: Req) -> None:
        req.answer(200, IMAGE.manifest, {"Docker-Content-Digest": digest_of(IMAGE.manifest)}, content_type=content_type)

    with Hostile(registry_route(IMAGE, REPO, "manifest", wrong)) as server:
        if command == "cubins":
            argv = ["cubins", f"{server.host}/{REPO}:v1"]
        else:
            lock = tmp_path / "images.lock.json"
            entry = lock_entry(f"{server.host}/{REPO}", digest_of(IMAGE.manifest), coherence={"status": "passed"})
            lock.write_text(json.dumps({"lock_version": 1, "images": {"cu130": entry}}))
            argv = ["publish", "cu130", "--tag", "cu130", "--lock", str(lock)]
        result = run_cli(argv, env=_env(tmp_path), timeout=WALL_S + 10)
        puts = [h for h in server.hits if h.startswith("PUT")]
    assert_clean_failure(result, rc=2, names=["Content-Type"], wall_s=WALL_S, max_lines=1)
    assert not puts, "a tag moved to a manifest served as another type"


def test_sigint_during_a_slow_blob_ends_the_command_at_once(tmp_path: Path) -> None:
    """Ctrl-C while a layer drips in: exit 130 with one line within a couple of seconds,
    not when the blob's own deadline passes (the reader thread must not hold the exit)."""
    layer_path = f"/v2/{REPO}/blobs/{digest_of(IMAGE.layer)}"
    with Hostile(registry_route(IMAGE, REPO, "blob", lambda req: req.drip(IMAGE.layer, every_s=0.5))) as server:
        proc = subprocess.Popen(
            [sys.executable, "-m", "spark_images", "cubins", f"{server.host}/{REPO}:v1"],
            env={**os.environ, **_env(tmp_path, SPARK_IMAGES_HTTP_TIMEOUT="60")},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            # as at a terminal: a suite started in the background inherits SIGINT ignored
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
        try:
            started = time.monotonic()
            while not any(layer_path in hit for hit in server.hits) and time.monotonic() - started < 20:
                time.sleep(0.05)
            assert any(layer_path in hit for hit in server.hits), "the blob was never asked for"
            time.sleep(1.0)  # inside the slow read
            proc.send_signal(signal.SIGINT)
            sent = time.monotonic()
            _, err = proc.communicate(timeout=30)
            ended_s = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    lines = [line for line in err.decode(errors="replace").splitlines() if line.strip()]
    assert proc.returncode == 130, (proc.returncode, lines)
    assert ended_s < 3.0, f"took {ended_s:.1f} s to end after SIGINT"
    assert lines == ["spark-images cubins: interrupted"], lines


# --- PyPI: the simple page and the wheel ----------------------------------------------

WHEEL = "vllm-0.33.0-cp312-cp312-manylinux_2_28_aarch64.whl"


def _wheel_bytes() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("vllm/__init__.py", "")
        zf.writestr("vllm/_C.abi3.so", b"\x7fELF" + b"\0" * 2000)
    return buf.getvalue()


WHEEL_BYTES = _wheel_bytes()


def _page(base: str, **over: object) -> dict[str, object]:
    record = {"filename": WHEEL, "url": f"{base}/files/{WHEEL}", "size": len(WHEEL_BYTES),
              "hashes": {"sha256": digest_of(WHEEL_BYTES).removeprefix("sha256:")}, **over}  # fmt: skip
    return {"meta": {"api-version": "1.1"}, "name": "vllm", "files": [record]}


def pypi_route(slot: str, bad: Route | None, page: dict[str, object] | None = None) -> Route:
    def route(req: Req) -> None:
        if req.path == "/simple/vllm/":
            if slot == "index" and bad is not None:
                return bad(req)
            return req.answer(200, page or _page(req.server.url), content_type="application/vnd.pypi.simple.v1+json")
        if req.path == f"/files/{WHEEL}":
            if slot == "wheel" and bad is not None:
                return bad(req)
            return req.answer(200, WHEEL_BYTES, content_type="application/octet-stream")
        return req.answer(404, b"not found", content_type="text/plain")

    return route


def _range_lies(req: Req) -> None:
    req.answer(206, WHEEL_BYTES[:100], {"Content-Range": f"bytes 0-99/{len(WHEEL_BYTES) * 1000}"})


WHEEL_CASES: dict[str, Route] = {
    **BODY_CASES,
    "wheel-wrong-bytes": lambda req: req.answer(200, b"PK" + b"x" * (len(WHEEL_BYTES) - 2)),
    "wheel-longer-than-declared": lambda req: req.answer(200, WHEEL_BYTES + b"x" * 100000),
    "wheel-shorter": lambda req: req.answer(200, WHEEL_BYTES[:50]),
    "wheel-endless-zeros": lambda req: req.endless(piece=b"\0" * 65536),
    "wheel-range-total-lies": _range_lies,
}

PAGE_CASES: dict[str, dict[str, object]] = {
    "page-files-string": {"files": "all"},
    "page-files-missing": {"meta": {}},
    "page-size-string": _page("http://x", size="12"),
    "page-size-negative": _page("http://x", size=-5),
    "page-hash-not-hex": _page("http://x", hashes={"sha256": "$(id)"}),
    "page-url-file-scheme": _page("http://x", url="file:///etc/passwd"),
    "page-filename-traversal": _page("http://x", filename="../../vllm-0.33.0-cp312-cp312-manylinux_2_28_aarch64.whl"),
    "page-only-x86": _page("http://x", filename="vllm-0.33.0-cp312-cp312-manylinux_2_28_x86_64.whl"),
    "page-bad-wheel-name": _page("http://x", filename="vllm-0.33.0-.whl"),
    "page-yanked": _page("http://x", yanked=True),
}


def _pypi_case(tmp_path: Path, route: Route) -> None:
    with Hostile(route) as server:
        env = _env(tmp_path, SPARK_IMAGES_PYPI_SIMPLE=f"{server.url}/simple")
        result = run_cli(["cubins", "vllm==0.33.0"], env=env, timeout=WALL_S + 10)
    assert_clean_failure(result, rc=2, names=[server.host, WHEEL, "vllm==0.33.0"], wall_s=WALL_S, max_lines=3)
    cache = tmp_path / "cache"
    partial = [p for p in tree_digest(cache)] if cache.exists() else []
    assert not [p for p in partial if p.endswith((".part", ".whl"))], f"partial download left: {partial}"


def test_the_well_behaved_index_is_read(tmp_path: Path) -> None:
    with Hostile(pypi_route("", None)) as server:
        env = _env(tmp_path, SPARK_IMAGES_PYPI_SIMPLE=f"{server.url}/simple")
        result = run_cli(["cubins", "vllm==0.33.0", "--json"], env=env)
    assert result.rc in (0, 1), result.stderr
    assert json.loads(result.stdout)


@pytest.mark.parametrize("name", sorted(BODY_CASES))
def test_hostile_simple_page(name: str, tmp_path: Path) -> None:
    _pypi_case(tmp_path, pypi_route("index", BODY_CASES[name]))


@pytest.mark.parametrize("name", sorted(PAGE_CASES))
def test_hostile_simple_page_content(name: str, tmp_path: Path) -> None:
    _pypi_case(tmp_path, pypi_route("", None, PAGE_CASES[name]))


@pytest.mark.parametrize("name", sorted(WHEEL_CASES))
def test_hostile_wheel_download(name: str, tmp_path: Path) -> None:
    _pypi_case(tmp_path, pypi_route("wheel", WHEEL_CASES[name]))


# --- the one reference grammar (pure) -------------------------------------------------

ACCEPTED = {
    "ghcr.io/o/a__b": ("ghcr.io", "o/a__b", None, None),
    "ghcr.io/o/a__b:cu130": ("ghcr.io", "o/a__b", "cu130", None),
    "[::1]:5000/x": ("[::1]:5000", "x", None, None),
    "[::1]:5000/x:v1": ("[::1]:5000", "x", "v1", None),
    "127.0.0.1:5000/spark-vllm": ("127.0.0.1:5000", "spark-vllm", None, None),
    "localhost/a/b.c/d-e---f": ("localhost", "a/b.c/d-e---f", None, None),
    "mirror.local:5000/nvidia/cuda:13.0.2-runtime-ubuntu24.04": ("mirror.local:5000", "nvidia/cuda", "13.0.2-runtime-ubuntu24.04", None),
    f"h.io/x@sha256:{'a' * 64}": ("h.io", "x", None, f"sha256:{'a' * 64}"),
    f"h.io/x:t@sha256:{'b' * 64}": ("h.io", "x", "t", f"sha256:{'b' * 64}"),
    "h.io/x:" + "T" * 128: ("h.io", "x", "T" * 128, None),
    "Registry.Example.COM/x": ("Registry.Example.COM", "x", None, None),
}
REFUSED = [
    "ghcr.io/o/a\n", "ghcr.io/o/a:tag\n", "ghcr.io/O/a", "ghcr.io/o/a_", "ghcr.io/o/_a", "ghcr.io/o//a",
    "ghcr.io/o/a___b", "ghcr.io/o/a..b", "ghcr.io/o/a:", "ghcr.io/o/a:.tag", "ghcr.io/o/a:-tag",
    "ghcr.io/o/a:" + "t" * 129, "ghcr.io/o/a@sha256:" + "A" * 64, "ghcr.io/o/a@sha256:" + "a" * 63,
    "ghcr.io/o/a@sha512:" + "a" * 128, "spark-vllm", "o/a", "ghcr.io/", "ghcr.io", "-h.io/x", "h-.io/x",
    "h.io:port/x", "[zz]:5000/x", "h.io/x y", "h.io/x\ty", "h.io/x$(id)", "h.io/x;rm", "h.io/x:t\u0101g",
    "h.io/" + "a" * 300, "h.io/x\r\nFROM evil", "ghcr.io/o/a:tag@", "http://ghcr.io/o/a",
]


@pytest.mark.parametrize("text", sorted(ACCEPTED))
def test_reference_accepted(text: str) -> None:
    from spark_images.registry.reference import ImageReference

    ref = ImageReference.parse(text)
    assert (ref.host, ref.repository, ref.tag, ref.digest) == ACCEPTED[text]
    assert str(ref) == text  # parsed once, printed back the same
    assert ImageReference.parse(str(ref)) == ref


@pytest.mark.parametrize("text", REFUSED, ids=repr)
def test_reference_refused_with_one_line(text: str) -> None:
    from spark_images.registry.reference import BadReference, ImageReference

    assert ImageReference.parse_or_none(text) is None
    with pytest.raises(BadReference) as caught:
        ImageReference.parse(text, what="--push")
    (line,) = caught.value.lines()
    assert "\n" not in line and len(line) < 600 and "fix:" in line


def test_reference_views() -> None:
    from spark_images.registry.reference import ImageReference

    ref = ImageReference.parse("[::1]:5000/spark/vllm:cu130")
    assert ref.is_loopback and ref.scheme == "http" and ref.hostname == "::1"
    assert ref.api_base == "http://[::1]:5000/v2/spark/vllm" and ref.reference == "cu130"
    pinned = ImageReference.parse("[::1]:5000/spark/vllm@sha256:" + "c" * 64)
    assert pinned.pinned == "[::1]:5000/spark/vllm@sha256:" + "c" * 64 and pinned.reference == pinned.digest
    assert ImageReference.parse("ghcr.io/o/a").scheme == "https"
    assert ImageReference.parse("ghcr.io/o/a").reference == "latest"

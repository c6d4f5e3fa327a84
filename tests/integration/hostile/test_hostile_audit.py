"""Hostile inputs to `spark-images audit` and `spark-images kb`: bad git refs, a
hostile package index (broken, deep, huge, endless or slow JSON and sdists) and
hostile knowledge-base files. Each case runs the CLI as a subprocess and must
fail cleanly: the documented exit code, one line naming the input, no
traceback, bounded time and memory (harness.assert_clean_failure).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from harness import assert_clean_failure, run_cli

from support.loopback import Loopback, QuietHandler
from support.oci_blobs import layer_tar_gz

pytestmark = pytest.mark.processes  # every case runs the CLI as a process under a clock

SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small squash-merged vLLM-shaped history (real git, via fast-import)."""
    repo = tmp_path_factory.mktemp("hostile-audit") / "vllm"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    stream = []
    for i in range(1, 41):
        msg = f"[Misc] change {i} (#{1000 + i})\n".encode()
        stream.append(f"commit refs/heads/main\nmark :{i}\ncommitter D <d@x.invalid> {1_700_000_000 + i} +0000\n"
                      f"data {len(msg)}\n{msg.decode()}")
        if i > 1:
            stream.append(f"from :{i - 1}\n")
        stream.append(f"M 100644 inline vllm/f{i}.py\ndata 2\n{i % 10}\n\n")
    stream.append("reset refs/tags/v0.22.0\nfrom :20\n\n")
    subprocess.run(["git", "fast-import", "--quiet"], cwd=repo, input="".join(stream).encode(), check=True)
    return repo


Route = Callable[[http.server.BaseHTTPRequestHandler], None]


@pytest.fixture()
def hostile_index() -> Iterator[tuple[str, dict[str, Route]]]:
    """A loopback server whose answers each test scripts per path."""
    routes: dict[str, Route] = {}

    class Handler(QuietHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            route = routes.get(self.path)
            if route is None:
                self.answer(404)
                return
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                route(self)

    with Loopback(Handler) as server:
        yield server.url, routes


def body(data: bytes, content_type: str = SIMPLE_JSON, length: int | None = None) -> Route:
    def send(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(data) if length is None else length))
        h.end_headers()
        h.wfile.write(data)

    return send


def endless(chunk: bytes, delay: float = 0.0, prefix: bytes = b"") -> Route:
    def send(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", SIMPLE_JSON)
        h.send_header("Connection", "close")
        h.end_headers()
        h.wfile.write(prefix)
        for _ in range(100_000):
            h.wfile.write(chunk)
            if delay:
                h.wfile.flush()
                time.sleep(delay)

    return send


def env(tmp_path: Path, base: str, **extra: str) -> dict[str, str]:
    return {"SPARK_IMAGES_PYPI_SIMPLE": f"{base}/simple", "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "NO_PROXY": "127.0.0.1,localhost", "SPARK_IMAGES_HTTP_TIMEOUT": "4", **extra}


def page(files: list[object], versions: object = None) -> bytes:
    doc: dict[str, object] = {"meta": {"api-version": "1.1"}, "name": "vllm", "files": files}
    if versions is not None:
        doc["versions"] = versions
    return json.dumps(doc).encode()


# --- bad refs ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["0123456789abcdef0123456789abcdef01234567"], "no such commit"),
        (["main\nHEAD"], "no such commit"),
        (["HEAD@{-1000}"], "no such commit"),
        (["main^{tree}"], "no such commit"),
        (["x" * 100_000], "no such commit"),
        (["main", "--discover", "--since=--output=/tmp/owned"], "--since"),
        (["main", "--discover", "--since", "no-such-tag"], "--since no-such-tag"),
        (["main", "--discover", "--since", "main:vllm/f1.py"], "--since"),
    ],
)
def test_bad_refs(history: Path, tmp_path: Path, argv: list[str], name: str) -> None:
    result = run_cli(["audit", *argv, "--fix", "1001", "--repo", str(history)], env=env(tmp_path, "http://127.0.0.1:9"))
    assert_clean_failure(result, rc=2, names=[name], max_lines=3)
    assert all(len(line) < 800 for line in result.lines()), "a message carries an unbounded value"


def test_history_that_is_not_a_repository(tmp_path: Path) -> None:
    result = run_cli(["audit", "main", "--repo", "/dev/null"], env=env(tmp_path, "http://127.0.0.1:9"))
    assert_clean_failure(result, rc=2, names=["/dev/null"], max_lines=2)


# --- a hostile package index -------------------------------------------------------------
@pytest.mark.parametrize(
    ("route", "name"),
    [
        (body(b"[" * 200_000 + b"]" * 200_000), "nests deeper"),
        (body(b"<html>not json</html>"), "not valid JSON"),
        (body(b'{"files": "not a list"}'), "no `files` list"),
        (body(b"{}", length=10**12), "over the cap"),
        (endless(b" " * 65536, prefix=b'{"files": ['), "over the cap"),
        (endless(b" ", delay=0.2, prefix=b"{"), "deadline"),
    ],
    ids=["deep", "not-json", "files-not-list", "declared-huge", "endless", "slow-drip"],
)
def test_hostile_index_page(
    history: Path, tmp_path: Path, hostile_index: tuple[str, dict[str, Route]], route: Route, name: str
) -> None:
    base, routes = hostile_index
    routes["/simple/vllm/"] = route
    # a release with no tag here must be resolved through the index: a clean exit 2
    result = run_cli(["audit", "0.99.0", "--repo", str(history)], env=env(tmp_path, base))
    assert_clean_failure(result, rc=2, names=[name], max_lines=2, wall_s=30)
    # a commit target only wants the release list for first releases: the audit goes on and says why
    result = run_cli(["audit", "main", "--fix", "1030", "--repo", str(history), "--json"], env=env(tmp_path, base))
    # #1030 is not in the knowledge base, so nothing proves its change: effect-unproven, a
    # finding (exit 1), never the environment's exit 2 for an unreadable release list
    assert result.rc == 1 and "Traceback" not in result.stderr, result.stderr
    doc = json.loads(result.stdout)
    assert doc["fixes"][0]["state"] == "effect-unproven"
    assert any("PyPI's release list could not be read" in n and name in n for n in doc["notes"]), doc["notes"]
    assert doc["fixes"][0]["first_release"] is None
    assert result.max_rss_mb < 512 and result.wall_s < 30


def test_hostile_file_entries_are_skipped(history: Path, tmp_path: Path, hostile_index: tuple[str, dict[str, Route]]) -> None:
    base, routes = hostile_index
    files = [
        "not a dict", {"filename": 7, "url": []}, {"filename": "vllm-0.99.0.tar.gz", "url": "file:///etc/passwd"},
        {"filename": "vllm-0.98.0.tar.gz", "url": "javascript:alert(1)"}, {"filename": "vllm-" + "9" * 5000 + ".tar.gz", "url": "x"},
    ]
    routes["/simple/vllm/"] = body(page(files, versions=["0.99.0", 12, None, "x" * 10_000, *[f"0.{i}.0" for i in range(3000)]]))
    result = run_cli(["audit", "0.99.0", "--repo", str(history)], env=env(tmp_path, base))
    assert_clean_failure(result, rc=2, names=["no sdist vllm-0.99.0.tar.gz"], max_lines=2)
    result = run_cli(["audit", "main", "--fix", "1030", "--repo", str(history), "--json"], env=env(tmp_path, base))
    assert result.rc == 1, result.stderr  # #1030: not in the knowledge base, effect-unproven
    doc = json.loads(result.stdout)
    # the listed releases have no tag and no readable sdist here: unchecked, so nothing is called first
    assert doc["fixes"][0]["first_release"] is None and doc["fixes"][0]["unchecked_releases"]
    assert result.wall_s < 30 and result.max_rss_mb < 512


@pytest.mark.parametrize(
    ("sdist", "size", "name"),
    [
        (layer_tar_gz({"vllm-0.99.0/setup.py": b""}), None, "has no vllm/_version.py"),
        (layer_tar_gz({"vllm-0.99.0/vllm/_version.py": b"#" * (1 << 20)}), None, "vllm/_version.py is 1048576 bytes"),
        (b"\x1f\x8b not really gzip" * 100, None, "cannot read vllm-0.99.0.tar.gz"),
        (layer_tar_gz({"vllm-0.99.0/vllm/_version.py": b"__version__ = '0.99.0'\n"}), None, "records no commit"),
        (None, 2000, "deadline"),
    ],
    ids=["no-version-file", "huge-version-file", "not-gzip", "no-commit", "endless-slow"],
)
def test_hostile_sdist(
    history: Path, tmp_path: Path, hostile_index: tuple[str, dict[str, Route]], sdist: bytes | None, size: int | None, name: str
) -> None:
    base, routes = hostile_index
    entry: dict[str, object] = {"filename": "vllm-0.99.0.tar.gz", "url": "../../files/vllm-0.99.0.tar.gz", "hashes": {}}
    if size is not None:
        entry["size"] = size
    routes["/simple/vllm/"] = body(page([entry]))
    routes["/files/vllm-0.99.0.tar.gz"] = body(sdist, "application/octet-stream") if sdist else endless(b"\x00" * 64, delay=0.2)
    result = run_cli(["audit", "0.99.0", "--repo", str(history)], env=env(tmp_path, base, SPARK_IMAGES_HTTP_TIMEOUT="2"))
    assert_clean_failure(result, rc=2, names=[name], max_lines=2, wall_s=30)


# --- hostile knowledge-base files -----------------------------------------------------------
@pytest.mark.parametrize(
    ("content", "rc", "name"),
    [
        (b"schema: 1\nfixes:\n" + b"  - {pr: 1, title: t, area: MoE, severity: high, symptom: s}\n" * 40_000, 2, "over the limit"),
        (b"schema: 1\nschema: 1\nfixes: []\n", 1, "duplicate key"),
        (b"a: &a [" + b"x, " * 50 + b"]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b]\n"
         b"d: &d [*c, *c, *c, *c, *c, *c, *c, *c]\ne: [*d, *d, *d, *d, *d, *d, *d, *d]\n", 1, "not valid YAML"),
        (b"\xff\xfe not utf-8", 2, "not UTF-8"),
        (b"schema: 1\nfixes:\n  - pr: 5\n    title: t\n    area: MoE\n    severity: high\n    symptom: s\n"
         b"    markers: [{path: ../../etc/passwd, contains: root, source: x}]\n", 1, "markers[0].path"),
    ],
    ids=["huge", "duplicate-keys", "alias-bomb", "not-utf8", "path-escape"],
)
def test_hostile_knowledge_base(tmp_path: Path, content: bytes, rc: int, name: str) -> None:
    kb = tmp_path / "kb.yaml"
    kb.write_bytes(content)
    result = run_cli(["kb", "export", "--format", "osv", "--kb", str(kb)], env=env(tmp_path, "http://127.0.0.1:9"))
    assert_clean_failure(result, rc=rc, names=[name])
    assert str(kb) in result.stderr


def test_knowledge_base_that_is_a_device(tmp_path: Path) -> None:
    result = run_cli(["kb", "export", "--format", "osv", "--kb", "/dev/zero"], env=env(tmp_path, "http://127.0.0.1:9"))
    assert_clean_failure(result, rc=2, names=["/dev/zero"], max_lines=2)

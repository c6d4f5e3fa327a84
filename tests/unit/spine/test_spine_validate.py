"""Profiles: the shipped ones validate; each broken one exits 1 naming its field.

The broken profiles are mutations of the shipped profiles/cu130.yaml (the tests
read the profile rather than repeating its values), written into a temporary
project so relative paths (patches, lock files) resolve as they would in a
checkout.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_images.cli import main
from spark_images.profiles.toolchain import rules_for

REPO = Path(__file__).resolve().parents[3]
SHIPPED = sorted((REPO / "profiles").glob("*.yaml"))
BASE_DOC: dict[str, Any] = yaml.safe_load((REPO / "profiles" / "cu130.yaml").read_text())
CU129_DOC: dict[str, Any] = yaml.safe_load((REPO / "profiles" / "cu129.yaml").read_text())
PATCH_OK = "Backport-Of: vllm-project/vllm#40923\n\ndiff --git a/x b/x\n"
PATCH_NO_PR = "Fixes something.\n\ndiff --git a/x b/x\n"

Mutation = Callable[[dict[str, Any]], None]


def _set(path: str, value: Any) -> Mutation:
    def mutate(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = doc
        for key in parents:
            node = node[key]
        node[last] = value

    return mutate


def _delete(path: str) -> Mutation:
    def mutate(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = doc
        for key in parents:
            node = node[key]
        del node[last]

    return mutate


def _rename(path: str, new: str) -> Mutation:
    def mutate(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = doc
        for key in parents:
            node = node[key]
        node[new] = node.pop(last)

    return mutate


def _all(*mutations: Mutation) -> Mutation:
    def mutate(doc: dict[str, Any]) -> None:
        for m in mutations:
            m(doc)

    return mutate


def _digest_of(doc: dict[str, Any]) -> str:
    return doc["cuda"]["base_image"].split("@", 1)[1]


CU13_DIGEST = _digest_of(BASE_DOC)

# (id, mutation, field named in the error line, rule id or text expected in the line)
BROKEN: list[tuple[str, Mutation, str, str]] = [
    ("unknown-top-key", _rename("vllm", "vlm"), "vlm", "did you mean 'vllm'"),
    ("unknown-nested-key", _rename("cuda.base_image", "base_imag"), "cuda.base_imag", "did you mean 'base_image'"),
    ("missing-commit", _delete("vllm.commit"), "vllm.commit", "missing required field"),
    ("missing-verify", _delete("verify"), "verify", "missing required field"),
    ("python-as-number", _set("python", 3.12), "python", "quote it"),
    ("max-jobs-string", _set("build.max_jobs", "8"), "build.max_jobs", "expected an integer"),
    ("max-jobs-bool", _set("build.max_jobs", True), "build.max_jobs", "expected an integer"),
    ("max-jobs-zero", _set("build.max_jobs", 0), "build.max_jobs", "at least 1"),
    ("bad-strategy", _set("build.strategy", "docker"), "build.strategy", "not one of"),
    ("epoch-not-int", _set("build.source_date_epoch", "yesterday"), "build.source_date_epoch", "expected an integer"),
    ("fix-not-int", _set("verify.required_fixes", ["#40082"]), "verify.required_fixes[0]", "expected an integer"),
    ("wheel-sha-short", _set("build.wheel.sha256", "e6b0dfc2"), "build.wheel.sha256", "sha256"),
    ("bad-url", _set("torch.index_url", "download.pytorch.org/whl/cu130"), "torch.index_url", "URL"),
    ("cuda-too-old", _all(_set("cuda.version", "12.6.3"),
                          _set("cuda.base_image", f"nvidia/cuda:12.6.3-devel-ubuntu24.04@{CU13_DIGEST}"),
                          _set("torch.index_url", "https://download.pytorch.org/whl/cu126")),
     "cuda.version", "cuda-too-old"),
    ("arch-gh200", _set("cuda.arch_list", "9.0 10.0+PTX"), "cuda.arch_list", "arch-gh200-example"),
    ("arch-no-spark", _set("cuda.arch_list", "8.0;9.0"), "cuda.arch_list", "arch-no-spark-target"),
    ("arch-120a-only", _set("cuda.arch_list", "12.0a"), "cuda.arch_list", "arch-no-spark-target"),
    ("arch-bare-120", _set("cuda.arch_list", "12.0"), "cuda.arch_list", "arch-bare-120"),
    ("arch-120-ptx", _set("cuda.arch_list", "12.0+PTX"), "cuda.arch_list", "arch-bare-120"),
    ("arch-bad-token", _set("cuda.arch_list", "12.1x"), "cuda.arch_list", "arch-bad-token"),
    ("flashinfer-mismatch", _set("flashinfer.cubin", "0.6.17"), "flashinfer.cubin", "flashinfer-mismatch"),
    ("cutlass-dsl-450", _set("cutlass_dsl.version", "4.5.0"), "cutlass_dsl.version", "NVIDIA/cutlass#3227"),
    ("base-no-digest", _set("cuda.base_image", "nvidia/cuda:13.0.2-devel-ubuntu24.04"), "cuda.base_image", "base-not-digest-pinned"),
    ("base-latest", _set("cuda.base_image", f"nvidia/cuda:latest@{CU13_DIGEST}"), "cuda.base_image", "base-latest"),
    ("base-runtime", _set("cuda.base_image", f"nvidia/cuda:13.0.2-runtime-ubuntu24.04@{CU13_DIGEST}"), "cuda.base_image", "base-not-devel"),
    ("base-cuda-mismatch", _set("cuda.base_image", f"nvidia/cuda:12.9.1-devel-ubuntu24.04@{CU13_DIGEST}"), "cuda.base_image", "base-cuda-mismatch"),
    ("commit-branch", _set("vllm.commit", "main"), "vllm.commit", "a branch or ref name"),
    ("commit-short", _set("vllm.commit", "98dff2a81"), "vllm.commit", "a short SHA"),
    ("commit-tag", _set("vllm.commit", "v0.29.0"), "vllm.commit", "a tag or version"),
    ("commit-upper", _set("vllm.commit", BASE_DOC["vllm"]["commit"].upper()), "vllm.commit", "upper-case"),
    ("torch-index-mismatch", _set("torch.index_url", "https://download.pytorch.org/whl/cu128"), "torch.index_url", "torch-index-cuda-mismatch"),
    ("torch-too-old", _set("torch.version", "2.6.0"), "torch.version", "torch-too-old"),
    ("wheel-missing", _delete("build.wheel"), "build.wheel", "wheel-strategy-needs-wheel"),
    ("source-with-wheel", _set("build.strategy", "source"), "build.wheel", "source-strategy-has-wheel"),
    ("native-libs-empty", _set("verify.native_libraries", []), "verify.native_libraries", "native-libraries-empty"),
    ("patch-missing", _set("patches", ["patches/missing.patch"]), "patches[0]", "does not exist"),
    ("patch-no-pr", _set("patches", ["patches/no-pr.patch"]), "patches[0]", "patch-no-pr"),
    ("lock-missing", _set("build.requirements_lock", "profiles/missing.lock"), "build.requirements_lock", "does not exist"),
    ("lock-incomplete", _set("build.requirements_lock", "profiles/incomplete.lock"), "build.requirements_lock", "marked incomplete"),
    ("lock-pin-mismatch", _set("cutlass_dsl.version", "4.6.3"), "build.requirements_lock", "lock-pin-mismatch"),
]

# a CUDA 12.9 profile asking for a family target
BROKEN_CU129: list[tuple[str, Mutation, str, str]] = [
    ("arch-family-on-cu129", _set("cuda.arch_list", "12.0f"), "cuda.arch_list", "arch-family-needs-cuda13"),
]


def _project(tmp_path: Path, doc: dict[str, Any] | str, name: str = "broken") -> Path:
    (tmp_path / "profiles").mkdir(exist_ok=True)
    (tmp_path / "patches").mkdir(exist_ok=True)
    (tmp_path / "patches" / "ok.patch").write_text(PATCH_OK)
    (tmp_path / "patches" / "no-pr.patch").write_text(PATCH_NO_PR)
    for lock in (REPO / "profiles").glob("*.requirements.lock"):
        (tmp_path / "profiles" / lock.name).write_text(lock.read_text())
    (tmp_path / "profiles" / "incomplete.lock").write_text("# spark-images: incomplete\n")
    path = tmp_path / "profiles" / f"{name}.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return path


def _validate(path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    code = main(["validate", "--no-audit", *extra, str(path)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("profile", SHIPPED, ids=lambda p: p.stem)
def test_shipped_profiles_are_valid(profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _validate(profile, capsys)
    assert code == 0, err
    assert "valid" in out
    assert "Traceback" not in err


@pytest.mark.parametrize(("case", "mutate", "field", "expected"), BROKEN + BROKEN_CU129, ids=[c[0] for c in BROKEN + BROKEN_CU129])
def test_broken_profile_exits_1_naming_the_field(
    case: str, mutate: Mutation, field: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = copy.deepcopy(CU129_DOC if case in {c[0] for c in BROKEN_CU129} else BASE_DOC)
    mutate(doc)
    path = _project(tmp_path, doc)
    code, _out, err = _validate(path, capsys)
    assert code == 1, f"{case}: exit {code}\n{err}"
    lines = [line for line in err.splitlines() if f"{path}: {field}:" in line]
    assert lines, f"no line names {field!r}:\n{err}"
    assert any(expected in line for line in lines), f"{expected!r} not in {lines}"
    assert "Traceback" not in err


def test_every_rule_has_a_broken_profile() -> None:
    covered = {expected for *_, expected in BROKEN + BROKEN_CU129}
    text_only = {"known-bad-pin": "NVIDIA/cutlass#3227", "vllm-commit-not-sha": "a short SHA",
                 "removed-env-var": "(warning, see test_removed_env_var_warns)"}
    for rule_id in rules_for("profile"):  # image-only rules are proven on images (tests/integration/check)
        assert rule_id in covered or rule_id in text_only, f"rule {rule_id} has no broken profile"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("name: [unclosed\n", "line 2"),
        ("name: a\nname: b\n", "line 2"),
        ("- just\n- a list\n", "(top level)"),
    ],
    ids=["syntax", "duplicate-key", "not-a-mapping"],
)
def test_unparsable_yaml_is_one_line(text: str, field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _project(tmp_path, text)
    code, _out, err = _validate(path, capsys)
    assert code == 1
    assert f"{path}: {field}" in err


def test_all_problems_reported_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = copy.deepcopy(BASE_DOC)
    doc["cutlass_dsl"]["version"] = "4.5.0"
    doc["vllm"]["commit"] = "main"
    doc["cuda"]["arch_list"] = "12.0"
    code, _out, err = _validate(_project(tmp_path, doc), capsys)
    assert code == 1
    for field in ("cutlass_dsl.version", "vllm.commit", "cuda.arch_list"):
        assert f": {field}:" in err


def test_removed_env_var_warns_and_names_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = copy.deepcopy(BASE_DOC)
    doc["serve"]["env"] = {"VLLM_FLASHINFER_MOE_BACKEND": "latency", "VLLM_NVFP4_GEMM_BACKEND": "cutlass"}
    code, _out, err = _validate(_project(tmp_path, doc), capsys)
    assert code == 0, err
    assert "serve.env.VLLM_FLASHINFER_MOE_BACKEND: warning:" in err and "--moe-backend" in err
    assert "serve.env.VLLM_NVFP4_GEMM_BACKEND: warning:" in err and "--linear-backend" in err


def test_patch_with_pr_header_is_accepted_where_the_build_applies_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = copy.deepcopy(BASE_DOC)
    doc["build"]["strategy"] = "source"
    del doc["build"]["wheel"]
    doc["patches"] = ["patches/ok.patch"]
    code, _out, err = _validate(_project(tmp_path, doc), capsys)
    assert code == 0, err


def test_patch_on_the_wheel_strategy_is_one_line_naming_file_field_and_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = copy.deepcopy(BASE_DOC)
    assert doc["build"]["strategy"] == "wheel"
    doc["patches"] = ["patches/ok.patch"]
    path = _project(tmp_path, doc)
    code, _out, err = _validate(path, capsys)
    assert code == 1
    (line,) = [ln for ln in err.splitlines() if ": patches[0]: " in ln]
    assert line.startswith(f"{path}: patches[0]: patches/ok.patch is never applied") and "(fix: set build.strategy: source" in line


def test_json_output_lists_problems(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = copy.deepcopy(BASE_DOC)
    doc["cuda"]["arch_list"] = "12.0"
    code, out, _err = _validate(_project(tmp_path, doc), capsys, "--json")
    assert code == 1
    report = json.loads(out)
    (entry,) = report["profiles"]
    assert entry["status"] == "invalid"
    assert [p["rule"] for p in entry["problems"]] == ["arch-bare-120"]
    assert entry["problems"][0]["field"] == "cuda.arch_list"


def test_missing_file_is_usage_error_without_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "spark_images.cli", "validate", "--no-audit", str(tmp_path / "nope.yaml")],
        capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 2
    assert "no such profile file" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_binary_garbage_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "profiles" / "garbage.yaml"
    path.parent.mkdir()
    path.write_bytes(b"\xff\xfe\x00\x01garbage\x00")
    proc = subprocess.run(
        [sys.executable, "-m", "spark_images.cli", "validate", "--no-audit", str(path)],
        capture_output=True, text=True, check=False,
    )
    assert proc.returncode in (1, 2)
    assert str(path) in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_arguments_exit_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "spark_images.cli", "validate"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr


def test_lock_without_a_pinned_package_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = copy.deepcopy(BASE_DOC)
    assert doc["build"].get("requirements_lock"), "the cu130 profile installs from its hash lock"
    doc["flashinfer"]["cubin"] = doc["flashinfer"]["python"]
    code, _out, err = _validate(_project(tmp_path, doc), capsys)
    assert code == 0, err
    assert "build.requirements_lock: warning:" in err and "does not install flashinfer-cubin" in err


def test_source_date_epoch_pin_reaches_the_plan(tmp_path: Path) -> None:
    from spark_images.buildline.resolve import resolve_profile

    doc = copy.deepcopy(BASE_DOC)
    doc["build"]["source_date_epoch"] = 1757408358
    assert resolve_profile(_project(tmp_path, doc)).plan.source_date_epoch == 1757408358
    assert resolve_profile(REPO / "profiles" / "cu130.yaml").plan.source_date_epoch is None

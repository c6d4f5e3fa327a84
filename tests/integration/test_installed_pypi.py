"""The package as users get it: a wheel built from this checkout, installed non-editable.

The wheel is installed into a fresh, empty venv (its dependencies come
from PyPI, as for a user) and each user command runs from a directory that is
not the checkout: templates and fixes.yaml must come from the package data.
One more venv holds an editable install (`pip install -e`), the developer's
path, to show the checkout itself still renders. That the suite itself runs on
the installed wheel under `nox -s tests` is tests/unit/test_installed.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from support.paths import GOLDEN, ORACLE_BIN, REPO, SRC

PACKAGE = SRC / "spark_images"
GOLDEN_CU130 = GOLDEN / "cu130.Dockerfile"
NATIVE_LIB = ORACLE_BIN / "lib" / "libsm121a.so"
# nox's tests session builds the wheel once and names it here
WHEEL_ENV = "SPARK_IMAGES_TEST_WHEEL"


@dataclass(frozen=True)
class Venv:
    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def env(self, home: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env.update(
            PATH=f"{self.bin}{os.pathsep}{env.get('PATH', '')}",
            VIRTUAL_ENV=str(self.root),
            XDG_CACHE_HOME=str(home / "cache"),
            # no vLLM history here: a path that does not exist fails at once, offline
            SPARK_IMAGES_VLLM_GIT_URL=str(home / "no-such-vllm.git"),
        )
        return env


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _checked(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, f"{' '.join(proc.args)} exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    return proc


def _new_venv(path: Path, *install: str) -> Venv:
    _checked(_run([sys.executable, "-m", "venv", str(path)], cwd=path.parent))
    venv = Venv(path)
    pip = [str(venv.bin / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _checked(_run([*pip, *install], cwd=path.parent, env=venv.env(path.parent)))
    return venv


def _package_files() -> set[str]:
    """Every file of the package in the checkout, as a wheel names it."""
    return {
        p.relative_to(SRC).as_posix()
        for p in PACKAGE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


@pytest.fixture(scope="module")
def wheel(pypi_reachable: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    named = os.environ.get(WHEEL_ENV)
    if named and Path(named).is_file():
        return Path(named)
    # build from a copy, so that setuptools' build/ and egg-info never land in the checkout
    work = tmp_path_factory.mktemp("wheel")
    tree = work / "tree"
    shutil.copytree(SRC, tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tree / name)
    _checked(_run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(work / "dist"), str(tree)], cwd=work))
    (built,) = (work / "dist").glob("spark_images-*.whl")
    return built


@pytest.fixture(scope="module")
def fresh_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    return _new_venv(tmp_path_factory.mktemp("user") / "venv", str(wheel))


@pytest.fixture()
def elsewhere(tmp_path: Path) -> Path:
    """A working directory far from the checkout, holding only a copy of profiles/."""
    shutil.copytree(REPO / "profiles", tmp_path / "profiles")
    return tmp_path


@pytest.mark.network
@pytest.mark.slow
def test_the_wheel_carries_every_package_file(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    missing = sorted(_package_files() - names)
    assert not missing, f"{wheel.name} lacks {missing} (package-data in pyproject.toml)"
    assert "spark_images/templates/Dockerfile.j2" in names and "spark_images/audit/fixes.yaml" in names


@pytest.mark.network
@pytest.mark.slow
def test_the_fresh_venv_imports_its_own_copy(fresh_venv: Venv, elsewhere: Path) -> None:
    proc = _checked(_run([str(fresh_venv.bin / "python"), "-c", "import spark_images; print(spark_images.__file__)"],
                         cwd=elsewhere, env=fresh_venv.env(elsewhere)))
    origin = Path(proc.stdout.strip()).resolve()
    assert fresh_venv.root.resolve() in origin.parents and SRC not in origin.parents


@pytest.mark.network
@pytest.mark.slow
def test_installed_render_equals_the_golden_dockerfile(fresh_venv: Venv, elsewhere: Path) -> None:
    proc = _checked(_run(["spark-images", "render", "profiles/cu130.yaml", "-o", "out"], cwd=elsewhere, env=fresh_venv.env(elsewhere)))
    assert "wrote out/Dockerfile" in proc.stdout + proc.stderr
    assert (elsewhere / "out" / "Dockerfile").read_text() == GOLDEN_CU130.read_text()
    plan = json.loads((elsewhere / "out" / "plan.json").read_text())
    assert plan, "empty plan.json"


@pytest.mark.network
@pytest.mark.slow
def test_installed_validate_without_history(fresh_venv: Venv, elsewhere: Path) -> None:
    proc = _run(["spark-images", "validate", "profiles/cu130.yaml"], cwd=elsewhere, env=fresh_venv.env(elsewhere))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "valid" in proc.stdout and "required fixes: skipped" in proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.mark.network
@pytest.mark.slow
def test_installed_cubins_reads_a_real_library(fresh_venv: Venv, elsewhere: Path) -> None:
    lib = shutil.copy(NATIVE_LIB, elsewhere / NATIVE_LIB.name)
    proc = _checked(_run(["spark-images", "cubins", str(lib), "--json"], cwd=elsewhere, env=fresh_venv.env(elsewhere)))
    report = json.loads(proc.stdout)
    assert report["verdict"] == "native"
    assert report["libraries"][0]["sass"] == ["sm_121a"]


@pytest.mark.network
@pytest.mark.slow
def test_installed_audit_uses_the_packaged_fixes(fresh_venv: Venv, elsewhere: Path) -> None:
    known = yaml.safe_load((PACKAGE / "audit" / "fixes.yaml").read_text())["fixes"]
    # a fix without a marker and with a stored patch-id: only its change can prove it
    fix = next(f for f in known if not f.get("markers") and f.get("patch_id"))
    pr = fix["pr"]
    repo = elsewhere / "vllm"
    git = ["git", "-C", str(repo), "-c", "user.name=Dev", "-c", "user.email=dev@example.invalid"]
    _checked(_run(["git", "init", "-q", "-b", "main", str(repo)], cwd=elsewhere))
    (repo / "vllm").mkdir()
    (repo / "vllm" / "__init__.py").write_text("")
    _checked(_run([*git, "add", "."], cwd=elsewhere))
    _checked(_run([*git, "commit", "-q", "-m", "vllm skeleton"], cwd=elsewhere))
    # a squash commit that changes the tree: an empty one is `effect-unproven`, not `included`
    (repo / "vllm" / "kernel.py").write_text(f"# {fix['title']}\n")
    _checked(_run([*git, "add", "."], cwd=elsewhere))
    _checked(_run([*git, "commit", "-q", "-m", f"[Kernel] {fix['title']} (#{pr})"], cwd=elsewhere))
    head = _checked(_run([*git, "rev-parse", "HEAD"], cwd=elsewhere)).stdout.strip()
    proc = _checked(_run(["spark-images", "audit", head, "--repo", str(repo), "--json"], cwd=elsewhere, env=fresh_venv.env(elsewhere)))
    states = {fix["pr"]: fix["state"] for fix in json.loads(proc.stdout)["fixes"]}
    assert set(states) == {fix["pr"] for fix in known}
    # its title, not its change: the packaged patch-id tells them apart
    assert states[pr] == "effect-unproven"
    evidence = next(f["evidence"] for f in json.loads(proc.stdout)["fixes"] if f["pr"] == pr)
    assert any(f"{head[:12]} has the (#{pr}) subject, but its change differs" in e and fix["patch_id"][:12] in e
               for e in evidence), evidence
    assert all(state == "absent" for other, state in states.items() if other != pr)


@pytest.mark.network
@pytest.mark.slow
def test_editable_install_renders_from_the_checkout(pypi_reachable: None, tmp_path: Path) -> None:
    """The developer's path: `pip install -e .` still finds the templates in src/."""
    venv = _new_venv(tmp_path / "venv", "-e", str(REPO))
    work = tmp_path / "work"
    shutil.copytree(REPO / "profiles", work / "profiles")
    env = venv.env(work)
    proc = _checked(_run([str(venv.bin / "python"), "-c", "import spark_images; print(spark_images.__file__)"], cwd=work, env=env))
    assert SRC in Path(proc.stdout.strip()).resolve().parents
    _checked(_run(["spark-images", "render", "profiles/cu130.yaml", "-o", "out"], cwd=work, env=env))
    assert (work / "out" / "Dockerfile").read_text() == GOLDEN_CU130.read_text()

"""Thin nox sessions: each one installs the package and calls the `spark-images` CLI.

    nox -s build-cu130      the main job: validate, audit, render, build, inspect, gate
    nox -s tests            the test suite (engine tests need .ci/engine-up.sh first)
    nox -s tests -- -m unit the fast loop: tests/unit only (no engine, network, registry, nvcc, git history)
    nox -s acceptance       the main job on a local stand-in base (hosts that cannot pull nvidia/cuda)
    nox -s reprotest        two varied builds of the real plan must give one digest (long; not in CI)

Every session installs the package as users get it (`pip install .`, never
`-e`); `tests` builds the wheel and runs the suite on that installed wheel.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import nox
from nox.command import CommandFailed

nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["lint", "tests"]

ROOT = Path(__file__).parent
PROFILES = sorted(p.stem for p in (ROOT / "profiles").glob("*.yaml"))


def _install(session: nox.Session, extras: str = "") -> None:
    session.install(f".{extras}")


def _build_wheel(session: nox.Session, work: Path) -> Path:
    """The wheel `pip install spark-images` would give, built from a copy of the checkout.

    The copy keeps setuptools' build/ and egg-info out of a tree others work
    in; the wheel lands outside the checkout, so no test sees it under src/.
    """
    tree = work / "tree"
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    session.run("python", "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(work / "dist"), str(tree))
    (wheel,) = (work / "dist").glob("spark_images-*.whl")
    return wheel


# pytest arguments that say how to spread the run, or that need one process
_ONE_PROCESS_OR_CHOSEN = ("-n", "--numprocesses", "--dist", "no:xdist", "-pno:xdist", "--pdb", "--trace")


def pytest_args(posargs: list[str]) -> list[str]:
    """The given pytest arguments, spread over every core (`-n auto`) unless they choose.

    Most unit tests run the CLI as a subprocess, so one process waits on
    another's startup: on two cores `-m unit` takes about half as long spread.
    """
    chosen = any(a.startswith(_ONE_PROCESS_OR_CHOSEN) for a in posargs)
    return list(posargs) if chosen else ["-n", "auto", *posargs]


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite on the installed wheel (pass pytest arguments after --: `-m unit`, `tests/unit`)."""
    work = Path(tempfile.mkdtemp(prefix="spark-images-wheel-"))
    try:
        wheel = _build_wheel(session, work)
        session.install(f"{wheel}[test]")
        # a reused venv may hold the same version (or an old editable install): replace it
        session.install("--force-reinstall", "--no-deps", str(wheel))
        session.run("pytest", *pytest_args(session.posargs), env={"SPARK_IMAGES_TEST_WHEEL": str(wheel)})
    except CommandFailed as exc:
        # exit 5 = nothing collected: a run that tested nothing must not look like a pass
        if str(exc) == "Returned code 5":
            session.error("pytest collected no tests (exit 5): check the arguments and [tool.pytest.ini_options]")
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6")
    session.run("ruff", "check", "src", "tests", "benchmarks", "noxfile.py")


@nox.session
def validate(session: nox.Session) -> None:
    _install(session)
    session.run("spark-images", "validate", *(session.posargs or [f"profiles/{p}.yaml" for p in PROFILES]))


@nox.session
def render(session: nox.Session) -> None:
    """Render every profile's build context into build/render/NAME."""
    _install(session)
    for name in session.posargs or PROFILES:
        session.run("spark-images", "render", f"profiles/{name}.yaml", "-o", f"build/render/{name}")


@nox.session
def golden(session: nox.Session) -> None:
    """Refresh the golden Dockerfiles the tests compare against (review the diff!)."""
    _install(session)
    for name in PROFILES:
        out = session.run("spark-images", "render", f"profiles/{name}.yaml", silent=True)
        (ROOT / "tests" / "data" / "spine" / "golden" / f"{name}.Dockerfile").write_text(out)


def _build_session(profile: str) -> None:
    @nox.session(name=f"build-{profile}")
    def build(session: nox.Session) -> None:
        _install(session)
        session.run("spark-images", "build", f"profiles/{profile}.yaml", *session.posargs)


# build-cu130, build-cu129: build, inspect, audit and gate (pass build flags after --)
for _profile in ("cu130", "cu129"):
    _build_session(_profile)


@nox.session(name="verify-repro")
def verify_repro(session: nox.Session) -> None:
    _install(session)
    session.run("spark-images", "verify-repro", *(session.posargs or ["profiles/cu130.yaml"]))


@nox.session
def cubins(session: nox.Session) -> None:
    """spark-images cubins TARGET ... (pass the arguments after --)."""
    _install(session)
    session.run("spark-images", "cubins", *session.posargs)


@nox.session
def audit(session: nox.Session) -> None:
    _install(session)
    session.run("spark-images", "audit", *session.posargs)


@nox.session
def coherence(session: nox.Session) -> None:
    _install(session)
    session.run("spark-images", "coherence", *session.posargs)


@nox.session
def publish(session: nox.Session) -> None:
    _install(session)
    session.run("spark-images", "publish", *session.posargs)


@nox.session
def acceptance(session: nox.Session) -> None:
    """The real cu130 lock through `spark-images build` on a local stand-in base, then
    `check` of the archive against the verdict written down in .ci/acceptance.py.
    Needs .ci/engine-up.sh (engine, registry, emulation) and PyPI; about 6 GB of
    wheels on a fresh machine, kept in BuildKit's cache mounts between runs. Prints
    the build's time by stage against the all-emulated baseline (benchmarks/build_real.py)."""
    _install(session)
    try:
        session.run("python", str(ROOT / ".ci" / "acceptance.py"), *session.posargs)
    finally:
        log = ROOT / "build" / "acceptance" / "build.log"
        if log.is_file() and not session.posargs:
            session.run("python", str(ROOT / "benchmarks" / "build_real.py"), "--log", str(log))


@nox.session
def reprotest(session: nox.Session) -> None:
    """Build the real plan twice without cache, varied as reprotest varies a build:
    another checkout path, umask, TZ, locale, user name and build directory; the two
    digests must be one. Twice the acceptance build: run it by hand, not in CI."""
    _install(session)
    session.run("python", str(ROOT / ".ci" / "reprotest.py"), *session.posargs)

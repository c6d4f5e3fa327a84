"""A repository for the workflow jobs to check out, and the data the fixtures hand the tests."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def git(cwd: Path, *args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 0, f"git {' '.join(args)}: {proc.stderr}"
    return proc.stdout.strip()


def checkout_files() -> list[str]:
    """The files a checkout of this repository holds (tracked and new, not ignored)."""
    listed = git(ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    return sorted(f for f in listed if f and (ROOT / f).is_file() and not (ROOT / f).is_symlink()) + sorted(
        f for f in listed if f and (ROOT / f).is_symlink()
    )


def make_origin(where: Path, profiles: dict[str, str] | None = None) -> Path:
    """A bare repository holding this checkout (profiles/ replaced when given): what jobs clone."""
    work = where / "source"
    for rel in checkout_files():
        dest = work / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        source = ROOT / rel
        if source.is_symlink():
            dest.symlink_to(source.readlink())
        else:
            shutil.copy2(source, dest)
    if profiles is not None:
        shutil.rmtree(work / "profiles")
        (work / "profiles").mkdir()
        for name, text in profiles.items():
            (work / "profiles" / name).write_text(text)
    git(work, "init", "-q", "-b", "main")
    git(work, "add", "-A")
    git(work, "-c", "user.name=Dev", "-c", "user.email=dev@example.invalid", "commit", "-q", "-m", "checkout")
    origin = where / "origin.git"
    git(where, "clone", "-q", "--bare", str(work), str(origin))
    return origin


@dataclass(frozen=True)
class VllmHistory:
    path: Path
    release_tag: str
    release_commit: str


@dataclass(frozen=True)
class StandinProfile:
    name: str
    text: str
    repository: str
    lock_text: str

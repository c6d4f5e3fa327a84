"""Zip members as pip installs them: real wheels made with zipfile, installed by the real pip.

A wheel can hold two members that install at one path: the same name twice,
or a second name that reaches it through `..`. pip writes the members in
archive order, so the file on disk is the last one's; the reader must judge
that copy and say that the other one is not installed. A member that leaves
site-packages makes pip refuse the whole wheel; the reader refuses it too.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import pytest

from spark_images.core.errors import UsageError
from spark_images.readers import files
from support.paths import ORACLE_BIN

DIST = "demo-1.0.dist-info"


def _wheel(path: Path, members: list[tuple[str, bytes]]) -> Path:
    """A wheel pip accepts (METADATA, WHEEL, RECORD) whose payload is `members`, in that order."""
    meta = [
        (f"{DIST}/METADATA", b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n"),
        (
            f"{DIST}/WHEEL",
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        ),
    ]
    record = "".join(f"{name},,\n" for name, _ in [*members, *meta]) + f"{DIST}/RECORD,,\n"
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", UserWarning
        )  # zipfile warns of a duplicate name: that is the case
        with zipfile.ZipFile(path, "w") as zf:
            for name, data in [*members, *meta, (f"{DIST}/RECORD", record.encode())]:
                zf.writestr(name, data)
    return path


def _pip_install(wheel: Path, target: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--no-compile",
         "--disable-pip-version-check", "--target", str(target), str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _read(wheel: Path) -> list[files.Member]:
    out = []
    for member in files.wheel_members(wheel, lambda p: p.startswith("demo/")):
        out.append(
            files.Member(
                member.path, bytes(member.data) if member.data is not None else None, member.error
            )
        )
    return out


@pytest.mark.parametrize("second", ["demo/lib.so", "demo/sub/../lib.so", "./demo/lib.so"])
def test_two_members_at_one_path_read_the_one_pip_installs(tmp_path: Path, second: str) -> None:
    wheel = _wheel(
        tmp_path / "demo-1.0-py3-none-any.whl",
        [("demo/lib.so", b"FIRST copy"), (second, b"LAST copy")],
    )
    installed = _pip_install(wheel, tmp_path / "site")
    assert installed.returncode == 0, installed.stderr
    on_disk = (tmp_path / "site" / "demo" / "lib.so").read_bytes()
    assert on_disk == b"LAST copy"  # pip's choice: the last member in archive order

    members = _read(wheel)
    read = [m for m in members if m.data is not None]
    assert [(m.path, m.data) for m in read] == [("demo/lib.so", on_disk)]
    (shadowed,) = [m for m in members if m.data is None]
    assert (
        shadowed.path == "demo/lib.so"
        and "not installed" in shadowed.error
        and repr(second) in shadowed.error
    )


def test_a_member_outside_site_packages_is_refused_as_pip_refuses_it(tmp_path: Path) -> None:
    wheel = _wheel(
        tmp_path / "demo-1.0-py3-none-any.whl",
        [("demo/lib.so", b"ok"), ("demo/../../evil.so", b"x")],
    )
    installed = _pip_install(wheel, tmp_path / "site")
    assert installed.returncode != 0 and "outside" in installed.stderr
    with pytest.raises(UsageError) as err:
        _read(wheel)
    (line,) = str(err.value).splitlines()
    assert str(wheel) in line and "'demo/../../evil.so'" in line and "fix:" in line


def test_a_wheel_without_duplicates_reads_every_wanted_member_once(tmp_path: Path) -> None:
    wheel = _wheel(
        tmp_path / "demo-1.0-py3-none-any.whl", [("demo/a.so", b"a"), ("demo/b/c.py", b"c")]
    )
    assert [(m.path, m.data, m.error) for m in _read(wheel)] == [
        ("demo/a.so", b"a", ""),
        ("demo/b/c.py", b"c", ""),
    ]


ORACLE = ORACLE_BIN / "lib"


def test_cubins_judges_the_copy_pip_keeps(tmp_path: Path) -> None:
    """The hostile case: native sm_121a code first, an sm_90-only library last at the same path
    (through `..`). pip installs the sm_90 one, so the wheel has no native sm_121 code, and the
    sm_121a copy is listed as not installed rather than counted."""
    native, other = (ORACLE / "libsm121a.so").read_bytes(), (ORACLE / "libsm90.so").read_bytes()
    wheel = _wheel(tmp_path / "demo-1.0-py3-none-any.whl", [("demo/lib.so", native), ("demo/x/../lib.so", other)])
    assert _pip_install(wheel, tmp_path / "site").returncode == 0
    assert (tmp_path / "site" / "demo" / "lib.so").read_bytes() == other
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from spark_images.cli import main; sys.exit(main(sys.argv[1:]))",
         "cubins", str(wheel), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and doc["verdict"] != "native", doc
    (lib,) = doc["libraries"]
    assert lib["path"] == "demo/lib.so" and lib["native"] == 0, lib
    assert [(u["path"], "not installed" in u["error"]) for u in doc["unreadable"]] == [("demo/lib.so", True)]

"""The suite runs on the package as users get it, not on src/.

`nox -s tests` installs a wheel built from this checkout into its venv
(non-editable) and runs the suite on it; this test proves the suite really
imports the installed copy, not src/. A developer run in the editable checkout
declares itself with SPARK_IMAGES_EDITABLE=1 and the test is then skipped, with
the reason. The wheel in a fresh venv, its commands run from elsewhere:
tests/integration/test_installed_pypi.py.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import pytest

import spark_images
from support.paths import SRC

EDITABLE = "SPARK_IMAGES_EDITABLE"


def test_the_suite_runs_on_the_installed_package() -> None:
    origin = Path(spark_images.__file__).resolve()
    if os.environ.get(EDITABLE) == "1":
        pytest.skip(f"{EDITABLE}=1: a developer run on the editable checkout ({origin})")
    assert SRC not in origin.parents, (
        f"spark_images was imported from the checkout ({origin}); the suite must run on the "
        f"installed wheel: use `nox -s tests`, or set {EDITABLE}=1 for a developer run"
    )
    purelib = Path(sysconfig.get_paths()["purelib"]).resolve()
    assert purelib in origin.parents, f"spark_images at {origin}, not in this interpreter's {purelib}"

"""Every test function in tests/ is collected, and each tree holds only its own kind.

pytest's default `norecursedirs` holds `build`, which once hid the whole build
room while the run stayed green. These tests compare pytest's own collection
(a `--collect-only` subprocess, the same config a run uses) with a static scan
of the `def test_` functions in every tests/**/test_*.py file: each function
must yield at least one item, and one that is not parametrised exactly one.
The second test proves the check sees a hidden folder. The third proves that
`-m unit` and `-m integration` (set from the folder in tests/conftest.py) split
the collection: every test is in exactly one of them, the one of its tree; and
that the folder is right, from what each test needs as pytest's own fixture
closure (item.fixturenames) and marks say it (the collection's report,
tests/conftest.py, SPARK_IMAGES_COLLECTION_REPORT): no test under tests/unit
reaches the engine, a registry, nvcc, PyPI or git history, and every test
under tests/integration needs one of them (or runs whole processes under a
clock: the `processes` mark), so that nothing is parked in the slow tree
without reason.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from support.paths import REPO as ROOT
from support.paths import TESTS

pytestmark = pytest.mark.processes  # pytest itself over the whole tree, four times

# tests/conftest.py writes its collection report there (tree and needs per node id)
REPORT_ENV = "SPARK_IMAGES_COLLECTION_REPORT"
# pytest's node id: path::[Class::]function[params]
NODE_ID = re.compile(r"^(?P<path>[^:\s]+\.py)::(?P<name>[^\[\s]+)(?P<params>\[.*\])?$")


def _is_parametrize(node: ast.expr) -> bool:
    target = node.func if isinstance(node, ast.Call) else node
    return isinstance(target, ast.Attribute) and target.attr == "parametrize"


def _marks_parametrize(value: ast.expr) -> bool:
    items = value.elts if isinstance(value, ast.List | ast.Tuple) else [value]
    return any(_is_parametrize(item) for item in items)


def static_tests() -> dict[str, bool]:
    """`path::[Class::]name` -> parametrised, for every test function in tests/."""
    found: dict[str, bool] = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(), filename=rel)
        module_param = any(
            isinstance(stmt, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in stmt.targets)
            and _marks_parametrize(stmt.value)
            for stmt in tree.body
        )

        def add(prefix: str, body: list[ast.stmt], inherited: bool, rel: str = rel) -> None:
            for stmt in body:
                if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) and stmt.name.startswith("test"):
                    param = inherited or any(_is_parametrize(d) for d in stmt.decorator_list)
                    found[f"{rel}::{prefix}{stmt.name}"] = param
                elif isinstance(stmt, ast.ClassDef) and stmt.name.startswith("Test"):
                    cls_param = inherited or any(_is_parametrize(d) for d in stmt.decorator_list)
                    add(f"{prefix}{stmt.name}::", stmt.body, cls_param)

        add("", tree.body, module_param)
    return found


@functools.cache
def _collection(*extra: str) -> tuple[dict[str, list[str]], dict[str, dict[str, Any]]]:
    """pytest's `--collect-only` of the tree: its node ids, and the conftest's report of each test."""
    with tempfile.TemporaryDirectory(prefix="collection-") as tmp:
        report = Path(tmp) / "report.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *extra],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            env={**env, REPORT_ENV: str(report)},
        )
        assert proc.returncode in (0, 5), f"collection failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}"
        needs = json.loads(report.read_text()) if report.is_file() else {}
    items: dict[str, list[str]] = defaultdict(list)
    for line in proc.stdout.splitlines():
        m = NODE_ID.match(line.strip())
        if m:
            items[f"{m['path']}::{m['name']}"].append(m["params"] or "")
    total = re.search(r"(\d+)(?:/\d+)? tests? collected", proc.stdout)  # `-m` prints SELECTED/ALL
    count = int(total.group(1)) if total else 0
    assert sum(len(v) for v in items.values()) == count, "could not read every node id of the collection"
    return items, needs


def collected(*extra: str) -> dict[str, list[str]]:
    """`path::[Class::]name` -> the parameter ids pytest collected for it ("" if none)."""
    return _collection(*extra)[0]


def needs_by_test() -> dict[str, dict[str, Any]]:
    """node id -> {"tree": unit | integration | None, "needs": [fixtures of its closure, then marks]}."""
    report = _collection()[1]
    assert report, f"tests/conftest.py wrote no collection report ({REPORT_ENV})"
    assert set(report) == {key + params for key, ids in collected().items() for params in ids}
    return report


def gaps(*extra: str) -> list[str]:
    """One line per difference between the static scan and pytest's collection."""
    expected = static_tests()
    got = collected(*extra)
    problems = [f"{key}: not collected" for key in expected if key not in got]
    problems += [f"{key}: collected but not found by the scan of tests/**/test_*.py" for key in got if key not in expected]
    for key, param in expected.items():
        ids = got.get(key, [])
        if ids and not param and ids != [""]:
            problems.append(f"{key}: no parametrize mark, yet collected {len(ids)} items {ids}")
        if ids and param and not all(ids):
            problems.append(f"{key}: parametrised, yet collected without parameter ids")
    return problems


def test_every_test_function_is_collected() -> None:
    expected = static_tests()
    for tree in ("unit", "integration"):
        assert any(key.startswith(f"tests/{tree}/build/") for key in expected), f"the scan found no tests in tests/{tree}/build"
    assert gaps() == []


def test_a_hidden_folder_is_detected() -> None:
    # pytest's old default: `build` in norecursedirs hides the build room of both trees
    problems = gaps("-o", "norecursedirs=build")
    hidden = {line.split("::")[0] for line in problems}
    assert problems and all(line.endswith(": not collected") for line in problems), problems
    assert hidden == {p.relative_to(ROOT).as_posix() for p in TESTS.glob("*/build/test_*.py")}
    assert {path.split("/")[1] for path in hidden} == {"unit", "integration"}


def unit_tests_that_need_the_environment() -> dict[str, list[str]]:
    """Tests under tests/unit that reach an environment fixture (through any other fixture)
    or have an environment mark: they belong in tests/integration."""
    return {node: doc["needs"] for node, doc in needs_by_test().items() if doc["tree"] == "unit" and doc["needs"]}


def integration_tests_that_need_nothing() -> list[str]:
    """Tests under tests/integration with no environment fixture or mark: they are unit tests."""
    return sorted(node for node, doc in needs_by_test().items() if doc["tree"] == "integration" and not doc["needs"])


def test_every_test_is_unit_or_integration_never_both() -> None:
    def node_ids(*extra: str) -> set[str]:
        return {key + params for key, ids in collected(*extra).items() for params in ids}

    everything, unit, integration = node_ids(), node_ids("-m", "unit"), node_ids("-m", "integration")
    assert unit and integration, "one of the markers selects nothing"
    assert sorted(unit & integration) == [], "marked both unit and integration"
    assert sorted(everything - unit - integration) == [], "marked neither unit nor integration"
    # the folder decides: `-m unit` is tests/unit, `-m integration` is tests/integration
    assert sorted(i for i in unit if not i.startswith("tests/unit/")) == [], "marked unit outside tests/unit"
    assert sorted(i for i in integration if not i.startswith("tests/integration/")) == [], "marked integration outside tests/integration"
    # and the folder is right: what each test needs, from its real fixture closure and marks
    assert {doc["tree"] for doc in needs_by_test().values()} == {"unit", "integration"}, "a test outside the two trees"
    wrong = [f"{node}: needs {', '.join(needs)} (move it to tests/integration)"
             for node, needs in sorted(unit_tests_that_need_the_environment().items())]
    idle = [f"{node}: needs nothing of the environment (move it to tests/unit, or mark what it needs)"
            for node in integration_tests_that_need_nothing()]
    assert wrong + idle == [], "tests in the wrong tree:\n" + "\n".join(wrong + idle)

"""Every test function in tests/ is collected: no folder or file is hidden.

pytest's default `norecursedirs` holds `build`, which once hid all of
tests/build/ while the run stayed green. These tests compare pytest's own
collection (a `--collect-only` subprocess, the same config a run uses) with a
static scan of the `def test_` functions in every tests/**/test_*.py file:
each function must yield at least one item, and one that is not parametrised
exactly one. The second test proves the check sees a hidden folder. The
third proves that `-m unit` and `-m integration` (set in tests/conftest.py)
split the collection: every test is in exactly one of them.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
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
def collected(*extra: str) -> dict[str, list[str]]:
    """`path::[Class::]name` -> the parameter ids pytest collected for it ("" if none)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},
    )
    assert proc.returncode in (0, 5), f"collection failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}"
    items: dict[str, list[str]] = defaultdict(list)
    for line in proc.stdout.splitlines():
        m = NODE_ID.match(line.strip())
        if m:
            items[f"{m['path']}::{m['name']}"].append(m["params"] or "")
    total = re.search(r"(\d+)(?:/\d+)? tests? collected", proc.stdout)  # `-m` prints SELECTED/ALL
    count = int(total.group(1)) if total else 0
    assert sum(len(v) for v in items.values()) == count, "could not read every node id of the collection"
    return items


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
    assert any(key.startswith("tests/build/") for key in expected), "the scan found no tests in tests/build"
    assert gaps() == []


def test_a_hidden_folder_is_detected() -> None:
    # pytest's old default: `build` in norecursedirs hides tests/build/
    problems = gaps("-o", "norecursedirs=build")
    hidden = {line.split("::")[0] for line in problems}
    assert problems and all(line.endswith(": not collected") for line in problems), problems
    assert hidden == {p.relative_to(ROOT).as_posix() for p in (TESTS / "build").glob("test_*.py")}


def test_every_test_is_unit_or_integration_never_both() -> None:
    def node_ids(*extra: str) -> set[str]:
        return {key + params for key, ids in collected(*extra).items() for params in ids}

    everything, unit, integration = node_ids(), node_ids("-m", "unit"), node_ids("-m", "integration")
    assert unit and integration, "one of the markers selects nothing"
    assert sorted(unit & integration) == [], "marked both unit and integration"
    assert sorted(everything - unit - integration) == [], "marked neither unit nor integration"

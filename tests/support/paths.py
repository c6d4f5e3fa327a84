"""The checkout's folders the tests read, from one place (a test moved between trees keeps them)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
SRC = REPO / "src"
# test data that more than one folder reads (tests/data/README.md)
DATA = TESTS / "data"
ORACLE = DATA / "cubins" / "oracle"
ORACLE_BIN = ORACLE / "bin"
GOLDEN = DATA / "spine" / "golden"

"""The shipped knowledge base, its validator, and the pure release/target parsers."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from spark_images.audit.knowledge import load_knowledge, parse_knowledge
from spark_images.audit.releases import first_release_and_rc, parse_tag, parse_version_file
from spark_images.audit.targets import classify
from spark_images.core.errors import Finding

# The Spark-relevant PRs named by the upstream facts sheet and section 9 of the
# guide (the issue asks for every one of them).
REFERENCE_PRS = {17280, 21309, 22131, 29242, 29711, 33517, 38126, 38423, 39825, 35568, 40082, 41215, 40923, 48245}


@pytest.fixture(autouse=True)
def _shipped_knowledge(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests read the shipped file, not the fixture history's knowledge base."""
    monkeypatch.delenv("SPARK_IMAGES_KB", raising=False)


def test_shipped_knowledge_base_covers_the_reference_prs() -> None:
    kb = load_knowledge()
    assert set(kb.prs()) >= REFERENCE_PRS
    for fix in kb.fixes:
        assert fix.title and fix.symptom
        for marker in fix.markers:
            assert marker.source.strip(), f"#{fix.pr}: marker without a source"
    assert kb.get(39825) is not None and kb.get(39825).undone_by == (39959,)  # type: ignore[union-attr]


# The facts sheet's "Spark-relevant PRs" table: PR -> (main commit prefix, first final
# release where the sheet names one exactly; "" where it says "before 0.18.0" or similar).
FACTS_TABLE = {
    17280: ("9e5552aa1390", "0.9.2"),
    21309: ("789562c28c14", ""),
    22131: ("3303f134e03f", ""),
    29242: ("e50209864", ""),
    29711: ("c0dfc8948", ""),
    33517: ("bc32444b2", ""),
    38126: ("97d19197bcd0", "0.19.0"),
    38423: ("b4a2f3ac3690", "0.20.0"),
    39825: ("65b980896", ""),
    35568: ("06d020bb6ef7", "0.22.0"),
    40082: ("363fc84407f8", "0.22.0"),
    41215: ("644b2a28e7eb", "0.22.0"),
    40923: ("6cc8577421f2", "0.23.0"),
    48245: ("a0c092ee72c0", ""),
}


def test_knowledge_base_agrees_with_the_facts_table() -> None:
    kb = load_knowledge()
    assert set(FACTS_TABLE) == REFERENCE_PRS
    for pr, (commit, first) in FACTS_TABLE.items():
        fix = kb.get(pr)
        assert fix is not None, f"#{pr}"
        # the full SHA the sheet's prefix resolved to in real history
        assert fix.main_commit.startswith(commit) and len(fix.main_commit) == 40, f"#{pr}"
        assert fix.first_release == first, f"#{pr}"
    # a commit the sheet does not give was read off history, with its patch-id and merge date
    # (39959's); the others carry none (nothing is guessed)
    for fix in kb.fixes:
        if fix.pr not in FACTS_TABLE:
            assert fix.first_release == "", f"#{fix.pr}"
            assert (fix.main_commit == "") or (len(fix.main_commit) == 40 and fix.patch_id and fix.merged), f"#{fix.pr}"
    # every main commit but the empty #41215's (no diff) and #48245's (no history at hand) has its patch-id
    assert sorted(f.pr for f in kb.fixes if f.main_commit and not f.patch_id) == [41215, 48245]
    assert all(f.date for f in kb.fixes)


def test_no_value_is_cut_by_a_yaml_comment() -> None:
    # `title: fixes #123` silently becomes `fixes` in YAML; such values must be quoted
    text = resources.files("spark_images.audit").joinpath("fixes.yaml").read_text()
    bad = [ln for ln in text.splitlines() if re.match(r"^\s+(title|symptom): [^\"'].* #", ln)]
    assert bad == []


def test_validator_reports_every_problem_with_its_field() -> None:
    text = """
schema: 1
fixes:
  - pr: 1
    title: a
    area: GPU
    severity: high
    symptom: s
    main_commit: 6cc8577421f2
    markers:
      - path: /abs
        contains: x
  - pr: 1
    title: b
    area: MoE
    severity: urgent
    symptom: s
    date: "2026-13-01T00:00:00Z"
    colour: red
"""
    with pytest.raises(Finding) as exc:
        parse_knowledge(text, "kb.yaml")
    lines = exc.value.lines()
    assert any("fixes[0].area" in ln and "'GPU'" in ln for ln in lines)
    assert any("fixes[0].markers[0].path" in ln for ln in lines)
    assert any("fixes[0].markers[0].source" in ln for ln in lines)
    assert any("fixes[1].severity" in ln for ln in lines)
    assert any("fixes[1].colour" in ln and "unknown key" in ln for ln in lines)
    assert any("fixes[0].main_commit" in ln and "not a full commit SHA" in ln for ln in lines)
    assert any("fixes[1].date" in ln and "not a UTC timestamp" in ln for ln in lines)
    assert all(ln.startswith("kb.yaml: ") for ln in lines)


def test_tag_order_follows_pep440() -> None:
    names = ["v0.23.0", "v0.22.1", "v0.22.1rc0", "v0.8.5.post1", "v0.8.5", "v0.22.0rc1", "v0.22.0", "v0.9.0.1"]
    ordered = sorted(n for n in (parse_tag(t) for t in names) if n is not None)
    assert [n.tag for n in ordered] == [
        "v0.8.5", "v0.8.5.post1", "v0.9.0.1", "v0.22.0rc1", "v0.22.0", "v0.22.1rc0", "v0.22.1", "v0.23.0",
    ]
    assert first_release_and_rc(["v0.23.0", "v0.22.1rc0", "v0.23.0rc0", "nightly"]) == ("v0.23.0", "v0.22.1rc0")
    assert parse_tag("nightly") is None
    assert parse_tag("v0.22.1rc1.dev26").kind == "dev"  # type: ignore[union-attr]


def test_version_file_formats() -> None:
    release = "__version__ = version = '0.29.0'\n__commit_id__ = commit_id = 'g98dff2a81'\n"
    assert parse_version_file(release) == ("0.29.0", "98dff2a81")
    dev = "__version__ = version = '0.22.1rc1.dev26+g6cc8577421.cu130'\n__commit_id__ = commit_id = None\n"
    assert parse_version_file(dev) == ("0.22.1rc1.dev26+g6cc8577421.cu130", "6cc8577421")
    old = "__version__ = version = '0.9.2'\n__version_tuple__ = version_tuple = (0, 9, 2)\n"
    assert parse_version_file(old) == ("0.9.2", None)


@pytest.mark.parametrize(
    ("text", "kind", "value"),
    [
        ("98dff2a81d747d1dba01a47f939f48c3526d4206", "commit", "98dff2a81d747d1dba01a47f939f48c3526d4206"),
        ("g98dff2a81", "commit", "98dff2a81"),
        ("v0.22.0", "release", "0.22.0"),
        ("0.22.1rc0", "release", "0.22.1rc0"),
        ("vllm==0.29.0", "release", "0.29.0"),
        ("vllm==0.22.1rc1.dev26+g6cc8577421.cu130", "commit", "6cc8577421"),
        ("profiles/cu130.yaml", "profile", "profiles/cu130.yaml"),
        ("dist/vllm-0.29.0-cp38-abi3-manylinux_2_28_aarch64.whl", "artifact", "dist/vllm-0.29.0-cp38-abi3-manylinux_2_28_aarch64.whl"),
        ("docker://vllm/vllm-openai:v0.22.0", "artifact", "docker://vllm/vllm-openai:v0.22.0"),
        ("127.0.0.1:5000/spark/vllm:cu130", "image", "127.0.0.1:5000/spark/vllm:cu130"),
        ("ghcr.io/spark-images/spark-vllm:cu130", "image", "ghcr.io/spark-images/spark-vllm:cu130"),
        ("releases/v0.22.0", "rev", "releases/v0.22.0"),
        ("main", "rev", "main"),
    ],
)
def test_target_classification(text: str, kind: str, value: str) -> None:
    spec = classify(text)
    assert (spec.kind, spec.value) == (kind, value)

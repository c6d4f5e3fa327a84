"""Upstream monitor: audit diffs, the bump decision, the PR body, the profile edit.

Audit documents are made with the audit room's own `AuditReport.to_json()`,
so the monitor reads exactly what `spark-images audit --json` prints.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_images.audit.states import AuditReport, FixResult
from spark_images.cli.monitor import standalone
from spark_images.release import monitor
from support.loopback import Loopback, QuietHandler

ROOT = Path(__file__).resolve().parents[3]
PINNED = "98dff2a81d747d1dba01a47f939f48c3526d4206"
RELEASE = "4ba787ec9" + "0" * 31  # a 40-hex stand-in for the v0.33.0 commit
MAIN = "c" * 40


def audit(target: str, commit: str, states: dict[int, str], required: tuple[int, ...] = ()) -> dict[str, Any]:
    fixes = tuple(
        FixResult(pr=pr, state=state, title=f"fix {pr}", symptom=f"symptom {pr}",
                  first_release="v0.33.0" if pr >= 50000 else "v0.22.0", first_rc=None,
                  evidence=(f"squash {pr:012d} on main",), required=pr in required)
        for pr, state in sorted(states.items())
    )
    return AuditReport(target=target, commit=commit, fixes=fixes).to_json()


BASE = {38126: "included", 40082: "included", 48245: "included"}


def test_diff_sorts_every_fix_into_one_bucket() -> None:
    pinned = audit("profiles/cu130.yaml", PINNED,
                   {**BASE, 50001: "absent", 50002: "patched", 50003: "patched", 50004: "absent",
                    50005: "unknown", 50006: "absent"}, required=(40082,))
    release = audit("v0.33.0", RELEASE,
                    {**BASE, 40082: "reverted", 50001: "included", 50002: "cherry-picked", 50003: "absent",
                     50004: "absent", 50005: "included", 50006: "effect-absent"})
    diff = monitor.diff_audits(pinned, release)
    assert [c.pr for c in diff.gained] == [50001]
    assert [(c.pr, c.before, c.after, c.required) for c in diff.lost] == [(40082, "included", "reverted", True)]
    assert [c.pr for c in diff.patch_upstreamed] == [50002]
    assert [c.pr for c in diff.patch_still_needed] == [50003]
    assert [c.pr for c in diff.still_missing] == [50004, 50006]
    assert [c.pr for c in diff.unverified] == [50005]
    assert not diff.same_commit
    assert diff.to_json()["gained"][0]["after"] == "included"


def test_a_fix_only_one_audit_lists_is_unverified() -> None:
    diff = monitor.diff_audits(audit("p", PINNED, BASE), audit("v0.33.0", RELEASE, {**BASE, 50001: "included"}))
    assert [(c.pr, c.before) for c in diff.unverified] == [(50001, "not audited")]
    assert diff.gained == ()


def test_malformed_audit_docs_are_named() -> None:
    with pytest.raises(monitor.AuditDocError, match="pinned: fixes"):
        monitor.diff_audits({"commit": PINNED}, audit("v", RELEASE, BASE))
    with pytest.raises(monitor.AuditDocError, match=r"other: fixes\[0\]"):
        monitor.diff_audits(audit("p", PINNED, BASE), {"commit": RELEASE, "fixes": [{"pr": "1"}]})
    with pytest.raises(monitor.AuditDocError, match="other: commit"):
        monitor.diff_audits(audit("p", PINNED, BASE), {"fixes": []})


@pytest.mark.parametrize(
    ("pinned_v", "release_v", "release_states", "release_commit", "bump", "reason"),
    [
        ("0.29.0", "0.33.0", {**BASE, 50001: "included"}, RELEASE, True, "contains #50001"),
        ("0.29.0", "0.33.0", {**BASE, 50001: "absent"}, RELEASE, False, "no fix the pinned commit lacks"),
        ("0.29.0", "0.29.0", {**BASE, 50001: "included"}, RELEASE, False, "not newer"),
        ("0.29.0", "0.28.1", {**BASE, 50001: "included"}, RELEASE, False, "not newer"),
        ("0.29.0", "0.33.0rc1", {**BASE, 50001: "included"}, RELEASE, False, "not a final release"),
        ("0.29.0", "0.33.0", {**BASE, 50001: "included"}, PINNED[:9], False, "is the pinned commit"),
        ("0.29.0", "0.33.0", {**BASE, 50001: "included", 40082: "reverted"}, RELEASE, False, "loses fixes"),
        # losing a fix the profile does not require is reported, not blocking
        ("0.29.0", "0.33.0", {**BASE, 50001: "included", 48245: "reverted"}, RELEASE, True, "contains #50001"),
    ],
)
def test_bump_decision(
    pinned_v: str, release_v: str, release_states: dict[int, str], release_commit: str, bump: bool, reason: str
) -> None:
    pinned = audit("profiles/cu130.yaml", PINNED, {**BASE, 50001: "absent"}, required=(40082,))
    diff = monitor.diff_audits(pinned, audit(f"v{release_v}", release_commit, release_states))
    decision = monitor.decide_bump(diff, pinned_v, release_v)
    assert decision.bump is bump
    assert reason in decision.reason


def test_pr_body_carries_the_audit_diff_and_main_only_fixes() -> None:
    pinned = audit("profiles/cu130.yaml", PINNED, {**BASE, 50001: "absent", 50007: "absent", 48245: "included"})
    release = audit("v0.33.0", RELEASE, {**BASE, 50001: "included", 50007: "absent", 48245: "reverted"})
    on_main = audit("main", MAIN, {**BASE, 50001: "included", 50007: "included"})
    diff = monitor.diff_audits(pinned, release)
    decision = monitor.decide_bump(diff, "0.29.0", "0.33.0")
    body = monitor.render_pr_body("cu130", "0.29.0", "0.33.0", diff, decision, monitor.diff_audits(pinned, on_main))
    assert body.startswith("## Bump `cu130`: vLLM 0.29.0 -> 0.33.0")
    assert "Decision: **bump**" in body
    fixes_added = body.split("### Fixes the release adds")[1].split("###")[0]
    assert "| #50001 | fix 50001 | absent | included | v0.33.0 | - |" in fixes_added
    assert "#48245" in body.split("### Regressions")[1].split("###")[0]
    unreleased = body.split("### On main, not yet in a release")[1]
    assert "#50007" in unreleased and "#50001" not in unreleased
    assert f"`{RELEASE}`" in body and "### Before merging" in body


def test_bump_profile_text_changes_only_the_pin(tmp_path: Path) -> None:
    text = (ROOT / "profiles" / "cu130.yaml").read_text()
    wheel = ("https://files.example/vllm-0.33.0-cp38-abi3-manylinux_2_28_aarch64.whl", "ab" * 32)
    new = monitor.bump_profile_text(text, old_version="0.29.0", version="0.33.0", commit=RELEASE, wheel=wheel)
    old_doc, new_doc = yaml.safe_load(text), yaml.safe_load(new)
    assert new_doc["vllm"]["version"] == "0.33.0" and new_doc["vllm"]["commit"] == RELEASE
    assert new_doc["build"]["wheel"] == {"url": wheel[0], "sha256": wheel[1]}
    assert "0.33.0" in new_doc["description"]
    # nothing else moved: same keys and values elsewhere, comments kept, same line count
    for key in ("cuda", "torch", "flashinfer", "verify", "serve", "image", "patches"):
        assert new_doc[key] == old_doc[key]
    assert new.count("\n") == text.count("\n")
    assert [ln for ln in new.splitlines() if ln.lstrip().startswith("#")] == [
        ln for ln in text.splitlines() if ln.lstrip().startswith("#")
    ]


def test_bump_profile_text_source_strategy_and_refusals() -> None:
    text = (ROOT / "profiles" / "cu129.yaml").read_text()
    new = monitor.bump_profile_text(text, old_version="0.29.0", version="0.33.0", commit=RELEASE)
    doc = yaml.safe_load(new)
    assert doc["vllm"]["commit"] == RELEASE and doc["cuda"]["version"] == yaml.safe_load(text)["cuda"]["version"]
    with pytest.raises(ValueError, match="40-hex"):
        monitor.bump_profile_text(text, old_version="0.29.0", version="0.33.0", commit="main")
    with pytest.raises(ValueError, match=r"build\.wheel\.url"):
        monitor.bump_profile_text(text, old_version="0.29.0", version="0.33.0", commit=RELEASE, wheel=("u", "s"))


def test_pick_aarch64_wheel() -> None:
    doc = {"files": [
        {"filename": "vllm-0.33.0.tar.gz", "url": "u0", "hashes": {"sha256": "0"}},
        {"filename": "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl", "url": "u1", "hashes": {"sha256": "1"}},
        {"filename": "vllm-0.33.0-cp38-abi3-manylinux_2_28_aarch64.whl", "url": "u2", "hashes": {"sha256": "2"},
         "yanked": True},
        {"filename": "vllm-0.33.0-cp38-abi3-manylinux_2_31_aarch64.whl", "url": "u3", "hashes": {"sha256": "3"}},
        {"filename": "vllm-0.33.01-cp38-abi3-manylinux_2_31_aarch64.whl", "url": "u4", "hashes": {"sha256": "4"}},
    ]}
    assert monitor.pick_aarch64_wheel(doc, "0.33.0") == ("u3", "3")
    assert monitor.pick_aarch64_wheel(doc, "0.34.0") is None


# -- the CLI, with a real package index on loopback ---------------------------------------


@pytest.fixture
def simple_index() -> Iterator[str]:
    """A PEP 691 JSON simple index for `vllm` served over loopback HTTP."""
    doc = {"meta": {"api-version": "1.1"}, "name": "vllm", "files": [
        {"filename": "vllm-0.33.0-cp38-abi3-manylinux_2_28_aarch64.whl",
         "url": "https://files.example/vllm-0.33.0-cp38-abi3-manylinux_2_28_aarch64.whl",
         "hashes": {"sha256": "cd" * 32}},
    ]}

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            ok = self.path == "/simple/vllm/" and "application/vnd.pypi.simple.v1+json" in self.headers.get("Accept", "")
            body = json.dumps(doc).encode() if ok else b"not found"
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
            self.end_headers()
            self.wfile.write(body)

    with Loopback(Handler) as server:
        yield f"{server.url}/simple"


def _write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc))
    return path


def _cu130_copy(tmp_path: Path) -> Path:
    """profiles/cu130.yaml copied to tmp_path/profiles/cu130.yaml, for the CLI to bump."""
    profile = tmp_path / "profiles" / "cu130.yaml"
    profile.parent.mkdir()
    shutil.copy(ROOT / "profiles" / "cu130.yaml", profile)
    return profile


def test_cli_bumps_a_wheel_profile(
    tmp_path: Path, simple_index: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = _cu130_copy(tmp_path)
    pinned = _write(tmp_path / "pinned.json", audit(str(profile), PINNED, {**BASE, 50001: "absent"}))
    release = _write(tmp_path / "release.json", audit("v0.33.0", RELEASE, {**BASE, 50001: "included"}))
    on_main = _write(tmp_path / "main.json", audit("main", MAIN, {**BASE, 50001: "included"}))
    monkeypatch.setenv("SPARK_IMAGES_PYPI_SIMPLE", simple_index)
    code = standalone([str(profile), "--pinned", str(pinned), "--release", str(release), "--main", str(on_main),
                       "--body", str(tmp_path / "body.md"), "--apply", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out)
    assert doc["bump"] is True and doc["applied"] is True
    assert doc["branch"] == "upstream-monitor/cu130-vllm-0.33.0"
    bumped = yaml.safe_load(profile.read_text())
    assert bumped["vllm"] == {**bumped["vllm"], "version": "0.33.0", "commit": RELEASE}
    assert bumped["build"]["wheel"]["sha256"] == "cd" * 32
    assert "#50001" in (tmp_path / "body.md").read_text()


def test_cli_no_bump_leaves_the_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = tmp_path / "cu129.yaml"
    shutil.copy(ROOT / "profiles" / "cu129.yaml", profile)
    before = profile.read_bytes()
    pinned = _write(tmp_path / "pinned.json", audit(str(profile), PINNED, BASE))
    release = _write(tmp_path / "release.json", audit("v0.33.0", RELEASE, BASE))
    code = standalone([str(profile), "--pinned", str(pinned), "--release", str(release), "--apply"])
    out, _ = capsys.readouterr()
    assert code == 0
    assert out.startswith("cu129: no bump: release 0.33.0 contains no fix the pinned commit lacks")
    assert profile.read_bytes() == before


def test_cli_bad_audit_file_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code = standalone([str(ROOT / "profiles" / "cu130.yaml"), "--pinned", str(bad), "--release", str(bad)])
    _, err = capsys.readouterr()
    assert code == 2
    assert "--pinned" in err and "not JSON" in err and "Traceback" not in err


# -- every new release and rc, effect-unproven, discovered PRs ----------------------------


def test_effect_unproven_decides_nothing() -> None:
    pinned = audit("p", PINNED, {**BASE, 50001: "absent", 50002: "included"})
    release = audit("v0.33.0", RELEASE, {**BASE, 50001: "effect-unproven", 50002: "effect-unproven"})
    diff = monitor.diff_audits(pinned, release)
    assert diff.gained == () and diff.lost == ()
    assert [(c.pr, c.after) for c in diff.unverified] == [(50001, "effect-unproven"), (50002, "effect-unproven")]
    assert not monitor.decide_bump(diff, "0.29.0", "0.33.0").bump


def test_choose_the_newest_final_that_gains_a_fix_rcs_never_bump() -> None:
    pinned = audit("p", PINNED, {**BASE, 50001: "absent", 50002: "absent"}, required=(40082,))
    releases = [
        ("0.30.0", audit("v0.30.0", "1" * 40, {**BASE, 50001: "included", 50002: "absent"}), "r30"),
        ("0.31.0", audit("v0.31.0", "2" * 40, {**BASE, 40082: "reverted", 50001: "included", 50002: "included"}), "r31"),
        ("0.32.0rc0", audit("v0.32.0rc0", "3" * 40, {**BASE, 50001: "included", 50002: "included"}), "rc"),
    ]
    chosen, candidates = monitor.choose_release(pinned, releases, "0.29.0")
    assert chosen is not None and chosen.version == "0.30.0"  # 0.31.0 loses the required #40082
    assert [c.decision.bump for c in candidates] == [True, False, False]
    assert "not a final release" in candidates[2].decision.reason
    body = monitor.render_pr_body("cu130", "0.29.0", chosen.version, chosen.diff, chosen.decision, others=candidates,
                                  discovered=[{"pr": 90103, "title": "[Quant] Route FP8 (#90103)", "commit": "ab" * 20,
                                               "evidence": "diff adds 'is_device_capability_family(120)'"}])
    rc_section = body.split("### In 0.32.0rc0")[1].split("###")[0]
    assert "#50002" in rc_section and "#50001" not in rc_section
    assert "### Spark-relevant PRs not in the knowledge base" in body and "#90103 `abababababab`" in body
    # nothing gains: the newest final is reported with its reason
    none, _ = monitor.choose_release(pinned, [("0.30.0", audit("v0.30.0", "1" * 40, {**BASE, 50001: "absent"}), "r")], "0.29.0")
    assert none is not None and not none.decision.bump


def test_cli_with_several_releases_and_discovered(
    tmp_path: Path, simple_index: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = _cu130_copy(tmp_path)
    pinned = _write(tmp_path / "pinned.json", audit(str(profile), PINNED, {**BASE, 50001: "absent"}))
    rc = _write(tmp_path / "rc.json", audit("v0.34.0rc0", "d" * 40, {**BASE, 50001: "included"}))
    release = _write(tmp_path / "release.json", audit("v0.33.0", RELEASE, {**BASE, 50001: "included"}))
    main_doc = audit("main", MAIN, {**BASE, 50001: "included"})
    main_doc["discovered"] = [{"pr": 90101, "title": "[Kernel] GB10 tuning (#90101)", "commit": "e" * 40,
                               "evidence": "subject names GB10 ('GB10')"}]
    on_main = _write(tmp_path / "main.json", main_doc)
    monkeypatch.setenv("SPARK_IMAGES_PYPI_SIMPLE", simple_index)
    code = standalone([str(profile), "--pinned", str(pinned), "--release", str(rc), "--release", str(release),
                       "--main", str(on_main), "--body", str(tmp_path / "body.md"), "--apply", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out)
    assert doc["bump"] is True and doc["release_version"] == "0.33.0"
    assert [(c["version"], c["bump"]) for c in doc["candidates"]] == [("0.34.0rc0", False), ("0.33.0", True)]
    assert doc["discovered"][0]["pr"] == 90101
    assert "#90101" in (tmp_path / "body.md").read_text()
    # only an rc (or nothing) new today: no bump, exit 0, the body still lists what the rc and main carry
    code = standalone([str(profile), "--pinned", str(pinned), "--release", str(rc), "--main", str(on_main),
                       "--body", str(tmp_path / "none.md"), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["bump"] is False and "no final release" in doc["decision"]["reason"]
    assert "#90101" in (tmp_path / "none.md").read_text()

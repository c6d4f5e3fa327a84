"""`audit --discover`, `kb add` and `kb export --format osv`, driven as the CLI,
over a real git history carrying each discovery signal once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from spark_images.audit import parse_knowledge
from spark_images.audit.discover import diff_evidence, findings, message_evidence, path_evidence
from spark_images.cli import main
from support.audit_histories import HistoryBuilder, VllmLike, filler_files, patch_id


@pytest.fixture(scope="module")
def spark_history(tmp_path_factory: pytest.TempPathFactory) -> HistoryBuilder:
    b = HistoryBuilder(tmp_path_factory.mktemp("discover") / "repo")
    b.commit("main", "[Core] Initial import (#100)", {"vllm/__init__.py": "", "CMakeLists.txt": 'set(ARCHS "9.0")\n'})
    for i in range(101, 111):
        b.commit("main", f"[Misc] Routine change {i} (#{i})", filler_files(i))
    b.tag("v0.22.0", "main")  # PyPI (the loopback index) lists 0.22.0
    b.commit("main", "[Kernel] Tune MoE configs for GB10 (#90101)", {"vllm/moe_gb10.json": "{}\n"}, name="subject")
    b.commit("main", "[Bugfix] Guard the attention backend (#90102)", {"vllm/attn.py": "X = 1\n"},
             body="Fixes a crash on the DGX Spark when the KV cache is large.", name="body")
    b.commit("main", "[Quant] Route FP8 per capability family (#90103)",
             {"vllm/fp8_route.py": "if current_platform.is_device_capability_family(120):\n    use_cutlass = True\n"},
             name="diff")
    b.commit("main", "[Build] Family targets for the FP4 kernels (#90104)",
             {"CMakeLists.txt": 'set(ARCHS "9.0")\ncuda_archs_loose_intersection(FP4_ARCHS "12.0f" "${CUDA_ARCHS}")\n'},
             name="cmake")
    b.commit("main", "[Docs] Mention 12.1a in a text file (#90105)", {"docs/arch.md": "targets: 12.1a\n"}, name="noise")
    b.commit("main", "[Kernel] New GEMM tile shapes (#90106)",
             {"csrc/quantization/cutlass_w8a8/c3x/scaled_mm_sm120_int8.cu": "// tiles\n"}, name="path")
    b.commit("main", "[Kernel] Integrate FlashInfer b12x MoE + FP4 GEMM for SM120/121 (#40082)", {"vllm/b12x.py": "B = 1\n"})
    b.commit("main", 'Revert "[Kernel] Tune MoE configs for GB10 (#90101)" (#90107)', {"vllm/moe_gb10.json": None})
    for i in range(111, 116):
        b.commit("main", f"[Misc] Routine change {i} (#{i})", filler_files(i))
    b.build()
    return b


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_discover_lists_each_signal_with_its_evidence(spark_history: HistoryBuilder, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "audit", "main", "--fix", "100", "--discover", "--since", "v0.22.0",
                         "--repo", str(spark_history.path), "--json")
    doc = json.loads(out)
    # #100 is not in the knowledge base: no commit to compare its change with, so not proven (exit 1)
    assert code == 1 and doc["fixes"][0]["state"] == "effect-unproven", err
    found = {d["pr"]: d for d in doc["discovered"]}
    # newest first; the KB's #40082, the revert, routine changes and a 12.1a outside CMake are not findings
    assert [d["pr"] for d in doc["discovered"]] == [90106, 90104, 90103, 90102, 90101]
    assert found[90101]["evidence"].startswith("subject names GB10")
    assert found[90102]["evidence"].startswith("body names DGX Spark ('DGX Spark'): Fixes a crash on the DGX Spark")
    assert found[90103]["evidence"] == ("diff adds 'is_device_capability_family(120)' in vllm/fp8_route.py: "
                                        "if current_platform.is_device_capability_family(120):")
    assert found[90104]["evidence"].startswith("diff adds '12.0f' in CMakeLists.txt")
    assert found[90106]["evidence"] == "touches the SM120 path csrc/quantization/cutlass_w8a8/c3x/scaled_mm_sm120_int8.cu"
    assert found[90103]["commit"] == spark_history.sha("diff")
    assert set(found[90101]) == {"pr", "title", "commit", "evidence"}
    assert doc["discover_range"] == f"v0.22.0..{spark_history.sha(spark_history.tips['main'])[:12]}"


def test_discover_defaults_to_the_previous_release_and_prints_words(spark_history: HistoryBuilder, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "audit", "main", "--fix", "100", "--discover", "--repo", str(spark_history.path))
    assert code == 1  # #100 itself is effect-unproven (see above)
    assert "discovered in v0.22.0.." in out and "5 Spark-relevant PR(s) not in the knowledge base" in out
    assert "#90103 " in out and "evidence: diff adds 'is_device_capability_family(120)'" in out
    # a range without Spark signals finds nothing, and says so
    code, out, _ = run(capsys, "audit", "main", "--fix", "100", "--discover", "--since", "HEAD~3",
                       "--repo", str(spark_history.path), "--json")
    assert code == 1 and json.loads(out)["discovered"] == []


def test_discover_bad_since_is_a_usage_error(spark_history: HistoryBuilder, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "audit", "main", "--discover", "--since", "no-such-ref", "--repo", str(spark_history.path))
    assert code == 2 and "--since no-such-ref: no such commit" in err and "Traceback" not in err
    code, _, err = run(capsys, "audit", "main", "--since", "v0.22.0", "--repo", str(spark_history.path))
    assert code == 2 and "--since needs --discover" in err


def test_signal_functions() -> None:
    assert message_evidence("[Kernel] sm_121 tile fix (#1)", "") is not None
    assert message_evidence("[Kernel] SM12x tile fix (#1)", "") is not None
    assert message_evidence("[Doc] consumer Blackwell notes (#1)", "") is not None
    assert message_evidence("[Kernel] sm_100 tile fix (#1)", "") is None
    assert message_evidence("[Misc] GB100 (#1)", "") is None
    assert diff_evidence([("cmake/utils.cmake", 'set(X "12.1a")')]) is not None
    assert diff_evidence([("vllm/x.py", 'ARCH = "12.1a"')]) is None
    assert diff_evidence([("vllm/x.py", "struct enable_sm120_family : K {}")]) is not None
    assert path_evidence(["vllm/model_executor/layers/flashinfer_sm120.py"]) is not None
    assert path_evidence(["csrc/attention/sm120_attn.cu"]) is None
    shas = [("a", "[Kernel] GB10 (#7)", "", []), ("b", "[Kernel] GB10 again (#7)", "", [])]
    assert [f.commit for f in findings(shas, {}, known=())] == ["a"]  # one finding per PR


def test_kb_add_drafts_an_entry_from_the_diff(spark_history: HistoryBuilder, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "kb", "add", "90103", "--repo", str(spark_history.path), "--json")
    assert code == 0, err
    draft = json.loads(out)
    entry = draft["entry"]
    assert entry["pr"] == 90103 and entry["title"] == "[Quant] Route FP8 per capability family"
    assert entry["area"] == "FP8" and entry["main_commit"] == spark_history.sha("diff")  # the full SHA
    assert entry["patch_id"] == patch_id(spark_history.path, spark_history.sha("diff"))
    assert entry["merged"] == entry["date"]
    assert parse_knowledge(yaml.safe_dump({"schema": 1, "fixes": [{**entry, "symptom": "s"}]})).fixes[0].main_commit == entry["main_commit"]
    assert entry["markers"][0] == {"path": "vllm/fp8_route.py",
                                   "contains": "if current_platform.is_device_capability_family(120):",
                                   "source": "drafted from the PR's diff (review before use)"}
    code, out, _ = run(capsys, "kb", "add", "#90104", "--repo", str(spark_history.path))
    assert code == 0 and out.startswith("# draft for #90104") and "area: NVFP4" in out and "12.0f" in out


def test_kb_add_refusals(spark_history: HistoryBuilder, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "kb", "add", "40082", "--repo", str(spark_history.path))
    assert code == 1 and "already in the knowledge base" in err
    code, _, err = run(capsys, "kb", "add", "99999", "--repo", str(spark_history.path))
    assert code == 2 and "no commit with a (#99999) subject" in err


OSV_SCHEMA = Path(__file__).parent / "data" / "osv-schema.json"


def test_kb_export_osv(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARK_IMAGES_KB")  # the shipped knowledge base
    code, out, _ = run(capsys, "kb", "export", "--format", "osv")
    assert code == 0
    records = json.loads(out)
    by_id = {r["id"]: r for r in records}
    rec = by_id["x_SPARK-VLLM-40923"]
    assert rec["modified"] == "2026-05-28T07:30:26Z" and rec["schema_version"]  # the entry's own date
    (affected,) = rec["affected"]
    assert affected["package"] == {"ecosystem": "PyPI", "name": "vllm", "purl": "pkg:pypi/vllm"}
    git_range = next(r for r in affected["ranges"] if r["type"] == "GIT")
    assert git_range["repo"] == "https://github.com/vllm-project/vllm"
    assert git_range["events"] == [{"introduced": "0"}, {"fixed": "6cc8577421f2c02b1a908a551e15d4e8fdd2ba49"}]
    assert {"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": "0.23.0"}]} in affected["ranges"]
    ours = rec["database_specific"]["spark_images"]
    assert (ours["pr"], ours["area"], ours["severity"], ours["patch_id"]) == (40923, "MoE", "high", "ad52f2b6d085cbd1a97fcd3a60f5f7024d88ca46")
    marker = by_id["x_SPARK-VLLM-41215"]["database_specific"]["spark_images"]["markers"][0]
    assert marker["hints"] == ["csrc/quantization/w8a8/cutlass/c3x/scaled_mm_sm120_fp8_dispatch.cuh"]
    assert by_id["x_SPARK-VLLM-39825"]["database_specific"]["spark_images"]["undone_by"] == [39959]
    # --output writes the same bytes, atomically; a later export is byte-identical
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1")  # the export's own time plays no part
    code, said, _ = run(capsys, "kb", "export", "--format", "osv", "--output", str(tmp_path / "osv.json"))
    assert code == 0 and f"wrote {len(records)} OSV records" in said
    assert (tmp_path / "osv.json").read_text() == out


def test_kb_export_osv_passes_the_osv_schema(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="the test extra (jsonschema) is not installed")
    monkeypatch.delenv("SPARK_IMAGES_KB")
    schema = json.loads(OSV_SCHEMA.read_text())
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    _code, out, _ = run(capsys, "kb", "export", "--format", "osv")
    records = json.loads(out)
    assert len(records) == 17
    for record in records:
        errors = [f"{record['id']}: {'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(record)]
        assert errors == []
    # the schema would refuse what earlier exports wrote: a 12-character prefix as a GIT event
    bad = json.loads(json.dumps(records[0]))
    bad["affected"][0]["ranges"][0]["events"][1]["fixed"] = bad["affected"][0]["ranges"][0]["events"][1]["fixed"][:12]
    assert not validator.is_valid(bad)


def test_kb_export_refuses_an_undated_entry_and_a_commit_not_in_the_clone(
    vllm_like: VllmLike, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kb = tmp_path / "kb.yaml"
    sha = vllm_like.sha("p40923")
    kb.write_text(f"schema: 1\nfixes:\n  - {{pr: 40923, title: t, area: MoE, severity: high, symptom: s, main_commit: {sha}}}\n")
    code, _, err = run(capsys, "kb", "export", "--format", "osv", "--kb", str(kb))
    assert code == 1 and f"{kb}: #40923.date: missing" in err
    kb.write_text(f"schema: 1\nfixes:\n  - {{pr: 40923, title: t, area: MoE, severity: high, symptom: s, main_commit: {sha[:10]}}}\n")
    code, _, err = run(capsys, "kb", "export", "--format", "osv", "--kb", str(kb))
    assert code == 1 and "main_commit" in err and "is not a full commit SHA" in err
    other = "6cc8577421f2c02b1a908a551e15d4e8fdd2ba49"
    kb.write_text("schema: 1\nfixes:\n  - {pr: 40923, title: t, area: MoE, severity: high, symptom: s, "
                  f"main_commit: {other}, date: '2026-05-28T07:30:26Z'}}\n")
    code, _, err = run(capsys, "kb", "export", "--format", "osv", "--kb", str(kb), "--repo", str(vllm_like.path))
    assert code == 1 and f"#40923.main_commit: {other} is not in {vllm_like.path}" in err


def test_kb_file_with_duplicate_keys_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kb = tmp_path / "kb.yaml"
    kb.write_text("schema: 1\nfixes:\n  - pr: 1\n    pr: 2\n    title: t\n    area: MoE\n    severity: high\n    symptom: s\n")
    code, _, err = run(capsys, "kb", "export", "--format", "osv", "--kb", str(kb))
    assert code == 1 and "duplicate key" in err and str(kb) in err

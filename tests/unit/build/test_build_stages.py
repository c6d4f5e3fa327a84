"""Fast tests of the typed build line: gates, failure causes, candidate vs promoted, --push.

The BuildKit outputs in tests/data/build/buildkit/ are real: captured from `docker buildx
build --progress plain` on the local engine, with pip pointed at an index host
that does not resolve (`nonexistent.invalid`) and at an HTTPS server with a
self-signed certificate (what a TLS-intercepting proxy looks like to pip).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spark_images.buildline import gates, serialise, summary
from spark_images.buildline.stages import (
    FAILED,
    PASSED,
    SKIPPED,
    Audited,
    Built,
    Gated,
    Locked,
    ScanKey,
    Scanned,
)
from spark_images.core.errors import EXIT_FINDING, EXIT_USAGE
from spark_images.engine import build as engine_build
from spark_images.engine import failures
from spark_images.release import lock
from support.build_helpers import CLI, DATA

DIGEST = "sha256:" + "ab" * 32
COMMIT = "98dff2a81d747d1dba01a47f939f48c3526d4206"
ROOT = Path(__file__).resolve().parents[3]


def _sample(name: str) -> list[str]:
    return (DATA / "buildkit" / name).read_text().splitlines()


# -- build failures classified by cause ----------------------------------------
def test_unresolvable_index_is_an_environment_problem_and_never_told_to_try_ca_cert() -> None:
    exc = engine_build.failed_build(1, _sample("pip-dns.txt"))
    assert exc.exit_code == EXIT_USAGE
    assert isinstance(exc, engine_build.BuildEnvironmentFailed) and exc.cause.kind == failures.DNS
    text = str(exc)
    assert "--ca-cert" not in text
    assert "DNS" in text
    # the real cause line, as BuildKit printed it, and pip's own ERROR line after it
    assert "`#5 17.93 WARNING: Retrying" in text and "Name or service not known" in text
    assert "`#5 25.56 ERROR: No matching distribution found for six==1.17.0`" in text


def test_certificate_failure_names_ca_cert() -> None:
    exc = engine_build.failed_build(1, _sample("pip-tls.txt"))
    assert exc.exit_code == EXIT_USAGE
    assert isinstance(exc, engine_build.BuildEnvironmentFailed) and exc.cause.kind == failures.TLS
    text = str(exc)
    assert "(fix: pass --ca-cert FILE" in text
    assert "CERTIFICATE_VERIFY_FAILED" in text and text.count("`#5 ") == 2


def test_a_missing_pin_alone_is_a_finding_with_the_step_error_quoted() -> None:
    # the DNS sample without the connection warnings: pip found the index and no such version
    lines = [line for line in _sample("pip-dns.txt") if "Retrying" not in line]
    exc = engine_build.failed_build(1, lines)
    assert exc.exit_code == EXIT_FINDING
    assert "#5 25.56 ERROR: No matching distribution found for six==1.17.0" in str(exc)


def test_a_registry_certificate_is_the_engines_trust_not_ca_cert() -> None:
    lines = [
        "#2 [internal] load metadata for registry.example.org/cuda:13",
        "#2 ERROR: failed to resolve source metadata for registry.example.org/cuda:13: failed to do request: "
        "tls: failed to verify certificate: x509: certificate signed by unknown authority",
        "ERROR: failed to solve: registry.example.org/cuda:13: failed to resolve source metadata",
    ]
    cause = failures.environment_cause(lines)
    assert cause is not None and cause.kind == failures.TLS_ENGINE
    assert "certs.d" in cause.fix and "only the build's RUN steps" in cause.fix


def test_unresolvable_registry_host_is_dns() -> None:
    lines = [
        "ERROR: failed to solve: nvidia/cuda@sha256:5dc1: failed to resolve source metadata for docker.io/nvidia/cuda: "
        "dial tcp: lookup registry-1.docker.io: no such host",
    ]
    cause = failures.environment_cause(lines)
    assert cause is not None and cause.kind == failures.DNS and "--ca-cert" not in cause.fix
    # the base could not be pulled: the line names the way to see the main job work here
    assert cause.base_pull and "nox -s acceptance" in cause.fix and "pinned base image" in cause.what


def test_a_step_that_cannot_reach_pypi_is_not_a_base_pull() -> None:
    cause = failures.environment_cause(_sample("pip-dns.txt"))
    assert cause is not None and not cause.base_pull and "acceptance" not in cause.fix


# -- gates ---------------------------------------------------------------------
def _scanned(verdict: str = "partial", missing: tuple[str, ...] = ()) -> Scanned:
    return Scanned(ScanKey(DIGEST, "0.1.0", "sm_121", ("vllm/_C*.so",)), "t", verdict, missing)


def _audited(status: str = PASSED, required: tuple[int, ...] = ()) -> Audited:
    return Audited(status, required, (), reason="no history" if status == SKIPPED else "")


def test_gates_stop_on_missing_native_code_and_pass_partial() -> None:
    assert gates.after_scan(_scanned("partial"), "sm_121") is None
    stop = gates.after_scan(_scanned("partial", ("vllm/_C.abi3.so: no native sm_121 code",)), "sm_121")
    assert stop is not None and stop.stage == "cubins" and "vllm/_C.abi3.so" in stop.reason
    for verdict in gates.NO_NATIVE_CODE:
        stop = gates.after_scan(_scanned(verdict), "sm_121")
        assert stop is not None and verdict in stop.reason


def _checked(*reasons: object) -> Scanned:
    import dataclasses

    from spark_images.check.inventory import Inventory
    from spark_images.check.verdict import CheckResult

    result = CheckResult("t", "oci-archive", "sm_121", DIGEST, Inventory(), [], {}, reasons=list(reasons))  # type: ignore[arg-type]
    return dataclasses.replace(_scanned(), check=result)


def test_a_broken_check_stops_the_line_for_any_reason_and_the_record_says_failed() -> None:
    """The verdict stage follows the verdict computed from content: a reason without a rule
    id (torch not installed) breaks the image as surely as a toolchain rule does."""
    from spark_images.check.rules import Reason, from_rule

    no_torch = Reason("broken", "", "torch", "torch: not installed, so vLLM cannot start")
    cpu_torch = from_rule("torch-no-cuda", "torch", torch="2.13.0", cuda="None", where="torch/version.py")
    bad_pin = from_rule("known-bad-pin", "nvidia-cutlass-dsl", package="nvidia-cutlass-dsl", version="4.5.0",
                        reason="illegal instruction on sm_121", fix="pin 4.4.2")  # fmt: skip
    no_moe = from_rule("no-native-moe-kernels", "vllm/_moe_C*.so", library="vllm/_moe_C*.so", what="not in the image")
    skipped = Gated(SKIPPED, "no sm_121 GPU")
    assert gates.after_check(_scanned()) is None  # no check at all: nothing to follow
    for reasons in ((no_torch,), (cpu_torch,), (bad_pin,), (no_torch, bad_pin, no_moe)):
        scanned = _checked(*reasons)
        assert scanned.check is not None and scanned.check.verdict == "broken"
        stop = gates.after_check(scanned)
        assert stop is not None and stop.stage == "verdict", reasons
        for reason in reasons:
            assert (reason.line() in stop.reason) == (reason.impact == "broken"), (reason, stop.reason)
        assert not gates.lock_decision(_audited(), scanned, skipped).allowed
        section = serialise.verdict_section(scanned)
        assert section is not None and section["status"] == FAILED and section["verdict"] == "broken"
        assert section["reason"] == stop.reason
    # degraded: the line goes on, the stage passed, its reasons are the stage's warnings
    degraded = _checked(no_moe)
    assert gates.after_check(degraded) is None and gates.lock_decision(_audited(), degraded, skipped).allowed
    section = serialise.verdict_section(degraded)
    assert section is not None and section["status"] == PASSED and "reason" not in section
    assert section["verdict"] == "degraded" and section["warnings"] == [no_moe.line()]
    ready = serialise.verdict_section(_checked())
    assert ready is not None and ready["status"] == PASSED and ready["verdict"] == "ready" and ready["warnings"] == []


def test_the_verdict_stage_is_failed_even_when_the_cubin_gate_stopped_the_line_first() -> None:
    """The record never reads `passed` beside a `broken` verdict, whichever gate stopped the line."""
    import dataclasses

    from spark_images.check.rules import from_rule

    main = from_rule("vllm-no-native-main", "vllm/_C.abi3.so", what="vllm/_C.abi3.so: no native sm_121 code", gpu="sm_121")
    scanned = dataclasses.replace(_checked(main), missing_required=("vllm/_C.abi3.so: no native sm_121 code",))
    stop = gates.after_scan(scanned, "sm_121")
    assert stop is not None and stop.stage == "cubins"
    results = serialise.Results(scanned=scanned, stop=stop)
    doc = serialise.sections(results)
    assert doc["cubins"]["status"] == FAILED
    assert doc["verdict"]["status"] == FAILED and "[vllm-no-native-main]" in doc["verdict"]["reason"]
    rows = {name: (status, detail) for name, status, detail in summary.rows(doc)}
    assert rows["verdict"][0] == FAILED and "[vllm-no-native-main]" in rows["verdict"][1]


def test_the_cubins_section_is_the_typed_reports_json() -> None:
    """`serialise` reads the cubin report itself (no JSON copy rides on `Scanned`): the section is
    the status, the report's JSON, then what the gate asked, as when the scan handed over its JSON."""
    import dataclasses

    from spark_images.cubins import verdict as v
    from spark_images.cubins.report import CubinReport, Library, Unit

    gpu = v.parse_gpu("sm_121")
    native = Library("vllm/_C.abi3.so", "shared-object", [Unit("fb0", v.NATIVE, ("sm_121a",), ("compute_121",))])
    moe = Library("vllm/_moe_C.abi3.so", "shared-object", [Unit("fb0", v.MISSING, ("sm_90",), ())])
    globs = ("vllm/_C*.so", "vllm/_moe_C*.so")
    report = CubinReport("/b/image.oci.tar", gpu, [native, moe], ["vllm/_C.abi3.so", "vllm/_moe_C.abi3.so"], globs)
    key = ScanKey(DIGEST, "0.1.0", "sm_121", globs)
    scanned = Scanned(key, report.target, report.verdict, tuple(report.missing_required), report=report)

    def before(stop: gates.Stop | None) -> dict[str, Any]:  # what the section was made of the scan's JSON
        doc: dict[str, Any] = {"status": FAILED if stop else PASSED, **({"reason": stop.reason} if stop else {})}
        doc.update({k: val for k, val in report.to_json().items() if k not in ("status", "reason")})
        doc.update(required=list(globs), key=key.to_json(), target=report.target)
        return doc

    stop = gates.after_scan(scanned, "sm_121")
    assert stop is not None and "vllm/_moe_C.abi3.so: no native sm_121 code" in stop.reason
    failed = serialise.sections(serialise.Results(scanned=scanned, stop=stop))["cubins"]
    assert json.dumps(failed) == json.dumps(before(stop))  # not sorted: the order is the same too
    assert failed["libraries"][1]["path"] == "vllm/_moe_C.abi3.so" and failed["missing_required"] == [stop.reason]
    passed = dataclasses.replace(scanned, missing_required=())
    assert json.dumps(serialise.cubins_section(passed)) == json.dumps(before(None))
    # a scan without its report (a stand-in in a test) has only what the gate asked
    bare = serialise.cubins_section(dataclasses.replace(passed, report=None))
    assert list(bare) == ["status", "required", "key", "target"]


def test_lock_decision() -> None:
    skipped = Gated(SKIPPED, "no sm_121 GPU")
    assert gates.lock_decision(_audited(), _scanned(), skipped).allowed
    assert gates.lock_decision(_audited(SKIPPED), _scanned(), skipped).allowed
    blocked = gates.lock_decision(_audited(SKIPPED, (40082,)), _scanned(), skipped)
    assert not blocked.allowed and "#40082" in blocked.reason
    assert not gates.lock_decision(_audited(), _scanned(), Gated(FAILED, "incoherent")).allowed
    assert gates.after_coherence(Gated(FAILED, "incoherent")) is not None
    assert gates.after_coherence(skipped) is None


def _built() -> Built:
    return Built(repository="127.0.0.1:5000/spark-vllm", digest=DIGEST, config_digest=DIGEST,
                 oci_archive=Path("/nonexistent.oci.tar"), local_image="spark-images/cu130:build",
                 source_date_epoch=1767225600, source_date_epoch_from="profile pin", platform="linux/arm64",
                 emulated=True, build_seconds=1.0)  # fmt: skip


def test_the_lock_section_is_serialised_from_the_typed_result(tmp_path: Path) -> None:
    """The line keeps a `Locked`, not a section: `serialise` writes the very section it wrote before
    (same keys, same order, same values), whether the entry was written or not."""
    from spark_images.buildline import pipeline, steps

    path = tmp_path / "images.lock.json"
    line = pipeline.Line(pipeline.BuildOptions(profile=ROOT / "profiles" / "cu130.yaml", lock_path=path), lambda _: None)
    v = steps.validate(line.opts.profile, lambda _: None)
    skipped = Gated(SKIPPED, "no sm_121 GPU")
    assert line.write_lock(v, _audited(), _built(), _scanned(), skipped)
    assert line.results.locked == Locked(PASSED, path=path, image=f"127.0.0.1:5000/spark-vllm@{DIGEST}", state="candidate")
    section = serialise.sections(line.results)["lock"]
    # the section the lock stage built itself before: stage("passed", path=..., image=..., state=...)
    before = {"status": "passed", "path": str(path), "image": f"127.0.0.1:5000/spark-vllm@{DIGEST}", "state": "candidate"}
    assert json.dumps(section) == json.dumps(before)  # not sorted: the order is the same too
    assert json.loads(path.read_text())["images"]["cu130"]["image"] == section["image"]

    blocked = pipeline.Line(line.opts, lambda _: None)
    assert not blocked.write_lock(v, _audited(SKIPPED, (40082,)), _built(), _scanned(), skipped)
    reason = "not written: the profile requires fixes #40082 and the audit did not run"
    assert blocked.results.locked == Locked(SKIPPED, reason)
    assert json.dumps(serialise.sections(blocked.results)["lock"]) == json.dumps({"status": "skipped", "reason": reason})
    # the line's result reads the lock's reason from the serialised section, as before
    assert blocked.finish(EXIT_FINDING, False).record.sections["result"]["reason"] == reason


# -- candidate vs promoted -------------------------------------------------------
def _entry(**over: Any) -> dict[str, Any]:
    doc = lock.make_entry(
        profile_path="profiles/cu130.yaml", repository="127.0.0.1:5000/spark-vllm", digest=DIGEST,
        plan={"vllm_commit": COMMIT, "vllm_version": "0.29.0", "cuda_version": "13.0.2", "cuda_line": "cu130",
              "arch_list": "12.0f", "required_fixes": [40082]},
        fixes_included=[40082, 38126], audit={"status": "passed"}, cubins={"verdict": "partial", "gpu": "sm_121"},
        coherence={"status": "skipped", "reason": "no sm_121 GPU"}, source_date_epoch=1767225600,
    )  # fmt: skip
    doc.update(over)
    return doc


def test_build_writes_a_candidate_and_only_promote_makes_it_promoted(tmp_path: Path) -> None:
    entry = _entry()
    assert entry["state"] == "candidate" and entry["fixes_required"] == [40082]
    with pytest.raises(ValueError, match="did not pass"):
        lock.promote(entry)  # its own coherence gate was skipped
    spark = {"status": "passed", "image": f"127.0.0.1:5000/spark-vllm@{DIGEST}"}
    with pytest.raises(ValueError, match="not of this digest"):
        lock.promote(entry, {**spark, "image": "127.0.0.1:5000/spark-vllm@sha256:" + "0" * 64})
    with pytest.raises(ValueError, match="assume-gpu"):
        lock.promote(entry, {**spark, "assumed_gpu": True})
    promoted = lock.promote(entry, spark)
    assert promoted["state"] == "promoted" and promoted["coherence"] == {"status": "passed"}
    assert entry["state"] == "candidate"  # a copy
    assert lock.entry_problems(promoted, "f", "cu130") == []
    # a promoted entry whose gate did not pass breaks the schema
    assert any("state" in p.field for p in lock.entry_problems({**promoted, "coherence": entry["coherence"]}, "f", "x"))
    # a rebuild to the same digest keeps the promotion and the tags; another digest is a new candidate
    path = tmp_path / "images.lock.json"
    lock.update_entry(path, "cu130", {**promoted, "tags": ["cu130"]})
    kept = lock.record_candidate(path, "cu130", entry)
    assert kept["state"] == "promoted" and kept["tags"] == ["cu130"]
    other = lock.record_candidate(path, "cu130", _entry(digest="sha256:" + "cd" * 32, image="127.0.0.1:5000/spark-vllm@sha256:" + "cd" * 32))
    assert other["state"] == "candidate" and other["tags"] == []
    assert json.loads(path.read_text())["images"]["cu130"]["state"] == "candidate"


# -- --push takes a repository only ------------------------------------------------
@pytest.mark.parametrize(
    ("target", "what"),
    [("127.0.0.1:5000/spark-images-test/x:cu130", "tag 'cu130'"), ("127.0.0.1:5000/x@sha256:" + "0" * 64, "digest")],
)
def test_push_with_a_tag_or_digest_is_a_usage_error_naming_publish(target: str, what: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CLI, "build", str(ROOT / "profiles" / "cu130.yaml"), "--push", target,
         "--lock", str(tmp_path / "l.json"), "--build-dir", str(tmp_path / "b")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert what in out and "spark-images publish" in out and "never creates a tag" in out
    assert "Traceback" not in out
    assert not (tmp_path / "b").exists() and not (tmp_path / "l.json").exists()



"""Log signatures and backend parsing on real-looking vLLM lines."""

from __future__ import annotations

from types import ModuleType

import pytest

from spark_images.coherence import signatures
from spark_images.coherence.signatures import BackendReport, LogScan, backend_mismatches


@pytest.mark.parametrize(
    ("line", "name"),
    [
        ("NotImplementedError: No compiled nvfp4 mm kernel for SM 121.", "nvfp4-kernel-missing"),
        ("RuntimeError: CUDA error: no kernel image is available for execution on the device",
         "no-kernel-image"),
        ("RuntimeError: Failed to run cutlass FP4 gemm on sm120. Error: Error Internal", "cutlass-fp4-gemm"),
        ("[cutlass_gemm_caller.cuh:62] cutlass_gemm_caller failed: Error Internal", "cutlass-gemm-caller"),
        ("ptxas fatal   : Value 'sm_121a' is not defined for option 'gpu-name'", "triton-ptxas-too-old"),
        ("triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 132000, "
         "Hardware limit: 101376", "shared-memory-limit"),
        ("torch.AcceleratorError: CUDA error: an illegal memory access was encountered", "cuda-fault"),
        ("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.", "engine-dead"),
        ("vllm serve: error: unrecognized arguments: --linear-backend marlin", "serve-usage-error"),
        ("vllm serve: error: argument --moe-backend: invalid choice: 'b12x' (choose from auto, marlin)",
         "serve-usage-error"),
    ],
)  # fmt: skip
def test_fatal_lines(line: str, name: str) -> None:
    hits = signatures.scan_line(f"(EngineCore_DP0 pid=87) ERROR 12-01 04:13:01 [core.py:866] {line}")
    assert [h.name for h in hits if h.severity == "fatal"] == [name]


def test_degraded_and_clean_lines() -> None:
    fallback = ("Your GPU does not have native support for FP4 computation but FP4 quantization is "
                "being used. Weight-only FP4 compression will be used leveraging the Marlin kernel.")  # fmt: skip
    assert [h.severity for h in signatures.scan_line(fallback)] == ["degraded"]
    unknown = "WARNING [envs.py:1687] Unknown vLLM environment variable detected: VLLM_FLASHINFER_MOE_BACKEND"
    assert [h.name for h in signatures.scan_line(unknown)] == ["unknown-env-var"]
    assert signatures.scan_line("INFO: Application startup complete.") == []
    assert signatures.scan_line('INFO: 127.0.0.1:5 - "GET /health HTTP/1.1" 200') == []


def test_backend_parsing_and_mismatch() -> None:
    report = BackendReport()
    report.feed("(EngineCore_DP0 pid=9) INFO [nvfp4.py:331] Using 'MARLIN' NvFp4 MoE backend out of "
                "potential backends: ['FLASHINFER_TRTLLM', 'MARLIN'].")  # fmt: skip
    report.feed("INFO [__init__.py:154] Selected FlashInferB12xNvFp4LinearKernel for ModelOptNvFp4LinearMethod")
    assert report.moe == {"NvFp4": "marlin"}
    assert report.linear == {"ModelOptNvFp4LinearMethod": "flashinfer_b12x"}
    problems = backend_mismatches(report, "flashinfer_b12x", "flashinfer-b12x")
    assert len(problems) == 1 and "ran marlin" in problems[0]
    assert backend_mismatches(report, "auto", "auto") == []
    assert backend_mismatches(report, "marlin", "flashinfer_b12x") == []


def test_enum_and_kernel_names_map_to_flag_values() -> None:
    assert signatures.moe_backend_from_enum("VLLM_CUTLASS") == "cutlass"
    assert signatures.moe_backend_from_enum("FLASHINFER_CUTLASS") == "flashinfer_cutlass"
    assert signatures.linear_backend_from_kernel("MarlinNvFp4LinearKernel") == "marlin"
    assert signatures.linear_backend_from_kernel("FlashInferCutlassNvFp4LinearKernel") == "flashinfer_cutlass"
    assert signatures.linear_backend_from_kernel("CutlassFP8ScaledMMLinearKernel") == "cutlass"


def test_log_scan_keeps_first_hit_and_prefers_the_root_cause() -> None:
    scan = LogScan(tail_lines=3)
    scan.feed("RuntimeError: Engine core initialization failed. See root cause above.")
    scan.feed("NotImplementedError: No compiled nvfp4 mm kernel for SM 121.")
    scan.feed("NotImplementedError: No compiled nvfp4 mm kernel for SM 121 (again)")
    for i in range(5):
        scan.feed(f"line {i}")
    assert [h.name for h in scan.hits] == ["engine-dead", "nvfp4-kernel-missing"]
    root = scan.root_cause()
    assert root is not None and root.name == "nvfp4-kernel-missing"
    assert scan.tail == ["line 2", "line 3", "line 4"]


@pytest.mark.parametrize(
    ("line", "moe", "linear"),
    [
        ("(EngineCore pid=207) INFO 04-19 10:19:23 [__init__.py:683] Using "
         "FlashInferCutlassNvFp4LinearKernel for NVFP4 GEMM", {}, {"NVFP4 GEMM": "flashinfer_cutlass"}),
        ("(Worker_TP0 pid=42) INFO 06-14 04:57:13 [fp8.py:419] Using MARLIN Fp8 MoE backend out of "
         "potential backends: ['AITER', 'FLASHINFER_TRTLLM', 'MARLIN'].", {"Fp8": "marlin"}, {}),
        ("INFO [nvfp4.py:209] Using 'VLLM_CUTLASS' NvFp4 MoE backend out of potential backends: []",
         {"NvFp4": "cutlass"}, {}),
        ("INFO Using TritonExperts MoE backend", {}, {}),
        ("INFO [cuda.py:368] Using FLASHINFER attention backend out of potential backends: ['FLASHINFER']",
         {}, {}),
    ],
)  # fmt: skip
def test_backend_line_variants(line: str, moe: dict[str, str], linear: dict[str, str]) -> None:
    report = BackendReport()
    report.feed(line)
    assert (report.moe, report.linear) == (moe, linear)


@pytest.mark.parametrize(
    ("mode", "asked", "mismatch", "degraded"),
    [("coherent", "flashinfer_b12x", False, False), ("mismatch", "flashinfer_b12x", True, False),
     ("degraded-marlin", "flashinfer_b12x", True, True), ("degraded-marlin", "marlin", False, True)],
)  # fmt: skip
def test_stand_in_start_up_log_is_read_as_vllm_s(
    fake_vllm: ModuleType, capsys: pytest.CaptureFixture[str], mode: str, asked: str, mismatch: bool,
    degraded: bool,
) -> None:
    fake_vllm.startup_log({"model": "m"}, asked, asked, mode)
    scan = LogScan()
    for line in capsys.readouterr().out.splitlines():
        scan.feed(line)
    assert scan.fatal() == []
    assert bool(backend_mismatches(scan.backends, asked, asked)) is mismatch
    assert bool(scan.degraded()) is degraded


@pytest.mark.parametrize(
    ("mode", "signature"),
    [("crash-nvfp4", "nvfp4-kernel-missing"), ("crash-cutlass-fp4", "cutlass-fp4-gemm"),
     ("crash-no-kernel", "no-kernel-image"), ("crash-ptxas", "triton-ptxas-too-old"),
     ("crash-fp8-cutlass", "cutlass-gemm-caller")],
)  # fmt: skip
def test_stand_in_crash_logs_name_their_root_cause(
    fake_vllm: ModuleType, capsys: pytest.CaptureFixture[str], mode: str, signature: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        fake_vllm.crash(mode)
    assert exc.value.code == 1
    scan = LogScan()
    for line in capsys.readouterr().out.splitlines():
        scan.feed(line)
    root = scan.root_cause()
    assert root is not None and root.name == signature
    assert {h.name for h in scan.fatal()} == {signature, "engine-dead"}

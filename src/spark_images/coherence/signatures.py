"""The vLLM log signature table and backend parsing (pure).

Every line a served container prints goes through `scan_line`: a fatal
signature fails the combination at once (the image lacks Spark code or a
kernel broke), a degraded one is a warning (it serves, but not what was
asked). `BackendReport` collects which MoE backend and which linear kernel
really ran, so a request for b12x that silently lands on Marlin is flagged.
Sources: reference/failure-signatures.md and the upstream issues it cites.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

Severity = Literal["fatal", "degraded"]


@dataclass(frozen=True)
class Signature:
    name: str
    severity: Severity
    pattern: re.Pattern[str]
    meaning: str
    seen_in: str = ""


def _sig(name: str, severity: Severity, regex: str, meaning: str, seen_in: str = "") -> Signature:
    return Signature(name, severity, re.compile(regex, re.IGNORECASE), meaning, seen_in)


SIGNATURES: tuple[Signature, ...] = (
    _sig(
        "nvfp4-kernel-missing",
        "fatal",
        r"No compiled nvfp4 mm kernel",
        "the wheel was built without the SM120 FP4 kernels (arch list without 12.0f/12.1a)",
        "vllm#41738, vllm#36835",
    ),
    _sig(
        "no-kernel-image",
        "fatal",
        r"no kernel image is available for execution on the device",
        "no cubin for this GPU and no PTX to JIT",
        "vllm#20748",
    ),
    _sig(
        "sm120-only-guard",
        "fatal",
        r"This kernel only supports sm120",
        "a narrow sm_120 guard trapped on sm_121",
    ),
    _sig(
        "torch-too-old",
        "fatal",
        r"Minimum and Maximum cuda capability supported by this version of PyTorch",
        "torch does not know compute capability 12.1",
        "vllm#31588",
    ),
    _sig(
        "cutlass-fp4-gemm",
        "fatal",
        r"Failed to (?:run|initialize) cutlass FP4 gemm|Failed to initialize GEMM",
        "a CUTLASS FP4 tile needs more shared memory than GB10 has (99 KiB)",
        "vllm#30163, vllm#24377, vllm#28110",
    ),
    _sig(
        "cutlass-gemm-caller",
        "fatal",
        r"cutlass_gemm_caller.*(?:Error Internal|Invalid status)",
        "CUTLASS FP8 GEMM failure at start-up profiling",
        "vllm#40758, vllm#43367",
    ),
    _sig(
        "triton-ptxas-too-old",
        "fatal",
        r"Value 'sm_121a?' is not defined for option 'gpu-name'",
        "Triton's bundled ptxas predates GB10; set TRITON_PTXAS_PATH to the CUDA ptxas",
        "triton#8539",
    ),
    _sig(
        "target-without-suffix",
        "fatal",
        r"not supported on \.target 'sm_121'",
        "code compiled for sm_121 without the a/f suffix",
    ),
    _sig(
        "shared-memory-limit",
        "fatal",
        r"out of resource: shared memory",
        "a kernel tuned for datacenter shared memory (GB10 limit 101376 bytes)",
        "triton#8182",
    ),
    _sig(
        "flashinfer-arch-detection",
        "fatal",
        r"No supported CUDA architectures found for major versions",
        "FlashInfer JIT could not match the GPU architecture",
    ),
    _sig(
        "cuda-fault",
        "fatal",
        r"an illegal memory access was encountered|illegal instruction was encountered"
        r"|CUDA error: illegal instruction|misaligned address",
        "asynchronous CUDA fault (often at graph capture or under concurrency)",
        "flashinfer#2884, vllm#38208",
    ),
    _sig(
        "engine-dead",
        "fatal",
        r"EngineDeadError|Engine core initialization failed",
        "the engine died; the cause is above it in the log",
    ),
    _sig(
        "serve-usage-error",
        "fatal",
        r"error: (?:unrecognized arguments|argument --[\w-]+: invalid choice)",
        "this vLLM does not know a flag or value of the combination (e.g. --linear-backend "
        "before v0.22, b12x before v0.29)",
    ),
    _sig(
        "marlin-fp4-fallback",
        "degraded",
        r"does not have native support for FP4 computation",
        "silent fallback to weight-only Marlin: the image lacks native FP4 code for sm_121",
        "vllm#50925",
    ),
    _sig(
        "unknown-env-var",
        "degraded",
        r"Unknown vLLM environment variable detected",
        "a removed VLLM_* variable is ignored; use --moe-backend / --linear-backend",
    ),
    _sig(
        "deprecated",
        "degraded",
        r"is deprecated and will be removed",
        "a setting that is going away",
    ),
)


@dataclass(frozen=True)
class SignatureHit:
    name: str
    severity: Severity
    meaning: str
    line: str
    seen_in: str = ""

    def to_json(self) -> dict[str, str]:
        doc = {"signature": self.name, "severity": self.severity, "meaning": self.meaning}
        doc["line"] = self.line[:500]
        if self.seen_in:
            doc["seen_in"] = self.seen_in
        return doc


def scan_line(line: str) -> list[SignatureHit]:
    """All signatures that one log line matches."""
    return [
        SignatureHit(s.name, s.severity, s.meaning, line.strip(), s.seen_in)
        for s in SIGNATURES
        if s.pattern.search(line)
    ]


# --- which backend really ran -------------------------------------------------------------

# `Using 'FLASHINFER_CUTLASS' NvFp4 MoE backend out of potential backends: [...]`, and without
# the quotes on other quantisations: `Using MARLIN Fp8 MoE backend out of potential backends`.
_MOE_RE = re.compile(r"Using '?([A-Za-z0-9_]+)'? (\w+) MoE backend out of potential backends")
# `Selected FlashInferB12xNvFp4LinearKernel for ModelOptNvFp4LinearMethod` (the kernel oracle),
# `Using FlashInferCutlassNvFp4LinearKernel for NVFP4 GEMM` (the same choice, other releases).
_LINEAR_RE = re.compile(r"(?:Selected|Using) (\w+Kernel) for (\w+(?: GEMM)?)")
# the degraded `marlin-fp4-fallback` signature's own pattern (one text, one place)
_MARLIN_FALLBACK_RE = next(s.pattern for s in SIGNATURES if s.name == "marlin-fp4-fallback")

# Kernel class name prefixes -> the `--linear-backend` value that selects them. Longest
# prefixes first, so FlashInferB12x is not read as FlashInfer + something.
_LINEAR_PREFIXES: tuple[tuple[str, str], ...] = (
    ("FlashInferB12x", "flashinfer_b12x"),
    ("FlashInferCutlass", "flashinfer_cutlass"),
    ("FlashInferTrtllm", "flashinfer_trtllm"),
    ("FlashInferTRTLLM", "flashinfer_trtllm"),
    ("FlashInferCudnn", "flashinfer_cudnn"),
    ("FlashInferCuteDsl", "flashinfer_cutedsl"),
    ("FlashInferCuteDSL", "flashinfer_cutedsl"),
    ("DeepGemm", "deep_gemm"),
    ("DeepGEMM", "deep_gemm"),
    ("B12x", "b12x"),
    ("Marlin", "marlin"),
    ("Cutlass", "cutlass"),
    ("CUTLASS", "cutlass"),
    ("Triton", "triton"),
    ("Torch", "torch"),
    ("Machete", "machete"),
    ("Exllama", "exllama"),
    ("Conch", "conch"),
    ("Fbgemm", "fbgemm"),
    ("Aiter", "aiter"),
    ("Humming", "humming"),
    ("Emulation", "emulation"),
)

# MoE enum names that differ from the CLI value that selects them.
_MOE_ALIASES: dict[str, str] = {"vllm_cutlass": "cutlass"}


def normalize_backend(value: str) -> str:
    """vLLM's own rule for backend values: lower case, `-` becomes `_`."""
    return value.strip().lower().replace("-", "_")


def moe_backend_from_enum(name: str) -> str:
    norm = normalize_backend(name)
    return _MOE_ALIASES.get(norm, norm)


def linear_backend_from_kernel(kernel: str) -> str:
    for prefix, backend in _LINEAR_PREFIXES:
        if kernel.startswith(prefix):
            return backend
    # Unknown class: snake-case it so the record still says something readable.
    return re.sub(r"(?<!^)(?=[A-Z])", "_", kernel).lower()


@dataclass
class BackendReport:
    """What the log says really ran (first sighting per quantisation/method)."""

    moe: dict[str, str] = field(default_factory=dict)  # quant kind -> backend value
    linear: dict[str, str] = field(default_factory=dict)  # method -> backend value
    linear_kernels: dict[str, str] = field(default_factory=dict)  # method -> class name
    marlin_fallback: bool = False

    def feed(self, line: str) -> None:
        m = _MOE_RE.search(line)
        if m:
            self.moe.setdefault(m.group(2), moe_backend_from_enum(m.group(1)))
        m = _LINEAR_RE.search(line)
        if m:
            kernel, method = m.group(1), m.group(2)
            self.linear.setdefault(method, linear_backend_from_kernel(kernel))
            self.linear_kernels.setdefault(method, kernel)
        if _MARLIN_FALLBACK_RE.search(line):
            self.marlin_fallback = True

    def to_json(self) -> dict[str, object]:
        return {
            "moe": dict(self.moe),
            "linear": dict(self.linear),
            "linear_kernels": dict(self.linear_kernels),
            "marlin_fallback": self.marlin_fallback,
        }


def backend_mismatches(
    report: BackendReport, requested_moe: str, requested_linear: str
) -> list[str]:
    """One sentence per backend that ran other than the one asked for.

    `auto` asks for nothing in particular, so it never mismatches; a backend that
    never showed up in the log is not a mismatch either (a dense model has no MoE).
    """
    problems: list[str] = []
    want_moe = moe_backend_from_enum(requested_moe)
    if want_moe != "auto":
        for kind, got in sorted(report.moe.items()):
            if got != want_moe:
                problems.append(f"asked --moe-backend {want_moe}, the {kind} MoE layers ran {got}")
    want_linear = normalize_backend(requested_linear)
    if want_linear != "auto":
        for method, got in sorted(report.linear.items()):
            if got != want_linear:
                problems.append(
                    f"asked --linear-backend {want_linear}, {method} ran "
                    f"{report.linear_kernels.get(method, got)} ({got})"
                )
        if report.marlin_fallback and want_linear != "marlin" and not report.linear:
            problems.append(
                f"asked --linear-backend {want_linear}, the log reports a weight-only Marlin "
                "fallback (no native FP4)"
            )
    return problems


@dataclass
class LogScan:
    """A server log read line by line: signature hits, backends, the last lines."""

    tail_lines: int = 40
    hits: list[SignatureHit] = field(default_factory=list)
    backends: BackendReport = field(default_factory=BackendReport)
    tail: list[str] = field(default_factory=list)
    lines_seen: int = 0

    def feed(self, line: str) -> None:
        line = line.rstrip("\r\n")
        self.lines_seen += 1
        self.tail.append(line)
        if len(self.tail) > self.tail_lines:
            del self.tail[: len(self.tail) - self.tail_lines]
        self.backends.feed(line)
        known = {h.name for h in self.hits}
        for hit in scan_line(line):
            if hit.name not in known:  # the first line of each signature is the telling one
                self.hits.append(hit)
                known.add(hit.name)

    def fatal(self) -> list[SignatureHit]:
        return [h for h in self.hits if h.severity == "fatal"]

    def degraded(self) -> list[SignatureHit]:
        return [h for h in self.hits if h.severity == "degraded"]

    def root_cause(self) -> SignatureHit | None:
        """The most specific fatal hit: `engine-dead` only says the cause is elsewhere."""
        fatal = self.fatal()
        specific = [h for h in fatal if h.name != "engine-dead"]
        return (specific or fatal or [None])[0]

"""Which kernels a recipe needs, and whether the image's cubin scan shows them native (pure).

Marlin kernels are C++ templates whose first four arguments are vLLM
ScalarType ids (activation, weight, output, scale type), packed as
`vllm/scalar_type.py` writes them: exponent 8 bits, mantissa 8, signed 1,
bias 32, finite-values-only 1, NaN representation 8. The mangled names in
the cubin scan (`cubins --kernels`) carry these ids, so "Marlin MoE for
NVFP4 with bf16 activations, native on sm_121" is read from the bytes: for
example vLLM 0.22.0's `_moe_C` has those kernels as PTX only (JIT at start),
0.33.0's has sm_12x cubins.

FlashInfer backends need FlashInfer in the target (its kernels ship in
flashinfer-cubin or are JIT-built); the check's `no-nvcc-for-jit` rule judges the JIT side.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spark_images.check.inventory import site_relative

MOE_LIBRARY = re.compile(r"vllm/_moe_C[^/]*\.so")
DENSE_LIBRARY = re.compile(r"vllm/_C[^/]*\.so")
_MARLIN = re.compile(r"(marlin_moe_wna16|marlin)6MarlinILl(\d+)ELl(\d+)ELl(\d+)ELl(\d+)E")
SIXTEEN_BIT = ("bf16", "fp16")
# checkpoint format -> (weight type, scale type or None: any) of the Marlin kernels it needs
MARLIN_TYPES: dict[str, tuple[str, str | None]] = {
    "nvfp4": ("fp4e2m1", "fp8e4m3"),
    "mxfp4": ("fp4e2m1", "e8m0"),
    "fp8": ("fp8e4m3", None),
    "gptq-int4": ("uint4b8", None),
    "awq-int4": ("uint4", None),
}
FLASHINFER_PREFIX = ("flashinfer", "b12x")


def scalar_type(type_id: int) -> str:
    """A ScalarType id as a short name: bf16, fp16, fp8e4m3, fp4e2m1, e8m0, int8, uint4, uint4b8, ..."""
    exponent, mantissa = type_id & 0xFF, (type_id >> 8) & 0xFF
    signed, bias = (type_id >> 16) & 1, (type_id >> 17) & 0xFFFFFFFF
    known = {(8, 7, 1): "bf16", (5, 10, 1): "fp16", (4, 3, 1): "fp8e4m3", (5, 2, 1): "fp8e5m2",
             (2, 1, 1): "fp4e2m1", (8, 0, 0): "e8m0"}  # fmt: skip
    if (exponent, mantissa, signed) in known:
        return known[(exponent, mantissa, signed)]
    if exponent == 0:
        bits = mantissa + signed
        return f"{'int' if signed else 'uint'}{bits}" + (f"b{bias}" if bias else "")
    return f"e{exponent}m{mantissa}{'s' if signed else 'u'}"


@dataclass(frozen=True)
class MarlinKernel:
    moe: bool
    activation: str
    weight: str
    scale: str
    cls: str  # native | jit_only | missing


def marlin_kernels(library: Mapping[str, Any]) -> list[MarlinKernel]:
    """Every Marlin kernel of one library's `cubins --kernels` document."""
    out: list[MarlinKernel] = []
    for cls, names in (library.get("kernel_classes") or {}).items():
        for name in names:
            m = _MARLIN.search(name)
            if m:
                a, b, _c, s = (scalar_type(int(m.group(i))) for i in (2, 3, 4, 5))
                out.append(MarlinKernel(moe=m.group(1) == "marlin_moe_wna16", activation=a, weight=b, scale=s, cls=cls))
    return out


@dataclass(frozen=True)
class Need:
    """One kernel family the recipe needs, and what the scan found for it."""

    what: str
    library: str
    found: str  # native | jit_only | missing | absent (no such library/package)

    @property
    def met(self) -> bool:
        return self.found == "native"


def _marlin_need(libraries: Sequence[Mapping[str, Any]], quantization: str, moe: bool) -> Need | None:
    types = MARLIN_TYPES.get(quantization)
    if types is None:
        return None
    weight, scale = types
    pattern = MOE_LIBRARY if moe else DENSE_LIBRARY
    kind = "Marlin MoE" if moe else "Marlin"
    what = f"{kind} kernels for {quantization} weights ({weight}) with 16-bit activations"
    libs = [lib for lib in libraries if pattern.fullmatch(site_relative(str(lib.get("path", ""))))]
    if not libs:
        return Need(what, pattern.pattern.replace("[^/]*", "*").replace("\\", ""), "absent")
    classes = {
        k.cls for lib in libs for k in marlin_kernels(lib)
        if k.moe == moe and k.activation in SIXTEEN_BIT and k.weight == weight and (scale is None or k.scale == scale)
    }  # fmt: skip
    found = "native" if "native" in classes else "jit_only" if "jit_only" in classes else "missing"
    return Need(what, site_relative(str(libs[0]["path"])), found)


def needs(
    quantization: str,
    moe: bool,
    moe_backend: str,
    linear_backend: str,
    libraries: Sequence[Mapping[str, Any]],
    packages: Iterable[str],
) -> list[Need]:
    """The kernel families a served model needs on this image (an empty list: nothing to judge).

    `libraries`: the check's GPU library documents with kernel classes;
    `packages`: normalised names of the installed packages.
    """
    installed = set(packages)
    out: list[Need] = []
    chosen = [("moe", moe_backend)] if moe else []
    chosen.append(("linear", linear_backend))
    for part, backend in chosen:
        if backend.startswith(FLASHINFER_PREFIX):
            found = "native" if "flashinfer-python" in installed else "absent"
            out.append(Need(f"FlashInfer kernels for --{part}-backend {backend}", "flashinfer-python", found))
        elif backend == "marlin":
            need = _marlin_need(libraries, quantization, moe=part == "moe")
            if need is not None:
                out.append(need)
    return out

"""Which code runs on which GPU, per fatbin, per library, overall (pure).

Rules (see the fatbin-format reference, "What runs on the Spark"):
- a plain cubin sm_XY runs on a GPU of the same major and an equal or higher minor;
- a family cubin sm_XYf likewise (same major, minor >= XY's minor);
- an arch-specific cubin sm_XYa runs only on exactly sm_XY;
- PTX compute_XY is JIT-compiled by the driver on any GPU >= XY;
  compute_XYf on the same major with minor >= XY's; compute_XYa only on XY.
LTO-IR is linked by the application at run time, never loaded by the driver,
so it neither runs nor JITs on its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

NATIVE = "native"
JIT_ONLY = "jit_only"
MISSING = "missing"

# overall verdicts
V_NATIVE = "native"
V_PARTIAL = "partial"
V_JIT_ONLY = "jit-only"
V_MISSING = "missing"
V_NO_GPU_CODE = "no-gpu-code"

_GPU = re.compile(r"^(?:sm_)?(\d{2,3})([af]?)$")


@dataclass(frozen=True)
class Gpu:
    sm: int  # 121

    @property
    def major(self) -> int:
        return self.sm // 10

    @property
    def minor(self) -> int:
        return self.sm % 10

    @property
    def name(self) -> str:
        return f"sm_{self.sm}"


def parse_gpu(text: str) -> Gpu:
    """'sm_121', '121', '12.1' -> Gpu(121); ValueError otherwise."""
    value = text.strip().lower()
    if re.fullmatch(r"\d+\.\d", value):
        major, minor = value.split(".")
        return Gpu(int(major) * 10 + int(minor))
    match = _GPU.match(value)
    if not match:
        raise ValueError(f"{text!r} is not a GPU architecture like sm_121 or 12.1")
    return Gpu(int(match.group(1)))


def _same_family(sm: int, gpu: Gpu) -> bool:
    return sm // 10 == gpu.major and sm % 10 <= gpu.minor


def runs_natively(sm: int, variant: str, gpu: Gpu) -> bool:
    """A cubin for sm_<sm><variant> loads on `gpu` without JIT."""
    if variant == "a":
        return sm == gpu.sm
    return _same_family(sm, gpu)


def jit_possible(sm: int, variant: str, gpu: Gpu) -> bool:
    """PTX compute_<sm><variant> can be JIT-compiled for `gpu`."""
    if variant == "a":
        return sm == gpu.sm
    if variant == "f":
        return _same_family(sm, gpu)
    return sm <= gpu.sm


def classify_targets(targets: Iterable[tuple[str, int, str]], gpu: Gpu) -> str:
    """(kind, sm, variant) of one unit's entries -> native / jit_only / missing."""
    jit = False
    for kind, sm, variant in targets:
        if kind == "cubin" and runs_natively(sm, variant, gpu):
            return NATIVE
        if kind == "ptx" and jit_possible(sm, variant, gpu):
            jit = True
    return JIT_ONLY if jit else MISSING


@dataclass(frozen=True)
class Counts:
    native: int = 0
    jit_only: int = 0
    missing: int = 0

    @property
    def units(self) -> int:
        return self.native + self.jit_only + self.missing

    def add(self, cls: str) -> Counts:
        return Counts(
            native=self.native + (cls == NATIVE),
            jit_only=self.jit_only + (cls == JIT_ONLY),
            missing=self.missing + (cls == MISSING),
        )

    def __add__(self, other: Counts) -> Counts:
        return Counts(
            self.native + other.native,
            self.jit_only + other.jit_only,
            self.missing + other.missing,
        )


def rollup(counts: Counts) -> str:
    """Verdict of a set of units (a library, or everything)."""
    if counts.units == 0:
        return V_NO_GPU_CODE
    if counts.native == counts.units:
        return V_NATIVE
    if counts.native:
        return V_PARTIAL
    if counts.jit_only:
        return V_JIT_ONLY
    return V_MISSING


def split_target(name: str) -> tuple[str, int, str]:
    """'sm_120f' -> ('cubin', 120, 'f'); 'compute_80' -> ('ptx', 80, ''); other prefixes kept."""
    prefix, _, rest = name.partition("_")
    digits = "".join(ch for ch in rest if ch.isdigit())
    kind = {"sm": "cubin", "compute": "ptx"}.get(prefix, prefix)
    return kind, int(digits or 0), rest[len(digits) :]


def sort_targets(names: Iterable[str]) -> list[str]:
    """sm_90 < sm_120 < sm_120a < sm_120f < compute_80; numbers compared as numbers."""

    rank = {"cubin": 0, "ptx": 1, "lto": 2}

    def key(name: str) -> tuple[int, str, int, str]:
        kind, sm, variant = split_target(name)
        return (rank.get(kind, 3), kind, sm, variant)

    return sorted(set(names), key=key)

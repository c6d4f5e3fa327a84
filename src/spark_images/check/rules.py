"""The toolchain rules applied to what is inside a target (pure: facts in, reasons out).

Rule ids, messages and fixes come from the one table in `spark_images.profiles.toolchain`
(the profile checks use the same entries); this module adds only what an
image needs on top: which facts each rule reads, and its impact on the image
(`broken`: it cannot serve on the GPU as built; `degraded`: it runs, but named
kernels JIT, fall back or lack fixes).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from spark_images.check.inventory import Inventory, Tool, site_relative
from spark_images.profiles import toolchain
from spark_images.profiles.toolchain import parse_version

Impact = Literal["broken", "degraded"]

IMPACT: dict[str, Impact] = {
    "cuda-too-old": "broken",
    "flashinfer-mismatch": "broken",  # FlashInfer refuses cubins of another release
    "known-bad-pin": "broken",
    "triton-ptxas-too-old": "broken",  # every Triton kernel fails to compile for sm_121a
    "torch-cuda-major-mismatch": "broken",
    "no-nvcc-for-jit": "degraded",
    "removed-env-var": "degraded",
    "cuda-mixed-toolkits": "degraded",
    "no-native-moe-kernels": "degraded",
    # TORCH_CUDA_ARCH_LIST in the image steers what JIT-built extensions compile for
    "arch-no-spark-target": "degraded",
    "arch-gh200-example": "degraded",
    # the essential facts (`_essential`): each one missing means vLLM cannot serve on the GPU
    "torch-no-cuda": "broken",
    "torch-no-gpu-code": "broken",
    "vllm-no-native-main": "broken",
}

MAIN_LIBRARY = "vllm/_C*.so"
MOE_LIBRARY = "vllm/_moe_C*.so"
TORCH_LIBRARY = "torch/lib/libtorch_cuda*.so"
# the libraries the essential-fact rules judge (`_essential`), not the per-library lines
ESSENTIAL = (MAIN_LIBRARY, TORCH_LIBRARY)
# cubin verdicts of a library with code that runs on the GPU (natively or after a PTX JIT)
RUNS = ("native", "partial", "jit-only")


@dataclass(frozen=True)
class Reason:
    """One line of a verdict: names the rule (`rule`) or the library/package (`subject`)."""

    impact: Impact
    rule: str
    subject: str
    message: str
    fix: str = ""

    def line(self) -> str:
        tag = f"[{self.rule}] " if self.rule else ""
        text = f"{self.impact}: {tag}{self.message}"
        return f"{text} (fix: {self.fix})" if self.fix else text

    def key(self) -> str:
        """What identifies this reason across two images (for `diff`)."""
        return f"{self.rule or 'library'}:{self.subject}"

    def to_json(self) -> dict[str, str]:
        return {"impact": self.impact, "rule": self.rule, "subject": self.subject,
                "message": self.message, "fix": self.fix, "line": self.line()}  # fmt: skip


def from_rule(rule_id: str, subject: str, **details: str) -> Reason:
    rule = toolchain.RULES[rule_id]
    return Reason(IMPACT[rule_id], rule_id, subject, rule.message.format(**details), rule.fix.format(**details))


def matches(pattern: str, path: str) -> bool:
    return fnmatch.fnmatchcase(site_relative(path), pattern)


def _release(version: str | None) -> tuple[int, ...]:
    return parse_version(version or "")[:2]


# --- the rules, one function per id --------------------------------------------------


def _cuda_too_old(inv: Inventory, _libs: Sequence[dict[str, Any]]) -> Iterator[Reason]:
    cuda = inv.cuda_version()
    for version, where in ((cuda[0], cuda[1]) if cuda else (None, ""), (inv.torch_cuda, "torch/version.py")):
        if version and _release(version) < toolchain.MIN_CUDA:
            yield from_rule("cuda-too-old", where, cuda=f"{version} ({where})")


def _flashinfer(inv: Inventory, _libs: Sequence[dict[str, Any]]) -> Iterator[Reason]:
    python, cubin = inv.version_of("flashinfer-python"), inv.version_of("flashinfer-cubin")
    if python and cubin and python != cubin:
        yield from_rule("flashinfer-mismatch", "flashinfer-cubin", python=python, cubin=cubin)


def _known_bad(inv: Inventory, _libs: Sequence[dict[str, Any]]) -> Iterator[Reason]:
    for package, version, reason, fix in toolchain.KNOWN_BAD_PINS:
        if inv.version_of(package) == version:
            yield from_rule("known-bad-pin", package, package=package, version=version, reason=reason, fix=fix)


def _no_nvcc(inv: Inventory, _libs: Sequence[dict[str, Any]]) -> Iterator[Reason]:
    version = inv.version_of("flashinfer-python")
    if version and not inv.nvcc:
        cubin = inv.version_of("flashinfer-cubin")
        what = ("the kernels flashinfer-cubin lacks" if cubin
                else "any kernel (and there is no flashinfer-cubin either)")  # fmt: skip
        yield from_rule("no-nvcc-for-jit", "nvcc", version=version, what=what)


def _effective_triton_ptxas(inv: Inventory) -> tuple[str, Tool | None]:
    if inv.triton_ptxas_path:
        return f"TRITON_PTXAS_PATH={inv.triton_ptxas_path}", inv.triton_ptxas_target
    bundled = next((t for t in inv.triton_ptxas if t.path.endswith("/ptxas")), None)
    bundled = bundled or (inv.triton_ptxas[0] if inv.triton_ptxas else None)
    return (f"its bundled {bundled.path}" if bundled else "no bundled ptxas"), bundled


def _triton_ptxas(inv: Inventory, _libs: Sequence[dict[str, Any]]) -> Iterator[Reason]:
    triton = inv.version_of("triton")
    if not triton:
        return
    # a newer Triton ships a second, Blackwell-capable ptxas beside the old one
    if not inv.triton_ptxas_path and any(t.knows_sm121a for t in inv.triton_ptxas):
        return
    label, tool = _effective_triton_ptxas(inv)
    if tool is not None and tool.knows_sm121a:
        return
    if tool is None:
        release = "not in the image" if inv.triton_ptxas_path else "none found"
    else:
        release = f"CUDA {tool.release}" if tool.release else "release unknown"
    yield from_rule("triton-ptxas-too-old", "triton", triton=triton, ptxas=label, release=release)


def _removed_env(inv: Inventory, _libs: Sequence[dict[str, Any]]) -> Iterator[Reason]:
    """A VLLM_* variable the image's own vllm/envs.py does not define; the hand table
    (toolchain.REMOVED_ENV_VARS) only when the target holds no envs.py to read."""
    if inv.config is None:
        return
    for var, _value in inv.config.env:
        flag = toolchain.REMOVED_ENV_VARS.get(var, "the serve flag that replaced it")
        if inv.vllm_env_vars is not None:
            if var.startswith("VLLM_") and var not in inv.vllm_env_vars:
                yield from_rule("removed-env-var", var, var=var, flag=flag)
        elif var in toolchain.REMOVED_ENV_VARS:
            yield from_rule("removed-env-var", var, var=var, flag=flag)


def _torch_cuda(inv: Inventory, _libs: Sequence[dict[str, Any]]) -> Iterator[Reason]:
    cuda = inv.cuda_version()
    if not inv.torch_cuda or not cuda:
        return
    if _release(inv.torch_cuda)[:1] != _release(cuda[0])[:1]:
        yield from_rule("torch-cuda-major-mismatch", "torch", torch=inv.torch_version or "?",
                        torch_cuda=inv.torch_cuda, cuda=cuda[0], where=cuda[1])  # fmt: skip


# which component would use which piece (for the one line of cuda-mixed-toolkits)
USERS = {
    "nvcc": "FlashInfer/extension JIT",
    "ptxas": "Triton via TRITON_PTXAS_PATH",
    "nvidia-cuda-nvcc": "FlashInfer JIT",
    "nvidia-nvvm": "nvcc's device front end",
    "nvidia-nvjitlink": "PTX/LTO JIT linking (cuBLAS, cuSPARSE, torch)",
    "nvidia-cuda-nvrtc": "torch runtime compilation",
    "nvidia-cuda-runtime": "every CUDA library",
    "cuda-toolkit": "the toolkit wheels",
}


def cuda_components(inv: Inventory) -> list[tuple[str, str, str]]:
    """(component, X.Y release, who uses it) of every CUDA piece with a version."""
    out: list[tuple[str, str, str]] = []
    for path, version in inv.toolkits:
        out.append((f"toolkit {path.rsplit('/', 1)[0]}", ".".join(map(str, _release(version))), "system CUDA"))
    for tool in (*inv.nvcc, *inv.ptxas):
        if tool.release and "-packages/" not in tool.path:
            name = tool.path.rsplit("/", 1)[-1]
            out.append((tool.path, tool.release, USERS[name]))
    for name, found in sorted(inv.packages.items()):
        base = name.removesuffix("-cu12").removesuffix("-cu13")
        if base in USERS or name.startswith("nvidia-cuda-"):
            release = ".".join(map(str, _release(found[0].version)))
            out.append((f"{name} {found[0].version}", release, USERS.get(base, "CUDA libraries")))
    return out


def _mixed(inv: Inventory, _libs: Sequence[dict[str, Any]]) -> Iterator[Reason]:
    parts = cuda_components(inv)
    releases = sorted({r for _c, r, _u in parts}, key=parse_version)
    if len(releases) < 2:
        return
    # the newest pieces are the ones whose PTX an older runtime/driver cannot take
    newest = releases[-1]
    text = "; ".join(
        f"{comp} is {rel}{' (newer)' if rel == newest else ''}, used by {user}" for comp, rel, user in parts
    )
    cuda = inv.cuda_version()
    yield from_rule("cuda-mixed-toolkits", "cuda", components=text, cuda=cuda[0] if cuda else releases[0])


def library_counts(doc: dict[str, Any]) -> str:
    return f"{doc.get('native', 0)}/{doc.get('fatbins', 0)} fatbins native, {doc.get('jit_only', 0)} JIT-only"


def _moe(inv: Inventory, libs: Sequence[dict[str, Any]]) -> Iterator[Reason]:
    if not inv.version_of("vllm"):
        return
    found = [doc for doc in libs if matches(MOE_LIBRARY, doc["path"])]
    if not found:
        yield from_rule("no-native-moe-kernels", MOE_LIBRARY, library=MOE_LIBRARY,
                        what="not in the image, or without device code")  # fmt: skip
    for doc in found:
        if not doc.get("native"):
            what = f"no native code ({doc.get('verdict')}; {library_counts(doc)})"
            yield from_rule("no-native-moe-kernels", site_relative(doc["path"]), library=site_relative(doc["path"]), what=what)


def _essential(inv: Inventory, libs: Sequence[dict[str, Any]], gpu: str) -> Iterator[Reason]:
    """The facts without which vLLM cannot serve on `gpu`, each proven from the files or named.

    A CUDA torch: torch/version.py sets `cuda`, and libtorch_cuda carries code that
    runs on the GPU (the CUDA major is `torch-cuda-major-mismatch`). vLLM's main
    library with native code. Packages that are not installed at all are the
    library lines of `library_reasons`.
    """
    torch = inv.version_of("torch")
    if torch:
        where = "torch/version.py" if inv.torch_version else "no torch/version.py"
        if not inv.torch_cuda:
            yield from_rule("torch-no-cuda", "torch", torch=torch, cuda="None" if inv.torch_version else "unknown",
                            where=where)  # fmt: skip
        found = [doc for doc in libs if matches(TORCH_LIBRARY, doc["path"])]
        if not found:
            what = f"no {TORCH_LIBRARY} with device code"
            yield from_rule("torch-no-gpu-code", "torch", torch=torch, what=what, gpu=gpu)
        elif not any(doc.get("verdict") in RUNS for doc in found):
            what = "; ".join(f"{site_relative(d['path'])} has no code for it ({d.get('verdict')}: {library_counts(d)})"
                             for d in found)  # fmt: skip
            yield from_rule("torch-no-gpu-code", "torch", torch=torch, what=what, gpu=gpu)
    if inv.version_of("vllm"):
        main = [doc for doc in libs if matches(MAIN_LIBRARY, doc["path"])]
        if not main:
            yield from_rule("vllm-no-native-main", MAIN_LIBRARY, what=f"{MAIN_LIBRARY}: no such library with device code",
                            gpu=gpu)  # fmt: skip
        elif not any(doc.get("native") for doc in main):
            what = "; ".join(f"{site_relative(d['path'])}: no native {gpu} code ({d.get('verdict')}: {library_counts(d)})"
                             for d in main)  # fmt: skip
            yield from_rule("vllm-no-native-main", site_relative(main[0]["path"]), what=what, gpu=gpu)


def _arch_env(inv: Inventory, _libs: Sequence[dict[str, Any]]) -> Iterator[Reason]:
    arch = inv.config.get_env("TORCH_CUDA_ARCH_LIST") if inv.config else None
    if not arch:
        return
    tokens = toolchain.split_arch_list(arch)
    targets = [t for t in map(toolchain.parse_arch_target, tokens) if t is not None]
    cuda = inv.cuda_version()
    derived = (toolchain.arch_list_for(cuda[0]) if cuda else None) or "12.0f"
    if set(tokens) == {"9.0", "10.0+PTX"}:
        yield from_rule("arch-gh200-example", "TORCH_CUDA_ARCH_LIST", arch=arch, derived=derived)
    elif targets and not any(t.runs_natively_on_sm121() for t in targets):
        yield from_rule("arch-no-spark-target", "TORCH_CUDA_ARCH_LIST", arch=arch, derived=derived)


RULE_CHECKS = (
    _arch_env,
    _cuda_too_old, _flashinfer, _known_bad, _no_nvcc, _triton_ptxas, _removed_env, _torch_cuda, _mixed, _moe,
)


# --- libraries and fixes: reasons that name a library or a PR, not a table rule ------


def built_for_other_gpus(doc: dict[str, Any], gpu: str) -> bool:
    """Only arch/family-specific cubins of another major, no PTX (FA3: sm_90a; FlashMLA):
    kernels that are by design not for this GPU, whose callers pick another backend."""
    sass, ptx = doc.get("sass") or [], doc.get("ptx") or []
    major = int(gpu.removeprefix("sm_")[:-1] or 0) if gpu.removeprefix("sm_")[:-1].isdigit() else 0
    if not sass or ptx:
        return False
    for target in sass:
        digits = "".join(ch for ch in target.removeprefix("sm_") if ch.isdigit())
        if not target.endswith(("a", "f")) or not digits or int(digits) // 10 == major:
            return False
    return True


def library_reasons(inv: Inventory, libs: Sequence[dict[str, Any]], gpu: str) -> Iterator[Reason]:
    if not inv.version_of("vllm"):
        yield Reason("broken", "", "vllm", "vllm: not installed (no vllm-*.dist-info/METADATA)")
    elif not inv.vllm_version_file:
        yield Reason("degraded", "", "vllm", "vllm: no vllm/_version.py, so the commit (and its fixes) is unknown")
    if not inv.version_of("torch"):
        yield Reason("broken", "", "torch", "torch: not installed, so vLLM cannot start")
    for doc in libs:
        rel = site_relative(doc["path"])
        if doc.get("native") or matches(MOE_LIBRARY, doc["path"]):
            continue  # some native code (partial is normal: Hopper-only kernels) / rule above
        verdict = doc.get("verdict", "")
        essential = any(fnmatch.fnmatchcase(rel, p) for p in ESSENTIAL)
        if verdict == "no-gpu-code" or built_for_other_gpus(doc, gpu) or (essential and verdict != "jit-only"):
            continue  # nothing for any GPU / by design for another / judged by `_essential`
        if matches(MAIN_LIBRARY, doc["path"]):
            continue  # a JIT-only main library is `vllm-no-native-main`
        how = "kernels JIT-compile from PTX at start" if verdict == "jit-only" else "its kernels cannot run"
        yield Reason("degraded", "", rel, f"{rel}: no native {gpu} code ({verdict}: {library_counts(doc)}); {how}")


def fix_reasons(audit: dict[str, Any]) -> Iterator[Reason]:
    if audit.get("status") not in ("passed", "failed"):
        return
    for fix in audit.get("failing", []):
        title = f" {fix['title']}" if fix.get("title") else ""
        yield Reason("degraded", "", f"#{fix['pr']}", f"fix #{fix['pr']}{title}: {fix['state']}",
                     "use a vLLM commit that contains it, or a patch backporting it")  # fmt: skip


def apply(inv: Inventory, libs: Sequence[dict[str, Any]], audit: dict[str, Any], gpu: str) -> list[Reason]:
    """Every reason, broken first, in rule order within each impact."""
    reasons = [r for check in RULE_CHECKS for r in check(inv, libs)]
    reasons.extend(_essential(inv, libs, gpu))
    reasons.extend(library_reasons(inv, libs, gpu))
    reasons.extend(fix_reasons(audit))
    order = {"broken": 0, "degraded": 1}
    return sorted(reasons, key=lambda r: order[r.impact])

"""The toolchain rules: what a Spark (sm_121) image needs, as data (pure).

Every rule has an id, a severity, the message, the fix and the reason (the
guide section or upstream issue it encodes). `check_profile` applies the rule
checks, each a small function keyed by its rule id, and returns Problems;
it never raises and does no I/O except what the caller passes in.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from spark_images.core.errors import Problem
from spark_images.core.inputs import DIGEST
from spark_images.profiles.profile import Profile
from spark_images.profiles.values import HEX40, base_image_reference

Severity = Literal["error", "warning"]
Scope = Literal["profile", "image"]
PROFILE: frozenset[Scope] = frozenset({"profile"})
IMAGE: frozenset[Scope] = frozenset({"image"})
BOTH: frozenset[Scope] = PROFILE | IMAGE


@dataclass(frozen=True)
class Rule:
    id: str
    severity: Severity
    message: str  # str.format()-ed with the check's details
    fix: str
    why: str
    # what the rule can judge: a profile (`validate`), the files of an image or
    # wheel set (`check`), or both. One table serves both commands.
    scope: frozenset[Scope] = PROFILE


RULES: dict[str, Rule] = {
    r.id: r
    for r in (
        Rule("cuda-too-old", "error",
             "CUDA {cuda} cannot build sm_121 code", "use CUDA 12.8 or newer (13.0 preferred)",
             "no sm_121 target exists before CUDA 12.8 (guide 10.2; CMakeLists.txt:99-110)", BOTH),
        Rule("arch-no-spark-target", "error",
             "arch list {arch!r} builds no code the Spark (sm_121) can run", "leave arch_list unset (derived: {derived}) or use {derived}",
             "a list without 12.0f/12.1a/12.1 builds no Spark code", BOTH),
        Rule("arch-gh200-example", "error",
             "arch list {arch!r} is the GH200/GB200 example of vLLM's Docker docs, not GB10", "use {derived}",
             "guide 10.2: do not copy torch_cuda_arch_list='9.0 10.0+PTX'", BOTH),
        Rule("arch-bare-120", "error",
             "arch list {arch!r} has only a plain 12.0 target, which skips the SM120 FP4/FP8 block-scaled kernels", "use {derived}",
             "block-scaled tensor-core kernels need an a or f target (fatbin facts; #41738, #36835)"),
        Rule("arch-family-needs-cuda13", "error",
             "arch target {target!r} is a family target, which needs CUDA 13, but the profile pins CUDA {cuda}", "use 12.1a (or 12.0a;12.1a) on CUDA 12.8/12.9",
             "family ('f') targets exist only from CUDA 13"),
        Rule("arch-bad-token", "error",
             "arch list entry {target!r} is not of the form 12.1a, 12.0f, 9.0 or 8.0+PTX", "write entries like 12.0f or 12.1a, separated by ';' or spaces",
             "TORCH_CUDA_ARCH_LIST syntax"),
        Rule("flashinfer-mismatch", "error",
             "flashinfer-python {python} and flashinfer-cubin {cubin} differ", "pin both to the same version (or cubin: null to rely on JIT)",
             "flashinfer cubins are built per release", BOTH),
        Rule("known-bad-pin", "error",
             "{package}=={version} is known broken on the Spark: {reason}", "{fix}",
             "upstream issue named in the message", BOTH),
        Rule("removed-env-var", "warning",
             "{var} is removed or ignored on current vLLM", "drop it and pass {flag} to vllm serve instead",
             "guide 10.4; vLLM warns 'Unknown vLLM environment variable detected'", BOTH),
        Rule("base-not-digest-pinned", "error",
             "base image {image!r} is not pinned by digest", "append @sha256:<digest> of the image you verified",
             "a tag can be re-pushed: two digests of nvidia/cuda:12.9.1-devel-ubuntu24.04 are pinned in public repositories"),
        Rule("base-latest", "error",
             "base image {image!r} uses the 'latest' tag", "name the exact CUDA tag and pin its digest",
             "latest moves with every release"),
        Rule("base-not-devel", "error",
             "base image {image!r} is not a CUDA devel image, so the runtime has no nvcc", "use an nvidia/cuda:<version>-devel-* image",
             "FlashInfer disables itself without cubins and without nvcc to JIT (guide 10.2)"),
        Rule("base-cuda-mismatch", "error",
             "base image tag says CUDA {tag_cuda} but cuda.version is {cuda}", "make cuda.version and the base image tag agree",
             "the arch list is derived from cuda.version; a different toolkit would build different code"),
        Rule("vllm-commit-not-sha", "error",
             "{commit!r} is {what}, not a full commit", "pin the full 40-hex commit (the release's sdist records it in vllm/_version.py)",
             "a branch or tag moves; a short SHA can become ambiguous"),
        Rule("torch-index-cuda-mismatch", "error",
             "torch index {index} is for CUDA {index_cuda}, but the profile pins CUDA {cuda}", "use the PyTorch index of the same CUDA major version (e.g. .../whl/cu130 for CUDA 13)",
             "torch's CUDA runtime must match the toolkit's major version"),
        Rule("torch-too-old", "error",
             "torch {version} predates Blackwell support", "use torch 2.7.0 or newer (built with CUDA 12.8+)",
             "'Minimum and Maximum cuda capability supported by this version of PyTorch' (#31588)"),
        Rule("wheel-strategy-needs-wheel", "error",
             "build.strategy is wheel but build.wheel is missing", "add build.wheel with url and sha256",
             "the wheel must be installed by sha256"),
        Rule("source-strategy-has-wheel", "error",
             "build.strategy is source but build.wheel is set", "remove build.wheel or set strategy: wheel",
             "one strategy per profile"),
        Rule("native-libraries-empty", "error",
             "verify.native_libraries is empty, so nothing proves the image carries sm_121 code", "list at least the main library, e.g. vllm/_C*.so",
             "the cubin gate must name what it checks"),
        # rules that only what is inside an image or wheel set can show (spark-images check)
        Rule("no-nvcc-for-jit", "warning",
             "flashinfer-python {version} is installed but there is no nvcc, so FlashInfer cannot JIT-compile {what}", "use a CUDA devel base (or the nvidia-cuda-nvcc wheel) so nvcc is on PATH or under CUDA_HOME",
             "FlashInfer disables itself without cubins and without nvcc to JIT (guide 10.2)", IMAGE),
        Rule("triton-ptxas-too-old", "error",
             "Triton {triton} compiles with {ptxas} ({release}), which does not know sm_121a", "set TRITON_PTXAS_PATH to a CUDA 12.9+ ptxas in the image, e.g. /usr/local/cuda/bin/ptxas",
             "Triton's bundled ptxas can predate sm_121a (guide 10.2)", IMAGE),
        Rule("torch-cuda-major-mismatch", "error",
             "torch {torch} is built for CUDA {torch_cuda}, but the CUDA toolkit is {cuda} ({where})", "install the torch build of the toolkit's CUDA major (e.g. the cu130 index for CUDA 13)",
             "torch's CUDA runtime must match the toolkit's major version; JIT extensions are built with the toolkit", IMAGE),
        Rule("cuda-mixed-toolkits", "warning",
             "CUDA components of different releases: {components}", "pin every nvidia-cuda-*/nvjitlink/nvvm wheel to the toolkit's release {cuda}",
             "PTX from newer tools cannot be JIT-compiled by an older driver, so each component must come from one release", IMAGE),
        # the essential facts: without each, vLLM cannot serve on the GPU at all
        Rule("torch-no-cuda", "error",
             "torch {torch} is not a CUDA build: torch.version.cuda is {cuda} ({where})", "install a CUDA build of torch (e.g. the cu130 index for CUDA 13)",
             "a CPU-only torch cannot put anything on the GPU; vLLM's CUDA platform needs torch.version.cuda", IMAGE),
        Rule("torch-no-gpu-code", "error",
             "torch {torch}: {what}, so torch cannot run on {gpu}", "install a CUDA build of torch whose libtorch_cuda carries {gpu} (or sm_120) cubins",
             "every CUDA operator of torch lives in torch/lib/libtorch_cuda.so; without code for the GPU there is no GPU torch", IMAGE),
        Rule("vllm-no-native-main", "error",
             "{what}, so vLLM's own kernels cannot run on {gpu}", "use a vLLM build whose main library carries sm_121 cubins (12.0f on CUDA 13, 12.1a on 12.8/12.9)",
             "vLLM's main library (vllm/_C*.so: _C.abi3.so, _C_stable_libtorch.abi3.so) holds the attention, cache and quantisation ops every model uses", IMAGE),
        Rule("no-native-moe-kernels", "warning",
             "{library}: {what}, so fused-MoE layers fall back to slower kernels", "use a vLLM build whose _moe_C carries sm_121 cubins (12.0f on CUDA 13, 12.1a on 12.8/12.9)",
             "the fused-MoE kernels are compiled into vllm/_moe_C; without sm_121 cubins they JIT from PTX or are absent", IMAGE),
    )
}



def rules_for(scope: Scope) -> dict[str, Rule]:
    """The rules one command applies: `validate` the profile ones, `check` the image ones."""
    return {rule_id: rule for rule_id, rule in RULES.items() if scope in rule.scope}


# CUDA line -> arch list. (first CUDA version, exclusive end, arch list)
ARCH_BY_CUDA: tuple[tuple[tuple[int, int], tuple[int, int] | None, str], ...] = (
    ((12, 8), (13, 0), "12.1a"),  # arch-specific cubins; 'f' needs CUDA 13
    ((13, 0), None, "12.0f"),  # the family cubin covers sm_120 and sm_121
)
MIN_CUDA = (12, 8)

# Pins known to break the Spark: (package, version, reason, fix)
KNOWN_BAD_PINS: tuple[tuple[str, str, str, str], ...] = (
    ("nvidia-cutlass-dsl", "4.5.0",
     "emits PTX that ptxas rejects on sm_120/sm_121 (NVIDIA/cutlass#3227)", "use 4.5.1 or newer"),
)

# Removed or ignored VLLM_* variables and the serve flag that replaced each.
REMOVED_ENV_VARS: dict[str, str] = {
    "VLLM_NVFP4_GEMM_BACKEND": "--linear-backend",
    "VLLM_USE_FLASHINFER_MOE_FP4": "--moe-backend",
    "VLLM_FLASHINFER_MOE_BACKEND": "--moe-backend",
}

MIN_TORCH = (2, 7)

_ARCH_TOKEN = re.compile(r"(\d+)\.(\d+)([af]?)(\+PTX)?")  # full match
# nvidia/cuda tags: VERSION-[cudnn-]FLAVOR-OS, e.g. 13.0.2-devel-ubuntu24.04; a bare VERSION
# (a mirror's retag) still says which toolkit it holds, and has no devel flavor to show
_CUDA_TAG = re.compile(r"(\d+\.\d+(?:\.\d+)?)(?:-([\w.-]+))?")


def parse_version(text: str) -> tuple[int, ...]:
    """Leading numeric components of a version: '13.0.2' -> (13, 0, 2)."""
    parts: list[int] = []
    for piece in text.split("."):
        m = re.match(r"\d+", piece)
        if not m:
            break
        parts.append(int(m.group()))
        if m.group() != piece:
            break
    return tuple(parts)


def arch_list_for(cuda: str) -> str | None:
    """The TORCH_CUDA_ARCH_LIST for a CUDA version, or None below 12.8."""
    v = parse_version(cuda)[:2]
    for start, end, arch in ARCH_BY_CUDA:
        if v >= start and (end is None or v < end):
            return arch
    return None


def cuda_line(cuda: str) -> str:
    """'13.0.2' -> 'cu130', '12.9.1' -> 'cu129'."""
    major, minor = (*parse_version(cuda), 0, 0)[:2]
    return f"cu{major}{minor}"


def split_arch_list(arch: str) -> list[str]:
    return [t for t in re.split(r"[;\s]+", arch.strip()) if t]


@dataclass(frozen=True)
class ArchTarget:
    major: int
    minor: int
    suffix: str  # "", "a" or "f"
    ptx: bool

    def runs_natively_on_sm121(self) -> bool:
        """Whether this target yields a cubin that runs on sm_121 (fatbin facts)."""
        if self.major != 12:
            return False
        if self.suffix == "a":
            return self.minor == 1
        return self.minor <= 1  # plain 12.0/12.1 and family 12.0f/12.1f

    def has_block_scaled_kernels(self) -> bool:
        return self.suffix in ("a", "f")


def parse_arch_target(token: str) -> ArchTarget | None:
    m = _ARCH_TOKEN.fullmatch(token)
    if not m:
        return None
    return ArchTarget(int(m.group(1)), int(m.group(2)), m.group(3), bool(m.group(4)))


# --- the checks, one per rule family -------------------------------------------------

Emit = Callable[..., Problem]
CheckFn = Callable[[Profile, Emit], Iterator[Problem]]


def _check_cuda(p: Profile, emit: Emit) -> Iterator[Problem]:
    if parse_version(p.cuda.version)[:2] < MIN_CUDA:
        yield emit("cuda-too-old", "cuda.version", cuda=p.cuda.version)


def _check_arch(p: Profile, emit: Emit) -> Iterator[Problem]:
    if p.cuda.arch_list is None:
        return
    derived = arch_list_for(p.cuda.version) or "12.1a"
    arch = p.cuda.arch_list
    tokens = split_arch_list(arch)
    targets = []
    for token in tokens:
        target = parse_arch_target(token)
        if target is None:
            yield emit("arch-bad-token", "cuda.arch_list", target=token)
        else:
            targets.append((token, target))
    if len(targets) != len(tokens):
        return
    cuda = parse_version(p.cuda.version)[:2]
    for token, t in targets:
        if t.suffix == "f" and cuda < (13, 0):
            yield emit("arch-family-needs-cuda13", "cuda.arch_list", target=token, cuda=p.cuda.version)
    spark = [t for _, t in targets if t.runs_natively_on_sm121()]
    if {tok for tok, _ in targets} == {"9.0", "10.0+PTX"}:
        yield emit("arch-gh200-example", "cuda.arch_list", arch=arch, derived=derived)
    elif not spark:
        yield emit("arch-no-spark-target", "cuda.arch_list", arch=arch, derived=derived)
    elif not any(t.has_block_scaled_kernels() for t in spark):
        yield emit("arch-bare-120", "cuda.arch_list", arch=arch, derived=derived)


def _check_base(p: Profile, emit: Emit) -> Iterator[Problem]:
    """The rules hold for every spelling of the image: any registry (with a port, an
    IPv6 host, a mirror) and any namespace, as long as the repository is `.../cuda`."""
    image = p.cuda.base_image
    ref = base_image_reference(image)
    if ref is None:  # the schema refuses it first; nothing to judge here
        return
    if ref.digest is None or DIGEST.fullmatch(ref.digest) is None:
        yield emit("base-not-digest-pinned", "cuda.base_image", image=image)
    if ref.tag is None or ref.tag == "latest":
        yield emit("base-latest", "cuda.base_image", image=image)
    m = _CUDA_TAG.fullmatch(ref.tag or "")
    if ref.repository.rsplit("/", 1)[-1] == "cuda" and m:
        tag_cuda, flavors = m.group(1), (m.group(2) or "").split("-")
        if "devel" not in flavors:
            yield emit("base-not-devel", "cuda.base_image", image=image)
        if parse_version(tag_cuda) != parse_version(p.cuda.version)[: len(parse_version(tag_cuda))]:
            yield emit("base-cuda-mismatch", "cuda.base_image", tag_cuda=tag_cuda, cuda=p.cuda.version)


def _check_vllm_commit(p: Profile, emit: Emit) -> Iterator[Problem]:
    commit = p.vllm.commit
    if HEX40.match(commit):
        return
    if re.fullmatch(r"[0-9a-fA-F]{4,39}", commit):
        what = "a short SHA"
    elif re.fullmatch(r"[0-9A-F]{40}", commit.upper()) and commit != commit.lower():
        what = "an upper-case SHA (git prints lower case)"
    elif re.fullmatch(r"v?\d+(\.\d+)+\S*", commit):
        what = "a tag or version"
    else:
        what = "a branch or ref name"
    yield emit("vllm-commit-not-sha", "vllm.commit", commit=commit, what=what)


def _check_pins(p: Profile, emit: Emit) -> Iterator[Problem]:
    fi = p.flashinfer
    if fi.cubin is not None and fi.cubin != fi.python:
        yield emit("flashinfer-mismatch", "flashinfer.cubin", python=fi.python, cubin=fi.cubin)
    pins = {
        "nvidia-cutlass-dsl": ("cutlass_dsl.version", p.cutlass_dsl),
        "flashinfer-python": ("flashinfer.python", fi.python),
        "torch": ("torch.version", p.torch.version),
    }
    for package, version, reason, fix in KNOWN_BAD_PINS:
        field, pinned = pins.get(package, ("", None))
        if pinned == version:
            yield emit("known-bad-pin", field, package=package, version=version, reason=reason, fix=fix)
    if parse_version(p.torch.version)[:2] < MIN_TORCH:
        yield emit("torch-too-old", "torch.version", version=p.torch.version)
    m = re.search(r"/cu(\d{2})(\d)/?\Z", p.torch.index_url)
    if m and int(m.group(1)) != parse_version(p.cuda.version)[0]:
        yield emit(
            "torch-index-cuda-mismatch", "torch.index_url",
            index=p.torch.index_url, index_cuda=f"{m.group(1)}.{m.group(2)}", cuda=p.cuda.version,
        )


def _check_env(p: Profile, emit: Emit) -> Iterator[Problem]:
    for var, _ in p.serve_env:
        if var in REMOVED_ENV_VARS:
            yield emit("removed-env-var", f"serve.env.{var}", var=var, flag=REMOVED_ENV_VARS[var])


def _check_build(p: Profile, emit: Emit) -> Iterator[Problem]:
    if p.build.strategy == "wheel" and p.build.wheel is None:
        yield emit("wheel-strategy-needs-wheel", "build.wheel")
    if p.build.strategy == "source" and p.build.wheel is not None:
        yield emit("source-strategy-has-wheel", "build.wheel")
    if not p.verify.native_libraries:
        yield emit("native-libraries-empty", "verify.native_libraries")


CHECKS: tuple[CheckFn, ...] = (
    _check_cuda, _check_arch, _check_base, _check_vllm_commit, _check_pins, _check_env, _check_build,
)


def check_profile(profile: Profile) -> list[Problem]:
    """Apply every rule to a parsed profile; errors and warnings, in rule order."""

    def emit(rule_id: str, field: str, **details: str) -> Problem:
        rule = RULES[rule_id]
        return Problem(
            file=profile.path,
            field=field,
            message=rule.message.format(**details),
            fix=rule.fix.format(**details),
            severity=rule.severity,
            rule=rule.id,
        )

    return [problem for check in CHECKS for problem in check(profile, emit)]

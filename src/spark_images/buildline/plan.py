"""Profile -> BuildPlan: the profile resolved into everything a build needs (pure).

The plan derives the arch list from the CUDA line, the build args, the OCI
labels, the patches with their sha256, and the fixes the image must contain.
Rendering and building read only the plan. Patch contents are passed in by
the caller (the CLI reads the files), so this module does no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from spark_images import defaults
from spark_images.profiles import reqlock
from spark_images.profiles.patches import PatchRef, patch_ref
from spark_images.profiles.profile import Profile
from spark_images.profiles.toolchain import arch_list_for, cuda_line

LABEL_PREFIX = "io.spark-images"
PLAN_VERSION = 1


def default_system_packages(python: str) -> tuple[str, ...]:
    """Ubuntu packages the toolchain stage adds to an nvidia/cuda devel base."""
    return (
        "ca-certificates",
        "ccache",
        "curl",
        "git",
        f"python{python}",
        f"python{python}-dev",
        f"python{python}-venv",
    )


@dataclass(frozen=True)
class CoherencePlan:
    """The Spark gate's matrix, resolved once: the defaults of profiles.py applied and
    every combination listed in the order the gate tries it (guide 10.3)."""

    models: tuple[str, ...]
    moe_backends: tuple[str, ...]
    # None: each MoE backend is paired with the linear backend of the same name
    linear_backends: tuple[str, ...] | None
    kv_cache_dtypes: tuple[str, ...]
    # (model, moe_backend, linear_backend, kv_cache_dtype), no repeats
    combinations: tuple[tuple[str, str, str, str], ...]
    # recipes/NAME.yaml the gate serves with their exact command (read and checked by `resolve`)
    recipes: tuple[str, ...] = ()
    # times the gate serves each combination (A B A B ...); gate-only, so not in plan.json (see to_json)
    rounds: int = 1


def _backend(value: str) -> str:
    """vLLM's own spelling of a backend value: lower case, `-` becomes `_`."""
    return value.strip().lower().replace("-", "_")


def coherence_plan(profile: Profile) -> CoherencePlan | None:
    settings = profile.verify.coherence
    if settings is None:
        return None
    moe = [_backend(b) for b in settings.moe_backends]
    kv = [_backend(k) for k in settings.kv_cache_dtypes]
    if settings.linear_backends:
        pairs = [(m, _backend(lin)) for m in moe for lin in settings.linear_backends]
    else:
        pairs = [(m, m) for m in moe]
    combos: list[tuple[str, str, str, str]] = []
    for model in settings.models:
        for (m, lin) in pairs:
            for k in kv:
                if (model, m, lin, k) not in combos:
                    combos.append((model, m, lin, k))
    return CoherencePlan(
        models=settings.models,
        moe_backends=settings.moe_backends,
        linear_backends=settings.linear_backends,
        kv_cache_dtypes=settings.kv_cache_dtypes,
        combinations=tuple(combos),
        recipes=settings.recipes,
        rounds=settings.rounds,
    )


@dataclass(frozen=True)
class BuildPlan:
    plan_version: int
    profile_name: str
    profile_path: str
    strategy: str
    vllm_version: str
    vllm_commit: str
    vllm_repository: str
    cuda_version: str
    cuda_line: str
    cuda_home: str
    arch_list: str
    arch_list_source: str  # "derived" or "profile"
    base_image: str
    base_name: str
    base_digest: str
    python_version: str
    system_packages: tuple[str, ...]
    torch_version: str
    torch_index_url: str
    flashinfer_python: str
    flashinfer_cubin: str | None
    flashinfer_index_url: str | None
    cutlass_dsl: str
    wheel_url: str | None
    wheel_sha256: str | None
    requirements_lock: str | None
    # the lock's packages by site-packages layer (defaults.LOCK_LAYERS), in layer order;
    # each is unpacked by its own installer stage and copied in as its own layer
    lock_layers: tuple[tuple[str, tuple[str, ...]], ...]
    source_date_epoch: int | None  # a pin; else the build takes the vLLM commit time
    max_jobs: int
    nvcc_threads: int
    patches: tuple[PatchRef, ...]
    required_fixes: tuple[int, ...]
    native_libraries: tuple[str, ...]
    serve_env: tuple[tuple[str, str], ...]
    serve_args: tuple[str, ...]
    image_repository: str
    image_source: str
    labels: tuple[tuple[str, str], ...]
    # the Spark gate's settings: nothing after planning reads the Profile
    coherence: CoherencePlan | None = None

    @property
    def pins(self) -> dict[str, str]:
        pins = {
            "torch": self.torch_version,
            "flashinfer-python": self.flashinfer_python,
            "nvidia-cutlass-dsl": self.cutlass_dsl,
        }
        if self.flashinfer_cubin is not None:
            pins["flashinfer-cubin"] = self.flashinfer_cubin
        return pins

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["labels"] = dict(self.labels)
        doc["serve_env"] = dict(self.serve_env)
        doc["lock_layers"] = [{"name": name, "packages": list(packages)} for name, packages in self.lock_layers]
        doc["pins"] = self.pins
        if self.coherence is not None:
            keys = ("model", "moe_backend", "linear_backend", "kv_cache_dtype")
            doc["coherence"]["combinations"] = [dict(zip(keys, c, strict=True)) for c in self.coherence.combinations]
            if not self.coherence.recipes:  # a plan without recipes stays as it was (plan.json is in the image)
                del doc["coherence"]["recipes"]
            # how often the gate serves a combination is no part of the image: plan.json is copied into
            # the build context, so a gate-only setting here would change the digest it gates
            del doc["coherence"]["rounds"]
        return doc


def pins_label(pins: Mapping[str, str]) -> str:
    return ",".join(f"{k}=={v}" for k, v in sorted(pins.items()))


def make_plan(
    profile: Profile,
    patch_texts: Mapping[str, str] | None = None,
    profile_path: str | None = None,
    lock_text: str | None = None,
) -> BuildPlan:
    """Resolve a validated profile. `patch_texts` maps each patch path to its text;
    `profile_path` is the profile's path relative to its project (cwd-independent);
    `lock_text` is the requirements lock the profile names, split here into layers."""
    texts = patch_texts or {}
    refs = [patch_ref(path, texts.get(path, "")) for path in profile.patches]
    arch = profile.cuda.arch_list or arch_list_for(profile.cuda.version) or ""
    base_name, _, digest = profile.cuda.base_image.partition("@")
    pins = {
        "torch": profile.torch.version,
        "flashinfer-python": profile.flashinfer.python,
        "nvidia-cutlass-dsl": profile.cutlass_dsl,
        **({"flashinfer-cubin": profile.flashinfer.cubin} if profile.flashinfer.cubin else {}),
    }
    line = cuda_line(profile.cuda.version)
    labels = {
        "org.opencontainers.image.title": f"spark-vllm {profile.name}",
        "org.opencontainers.image.description": f"vLLM {profile.vllm.version} for the NVIDIA DGX Spark (GB10, sm_121), CUDA {profile.cuda.version}",
        "org.opencontainers.image.source": profile.image_source,
        "org.opencontainers.image.revision": profile.vllm.commit,
        "org.opencontainers.image.version": f"{profile.vllm.version}-{line}",
        "org.opencontainers.image.base.name": base_name,
        "org.opencontainers.image.base.digest": digest,
        f"{LABEL_PREFIX}.profile": profile.name,
        f"{LABEL_PREFIX}.strategy": profile.build.strategy,
        f"{LABEL_PREFIX}.vllm.commit": profile.vllm.commit,
        f"{LABEL_PREFIX}.vllm.version": profile.vllm.version,
        f"{LABEL_PREFIX}.cuda.version": profile.cuda.version,
        f"{LABEL_PREFIX}.cuda.line": line,
        f"{LABEL_PREFIX}.arch-list": arch,
        f"{LABEL_PREFIX}.pins": pins_label(pins),
        f"{LABEL_PREFIX}.fixes.required": ",".join(str(n) for n in profile.verify.required_fixes),
        f"{LABEL_PREFIX}.patches": ",".join(f"{r.path}@sha256:{r.sha256}" for r in refs),
    }
    packages = profile.build.system_packages
    return BuildPlan(
        plan_version=PLAN_VERSION,
        profile_name=profile.name,
        profile_path=profile_path or profile.path,
        strategy=profile.build.strategy,
        vllm_version=profile.vllm.version,
        vllm_commit=profile.vllm.commit,
        vllm_repository=profile.vllm.repository,
        cuda_version=profile.cuda.version,
        cuda_line=line,
        cuda_home=profile.cuda.home,
        arch_list=arch,
        arch_list_source="profile" if profile.cuda.arch_list else "derived",
        base_image=profile.cuda.base_image,
        base_name=base_name,
        base_digest=digest,
        python_version=profile.python,
        system_packages=tuple(sorted(packages)) if packages is not None else default_system_packages(profile.python),
        torch_version=profile.torch.version,
        torch_index_url=profile.torch.index_url,
        flashinfer_python=profile.flashinfer.python,
        flashinfer_cubin=profile.flashinfer.cubin,
        flashinfer_index_url=profile.flashinfer.index_url,
        cutlass_dsl=profile.cutlass_dsl,
        wheel_url=profile.build.wheel.url if profile.build.wheel else None,
        wheel_sha256=profile.build.wheel.sha256 if profile.build.wheel else None,
        requirements_lock=profile.build.requirements_lock,
        lock_layers=reqlock.layered(lock_text, defaults.LOCK_LAYERS, defaults.LAST_LAYER)
        if lock_text and profile.build.requirements_lock else (),
        source_date_epoch=profile.build.source_date_epoch,
        max_jobs=profile.build.max_jobs,
        nvcc_threads=profile.build.nvcc_threads,
        patches=tuple(refs),
        required_fixes=profile.verify.required_fixes,
        native_libraries=profile.verify.native_libraries,
        serve_env=profile.serve_env,
        serve_args=profile.serve_args,
        image_repository=profile.image_repository,
        image_source=profile.image_source,
        labels=tuple(sorted(labels.items())),
        coherence=coherence_plan(profile),
    )

"""Profiles: what a human pinned, validated into plain data (no derivation here).

`parse_profile(text, file)` is pure; `load_profile(path)` only reads the file.
Schema errors (unknown keys with "did you mean", wrong types, missing fields)
come from `schema.py`; the toolchain rules (arch lists, known-bad pins, ...)
are applied by `toolchain.check_profile` on the parsed Profile.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from spark_images.errors import Finding, Problem, UsageError
from spark_images.schema import Field, validate

HEX40 = re.compile(r"^[0-9a-f]{40}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
VERSION = re.compile(r"^\d+(\.\d+)*([a-z0-9.+-]*)$")
PYTHON_VERSION = re.compile(r"^3\.\d{1,2}$")
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
STRATEGIES = ("source", "wheel")


def _pattern(regex: re.Pattern[str], what: str) -> Any:
    def check(value: Any) -> str | None:
        return None if regex.match(str(value)) else f"{value!r} is not {what}"

    return check


def _one_of(*allowed: str) -> Any:
    def check(value: Any) -> str | None:
        return None if value in allowed else f"{value!r} is not one of {', '.join(allowed)}"

    return check


def _positive(value: Any) -> str | None:
    return None if value > 0 else f"{value} must be at least 1"


def _url(value: Any) -> str | None:
    return None if re.match(r"^(https?|file)://\S+$", value) else f"{value!r} is not an http(s) or file URL"


_STR_LIST = Field(list, items=Field(str))

SPEC: dict[str, Field] = {
    "name": Field(str, doc="the profile's name, e.g. cu130", check=_pattern(NAME, "a lower-case name")),
    "description": Field(str, required=False),
    "vllm": Field(
        dict,
        children={
            "version": Field(str, doc="the vLLM release, e.g. \"0.29.0\"", check=_pattern(VERSION, "a version")),
            "commit": Field(str, doc="the full 40-hex commit of that release"),
            "repository": Field(str, required=False, check=_url),
        },
    ),
    "cuda": Field(
        dict,
        children={
            "version": Field(str, doc="the CUDA toolkit version, e.g. \"13.0.2\"", check=_pattern(VERSION, "a version")),
            "base_image": Field(str, doc="the devel base image, NAME:TAG@sha256:DIGEST"),
            "arch_list": Field(str, required=False, nullable=True, doc="override TORCH_CUDA_ARCH_LIST only if you must"),
            "home": Field(str, required=False, doc="CUDA_HOME in the image (default /usr/local/cuda)"),
        },
    ),
    "python": Field(str, doc="the Python of the image, e.g. \"3.12\"", check=_pattern(PYTHON_VERSION, "a 3.X version")),
    "torch": Field(
        dict,
        children={
            "version": Field(str, check=_pattern(VERSION, "a version")),
            "index_url": Field(str, doc="the PyTorch index of the CUDA line, e.g. https://download.pytorch.org/whl/cu130", check=_url),
        },
    ),
    "flashinfer": Field(
        dict,
        children={
            "python": Field(str, doc="flashinfer-python version", check=_pattern(VERSION, "a version")),
            "cubin": Field(str, nullable=True, doc="flashinfer-cubin version (same as python) or null", check=_pattern(VERSION, "a version")),
            "index_url": Field(str, required=False, nullable=True, check=_url),
        },
    ),
    "cutlass_dsl": Field(
        dict,
        children={"version": Field(str, doc="nvidia-cutlass-dsl version", check=_pattern(VERSION, "a version"))},
    ),
    "build": Field(
        dict,
        children={
            "strategy": Field(str, doc="source or wheel", check=_one_of(*STRATEGIES)),
            "wheel": Field(
                dict,
                required=False,
                nullable=True,
                children={
                    "url": Field(str, check=_url),
                    "sha256": Field(str, doc="64 lower-case hex digits", check=_pattern(SHA256, "a sha256 (64 hex)")),
                },
            ),
            "max_jobs": Field(int, check=_positive),
            "nvcc_threads": Field(int, check=_positive),
            "requirements_lock": Field(str, required=False, nullable=True, doc="hash-pinned requirements file beside the profile"),
            "source_date_epoch": Field(int, required=False, nullable=True, check=_positive,
                                       doc="seconds since 1970 for every timestamp in the image (default: the vLLM commit time)"),
            "system_packages": Field(list, required=False, nullable=True, items=Field(str)),
        },
    ),
    "patches": Field(list, required=False, items=Field(str)),
    "serve": Field(
        dict,
        required=False,
        children={
            "env": Field(dict, required=False),
            "args": Field(list, required=False, items=Field(str)),
        },
    ),
    "verify": Field(
        dict,
        children={
            "required_fixes": Field(list, items=Field(int, check=_positive), doc="vLLM PR numbers"),
            "native_libraries": Field(list, items=Field(str), doc="globs under site-packages, e.g. vllm/_C*.so"),
            "coherence": Field(
                dict,
                required=False,
                children={
                    "models": _STR_LIST,
                    "moe_backends": Field(list, required=False, items=Field(str)),
                    "linear_backends": Field(list, required=False, items=Field(str)),
                    "kv_cache_dtypes": Field(list, required=False, items=Field(str)),
                },
            ),
        },
    ),
    "image": Field(
        dict,
        children={
            "repository": Field(str, doc="where the image is pushed, e.g. ghcr.io/OWNER/spark-vllm"),
            "source": Field(str, doc="URL of this project, for the OCI source label", check=_url),
        },
    ),
}


@dataclass(frozen=True)
class VllmPin:
    version: str
    commit: str
    repository: str


@dataclass(frozen=True)
class CudaPin:
    version: str
    base_image: str
    arch_list: str | None
    home: str


@dataclass(frozen=True)
class TorchPin:
    version: str
    index_url: str


@dataclass(frozen=True)
class FlashInferPin:
    python: str
    cubin: str | None
    index_url: str | None


@dataclass(frozen=True)
class WheelPin:
    url: str
    sha256: str


@dataclass(frozen=True)
class BuildSettings:
    strategy: str
    wheel: WheelPin | None
    max_jobs: int
    nvcc_threads: int
    requirements_lock: str | None
    system_packages: tuple[str, ...] | None
    source_date_epoch: int | None


@dataclass(frozen=True)
class CoherenceSettings:
    models: tuple[str, ...]
    moe_backends: tuple[str, ...]
    # None: each MoE backend is paired with the linear backend of the same name
    # (auto/auto, b12x/b12x, marlin/marlin: the guide's 10.3 order)
    linear_backends: tuple[str, ...] | None
    kv_cache_dtypes: tuple[str, ...]


@dataclass(frozen=True)
class VerifySettings:
    required_fixes: tuple[int, ...]
    native_libraries: tuple[str, ...]
    coherence: CoherenceSettings | None


@dataclass(frozen=True)
class Profile:
    name: str
    path: str  # as given (relative paths stay relative: plans must not depend on cwd)
    description: str
    vllm: VllmPin
    cuda: CudaPin
    python: str
    torch: TorchPin
    flashinfer: FlashInferPin
    cutlass_dsl: str
    build: BuildSettings
    patches: tuple[str, ...]
    serve_env: tuple[tuple[str, str], ...]
    serve_args: tuple[str, ...]
    verify: VerifySettings
    image_repository: str
    image_source: str


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (YAML would silently keep the last)."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key '{key}'", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_yaml(text: str, file: str) -> Any:
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(yaml)"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise Finding(Problem(file=file, field=where, message=f"not valid YAML: {problem}", fix="fix the YAML syntax")) from None


def parse_profile(text: str, file: str) -> Profile:
    """Validate the document against the schema and build a Profile (pure)."""
    doc = parse_yaml(text, file)
    problems = validate(doc, SPEC, file)
    if problems:
        raise Finding(*problems)
    return _to_profile(doc, file)


def load_profile(path: str | Path) -> Profile:
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(Problem(file=file, field="", message="no such profile file", fix="pass a path like profiles/cu130.yaml")) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(Problem(file=file, field="", message=f"cannot read: {exc}")) from None
    return parse_profile(text, file)


def _to_profile(doc: dict[str, Any], file: str) -> Profile:
    cuda, build, verify = doc["cuda"], doc["build"], doc["verify"]
    wheel = build.get("wheel")
    coherence = verify.get("coherence")
    serve = doc.get("serve") or {}
    packages = build.get("system_packages")
    return Profile(
        name=doc["name"],
        path=file,
        description=doc.get("description", ""),
        vllm=VllmPin(
            version=doc["vllm"]["version"],
            commit=doc["vllm"]["commit"],
            repository=doc["vllm"].get("repository", "https://github.com/vllm-project/vllm.git"),
        ),
        cuda=CudaPin(
            version=cuda["version"],
            base_image=cuda["base_image"],
            arch_list=cuda.get("arch_list"),
            home=cuda.get("home", "/usr/local/cuda"),
        ),
        python=doc["python"],
        torch=TorchPin(version=doc["torch"]["version"], index_url=doc["torch"]["index_url"]),
        flashinfer=FlashInferPin(
            python=doc["flashinfer"]["python"],
            cubin=doc["flashinfer"]["cubin"],
            index_url=doc["flashinfer"].get("index_url"),
        ),
        cutlass_dsl=doc["cutlass_dsl"]["version"],
        build=BuildSettings(
            strategy=build["strategy"],
            wheel=WheelPin(url=wheel["url"], sha256=wheel["sha256"]) if wheel else None,
            max_jobs=build["max_jobs"],
            nvcc_threads=build["nvcc_threads"],
            requirements_lock=build.get("requirements_lock"),
            system_packages=tuple(packages) if packages is not None else None,
            source_date_epoch=build.get("source_date_epoch"),
        ),
        patches=tuple(doc.get("patches") or ()),
        serve_env=tuple(sorted((str(k), str(v)) for k, v in (serve.get("env") or {}).items())),
        serve_args=tuple(serve.get("args") or ()),
        verify=VerifySettings(
            required_fixes=tuple(verify["required_fixes"]),
            native_libraries=tuple(verify["native_libraries"]),
            coherence=CoherenceSettings(
                models=tuple(coherence["models"]),
                moe_backends=tuple(coherence.get("moe_backends") or ("auto",)),
                linear_backends=tuple(coherence["linear_backends"]) if coherence.get("linear_backends") else None,
                kv_cache_dtypes=tuple(coherence.get("kv_cache_dtypes") or ("auto",)),
            )
            if coherence
            else None,
        ),
        image_repository=doc["image"]["repository"],
        image_source=doc["image"]["source"],
    )

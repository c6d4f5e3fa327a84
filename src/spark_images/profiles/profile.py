"""Profiles: what a human pinned, validated into plain data (no derivation here).

`parse_profile(text, file)` is pure; `load_profile(path)` only reads the file.
Schema errors (unknown keys with "did you mean", wrong types, missing fields)
come from `schema.py`; the toolchain rules (arch lists, known-bad pins, ...)
are applied by `toolchain.check_profile` on the parsed Profile.

Every string is checked for what it is, with full matches, by the grammars
of `profile_values.py` (versions, image references, URLs, Debian package
names, environment names, paths that stay inside the project). Rendering
quotes each value again for where it lands; these checks keep the Dockerfile
readable and refuse what no quoting should have to carry.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_images import defaults
from spark_images.core import inputs
from spark_images.core.errors import Finding
from spark_images.profiles.schema import Field, json_schema, validate
from spark_images.profiles.values import (
    ABSOLUTE_PATH,
    ARCH_LIST,
    BACKEND,
    CUDA_VERSION,
    DEBIAN_PACKAGE,
    ENV_KEY,
    GLOB,
    MODEL,
    NAME,
    ONE_LINE,
    PYTHON_VERSION,
    STRATEGIES,
    VERSION,
    base_image_problem,
    between,
    matching,
    pep440_problem,
    project_path_problem,
    relative_path,
    repository_problem,
    url_check,
)

# The one place each default lives (the JSON Schema shows them too).
DEFAULT_VLLM_REPOSITORY = defaults.VLLM_GIT_URL
DEFAULT_CUDA_HOME = "/usr/local/cuda"
DEFAULT_MOE_BACKENDS: tuple[str, ...] = ("auto",)
DEFAULT_KV_CACHE_DTYPES: tuple[str, ...] = ("auto",)
# One round: each round reloads the model (minutes on a Spark), so more is asked for, not assumed.
DEFAULT_COHERENCE_ROUNDS = 1
MAX_COHERENCE_ROUNDS = 20

PROFILE_LIMIT = 1024 * 1024  # bytes of a profile file; ours are ~3 KB
SCHEMA_ID = "https://github.com/spark-images/spark-images/profile.schema.json"


_VERSION = matching(VERSION, "a version")
_PY_VERSION = Field(str, pattern=VERSION.pattern, what="a version", check=pep440_problem)
_ONE_LINE = Field(str, pattern=ONE_LINE.pattern, what="one line of text")

SPEC: dict[str, Field] = {
    "name": matching(NAME, "a lower-case name", doc="the profile's name, e.g. cu130", max_length=64),
    "description": Field(str, required=False, pattern=ONE_LINE.pattern, what="one line of text", max_length=1000),
    "vllm": Field(
        dict,
        children={
            "version": Field(str, doc="the vLLM release, e.g. \"0.29.0\"", pattern=VERSION.pattern, what="a version", check=pep440_problem),
            "commit": Field(str, doc="the full 40-hex commit of that release"),
            "repository": Field(str, required=False, check=url_check, max_length=2048, default=DEFAULT_VLLM_REPOSITORY),
        },
    ),
    "cuda": Field(
        dict,
        children={
            "version": Field(str, doc="the CUDA toolkit version, e.g. \"13.0.2\"", pattern=CUDA_VERSION.pattern,
                             what="a CUDA toolkit version (MAJOR.MINOR or MAJOR.MINOR.PATCH, digits only, e.g. 13.0.2)"),
            "base_image": Field(str, doc="the devel base image, NAME:TAG@sha256:DIGEST", check=base_image_problem),
            "arch_list": Field(str, required=False, nullable=True, doc="override TORCH_CUDA_ARCH_LIST only if you must",
                               pattern=ARCH_LIST.pattern, what="an arch list (entries like 12.0f or 12.1a, separated by ';' or spaces)"),
            "home": Field(str, required=False, doc="CUDA_HOME in the image (default /usr/local/cuda)",
                          pattern=ABSOLUTE_PATH.pattern, what="an absolute path (letters, digits, . _ + - and /)",
                          default=DEFAULT_CUDA_HOME),
        },
    ),
    "python": Field(str, doc="the Python of the image, e.g. \"3.12\"", pattern=PYTHON_VERSION.pattern, what="a 3.X version"),
    "torch": Field(
        dict,
        children={
            "version": _PY_VERSION,
            "index_url": Field(str, doc="the PyTorch index of the CUDA line, e.g. https://download.pytorch.org/whl/cu130", check=url_check, max_length=2048),
        },
    ),
    "flashinfer": Field(
        dict,
        children={
            "python": Field(str, doc="flashinfer-python version", pattern=VERSION.pattern, what="a version", check=pep440_problem),
            "cubin": Field(str, nullable=True, doc="flashinfer-cubin version (same as python) or null", pattern=VERSION.pattern,
                           what="a version", check=pep440_problem),
            "index_url": Field(str, required=False, nullable=True, check=url_check, max_length=2048),
        },
    ),
    "cutlass_dsl": Field(
        dict,
        children={"version": Field(str, doc="nvidia-cutlass-dsl version", pattern=VERSION.pattern, what="a version", check=pep440_problem)},
    ),
    "build": Field(
        dict,
        children={
            "strategy": Field(str, doc="source or wheel", enum=STRATEGIES),
            "wheel": Field(
                dict,
                required=False,
                nullable=True,
                children={
                    "url": Field(str, check=url_check, max_length=2048),
                    "sha256": Field(str, doc="64 lower-case hex digits", pattern=inputs.SHA256_HEX.pattern, what="a sha256 (64 hex)"),
                },
            ),
            "max_jobs": Field(int, check=between(1, 1024)),
            "nvcc_threads": Field(int, check=between(1, 1024)),
            "requirements_lock": relative_path("a relative path (letters, digits, . _ + - and /)", required=False, nullable=True,
                                           doc="hash-pinned requirements file, relative to the folder that holds profiles/"),
            "source_date_epoch": Field(int, required=False, nullable=True, check=between(1, 253402300799),
                                       doc="seconds since 1970 for every timestamp in the image (default: the vLLM commit time)"),
            "system_packages": Field(list, required=False, nullable=True,
                                     items=matching(DEBIAN_PACKAGE, "a Debian package name ([a-z0-9][a-z0-9+.-]+)", max_length=128)),
        },
    ),
    "patches": Field(list, required=False, items=relative_path("a relative path (letters, digits, . _ + - and /)",
                                                           doc="a patch file, relative to the folder that holds profiles/")),
    "serve": Field(
        dict,
        required=False,
        children={
            "env": Field(dict, required=False,
                         keys=matching(ENV_KEY, "an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"),
                         values=Field(str, pattern=ONE_LINE.pattern, what="one line of text", max_length=4096,
                                      doc='quote values that YAML would read otherwise, e.g. "true", "8000", ""')),
            "args": Field(list, required=False, items=Field(str, pattern=ONE_LINE.pattern, what="one line of text", max_length=4096)),
        },
    ),
    "verify": Field(
        dict,
        children={
            "required_fixes": Field(list, items=Field(int, check=between(1, 10**8)), doc="vLLM PR numbers"),
            "native_libraries": Field(list, items=Field(str, pattern=GLOB.pattern, what="a glob under site-packages", check=project_path_problem),
                                      doc="globs under site-packages, e.g. vllm/_C*.so"),
            "coherence": Field(
                dict,
                required=False,
                children={
                    "models": Field(list, items=matching(MODEL, "a model id (ORG/NAME)"), min_items=1,
                                    doc="at least one model id (ORG/NAME) the gate serves; leave verify.coherence out to have no gate"),
                    "moe_backends": Field(list, required=False, items=matching(BACKEND, "a backend name"), default=DEFAULT_MOE_BACKENDS),
                    "linear_backends": Field(list, required=False, items=matching(BACKEND, "a backend name"),
                                             doc="unset: each MoE backend with the linear backend of the same name"),
                    "kv_cache_dtypes": Field(list, required=False, items=matching(BACKEND, "a KV-cache dtype"), default=DEFAULT_KV_CACHE_DTYPES),
                    "recipes": Field(list, required=False, items=matching(NAME, "a recipe name (recipes/NAME.yaml)"),
                                     doc="recipes the gate serves with their exact command (recipes/NAME.yaml)"),
                    "rounds": Field(int, required=False, check=between(1, MAX_COHERENCE_ROUNDS), default=DEFAULT_COHERENCE_ROUNDS,
                                    doc="times `coherence --profile` and the build line's gate serve each combination, interleaved "
                                    "(A B A B ...), its speed runs pooled; each round reloads the model (gate-only: not in "
                                    "the image's plan.json)"),
                },
            ),
        },
    ),
    "image": Field(
        dict,
        children={
            "repository": Field(str, doc="where the image is pushed, e.g. ghcr.io/OWNER/spark-vllm", check=repository_problem),
            "source": Field(str, doc="URL of this project, for the OCI source label", check=url_check, max_length=2048),
        },
    ),
}


def profile_json_schema() -> dict[str, Any]:
    """The JSON Schema of a profile, generated from SPEC (what `spark-images schema` prints)."""
    return json_schema(SPEC, title="spark-images profile", schema_id=SCHEMA_ID)


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
    recipes: tuple[str, ...] = ()  # recipes/NAME.yaml the gate serves (spark_images.recipes.gate)
    rounds: int = DEFAULT_COHERENCE_ROUNDS  # each combination served this often, A B A B ...


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


def parse_yaml(text: str, file: str) -> Any:
    """A profile's YAML, bounded (size, depth, aliases) and with duplicate keys refused."""
    return inputs.loads_yaml(text, file=file, what="profile", max_bytes=PROFILE_LIMIT)


def parse_profile(text: str, file: str) -> Profile:
    """Validate the document against the schema and build a Profile (pure)."""
    doc = parse_yaml(text, file)
    problems = validate(doc, SPEC, file)
    if problems:
        raise Finding(*problems)
    return _to_profile(doc, file)


def load_profile(path: str | Path) -> Profile:
    """Read a profile (a regular file of at most PROFILE_LIMIT bytes, UTF-8) and parse it."""
    text = inputs.read_text(path, what="profile", limit=PROFILE_LIMIT, example="profiles/cu130.yaml")
    return parse_profile(text, inputs.display_path(path))


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
            repository=doc["vllm"].get("repository", DEFAULT_VLLM_REPOSITORY),
        ),
        cuda=CudaPin(
            version=cuda["version"],
            base_image=cuda["base_image"],
            arch_list=cuda.get("arch_list"),
            home=cuda.get("home", DEFAULT_CUDA_HOME),
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
        serve_env=tuple(sorted((serve.get("env") or {}).items())),  # keys and values are strings (schema)
        serve_args=tuple(serve.get("args") or ()),
        verify=VerifySettings(
            required_fixes=tuple(verify["required_fixes"]),
            native_libraries=tuple(verify["native_libraries"]),
            coherence=CoherenceSettings(
                models=tuple(coherence["models"]),
                moe_backends=tuple(coherence.get("moe_backends") or DEFAULT_MOE_BACKENDS),
                linear_backends=tuple(coherence["linear_backends"]) if coherence.get("linear_backends") else None,
                kv_cache_dtypes=tuple(coherence.get("kv_cache_dtypes") or DEFAULT_KV_CACHE_DTYPES),
                recipes=tuple(coherence.get("recipes") or ()),
                rounds=coherence.get("rounds", DEFAULT_COHERENCE_ROUNDS),
            )
            if coherence
            else None,
        ),
        image_repository=doc["image"]["repository"],
        image_source=doc["image"]["source"],
    )

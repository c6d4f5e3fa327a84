"""Profiles: what a human pinned, validated into plain data (no derivation here).

`parse_profile(text, file)` is pure; `load_profile(path)` only reads the file.
Schema errors (unknown keys with "did you mean", wrong types, missing fields)
come from `schema.py`; the toolchain rules (arch lists, known-bad pins, ...)
are applied by `toolchain.check_profile` on the parsed Profile.

Every string is checked for what it is, with full matches (a trailing newline
never passes): versions (PEP 440 for Python packages), image references in the
one grammar of `registry/reference.py`, URLs parsed by urllib (https or file,
no whitespace, quotes, `$` or backticks), Debian package names, environment
names and string-only values, paths that stay inside the project. Rendering
quotes each value again for where it lands; these checks keep the Dockerfile
readable and refuse what no quoting should have to carry.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from spark_images import inputs
from spark_images.errors import Finding, Problem, SparkImagesError, UsageError
from spark_images.registry.reference import ImageReference, names_registry
from spark_images.schema import Field, json_schema, show, validate

# Every pattern is used with re.fullmatch (a trailing newline never passes).
HEX40 = re.compile(r"[0-9a-f]{40}\Z")  # \Z: callers that use .match() get a full match too
SHA256 = re.compile(r"[0-9a-f]{64}")
VERSION = re.compile(r"\d+(\.\d+)*([a-z0-9.+-]*)")
PYTHON_VERSION = re.compile(r"3\.\d{1,2}")
NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
DEBIAN_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+")  # Debian policy 5.6.1
ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# one path component: letters, digits and . _ + - (no quoting needed anywhere)
_PART = r"[A-Za-z0-9_+-][A-Za-z0-9._+-]*|\.[A-Za-z0-9_+-][A-Za-z0-9._+-]*"
RELATIVE_PATH = re.compile(rf"(?:{_PART})(?:/(?:{_PART}))*")
ABSOLUTE_PATH = re.compile(rf"(?:/(?:{_PART}))+/?")
GLOB = re.compile(r"[A-Za-z0-9._+*?\[\]-]+(?:/[A-Za-z0-9._+*?\[\]-]+)*")
MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(?:/[A-Za-z0-9][A-Za-z0-9._-]*)?")  # ORG/NAME as the Hub spells it
BACKEND = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
ARCH_LIST = re.compile(r"[A-Za-z0-9.+]+(?:[; ]+[A-Za-z0-9.+]+)*")  # tokens are judged by the toolchain rules
# RFC 3986 characters, less quotes and `$` (a URL never needs them; percent-encode)
URL_CHARS = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!&()*+,;=%]+")
ONE_LINE = re.compile(r"[^\x00-\x1f\x7f]*")  # printable text, no newline or control character
STRATEGIES = ("source", "wheel")
URL_SCHEMES = ("https", "file")

# The one place each default lives (the JSON Schema shows them too).
DEFAULT_VLLM_REPOSITORY = "https://github.com/vllm-project/vllm.git"
DEFAULT_CUDA_HOME = "/usr/local/cuda"
DEFAULT_MOE_BACKENDS: tuple[str, ...] = ("auto",)
DEFAULT_KV_CACHE_DTYPES: tuple[str, ...] = ("auto",)

PROFILE_LIMIT = 1024 * 1024  # bytes of a profile file; ours are ~3 KB
SCHEMA_ID = "https://github.com/spark-images/spark-images/profile.schema.json"


def _is(regex: re.Pattern[str], what: str, **kw: Any) -> Field:
    """A string field that must fully match `regex`."""
    return Field(str, pattern=regex.pattern, what=what, **kw)


def _between(minimum: int, maximum: int) -> Any:
    def check(value: Any) -> str | None:
        if value < minimum:
            return f"{value} must be at least {minimum}"
        return f"{value} must be at most {maximum}" if value > maximum else None

    check.minimum, check.maximum = minimum, maximum  # type: ignore[attr-defined]
    return check


def _pep440(value: Any) -> str | None:
    """Python package versions must also be PEP 440 (pip compares them that way)."""
    try:
        Version(value)
    except InvalidVersion:
        return f"{show(value)} is not a PEP 440 version"
    return None


def url_problem(value: str) -> str | None:
    """Why VALUE is not an https or file URL we will put in a Dockerfile, or None."""
    if URL_CHARS.fullmatch(value) is None:
        return f"{show(value)} is not a URL: it holds whitespace, quotes, $, backticks or other characters a URL never needs (percent-encode them)"
    try:
        parts = urllib.parse.urlsplit(value)
        _ = parts.port  # a port that is not a number raises
    except ValueError as exc:
        return f"{show(value)} is not a URL ({exc})"
    if parts.scheme not in URL_SCHEMES:
        return f"{show(value)} is not an https or file URL"
    if parts.scheme == "https" and not parts.hostname:
        return f"{show(value)} is not an https URL with a host"
    if parts.scheme == "file" and (parts.netloc not in ("", "localhost") or not parts.path.startswith("/")):
        return f"{show(value)} is not a file URL (file:///ABSOLUTE/PATH)"
    return None


def _url(value: Any) -> str | None:
    return url_problem(value)


def base_image_reference(text: str) -> ImageReference | None:
    """The base image as a reference; a name without a registry host means Docker Hub,
    as it does to FROM (`nvidia/cuda:...` is `docker.io/nvidia/cuda:...`)."""
    return ImageReference.parse_or_none(text if names_registry(text) else f"docker.io/{text}")


def _base_image(value: Any) -> str | None:
    if base_image_reference(value) is None:
        why = ImageReference.problem(value if names_registry(value) else f"docker.io/{value}")
        return f"{show(value)} is not an image reference ({why})"
    return None


def _repository(value: Any) -> str | None:
    if not names_registry(value):  # parse_or_none alone takes `owner/name` as host/path
        return f"{show(value)} is not an image repository (it does not start with a registry host, e.g. ghcr.io/OWNER/NAME)"
    why = ImageReference.problem(value)
    if why is not None:
        return f"{show(value)} is not an image repository ({why})"
    ref = ImageReference.parse_or_none(value)
    if ref is not None and (ref.tag or ref.digest):
        return f"{show(value)} names a tag or digest; give the repository only (tags are set by publish)"
    return None


def _project_path(value: Any) -> str | None:
    """Paths in a profile are relative to the project and stay inside it."""
    if value.startswith("/"):
        return f"{show(value)} is an absolute path; name it relative to the folder that holds profiles/"
    if ".." in value.split("/"):
        return f"{show(value)} leaves the project (..); name a file inside it"
    return None


def _relative(what: str, **kw: Any) -> Field:
    return Field(str, pattern=RELATIVE_PATH.pattern, what=what, check=_project_path, **kw)


_VERSION = _is(VERSION, "a version")
_PY_VERSION = Field(str, pattern=VERSION.pattern, what="a version", check=_pep440)
_ONE_LINE = Field(str, pattern=ONE_LINE.pattern, what="one line of text")

SPEC: dict[str, Field] = {
    "name": _is(NAME, "a lower-case name", doc="the profile's name, e.g. cu130", max_length=64),
    "description": Field(str, required=False, pattern=ONE_LINE.pattern, what="one line of text", max_length=1000),
    "vllm": Field(
        dict,
        children={
            "version": Field(str, doc="the vLLM release, e.g. \"0.29.0\"", pattern=VERSION.pattern, what="a version", check=_pep440),
            "commit": Field(str, doc="the full 40-hex commit of that release"),
            "repository": Field(str, required=False, check=_url, max_length=2048, default=DEFAULT_VLLM_REPOSITORY),
        },
    ),
    "cuda": Field(
        dict,
        children={
            "version": Field(str, doc="the CUDA toolkit version, e.g. \"13.0.2\"", pattern=VERSION.pattern, what="a version"),
            "base_image": Field(str, doc="the devel base image, NAME:TAG@sha256:DIGEST", check=_base_image),
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
            "index_url": Field(str, doc="the PyTorch index of the CUDA line, e.g. https://download.pytorch.org/whl/cu130", check=_url, max_length=2048),
        },
    ),
    "flashinfer": Field(
        dict,
        children={
            "python": Field(str, doc="flashinfer-python version", pattern=VERSION.pattern, what="a version", check=_pep440),
            "cubin": Field(str, nullable=True, doc="flashinfer-cubin version (same as python) or null", pattern=VERSION.pattern,
                           what="a version", check=_pep440),
            "index_url": Field(str, required=False, nullable=True, check=_url, max_length=2048),
        },
    ),
    "cutlass_dsl": Field(
        dict,
        children={"version": Field(str, doc="nvidia-cutlass-dsl version", pattern=VERSION.pattern, what="a version", check=_pep440)},
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
                    "url": Field(str, check=_url, max_length=2048),
                    "sha256": Field(str, doc="64 lower-case hex digits", pattern=SHA256.pattern, what="a sha256 (64 hex)"),
                },
            ),
            "max_jobs": Field(int, check=_between(1, 1024)),
            "nvcc_threads": Field(int, check=_between(1, 1024)),
            "requirements_lock": _relative("a relative path (letters, digits, . _ + - and /)", required=False, nullable=True,
                                           doc="hash-pinned requirements file, relative to the folder that holds profiles/"),
            "source_date_epoch": Field(int, required=False, nullable=True, check=_between(1, 253402300799),
                                       doc="seconds since 1970 for every timestamp in the image (default: the vLLM commit time)"),
            "system_packages": Field(list, required=False, nullable=True,
                                     items=_is(DEBIAN_PACKAGE, "a Debian package name ([a-z0-9][a-z0-9+.-]+)", max_length=128)),
        },
    ),
    "patches": Field(list, required=False, items=_relative("a relative path (letters, digits, . _ + - and /)",
                                                           doc="a patch file, relative to the folder that holds profiles/")),
    "serve": Field(
        dict,
        required=False,
        children={
            "env": Field(dict, required=False,
                         keys=_is(ENV_KEY, "an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"),
                         values=Field(str, pattern=ONE_LINE.pattern, what="one line of text", max_length=4096,
                                      doc='quote values that YAML would read otherwise, e.g. "true", "8000", ""')),
            "args": Field(list, required=False, items=Field(str, pattern=ONE_LINE.pattern, what="one line of text", max_length=4096)),
        },
    ),
    "verify": Field(
        dict,
        children={
            "required_fixes": Field(list, items=Field(int, check=_between(1, 10**8)), doc="vLLM PR numbers"),
            "native_libraries": Field(list, items=Field(str, pattern=GLOB.pattern, what="a glob under site-packages", check=_project_path),
                                      doc="globs under site-packages, e.g. vllm/_C*.so"),
            "coherence": Field(
                dict,
                required=False,
                children={
                    "models": Field(list, items=_is(MODEL, "a model id (ORG/NAME)")),
                    "moe_backends": Field(list, required=False, items=_is(BACKEND, "a backend name"), default=DEFAULT_MOE_BACKENDS),
                    "linear_backends": Field(list, required=False, items=_is(BACKEND, "a backend name"),
                                             doc="unset: each MoE backend with the linear backend of the same name"),
                    "kv_cache_dtypes": Field(list, required=False, items=_is(BACKEND, "a KV-cache dtype"), default=DEFAULT_KV_CACHE_DTYPES),
                },
            ),
        },
    ),
    "image": Field(
        dict,
        children={
            "repository": Field(str, doc="where the image is pushed, e.g. ghcr.io/OWNER/spark-vllm", check=_repository),
            "source": Field(str, doc="URL of this project, for the OCI source label", check=_url, max_length=2048),
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
    file = inputs.display_path(path)
    try:
        text = inputs.read_text(path, what="profile", limit=PROFILE_LIMIT)
    except SparkImagesError as exc:
        if any(p.message == "no such profile file" for p in exc.problems):
            raise UsageError(Problem(file=file, field="", message="no such profile file",
                                     fix="pass a path like profiles/cu130.yaml")) from None
        raise
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
            )
            if coherence
            else None,
        ),
        image_repository=doc["image"]["repository"],
        image_source=doc["image"]["source"],
    )

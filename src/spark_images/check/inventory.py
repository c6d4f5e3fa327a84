"""What an image or wheel set holds, read from its own files (pure: bytes in, facts out).

`Collector.wants(path)` says which files the one pass over the target must
read; `Collector.add(path, data)` parses each into facts; `Collector.finish()`
returns the `Inventory` the rules are applied to. Nothing here opens a file:
the I/O edge (`check.collect`) feeds the bytes.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

from spark_images.pypi import normalize

# packages named in the report even when the rules do not need them
KEY_PACKAGES = (
    "vllm", "torch", "triton", "flashinfer-python", "flashinfer-cubin", "nvidia-cutlass-dsl",
)  # fmt: skip

_METADATA = re.compile(r"(?:^|/)([^/]+)-([^/-]+)\.dist-info/METADATA$")
_VERSION_JSON = re.compile(r"(?:^|/)(cuda[^/]*)/version\.json$")
_TOOL = re.compile(r"(?:^|/)bin/(nvcc|ptxas)$")
_TRITON_PTXAS = re.compile(r"(?:^|/)triton/backends/nvidia/bin/(ptxas[^/]*)$")
_SITE = re.compile(r"^(.*?(?:site|dist)-packages)/")
# the release line every CUDA tool binary embeds: "Cuda compilation tools, release 13.0, V13.0.88"
_RELEASE = re.compile(rb"Cuda compilation tools, release (\d+\.\d+), V(\d+\.\d+\.\d+)")
_SM121A = b"sm_121a"
_PY_STR = r"""\s*[:=]\s*(?:[\w.\[\]]+\s*[:=]\s*)*['"]([^'"]*)['"]"""


def _py_value(text: str, name: str) -> str | None:
    """The string assigned to `name` in a generated version file (`a = b = '1.0'` too)."""
    m = re.search(rf"^{re.escape(name)}{_PY_STR}", text, re.MULTILINE)
    return m.group(1) if m else None


def site_relative(path: str) -> str:
    """'usr/lib/python3/dist-packages/vllm/_C.so' -> 'vllm/_C.so' (unchanged outside site-packages)."""
    m = _SITE.match(path)
    return path[m.end() :] if m else path


def site_dir(path: str) -> str:
    m = _SITE.match(path)
    return m.group(1) if m else posixpath.dirname(path)


@dataclass(frozen=True)
class Package:
    name: str  # normalised (PEP 503)
    version: str
    location: str  # the site-packages directory (or the wheel/dir root)

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "version": self.version, "location": self.location}


@dataclass(frozen=True)
class Tool:
    """A CUDA tool binary found in the target (never executed)."""

    path: str
    release: str | None  # "13.0" from the embedded release line
    build: str | None  # "13.0.88"
    knows_sm121a: bool

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "release": self.release, "version": self.build,
                "knows_sm_121a": self.knows_sm121a}  # fmt: skip


@dataclass(frozen=True)
class ImageConfig:
    env: tuple[tuple[str, str], ...] = ()
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()

    def get_env(self, name: str) -> str | None:
        return next((v for k, v in self.env if k == name), None)

    def to_json(self) -> dict[str, Any]:
        return {"env": dict(self.env), "entrypoint": list(self.entrypoint), "cmd": list(self.cmd),
                "labels": dict(self.labels)}  # fmt: skip


def parse_config(doc: Any) -> ImageConfig:
    """An OCI/Docker image config document (`{"config": {"Env": [...], ...}}`) -> ImageConfig."""
    cfg = doc.get("config") if isinstance(doc, dict) else None
    if not isinstance(cfg, dict):
        cfg = doc if isinstance(doc, dict) else {}

    def strings(value: Any) -> tuple[str, ...]:
        return tuple(str(v) for v in value) if isinstance(value, list) else ()

    env = []
    for item in strings(cfg.get("Env")):
        key, _, value = item.partition("=")
        env.append((key, value))
    labels = cfg.get("Labels") if isinstance(cfg.get("Labels"), dict) else {}
    return ImageConfig(
        env=tuple(env),
        entrypoint=strings(cfg.get("Entrypoint")),
        cmd=strings(cfg.get("Cmd")),
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
    )


def parse_metadata(data: bytes) -> tuple[str, str] | None:
    """(Name, Version) from the header block of a dist-info METADATA file."""
    head = bytes(data[:65536]).split(b"\n\n", 1)[0].decode("utf-8", "replace")
    name = re.search(r"^Name:\s*(\S+)", head, re.MULTILINE)
    version = re.search(r"^Version:\s*(\S+)", head, re.MULTILINE)
    if not name or not version:
        return None
    return normalize(name.group(1)), version.group(1)


def parse_tool(path: str, data: bytes | bytearray | memoryview | Any) -> Tool:
    """Release and support for sm_121a from the binary's own strings (never executed)."""
    m = _RELEASE.search(data)
    release = m.group(1).decode() if m else None
    build = m.group(2).decode() if m else None
    return Tool(path=path, release=release, build=build, knows_sm121a=data.find(_SM121A) != -1)


def parse_env_vars(data: bytes) -> frozenset[str] | None:
    """The variables the image's vllm/envs.py defines (parsed with ast, never imported)."""
    import ast

    from spark_images.check.vllm_source import env_facts

    try:
        tree = ast.parse(bytes(data).decode("utf-8", "replace"))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return env_facts(tree)[0]


def parse_cuda_version_json(data: bytes) -> str | None:
    import json

    try:
        doc = json.loads(bytes(data))
    except ValueError:
        return None
    cuda = doc.get("cuda") if isinstance(doc, dict) else None
    version = cuda.get("version") if isinstance(cuda, dict) else None
    return str(version) if version else None


@dataclass
class Inventory:
    """Every fact the rules use, in one place (JSON-serialisable through `to_json`)."""

    packages: dict[str, list[Package]] = field(default_factory=dict)
    vllm_version: str | None = None
    vllm_commit: str | None = None
    vllm_version_file: str | None = None
    torch_version: str | None = None
    torch_cuda: str | None = None
    toolkits: list[tuple[str, str]] = field(default_factory=list)  # (version.json path, version)
    nvcc: list[Tool] = field(default_factory=list)
    ptxas: list[Tool] = field(default_factory=list)
    triton_ptxas: list[Tool] = field(default_factory=list)
    triton_ptxas_path: str | None = None  # TRITON_PTXAS_PATH from the config
    triton_ptxas_target: Tool | None = None  # the file it names, when found
    config: ImageConfig | None = None
    problems: list[str] = field(default_factory=list)
    # the keys of environment_variables in the image's own vllm/envs.py (None: no envs.py read)
    vllm_env_vars: frozenset[str] | None = None
    vllm_envs_file: str | None = None

    def version_of(self, name: str) -> str | None:
        found = self.packages.get(normalize(name))
        return found[0].version if found else None

    def cuda_version(self) -> tuple[str, str] | None:
        """(version, where it comes from) of the image's CUDA toolkit, best source first."""
        if self.toolkits:
            path, version = self.toolkits[0]
            return version, path
        for tool in self.nvcc:
            if tool.build and not site_dir(tool.path).endswith("-packages"):
                return tool.build, tool.path
        for name in ("cuda-toolkit", "nvidia-cuda-runtime", "nvidia-cuda-runtime-cu12"):
            version = self.version_of(name)
            if version:
                return version, f"{name} dist-info"
        return None

    def to_json(self) -> dict[str, Any]:
        cuda = self.cuda_version()
        return {
            "packages": [p.to_json() for name in sorted(self.packages) for p in self.packages[name]],
            "vllm": {"version": self.vllm_version, "commit": self.vllm_commit, "file": self.vllm_version_file},
            "torch": {"version": self.torch_version, "cuda": self.torch_cuda},
            "cuda": {
                "version": cuda[0] if cuda else None,
                "source": cuda[1] if cuda else None,
                "toolkits": [{"path": p, "version": v} for p, v in self.toolkits],
                "nvcc": [t.to_json() for t in self.nvcc],
                "ptxas": [t.to_json() for t in self.ptxas],
                "triton_ptxas": [t.to_json() for t in self.triton_ptxas],
                "triton_ptxas_path": self.triton_ptxas_path,
                "triton_ptxas_path_target": self.triton_ptxas_target.to_json() if self.triton_ptxas_target else None,
            },
            "config": self.config.to_json() if self.config else None,
            "problems": list(self.problems),
        }


def _normal_path(text: str) -> str:
    return posixpath.normpath("/" + text).lstrip("/")


class Collector:
    """Feed it the target's wanted files in any order; `finish()` gives the Inventory."""

    def __init__(self, config: ImageConfig | None = None) -> None:
        self.inv = Inventory(config=config)
        ptxas_path = config.get_env("TRITON_PTXAS_PATH") if config else None
        self.inv.triton_ptxas_path = ptxas_path
        self._ptxas_target = _normal_path(ptxas_path) if ptxas_path else None

    def wants(self, path: str) -> bool:
        if self._ptxas_target is not None and path == self._ptxas_target:
            return True
        if path.endswith("/METADATA"):
            return bool(_METADATA.search(path))
        if path.endswith(("vllm/_version.py", "torch/version.py", "vllm/envs.py")):
            return True
        if path.endswith("/version.json"):
            return bool(_VERSION_JSON.search(path))
        if "ptxas" not in path and "nvcc" not in path:  # most paths: no regex needed
            return False
        return bool(_TOOL.search(path) or _TRITON_PTXAS.search(path))

    def add(self, path: str, data: bytes) -> None:
        inv = self.inv
        if self._ptxas_target is not None and path == self._ptxas_target:
            inv.triton_ptxas_target = parse_tool(path, data)
        if _METADATA.search(path):
            parsed = parse_metadata(data)
            if parsed is None:
                inv.problems.append(f"{path}: no Name/Version header")
                return
            name, version = parsed
            location = posixpath.dirname(posixpath.dirname(path)) or "."  # the dir holding the dist-info
            inv.packages.setdefault(name, []).append(Package(name, version, location))
        elif path.endswith("vllm/_version.py") and site_relative(path) == "vllm/_version.py":
            text = bytes(data).decode("utf-8", "replace")
            inv.vllm_version = _py_value(text, "__version__") or _py_value(text, "version")
            commit = _py_value(text, "__commit_id__") or _py_value(text, "commit_id")
            inv.vllm_commit = commit[1:] if commit and re.fullmatch(r"g[0-9a-f]{7,40}", commit) else commit
            inv.vllm_version_file = path
        elif path.endswith("vllm/envs.py") and site_relative(path) == "vllm/envs.py":
            inv.vllm_env_vars = parse_env_vars(data)
            inv.vllm_envs_file = path
        elif path.endswith("torch/version.py") and site_relative(path) == "torch/version.py":
            text = bytes(data).decode("utf-8", "replace")
            inv.torch_version = _py_value(text, "__version__")
            inv.torch_cuda = _py_value(text, "cuda")
        elif _VERSION_JSON.search(path):
            version = parse_cuda_version_json(data)
            if version:
                inv.toolkits.append((path, version))
        elif _TRITON_PTXAS.search(path):
            inv.triton_ptxas.append(parse_tool(path, data))
        elif m := _TOOL.search(path):
            (inv.nvcc if m.group(1) == "nvcc" else inv.ptxas).append(parse_tool(path, data))

    def finish(self) -> Inventory:
        inv = self.inv
        for found in inv.packages.values():
            found.sort(key=lambda p: p.location)
        inv.toolkits.sort()
        inv.nvcc.sort(key=lambda t: t.path)
        inv.ptxas.sort(key=lambda t: t.path)
        inv.triton_ptxas.sort(key=lambda t: t.path)
        if inv.triton_ptxas_path and inv.triton_ptxas_target is None:
            inv.triton_ptxas_target = self._through_cuda_link(inv)
        return inv

    def _through_cuda_link(self, inv: Inventory) -> Tool | None:
        """`/usr/local/cuda/bin/ptxas` when `/usr/local/cuda` is the usual link to one `cuda-X.Y`.

        Layers yield regular files only, so a path through that symlink is
        matched to the single versioned toolkit that holds the same file.
        """
        target = self._ptxas_target or ""
        m = re.match(r"^(.*/)?cuda/(.+)$", target)
        if not m:
            return None
        prefix, rest = m.group(1) or "", m.group(2)
        hits = [t for t in inv.ptxas if re.fullmatch(rf"{re.escape(prefix)}cuda-[\d.]+/{re.escape(rest)}", t.path)]
        return hits[0] if len(hits) == 1 else None

"""What an image's own vLLM accepts, read from its Python source with `ast` (pure; never imported).

`SOURCE_FILES` names the site-relative files read; `parse_facts(texts)` turns
their text into `VllmFacts`:
- serve flags: every option string of an `add_argument` call in the serve
  parser's files, plus the `--field-name` options a `get_kwargs(cls)` loop
  makes from a dataclass's fields, plus `--no-X` where argparse's
  BooleanOptionalAction makes one (a bool field);
- environment variables: the keys of `environment_variables` in `vllm/envs.py`
  (and which of them `deprecated_env` wraps, with its removal version);
- backend and quantization names: the `MoEBackend`, `LinearBackend`,
  `CacheDType` and `QuantizationMethods` Literals and the members of
  `AttentionBackendEnum`.
A file that is absent leaves its facts `None`: the rules then say they could not judge.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

ENVS = "vllm/envs.py"
ARG_UTILS = "vllm/engine/arg_utils.py"
FLAG_FILES = (
    ARG_UTILS,
    "vllm/entrypoints/openai/cli_args.py",  # <= 0.2x
    "vllm/entrypoints/common/cli_args.py",  # later releases
    "vllm/entrypoints/cli/serve.py",
)
KERNEL_CONFIG = "vllm/config/kernel.py"
CACHE_CONFIG = "vllm/config/cache.py"
QUANTIZATION = "vllm/model_executor/layers/quantization/__init__.py"
ATTENTION_REGISTRIES = ("vllm/v1/attention/backends/registry.py", "vllm/attention/backends/registry.py")
SOURCE_FILES = frozenset((ENVS, *FLAG_FILES, KERNEL_CONFIG, CACHE_CONFIG, QUANTIZATION, *ATTENTION_REGISTRIES))


@dataclass
class VllmFacts:
    flags: frozenset[str] | None = None
    engine_fields: frozenset[str] | None = None  # the EngineArgs dataclass's fields
    env_vars: frozenset[str] | None = None
    deprecated_env: dict[str, str] = field(default_factory=dict)  # name -> removal version
    moe_backends: frozenset[str] | None = None
    linear_backends: frozenset[str] | None = None
    attention_backends: frozenset[str] | None = None
    kv_cache_dtypes: frozenset[str] | None = None
    quantizations: frozenset[str] | None = None
    files: tuple[str, ...] = ()  # the files these facts come from
    problems: list[str] = field(default_factory=list)  # files that did not parse

    def to_json(self) -> dict[str, object]:
        def listed(value: frozenset[str] | None) -> list[str] | None:
            return sorted(value) if value is not None else None

        return {
            "files": list(self.files),
            "flags": len(self.flags) if self.flags is not None else None,
            "engine_args_fields": len(self.engine_fields) if self.engine_fields is not None else None,
            "env_vars": len(self.env_vars) if self.env_vars is not None else None,
            "deprecated_env": dict(sorted(self.deprecated_env.items())),
            "moe_backends": listed(self.moe_backends),
            "linear_backends": listed(self.linear_backends),
            "attention_backends": listed(self.attention_backends),
            "kv_cache_dtypes": listed(self.kv_cache_dtypes),
            "quantizations": listed(self.quantizations),
            "problems": list(self.problems),
        }


def _literal_strings(node: ast.AST | None) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)] if node else []


def _assigned(tree: ast.Module, name: str) -> ast.AST | None:
    """The value of a module-level `name = ...` or `name: T = ...`."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node.value
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return node.value
    return None


def literal_values(tree: ast.Module, name: str) -> frozenset[str] | None:
    """The strings of `name = Literal["a", "b", ...]`."""
    value = _assigned(tree, name)
    if not isinstance(value, ast.Subscript):
        return None
    return frozenset(_literal_strings(value.slice))


def enum_members(tree: ast.Module, class_name: str) -> frozenset[str] | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            names = set()
            for item in node.body:
                targets = item.targets if isinstance(item, ast.Assign) else [item.target] if isinstance(item, ast.AnnAssign) else []
                names.update(t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper())
            return frozenset(names)
    return None


def env_facts(tree: ast.Module) -> tuple[frozenset[str] | None, dict[str, str]]:
    """(every key of environment_variables, deprecated name -> removal version)."""
    value = _assigned(tree, "environment_variables")
    if not isinstance(value, ast.Dict):
        return None, {}
    names: set[str] = set()
    deprecated: dict[str, str] = {}
    for key, item in zip(value.keys, value.values, strict=True):
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
            continue
        names.add(key.value)
        if isinstance(item, ast.Call) and getattr(item.func, "id", "") == "deprecated_env":
            removal = item.args[1] if len(item.args) > 1 else None
            deprecated[key.value] = removal.value if isinstance(removal, ast.Constant) and isinstance(removal.value, str) else "?"
    return frozenset(names), deprecated


def _class_fields(node: ast.ClassDef) -> dict[str, str]:
    """field name -> its annotation's source text (ClassVar excluded)."""
    out: dict[str, str] = {}
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            text = ast.unparse(item.annotation)
            if "ClassVar" not in text:
                out[item.target.id] = text
    return out


def _is_bool(annotation: str) -> bool:
    return any(part.strip() == "bool" for part in annotation.replace("|", ",").replace("[", ",").replace("]", ",").split(","))


def _kwargs_key(call: ast.Call) -> str | None:
    """'enforce_eager' of `add_argument("--enforce-eager", **model_kwargs["enforce_eager"])`."""
    for kw in call.keywords:
        if kw.arg is None:  # `**kwargs["x"]`, or `**{**kwargs["x"], "default": None}`
            for node in ast.walk(kw.value):
                if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                    return str(node.slice.value)
    return None


def _boolean_action(call: ast.Call) -> bool:
    return any(kw.arg == "action" and "BooleanOptionalAction" in ast.unparse(kw.value) for kw in call.keywords)


def _generated_from_fields(tree: ast.Module) -> Iterator[tuple[str, str]]:
    """(field, annotation) of classes whose add_cli_args turns every field into `--field-name`.

    The pattern (`get_kwargs(cls)` then `add_argument(..., f"--{key.replace('_', '-')}", ...)`)
    applies to the class and every subclass of it in the same file; fields of
    bases in the file count too.
    """
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}

    def generating(node: ast.ClassDef) -> bool:
        for item in ast.walk(node):
            if isinstance(item, ast.Call) and getattr(item.func, "id", "") == "get_kwargs" and item.args \
                    and isinstance(item.args[0], ast.Name) and item.args[0].id == "cls":
                return True
        return False

    def chain(node: ast.ClassDef, seen: frozenset[str] = frozenset()) -> list[ast.ClassDef]:
        out = [node]
        for base in node.bases:
            name = getattr(base, "id", None)
            if name in classes and name not in seen:
                out += chain(classes[name], seen | {node.name})
        return out

    for node in classes.values():
        if any(generating(c) for c in chain(node)):
            for c in chain(node):
                yield from _class_fields(c).items()


def flag_facts(trees: Mapping[str, ast.Module]) -> tuple[frozenset[str], frozenset[str] | None]:
    """(every option the serve parser defines, the EngineArgs fields)."""
    engine: dict[str, str] = {}
    if ARG_UTILS in trees:
        for node in ast.walk(trees[ARG_UTILS]):
            if isinstance(node, ast.ClassDef) and node.name == "EngineArgs":
                engine = _class_fields(node)
    flags: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"):
                continue
            names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-")]
            flags.update(names)
            key = _kwargs_key(node)
            if _boolean_action(node) or (key is not None and _is_bool(engine.get(key, ""))):
                flags.update("--no-" + n[2:] for n in names if n.startswith("--"))
        for name, annotation in _generated_from_fields(tree):
            flag = "--" + name.replace("_", "-")
            flags.add(flag)
            if _is_bool(annotation):
                flags.add("--no-" + flag[2:])
    return frozenset(flags), frozenset(engine) if engine else None


def parse_facts(texts: Mapping[str, str]) -> VllmFacts:
    """Facts from the texts of SOURCE_FILES (site-relative path -> source); absent files stay None."""
    facts = VllmFacts(files=tuple(sorted(texts)))
    trees: dict[str, ast.Module] = {}
    for path, text in sorted(texts.items()):
        try:
            trees[path] = ast.parse(text, filename=path)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
            facts.problems.append(f"{path}: not Python this parser reads ({exc.__class__.__name__})")
    if ENVS in trees:
        facts.env_vars, facts.deprecated_env = env_facts(trees[ENVS])
    flag_trees = {p: trees[p] for p in FLAG_FILES if p in trees}
    if ARG_UTILS in flag_trees:  # without the engine's arguments there is no flag list to judge by
        facts.flags, facts.engine_fields = flag_facts(flag_trees)
    if KERNEL_CONFIG in trees:
        facts.moe_backends = literal_values(trees[KERNEL_CONFIG], "MoEBackend")
        facts.linear_backends = literal_values(trees[KERNEL_CONFIG], "LinearBackend")
    if CACHE_CONFIG in trees:
        facts.kv_cache_dtypes = literal_values(trees[CACHE_CONFIG], "CacheDType")
    if QUANTIZATION in trees:
        facts.quantizations = literal_values(trees[QUANTIZATION], "QuantizationMethods")
    for path in ATTENTION_REGISTRIES:
        if path in trees and facts.attention_backends is None:
            facts.attention_backends = enum_members(trees[path], "AttentionBackendEnum")
    return facts

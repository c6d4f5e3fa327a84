"""A recipe: one model served on a Spark, pinned like a profile (pure: text in, Recipe out).

`parse_recipe(text, file)` validates against SPEC with the profiles' schema
machinery (`spark_images.profiles.schema`: one line per problem, "did you mean" for
unknown keys, bounded values) and the same bounded YAML reader
(`spark_images.core.inputs`); `load_recipe(path)` only reads the file. Checks that
span fields (one model source, a revision for a hub model, no limit repeated
in `serve.args`) follow the schema's, in the same one-line style.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_images.core import inputs
from spark_images.core.errors import Finding, Problem
from spark_images.profiles.cluster import ClusterSettings, parse_settings
from spark_images.profiles.schema import Field, json_schema, show, validate
from spark_images.profiles.values import (
    ABSOLUTE_PATH,
    BACKEND,
    ENV_KEY,
    HEX40,
    MODEL,
    NAME,
    ONE_LINE,
    between,
    matching,
)

RECIPE_LIMIT = 256 * 1024  # bytes of a recipe file; ours are ~2 KB
SCHEMA_ID = "https://github.com/spark-images/spark-images/recipe.schema.json"
STATUSES = ("unvalidated", "validated")
# what the checkpoint's weights are: decides which kernels the image must carry
QUANTIZATIONS = ("bf16", "fp16", "fp8", "nvfp4", "mxfp4", "gptq-int4", "awq-int4", "gguf")
# the serve flags each limit becomes (serve_command adds them; serve.args must not repeat them)
LIMIT_FLAGS: dict[str, str] = {
    "max_model_len": "--max-model-len",
    "max_num_seqs": "--max-num-seqs",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "kv_cache_dtype": "--kv-cache-dtype",
}
MODEL_FLAGS = ("--model", "--revision")  # the model comes from `model:`, never from args
# interface and HCA names as Linux and rdma-core spell them (IFNAMSIZ is 16 with the NUL)
IFNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,14}")
HCA = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}(?::\d{1,2})?")

_ONE_LINE = Field(str, pattern=ONE_LINE.pattern, what="one line of text", max_length=4096)


def _fraction(value: Any) -> str | None:
    return None if 0 < value <= 1 else f"{show(value)} must be more than 0 and at most 1"


def _positive(value: Any) -> str | None:
    return None if value >= 0 else f"{show(value)} must not be negative"


def _figure(doc: str) -> Field:
    """An expected figure and where it comes from: a value without a source is refused."""
    return Field(
        dict,
        doc=doc,
        children={
            "value": Field((int, float), nullable=True, check=_positive, doc="null when the source gives none"),
            "source": Field(str, pattern=ONE_LINE.pattern, what="one line of text", max_length=1000,
                            doc="where the figure comes from: a URL, an issue, a post"),
        },
    )


SPEC: dict[str, Field] = {
    "name": matching(NAME, "a lower-case name", doc="the recipe's name, e.g. gpt-oss-120b", max_length=64),
    "description": Field(str, required=False, pattern=ONE_LINE.pattern, what="one line of text", max_length=1000),
    "status": Field(str, enum=STATUSES, doc="unvalidated until the gate has served it on a Spark"),
    "model": Field(
        dict,
        doc="exactly one of hub (with revision), path or gguf",
        children={
            "hub": matching(MODEL, "a model id (ORG/NAME)", required=False, doc="the Hugging Face model id"),
            "revision": Field(str, required=False, nullable=True, pattern=HEX40.pattern.removesuffix(r"\Z"),
                              what="a 40-hex commit", doc="the model repository's commit (null only while unvalidated)"),
            "path": matching(ABSOLUTE_PATH, "an absolute path (letters, digits, . _ + - and /)", required=False,
                             doc="a model directory as vLLM sees it"),
            "gguf": matching(ABSOLUTE_PATH, "an absolute path (letters, digits, . _ + - and /)", required=False,
                             doc="a GGUF file as vLLM sees it"),
            "quantization": Field(str, enum=QUANTIZATIONS, doc="the checkpoint's weight format"),
            "moe": Field(bool, doc="true for a mixture-of-experts model"),
        },
    ),
    "serve": Field(
        dict,
        children={
            "args": Field(list, items=_ONE_LINE, doc="vllm serve arguments after the model (no limits, no --model)"),
            "env": Field(dict, required=False, keys=matching(ENV_KEY, "an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"),
                         values=Field(str, pattern=ONE_LINE.pattern, what="one line of text", max_length=4096,
                                      doc='quote values that YAML would read otherwise, e.g. "0", "true"')),
        },
    ),
    "limits": Field(
        dict,
        children={
            "max_model_len": Field(int, check=between(16, 16_777_216), doc="tokens of one sequence"),
            "max_num_seqs": Field(int, check=between(1, 4096), doc="sequences served at once"),
            "gpu_memory_utilization": Field((int, float), check=_fraction, doc="share of the device memory vLLM takes"),
            "kv_cache_dtype": matching(BACKEND, "a KV-cache dtype", doc="auto, fp8, ..."),
        },
    ),
    "expect": Field(
        dict,
        children={
            "decode_tok_s": _figure("batch-1 decode tokens per second"),
            "memory_gib": _figure("unified memory the served model takes, GiB"),
        },
    ),
    "profiles": Field(list, items=matching(NAME, "a profile name"), doc="the image lines it is meant for, e.g. cu130"),
    "cluster": Field(
        dict,
        required=False,
        doc="two Sparks over the ConnectX-7 link, through Ray: the keys of profiles/cluster.py (README: Multi-Spark)",
    ),
}


def recipe_json_schema() -> dict[str, Any]:
    """The JSON Schema of a recipe, generated from SPEC (what `spark-images schema recipe` prints)."""
    return json_schema(SPEC, title="spark-images recipe", schema_id=SCHEMA_ID)


@dataclass(frozen=True)
class ModelSource:
    hub: str | None
    revision: str | None
    path: str | None
    gguf: str | None
    quantization: str
    moe: bool

    def reference(self) -> str:
        """What `vllm serve` takes as its model."""
        return self.hub or self.path or self.gguf or ""


@dataclass(frozen=True)
class Limits:
    max_model_len: int
    max_num_seqs: int
    gpu_memory_utilization: float
    kv_cache_dtype: str


@dataclass(frozen=True)
class Figure:
    value: float | None
    source: str


@dataclass(frozen=True)
class Recipe:
    name: str
    path: str
    description: str
    status: str
    model: ModelSource
    serve_args: tuple[str, ...]
    serve_env: tuple[tuple[str, str], ...]
    limits: Limits
    decode_tok_s: Figure
    memory_gib: Figure
    profiles: tuple[str, ...]
    cluster: ClusterSettings | None  # the two-Spark settings over the Spark defaults


def _cross_field(doc: dict[str, Any], file: str) -> list[Problem]:
    """What the schema cannot say: one model source, a revision for a hub model, no repeated limits."""
    out: list[Problem] = []
    model = doc["model"]
    given = [key for key in ("hub", "path", "gguf") if key in model]
    if len(given) != 1:
        out.append(Problem(file, "model", f"names {len(given)} model sources ({', '.join(given) or 'none'})",
                           "give exactly one of hub (with revision), path or gguf"))
    if "hub" in model and "revision" not in model:
        out.append(Problem(file, "model.revision", "missing: a hub model is pinned by its commit",
                           "add revision: the 40-hex commit of the model repository"))
    if model.get("revision") is not None and "hub" not in model:
        out.append(Problem(file, "model.revision", "a revision without a hub model", "drop it, or name the hub model"))
    if doc["status"] == "validated" and "hub" in model and model.get("revision") is None:
        out.append(Problem(file, "model.revision", "null, but the recipe is validated",
                           "pin the commit the gate served, or set status: unvalidated"))
    if "gguf" in model and not model["gguf"].endswith(".gguf"):
        out.append(Problem(file, "model.gguf", f"{show(model['gguf'])} does not end in .gguf", "name the GGUF file"))
    if ("gguf" in model) != (model["quantization"] == "gguf"):
        out.append(Problem(file, "model.quantization", "gguf goes with model.gguf and only with it",
                           "set quantization: gguf for a GGUF file, else the checkpoint's format"))
    if "cluster" in doc:  # the cluster room's settings, one line per bad key, at its own field
        out += parse_settings(doc["cluster"], file)[1]
    reserved = {flag: key for key, flag in LIMIT_FLAGS.items()} | {flag: "model" for flag in MODEL_FLAGS}
    for i, arg in enumerate(doc["serve"]["args"]):
        flag = arg.split("=", 1)[0].replace("_", "-") if arg.startswith("--") else ""
        if flag in reserved:
            where = reserved[flag]
            fix = f"set limits.{where} instead" if where != "model" else "name the model under model:"
            out.append(Problem(file, f"serve.args[{i}]", f"{show(arg)} repeats what {where} sets", fix))
    return out


def parse_recipe(text: str, file: str) -> Recipe:
    """Validate the document and build a Recipe (pure); Finding with one Problem per line."""
    doc = inputs.loads_yaml(text, file=file, what="recipe", max_bytes=RECIPE_LIMIT)
    problems = validate(doc, SPEC, file)
    if problems:
        raise Finding(*problems)
    problems = _cross_field(doc, file)
    if problems:
        raise Finding(*problems)
    return _to_recipe(doc, file)


def load_recipe(path: str | Path) -> Recipe:
    """Read a recipe (a regular file of at most RECIPE_LIMIT bytes, UTF-8) and parse it."""
    text = inputs.read_text(path, what="recipe", limit=RECIPE_LIMIT, example="recipes/gpt-oss-120b.yaml")
    return parse_recipe(text, inputs.display_path(path))


def _figure_of(doc: dict[str, Any]) -> Figure:
    value = doc["value"]
    return Figure(value=float(value) if value is not None else None, source=doc["source"])


def _to_recipe(doc: dict[str, Any], file: str) -> Recipe:
    model, limits, cluster = doc["model"], doc["limits"], doc.get("cluster")
    return Recipe(
        name=doc["name"],
        path=file,
        description=doc.get("description", ""),
        status=doc["status"],
        model=ModelSource(hub=model.get("hub"), revision=model.get("revision"), path=model.get("path"),
                          gguf=model.get("gguf"), quantization=model["quantization"], moe=model["moe"]),
        serve_args=tuple(doc["serve"]["args"]),
        serve_env=tuple(sorted((doc["serve"].get("env") or {}).items())),
        limits=Limits(max_model_len=limits["max_model_len"], max_num_seqs=limits["max_num_seqs"],
                      gpu_memory_utilization=float(limits["gpu_memory_utilization"]),
                      kv_cache_dtype=limits["kv_cache_dtype"]),
        decode_tok_s=_figure_of(doc["expect"]["decode_tok_s"]),
        memory_gib=_figure_of(doc["expect"]["memory_gib"]),
        profiles=tuple(doc["profiles"]),
        cluster=parse_settings(cluster, file)[0] if cluster is not None else None,
    )

"""`spark-images schema`: the profile's JSON Schema, generated from the one schema.

Both shipped profiles validate against it, and mutations that `validate`
refuses at the schema level are refused by it too, so the export is neither
vacuous nor stricter than validate. The check uses the `jsonschema` package
where it is installed, else a small checker of exactly the keywords the
export emits (type, enum, pattern, lengths, properties, items, bounds).
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_images.profiles.profile import profile_json_schema

REPO = Path(__file__).resolve().parents[3]
PROFILES = sorted((REPO / "profiles").glob("*.yaml"))
_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list}
_KNOWN = {"$schema", "$id", "title", "description", "default", "type", "enum", "pattern", "maxLength", "properties",
          "required", "additionalProperties", "propertyNames", "items", "maxItems", "minItems", "maxProperties", "minimum",
          "maximum"}


def _is_type(value: Any, name: str) -> bool:
    if name == "null":
        return value is None
    if name in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _TYPES[name])


def _errors(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    unknown = set(schema) - _KNOWN
    assert not unknown, f"the export uses keywords this checker does not know: {unknown}"
    types = schema.get("type")
    if types is not None and not any(_is_type(value, t) for t in ([types] if isinstance(types, str) else types)):
        return [f"{path}: not {types}"]
    out: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path}: not in enum")
    if isinstance(value, str):
        if len(value) > schema.get("maxLength", len(value)):
            out.append(f"{path}: too long")
        if "pattern" in schema and re.search(schema["pattern"], value) is None:
            out.append(f"{path}: does not match")
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if number and (value < schema.get("minimum", value) or value > schema.get("maximum", value)):
        out.append(f"{path}: out of range")
    if isinstance(value, dict):
        if len(value) > schema.get("maxProperties", len(value)):
            out.append(f"{path}: too many keys")
        props = schema.get("properties", {})
        out += [f"{path}.{k}: required" for k in schema.get("required", []) if k not in value]
        for key, item in value.items():
            if "propertyNames" in schema:
                out += _errors(key, schema["propertyNames"], f"{path}.{key}(name)")
            if key in props:
                out += _errors(item, props[key], f"{path}.{key}")
            elif schema.get("additionalProperties") is False:
                out.append(f"{path}.{key}: not allowed")
            elif isinstance(schema.get("additionalProperties"), dict):
                out += _errors(item, schema["additionalProperties"], f"{path}.{key}")
    if isinstance(value, list):
        if len(value) > schema.get("maxItems", len(value)):
            out.append(f"{path}: too many items")
        if len(value) < schema.get("minItems", 0):
            out.append(f"{path}: too few items")
        for i, item in enumerate(value):
            out += _errors(item, schema.get("items", {}), f"{path}[{i}]")
    return out


def _validate(doc: Any, schema: dict[str, Any]) -> list[str]:
    try:
        import jsonschema
    except ImportError:
        return _errors(doc, schema)
    validator = jsonschema.Draft202012Validator(schema)
    return [e.message for e in validator.iter_errors(doc)]


def test_the_schema_is_itself_a_valid_json_schema() -> None:
    schema = profile_json_schema()
    try:
        import jsonschema
    except ImportError:
        for pattern in re.findall(r'"pattern": ("(?:[^"\\]|\\.)*")', json.dumps(schema)):
            re.compile(json.loads(pattern))  # every pattern compiles
    else:
        jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) >= {"name", "vllm", "cuda", "build", "verify", "image"}


@pytest.mark.parametrize("profile", PROFILES, ids=[p.stem for p in PROFILES])
def test_the_shipped_profiles_validate_against_the_schema(profile: Path) -> None:
    doc = yaml.safe_load(profile.read_text())
    assert _validate(doc, profile_json_schema()) == []


def _mutated(path: str, value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(yaml.safe_load((REPO / "profiles" / "cu130.yaml").read_text()))
    *parents, last = path.split(".")
    node = doc
    for key in parents:
        node = node[key]
    node[last] = value
    return doc


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("vlm", {}),  # unknown key
        ("python", 3.12),
        ("build.max_jobs", 0),
        ("build.max_jobs", True),
        ("build.strategy", "docker"),
        ("cuda.home", "/usr/local/cuda\nRUN id"),
        ("name", "cu130\n"),
        ("build.wheel.sha256", "e6b0dfc2"),
        ("build.system_packages", ["curl; id"]),
        ("serve.env", {"A B": "x"}),
        ("serve.env", {"A": True}),
        ("serve.env", {"A": "x\ny"}),
        ("patches", [1]),
        ("verify.required_fixes", ["#1"]),
        ("verify.coherence.models", []),
        ("verify.coherence.rounds", 0),
        ("verify.coherence.rounds", True),
        ("verify.coherence.rounds", 21),
        ("cuda.version", "13.0.2-rc"),
        ("cuda.version", "13.0.2.1"),
    ],
)
def test_the_schema_refuses_what_validate_refuses_by_shape(path: str, value: Any) -> None:
    assert _validate(_mutated(path, value), profile_json_schema()), f"{path}={value!r} passed the schema"


def test_schema_command_prints_the_schema_and_writes_it(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "spark_images", "schema"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == profile_json_schema()
    out = tmp_path / "profile.schema.json"
    proc = subprocess.run([sys.executable, "-m", "spark_images", "schema", "-o", str(out)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text()) == profile_json_schema()


def test_the_schema_documents_the_defaults_of_the_one_configuration_layer() -> None:
    from spark_images.profiles import profile as profiles

    props = profile_json_schema()["properties"]
    coherence = props["verify"]["properties"]["coherence"]["properties"]
    assert coherence["moe_backends"]["default"] == list(profiles.DEFAULT_MOE_BACKENDS)
    assert coherence["kv_cache_dtypes"]["default"] == list(profiles.DEFAULT_KV_CACHE_DTYPES)
    assert coherence["rounds"]["default"] == profiles.DEFAULT_COHERENCE_ROUNDS
    assert props["cuda"]["properties"]["home"]["default"] == profiles.DEFAULT_CUDA_HOME

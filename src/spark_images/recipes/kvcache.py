"""KV-cache bytes per token from a model's config.json or GGUF keys (pure).

Standard attention: 2 (K and V) x layers x KV heads x head dim x dtype bytes.
Counted right, or named as not handled:
- sliding-window layers (`layer_types` with "sliding_attention", or a uniform
  `sliding_window`) hold at most the window: their bytes grow with min(L, window);
- MLA (`kv_lora_rank`): one latent of kv_lora_rank + qk_rope_head_dim per layer;
- hybrid models (`layer_types` with linear attention, `hybrid_override_pattern`
  with Mamba layers): only the attention layers are counted; the recurrent
  state, constant per sequence, is named in `not_handled`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DTYPE_BYTES = {"auto": None, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float32": 4}
CONFIG_DTYPES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass
class KvCache:
    full_bytes_per_token: int  # layers that keep every token
    window_bytes_per_token: int  # sliding-window layers, up to `window` tokens
    window: int | None
    layers: int
    attention_layers: int
    how: str
    not_handled: list[str] = field(default_factory=list)

    def bytes_for(self, tokens: int) -> int:
        """KV bytes of one sequence of `tokens`."""
        windowed = min(tokens, self.window) if self.window else tokens
        return self.full_bytes_per_token * tokens + self.window_bytes_per_token * windowed

    def to_json(self) -> dict[str, Any]:
        return {"full_bytes_per_token": self.full_bytes_per_token, "window_bytes_per_token": self.window_bytes_per_token,
                "window": self.window, "layers": self.layers, "attention_layers": self.attention_layers,
                "how": self.how, "not_handled": list(self.not_handled)}  # fmt: skip


class ConfigProblem(ValueError):
    """config.json lacks what the count needs (one line)."""


def _int(cfg: Mapping[str, Any], key: str) -> int | None:
    value = cfg.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def kv_dtype_bytes(kv_cache_dtype: str, model_dtype: str | None) -> float:
    size = DTYPE_BYTES.get(kv_cache_dtype, -1)
    if size is None:  # auto: the model's own dtype
        return CONFIG_DTYPES.get(model_dtype or "bfloat16", 2)
    if size == -1:
        raise ConfigProblem(f"KV-cache dtype {kv_cache_dtype!r} is not one this count handles (auto, bfloat16, float16, fp8*)")
    return size


def from_config(config: Mapping[str, Any], kv_cache_dtype: str) -> KvCache:
    cfg = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    layers = _int(cfg, "num_hidden_layers")
    heads = _int(cfg, "num_attention_heads")
    if layers is None or heads is None:
        raise ConfigProblem("config.json has no num_hidden_layers / num_attention_heads")
    kv_heads = _int(cfg, "num_key_value_heads") or heads
    hidden = _int(cfg, "hidden_size")
    head_dim = _int(cfg, "head_dim") or (hidden // heads if hidden else None)
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or config.get("torch_dtype")
    size = kv_dtype_bytes(kv_cache_dtype, dtype if isinstance(dtype, str) else None)
    not_handled: list[str] = []
    kinds = cfg.get("layer_types") if isinstance(cfg.get("layer_types"), list) else None
    pattern = cfg.get("hybrid_override_pattern") if isinstance(cfg.get("hybrid_override_pattern"), str) else None
    window = _int(cfg, "sliding_window")
    full_layers, window_layers = layers, 0
    how = "2 x layers x KV heads x head dim x dtype bytes"
    if kinds is not None:
        full_layers = sum(1 for k in kinds if k in ("full_attention", "attention"))
        window_layers = sum(1 for k in kinds if k == "sliding_attention")
        other = len(kinds) - full_layers - window_layers
        if other:
            not_handled.append(f"{other} layers of {sorted({k for k in kinds if k not in ('full_attention', 'attention', 'sliding_attention')})}: their per-sequence state is not counted")
        how += "; layer_types: full layers x every token, sliding layers x min(tokens, window)"
    elif pattern is not None:
        full_layers = pattern.count("*")
        if pattern.count("M"):
            not_handled.append(f"{pattern.count('M')} Mamba layers: their per-sequence state is not counted")
        how += "; hybrid_override_pattern: only '*' attention layers hold KV"
    elif window and cfg.get("use_sliding_window", True) is not False and not cfg.get("max_window_layers"):
        full_layers, window_layers = 0, layers
        how += "; every layer slides over the window"
    if window_layers and not window:
        raise ConfigProblem("layer_types names sliding layers but config.json has no sliding_window")
    if _int(cfg, "kv_lora_rank"):
        latent = (_int(cfg, "kv_lora_rank") or 0) + (_int(cfg, "qk_rope_head_dim") or 0)
        per_layer = latent * size
        how = "MLA: layers x (kv_lora_rank + qk_rope_head_dim) x dtype bytes"
        return KvCache(int(per_layer * full_layers), int(per_layer * window_layers), window, layers,
                       full_layers + window_layers, how, not_handled)
    if head_dim is None:
        raise ConfigProblem("config.json has no head_dim and no hidden_size to derive it")
    per_layer = 2 * kv_heads * head_dim * size
    return KvCache(int(per_layer * full_layers), int(per_layer * window_layers), window if window_layers else None,
                   layers, full_layers + window_layers, how, not_handled)


def from_gguf(metadata: Mapping[str, Any], kv_cache_dtype: str) -> KvCache:
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ConfigProblem("the GGUF header names no general.architecture")
    config = {
        "num_hidden_layers": metadata.get(f"{arch}.block_count"),
        "num_attention_heads": metadata.get(f"{arch}.attention.head_count"),
        "num_key_value_heads": metadata.get(f"{arch}.attention.head_count_kv"),
        "hidden_size": metadata.get(f"{arch}.embedding_length"),
        "head_dim": metadata.get(f"{arch}.attention.key_length"),
        "sliding_window": metadata.get(f"{arch}.attention.sliding_window"),
        "torch_dtype": "float16",  # llama.cpp-format weights dequantise to 16-bit activations
    }
    return from_config({k: v for k, v in config.items() if v is not None}, kv_cache_dtype)

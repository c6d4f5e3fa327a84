"""`spark-images fit` on real files from PyPI: the SmolLM2 GGUF, and a real vLLM's site-packages as the image.

The fit on safetensors headers read by range from a loopback hub:
tests/unit/recipes/test_fit.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from support.recipe_support import run_cli, write_recipe


def test_fit_on_the_smollm2_gguf_counts_its_tensor_data(smollm2_gguf: Path, tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, "smollm2-135m-instruct-gguf", "smol")
    proc = run_cli(["fit", str(recipe), "--from", str(smollm2_gguf.parent), "--json"])
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    size = smollm2_gguf.stat().st_size
    weights = doc["weights"]["bytes"]
    # the tensor data section is what follows the header: weights computed from each
    # tensor's ggml type and dimensions must be within 1% of it
    data_section = int(doc["weights"]["source"].split("tensor data section: ")[1].split(" ")[0])
    assert abs(weights - data_section) <= 0.01 * data_section
    assert 0.97 * size <= weights <= size
    assert doc["weights"]["by_type"].keys() == {"Q4_1", "Q8_0", "F32"}
    # llama.block_count 30, head_count_kv 3, head dim 576/9 = 64, 16-bit: 2*30*3*64*2 bytes per token
    assert doc["kv_cache"]["full_bytes_per_token"] == 2 * 30 * 3 * 64 * 2
    assert doc["verdict"] == "fits" and doc["largest_max_model_len"] == 8192


def test_fit_with_an_image_checks_the_kv_dtype_against_it(smollm2_gguf: Path, vllm_site: Any, tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, "smollm2-135m-instruct-gguf", "smol-img", limits__kv_cache_dtype="fp8_e4m3")
    proc = run_cli(["fit", str(recipe), "--from", str(smollm2_gguf.parent), "--image", str(vllm_site("0.33.0")), "--json"])
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["image"]["vllm"] == "0.33.0" and doc["image"]["kv_cache_dtype_known"] is True
    assert doc["kv_cache"]["full_bytes_per_token"] == 2 * 30 * 3 * 64 * 1  # fp8: one byte

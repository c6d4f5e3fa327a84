"""`spark-images fit RECIPE [--image TARGET] [--from DIR]`: does the recipe fit one Spark's 128 GB?

Weights from the model's own headers (safetensors index and shard headers by
HTTP range reads from the hub, or a local directory; a GGUF file's header),
the KV cache from config.json, the reserves and the pool from documented
figures. Prints the verdict (fits / tight / does-not-fit) with the numbers,
the largest max_model_len that fits and the --gpu-memory-utilization to set.
Exit 0 fits, 1 tight or does-not-fit (or a model whose headers lie), 2 usage/network.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from spark_images.cli._common import add_json_flag, emit, target
from spark_images.core.errors import EXIT_FINDING, EXIT_OK, Finding, Problem


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser("fit", help="does a recipe fit one Spark's unified memory (from the model's headers)",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", metavar="RECIPE", help="recipes/NAME.yaml")
    parser.add_argument("--image", type=target, metavar="TARGET",
                        help="also check the KV-cache dtype against this image's vLLM (anything `check` takes)")
    parser.add_argument("--from", dest="local", type=Path, metavar="DIR",
                        help="read the model's files from DIR instead of the hub")
    add_json_flag(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from spark_images.recipes.fit import FITS, judge
    from spark_images.recipes.hub import read_model
    from spark_images.recipes.kvcache import ConfigProblem, from_config, from_gguf
    from spark_images.recipes.model import load_recipe

    recipe = load_recipe(args.recipe)
    files = read_model(recipe, args.local)
    try:
        if files.config is not None:
            kv = from_config(files.config, recipe.limits.kv_cache_dtype)
            cfg = files.config.get("text_config") if isinstance(files.config.get("text_config"), dict) else files.config
            context = cfg.get("max_position_embeddings")
        else:
            kv = from_gguf(files.gguf_metadata or {}, recipe.limits.kv_cache_dtype)
            arch = (files.gguf_metadata or {}).get("general.architecture")
            context = (files.gguf_metadata or {}).get(f"{arch}.context_length")
    except ConfigProblem as exc:
        raise Finding(Problem(files.where, "", str(exc), "fit handles standard, sliding-window, MLA and hybrid configs")) from None
    doc = judge(recipe, files.weights, kv, context if isinstance(context, int) else None)
    doc["model"] = {"reference": recipe.model.reference(), "revision": recipe.model.revision, "read_from": files.where}
    if args.image:
        from spark_images.recipes.target import read_target

        facts, found = read_target(args.image)
        known = facts.kv_cache_dtypes
        doc["image"] = {"target": found.target, "vllm": found.inventory.vllm_version,
                        "kv_cache_dtype_known": None if known is None else recipe.limits.kv_cache_dtype in known}
        if known is not None and recipe.limits.kv_cache_dtype not in known:
            doc["notes"].append(f"kv_cache_dtype {recipe.limits.kv_cache_dtype!r} is not in this image's CacheDType")
    lines = [
        f"{recipe.path}: {doc['verdict']}: needs {doc['need_gib']} GiB for one {recipe.limits.max_model_len}-token "
        f"sequence ({doc['want_gib']} GiB for {recipe.limits.max_num_seqs}) of a {doc['pool']['budget_gib']} GiB budget",
        f"  weights {doc['weights']['gib']} GiB ({doc['weights']['source']}); KV {doc['kv_cache']['gib_one_sequence']} GiB per "
        f"full-length sequence ({doc['kv_cache']['how']})",
        f"  largest max_model_len that fits: {doc['largest_max_model_len']}; set --gpu-memory-utilization "
        f"{doc['gpu_memory_utilization']:g} (recipe: {doc['recipe_gpu_memory_utilization']:g})",
        *(f"  note: {n}" for n in doc["notes"]),
    ]
    emit(args, doc, "\n".join(lines))
    return EXIT_OK if doc["verdict"] == FITS else EXIT_FINDING

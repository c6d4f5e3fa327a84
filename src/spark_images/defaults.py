"""Every default of spark-images, and the one reader of its environment settings.

A default that two rooms need lives here once: the GPU a verdict is for, the
lock's file name, the upstream vLLM repository, the PyPI index, the HTTP
deadline, the caches. Outside the CLI, nothing else reads `os.environ` for a
setting: a room asks for the setting by its function here, so every
variable a user can set is listed in one place (and in the README's table).
Passing the whole environment on to a child process (git, buildx) is not
reading a setting and stays where the child is started.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

# -- the target --------------------------------------------------------------
GPU = "sm_121"  # the DGX Spark's GB10 (compute capability 12.1)
TARGET_PLATFORM = "linux/arm64"  # the Spark's CPU (Grace, aarch64): what every image is built for

# -- files people edit or read -----------------------------------------------
LOCK_FILE = "images.lock.json"

# -- the image's layers ------------------------------------------------------
# The hash lock's wheels are unpacked into these site-packages layers, in this
# order, by one installer stage each (BuildKit runs them side by side) and the
# export compresses them side by side too: one 7 GB layer would be one core's
# work twice (compress, then rewrite for SOURCE_DATE_EPOCH). A package goes to
# the first layer with a glob matching its PEP 503 name; the rest go to LAST_LAYER.
# Grouped by what changes together, so a vLLM or torch bump re-pulls only its own
# layers. The cu130 lock unpacks to cuda-math 1.6 GB, torch 2.3 GB, cuda 1.9 GB
# and python 1.2 GB.
LOCK_LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cuda-math", ("nvidia-cublas*", "nvidia-cufft*", "nvidia-curand*", "nvidia-cusolver*",
                   "nvidia-cusparse", "nvidia-cusparse-cu*")),
    # torch-c-dlpack-ext stays with the Python packages: it ships a top-level
    # build_backend.py, as flashinfer-python does (other bytes), and two layers
    # must not hold one path (the installer-checked stage refuses it)
    ("torch", ("torch", "torchaudio", "torchcodec", "torchvision", "triton", "tokenspeed-triton",
               "nvidia-cutlass-dsl*")),
    ("cuda", ("nvidia-*", "cuda-*")),
)
LAST_LAYER = "python"

# -- upstream ----------------------------------------------------------------
VLLM_REPOSITORY = "https://github.com/vllm-project/vllm"
VLLM_GIT_URL = f"{VLLM_REPOSITORY}.git"
PYPI_SIMPLE = "https://pypi.org/simple"
HF_HUB = "https://huggingface.co"  # model files for `fit`, read by HTTP range requests

# -- limits ------------------------------------------------------------------
HTTP_DEADLINE_S = 60.0  # overall deadline of one metadata HTTP call


class Env:
    """The names of the environment variables users set (README: Configuration)."""

    PYPI_SIMPLE = "SPARK_IMAGES_PYPI_SIMPLE"
    HTTP_TIMEOUT = "SPARK_IMAGES_HTTP_TIMEOUT"
    CACHE = "SPARK_IMAGES_CACHE"
    VLLM_GIT_URL = "SPARK_IMAGES_VLLM_GIT_URL"
    REGISTRY_USER = "SPARK_IMAGES_REGISTRY_USER"
    REGISTRY_PASSWORD = "SPARK_IMAGES_REGISTRY_PASSWORD"
    SOURCE_DATE_EPOCH = "SOURCE_DATE_EPOCH"
    XDG_CACHE_HOME = "XDG_CACHE_HOME"
    HF_ENDPOINT = "SPARK_IMAGES_HF_ENDPOINT"
    KB = "SPARK_IMAGES_KB"


def setting(name: str) -> str | None:
    """The raw value of one environment setting, or None when unset or empty."""
    value = os.environ.get(name)
    return value if value else None


def pypi_simple() -> str:
    """The simple index every PyPI lookup uses."""
    return (setting(Env.PYPI_SIMPLE) or PYPI_SIMPLE).rstrip("/")


def http_deadline_s() -> float:
    """SPARK_IMAGES_HTTP_TIMEOUT when it is a positive finite number, else the default."""
    raw = setting(Env.HTTP_TIMEOUT)
    try:
        value = float(raw) if raw else HTTP_DEADLINE_S
    except ValueError:
        return HTTP_DEADLINE_S
    return value if math.isfinite(value) and value > 0 else HTTP_DEADLINE_S


def hf_hub() -> str:
    return (setting(Env.HF_ENDPOINT) or HF_HUB).rstrip("/")


def vllm_git_url() -> str:
    return setting(Env.VLLM_GIT_URL) or VLLM_GIT_URL


def download_cache() -> Path:
    """Where downloaded wheels are cached (SPARK_IMAGES_CACHE, else ~/.cache/spark-images)."""
    base = setting(Env.CACHE)
    return Path(base) if base else Path.home() / ".cache" / "spark-images"


def history_cache() -> Path:
    """Where the treeless clone of upstream vLLM is kept (XDG_CACHE_HOME/spark-images)."""
    return Path(setting(Env.XDG_CACHE_HOME) or str(Path.home() / ".cache")) / "spark-images"


def registry_credentials() -> tuple[str, str] | None:
    user = setting(Env.REGISTRY_USER)
    return (user, os.environ.get(Env.REGISTRY_PASSWORD, "")) if user else None


def source_date_epoch() -> str | None:
    return os.environ.get(Env.SOURCE_DATE_EPOCH)

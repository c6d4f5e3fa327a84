# Rendered by spark-images from profiles/cu130.yaml (profile cu130). Do not edit: re-render.
# vLLM 0.29.0 @ 98dff2a81d747d1dba01a47f939f48c3526d4206 for the NVIDIA DGX Spark (GB10, sm_121).
# CUDA 13.0.2 (cu130), TORCH_CUDA_ARCH_LIST=12.0f (derived), strategy: wheel.
# Build: docker buildx build --platform linux/arm64 [--secret id=cacert,src=CA_BUNDLE.pem] .
# The optional cacert secret is trusted by every download of the build and never lands in a layer.

########## installer: every locked wheel for linux/arm64, unpacked on the build host ##########
# The same digest-pinned base, in its variant for the build host's platform
# (nvidia/cuda images are multi-arch): one pin covers both, and on an arm64
# host this stage is the arm64 base itself. Only its Python and pip are used;
# nothing of this stage but the unpacked wheels reaches the image.
FROM --platform=$BUILDPLATFORM nvidia/cuda:13.0.2-devel-ubuntu24.04@sha256:5dc1bca23d05bd37b011be68ec470c03b403a5da07ec3a86e41af9470e9d0cc6 AS installer
ARG SOURCE_DATE_EPOCH
SHELL ["/bin/bash", "-o", "pipefail", "-euc"]
ENV DEBIAN_FRONTEND=noninteractive \
    LANG=C.UTF-8 \
    LC_ALL=C.UTF-8 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
# Any Python 3 with venv can unpack wheels for another platform; a base without
# one gets it from its own distribution.
RUN --mount=type=secret,id=cacert,target=/run/secrets/cacert,required=false \
    if [ -s /run/secrets/cacert ]; then export SSL_CERT_FILE=/run/secrets/cacert PIP_CERT=/run/secrets/cacert REQUESTS_CA_BUNDLE=/run/secrets/cacert CURL_CA_BUNDLE=/run/secrets/cacert GIT_SSL_CAINFO=/run/secrets/cacert APT_CA=/run/secrets/cacert; fi; \
    python3 -m venv /opt/installer 2>/dev/null || { \
        rm -rf /opt/installer \
        && apt-get ${APT_CA:+-o Acquire::https::CAInfo=$APT_CA} update -q \
        && apt-get ${APT_CA:+-o Acquire::https::CAInfo=$APT_CA} install -y -q --no-install-recommends ca-certificates python3 python3-venv \
        && rm -rf /var/lib/apt/lists/* \
        && python3 -m venv /opt/installer; }
# Every wheel is checked against the lock's sha256; pip checks Requires-Python
# against the interpreter it runs on, not --python-version, hence
# --ignore-requires-python. A lock entry with no wheel for linux/arm64
# (an sdist only) stops its stage with pip's line naming it. Console scripts get
# the image's interpreter; no .pyc is written (--no-compile).
# One stage per site-packages layer of the lock (requirements/LAYER.lock): BuildKit
# unpacks them side by side, and each becomes one layer of the image.

# layer cuda-math: 5 packages (nvidia-cublas, nvidia-cufft, nvidia-curand, nvidia-cusolver, ...)
FROM installer AS installer-cuda-math
COPY requirements/cuda-math.lock /tmp/spark/cuda-math.lock
RUN --mount=type=cache,id=spark-images-pip-cuda-math,target=/root/.cache/pip,sharing=locked \
    --mount=type=secret,id=cacert,target=/run/secrets/cacert,required=false \
    if [ -s /run/secrets/cacert ]; then export SSL_CERT_FILE=/run/secrets/cacert PIP_CERT=/run/secrets/cacert REQUESTS_CA_BUNDLE=/run/secrets/cacert CURL_CA_BUNDLE=/run/secrets/cacert GIT_SSL_CAINFO=/run/secrets/cacert APT_CA=/run/secrets/cacert; fi; \
    /opt/installer/bin/pip install --require-hashes --no-deps --only-binary=:all: --ignore-requires-python --no-compile \
        --implementation cp --python-version 3.12 \
        --platform manylinux_2_17_aarch64 \
        --platform manylinux_2_18_aarch64 \
        --platform manylinux_2_19_aarch64 \
        --platform manylinux_2_20_aarch64 \
        --platform manylinux_2_21_aarch64 \
        --platform manylinux_2_22_aarch64 \
        --platform manylinux_2_23_aarch64 \
        --platform manylinux_2_24_aarch64 \
        --platform manylinux_2_25_aarch64 \
        --platform manylinux_2_26_aarch64 \
        --platform manylinux_2_27_aarch64 \
        --platform manylinux_2_28_aarch64 \
        --platform manylinux_2_29_aarch64 \
        --platform manylinux_2_30_aarch64 \
        --platform manylinux_2_31_aarch64 \
        --platform manylinux_2_32_aarch64 \
        --platform manylinux_2_33_aarch64 \
        --platform manylinux_2_34_aarch64 \
        --platform manylinux_2_35_aarch64 \
        --platform manylinux_2_36_aarch64 \
        --platform manylinux_2_37_aarch64 \
        --platform manylinux_2_38_aarch64 \
        --platform manylinux_2_39_aarch64 \
        --platform manylinux2014_aarch64 --platform linux_aarch64 --platform any \
        --target /opt/spark/layers/cuda-math/site -r /tmp/spark/cuda-math.lock \
    && mkdir -p /opt/spark/layers/cuda-math/bin \
    && if [ -d /opt/spark/layers/cuda-math/site/bin ]; then find /opt/spark/layers/cuda-math/site/bin -mindepth 1 -maxdepth 1 -exec mv -t /opt/spark/layers/cuda-math/bin {} + && rmdir /opt/spark/layers/cuda-math/site/bin; fi \
    && for script in /opt/spark/layers/cuda-math/bin/*; do \
        if [ -f "$script" ] && [ "$(head -c 2 "$script")" = '#!' ]; then sed -i '1s|^#!.*python[0-9.]*$|#!/opt/venv/bin/python|' "$script"; fi; \
    done

# layer torch: 11 packages (nvidia-cutlass-dsl, nvidia-cutlass-dsl-libs-base, nvidia-cutlass-dsl-libs-core, nvidia-cutlass-dsl-libs-cu12, ...)
FROM installer AS installer-torch
COPY requirements/torch.lock /tmp/spark/torch.lock
RUN --mount=type=cache,id=spark-images-pip-torch,target=/root/.cache/pip,sharing=locked \
    --mount=type=secret,id=cacert,target=/run/secrets/cacert,required=false \
    if [ -s /run/secrets/cacert ]; then export SSL_CERT_FILE=/run/secrets/cacert PIP_CERT=/run/secrets/cacert REQUESTS_CA_BUNDLE=/run/secrets/cacert CURL_CA_BUNDLE=/run/secrets/cacert GIT_SSL_CAINFO=/run/secrets/cacert APT_CA=/run/secrets/cacert; fi; \
    /opt/installer/bin/pip install --require-hashes --no-deps --only-binary=:all: --ignore-requires-python --no-compile \
        --implementation cp --python-version 3.12 \
        --platform manylinux_2_17_aarch64 \
        --platform manylinux_2_18_aarch64 \
        --platform manylinux_2_19_aarch64 \
        --platform manylinux_2_20_aarch64 \
        --platform manylinux_2_21_aarch64 \
        --platform manylinux_2_22_aarch64 \
        --platform manylinux_2_23_aarch64 \
        --platform manylinux_2_24_aarch64 \
        --platform manylinux_2_25_aarch64 \
        --platform manylinux_2_26_aarch64 \
        --platform manylinux_2_27_aarch64 \
        --platform manylinux_2_28_aarch64 \
        --platform manylinux_2_29_aarch64 \
        --platform manylinux_2_30_aarch64 \
        --platform manylinux_2_31_aarch64 \
        --platform manylinux_2_32_aarch64 \
        --platform manylinux_2_33_aarch64 \
        --platform manylinux_2_34_aarch64 \
        --platform manylinux_2_35_aarch64 \
        --platform manylinux_2_36_aarch64 \
        --platform manylinux_2_37_aarch64 \
        --platform manylinux_2_38_aarch64 \
        --platform manylinux_2_39_aarch64 \
        --platform manylinux2014_aarch64 --platform linux_aarch64 --platform any \
        --target /opt/spark/layers/torch/site -r /tmp/spark/torch.lock \
    && mkdir -p /opt/spark/layers/torch/bin \
    && if [ -d /opt/spark/layers/torch/site/bin ]; then find /opt/spark/layers/torch/site/bin -mindepth 1 -maxdepth 1 -exec mv -t /opt/spark/layers/torch/bin {} + && rmdir /opt/spark/layers/torch/site/bin; fi \
    && for script in /opt/spark/layers/torch/bin/*; do \
        if [ -f "$script" ] && [ "$(head -c 2 "$script")" = '#!' ]; then sed -i '1s|^#!.*python[0-9.]*$|#!/opt/venv/bin/python|' "$script"; fi; \
    done

# layer cuda: 23 packages (cuda-bindings, cuda-core, cuda-pathfinder, cuda-python, ...)
FROM installer AS installer-cuda
COPY requirements/cuda.lock /tmp/spark/cuda.lock
RUN --mount=type=cache,id=spark-images-pip-cuda,target=/root/.cache/pip,sharing=locked \
    --mount=type=secret,id=cacert,target=/run/secrets/cacert,required=false \
    if [ -s /run/secrets/cacert ]; then export SSL_CERT_FILE=/run/secrets/cacert PIP_CERT=/run/secrets/cacert REQUESTS_CA_BUNDLE=/run/secrets/cacert CURL_CA_BUNDLE=/run/secrets/cacert GIT_SSL_CAINFO=/run/secrets/cacert APT_CA=/run/secrets/cacert; fi; \
    /opt/installer/bin/pip install --require-hashes --no-deps --only-binary=:all: --ignore-requires-python --no-compile \
        --implementation cp --python-version 3.12 \
        --platform manylinux_2_17_aarch64 \
        --platform manylinux_2_18_aarch64 \
        --platform manylinux_2_19_aarch64 \
        --platform manylinux_2_20_aarch64 \
        --platform manylinux_2_21_aarch64 \
        --platform manylinux_2_22_aarch64 \
        --platform manylinux_2_23_aarch64 \
        --platform manylinux_2_24_aarch64 \
        --platform manylinux_2_25_aarch64 \
        --platform manylinux_2_26_aarch64 \
        --platform manylinux_2_27_aarch64 \
        --platform manylinux_2_28_aarch64 \
        --platform manylinux_2_29_aarch64 \
        --platform manylinux_2_30_aarch64 \
        --platform manylinux_2_31_aarch64 \
        --platform manylinux_2_32_aarch64 \
        --platform manylinux_2_33_aarch64 \
        --platform manylinux_2_34_aarch64 \
        --platform manylinux_2_35_aarch64 \
        --platform manylinux_2_36_aarch64 \
        --platform manylinux_2_37_aarch64 \
        --platform manylinux_2_38_aarch64 \
        --platform manylinux_2_39_aarch64 \
        --platform manylinux2014_aarch64 --platform linux_aarch64 --platform any \
        --target /opt/spark/layers/cuda/site -r /tmp/spark/cuda.lock \
    && mkdir -p /opt/spark/layers/cuda/bin \
    && if [ -d /opt/spark/layers/cuda/site/bin ]; then find /opt/spark/layers/cuda/site/bin -mindepth 1 -maxdepth 1 -exec mv -t /opt/spark/layers/cuda/bin {} + && rmdir /opt/spark/layers/cuda/site/bin; fi \
    && for script in /opt/spark/layers/cuda/bin/*; do \
        if [ -f "$script" ] && [ "$(head -c 2 "$script")" = '#!' ]; then sed -i '1s|^#!.*python[0-9.]*$|#!/opt/venv/bin/python|' "$script"; fi; \
    done

# layer python: 158 packages (agent-detector, aiohappyeyeballs, aiohttp, aiosignal, ...)
FROM installer AS installer-python
COPY requirements/python.lock /tmp/spark/python.lock
RUN --mount=type=cache,id=spark-images-pip-python,target=/root/.cache/pip,sharing=locked \
    --mount=type=secret,id=cacert,target=/run/secrets/cacert,required=false \
    if [ -s /run/secrets/cacert ]; then export SSL_CERT_FILE=/run/secrets/cacert PIP_CERT=/run/secrets/cacert REQUESTS_CA_BUNDLE=/run/secrets/cacert CURL_CA_BUNDLE=/run/secrets/cacert GIT_SSL_CAINFO=/run/secrets/cacert APT_CA=/run/secrets/cacert; fi; \
    /opt/installer/bin/pip install --require-hashes --no-deps --only-binary=:all: --ignore-requires-python --no-compile \
        --implementation cp --python-version 3.12 \
        --platform manylinux_2_17_aarch64 \
        --platform manylinux_2_18_aarch64 \
        --platform manylinux_2_19_aarch64 \
        --platform manylinux_2_20_aarch64 \
        --platform manylinux_2_21_aarch64 \
        --platform manylinux_2_22_aarch64 \
        --platform manylinux_2_23_aarch64 \
        --platform manylinux_2_24_aarch64 \
        --platform manylinux_2_25_aarch64 \
        --platform manylinux_2_26_aarch64 \
        --platform manylinux_2_27_aarch64 \
        --platform manylinux_2_28_aarch64 \
        --platform manylinux_2_29_aarch64 \
        --platform manylinux_2_30_aarch64 \
        --platform manylinux_2_31_aarch64 \
        --platform manylinux_2_32_aarch64 \
        --platform manylinux_2_33_aarch64 \
        --platform manylinux_2_34_aarch64 \
        --platform manylinux_2_35_aarch64 \
        --platform manylinux_2_36_aarch64 \
        --platform manylinux_2_37_aarch64 \
        --platform manylinux_2_38_aarch64 \
        --platform manylinux_2_39_aarch64 \
        --platform manylinux2014_aarch64 --platform linux_aarch64 --platform any \
        --target /opt/spark/layers/python/site -r /tmp/spark/python.lock \
    && mkdir -p /opt/spark/layers/python/bin \
    && if [ -d /opt/spark/layers/python/site/bin ]; then find /opt/spark/layers/python/site/bin -mindepth 1 -maxdepth 1 -exec mv -t /opt/spark/layers/python/bin {} + && rmdir /opt/spark/layers/python/site/bin; fi \
    && for script in /opt/spark/layers/python/bin/*; do \
        if [ -f "$script" ] && [ "$(head -c 2 "$script")" = '#!' ]; then sed -i '1s|^#!.*python[0-9.]*$|#!/opt/venv/bin/python|' "$script"; fi; \
    done

# the vLLM wheel by its sha256: its requirements are the lock's
FROM installer AS installer-vllm
RUN mkdir -p /tmp/spark \
    && printf '%s\n' 'vllm @ https://files.pythonhosted.org/packages/b3/dc/de2ca88cfb6539c987bc4f6a69887deaa53eb5c4fd483e0923ca00ebd60a/vllm-0.29.0-cp38-abi3-manylinux_2_28_aarch64.whl --hash=sha256:e6b0dfc2b6fd307315e9b34b73cd2bfe7b6b08958eda721828e61732bba426b0' > /tmp/spark/vllm-wheel.txt
RUN --mount=type=cache,id=spark-images-pip-vllm,target=/root/.cache/pip,sharing=locked \
    --mount=type=secret,id=cacert,target=/run/secrets/cacert,required=false \
    if [ -s /run/secrets/cacert ]; then export SSL_CERT_FILE=/run/secrets/cacert PIP_CERT=/run/secrets/cacert REQUESTS_CA_BUNDLE=/run/secrets/cacert CURL_CA_BUNDLE=/run/secrets/cacert GIT_SSL_CAINFO=/run/secrets/cacert APT_CA=/run/secrets/cacert; fi; \
    /opt/installer/bin/pip install --require-hashes --no-deps --only-binary=:all: --ignore-requires-python --no-compile \
        --implementation cp --python-version 3.12 \
        --platform manylinux_2_17_aarch64 \
        --platform manylinux_2_18_aarch64 \
        --platform manylinux_2_19_aarch64 \
        --platform manylinux_2_20_aarch64 \
        --platform manylinux_2_21_aarch64 \
        --platform manylinux_2_22_aarch64 \
        --platform manylinux_2_23_aarch64 \
        --platform manylinux_2_24_aarch64 \
        --platform manylinux_2_25_aarch64 \
        --platform manylinux_2_26_aarch64 \
        --platform manylinux_2_27_aarch64 \
        --platform manylinux_2_28_aarch64 \
        --platform manylinux_2_29_aarch64 \
        --platform manylinux_2_30_aarch64 \
        --platform manylinux_2_31_aarch64 \
        --platform manylinux_2_32_aarch64 \
        --platform manylinux_2_33_aarch64 \
        --platform manylinux_2_34_aarch64 \
        --platform manylinux_2_35_aarch64 \
        --platform manylinux_2_36_aarch64 \
        --platform manylinux_2_37_aarch64 \
        --platform manylinux_2_38_aarch64 \
        --platform manylinux_2_39_aarch64 \
        --platform manylinux2014_aarch64 --platform linux_aarch64 --platform any \
        --target /opt/spark/vllm/site -r /tmp/spark/vllm-wheel.txt \
    && mkdir -p /opt/spark/vllm/bin \
    && if [ -d /opt/spark/vllm/site/bin ]; then find /opt/spark/vllm/site/bin -mindepth 1 -maxdepth 1 -exec mv -t /opt/spark/vllm/bin {} + && rmdir /opt/spark/vllm/site/bin; fi \
    && for script in /opt/spark/vllm/bin/*; do \
        if [ -f "$script" ] && [ "$(head -c 2 "$script")" = '#!' ]; then sed -i '1s|^#!.*python[0-9.]*$|#!/opt/venv/bin/python|' "$script"; fi; \
    done

# One pip install would keep one file of two that share a path; the layers are
# unpacked apart, so no path may be in two of them (site-packages or bin). The
# console scripts of the lock's layers are gathered here for one COPY.
FROM installer AS installer-checked
RUN --mount=type=bind,from=installer-cuda-math,source=/opt/spark/layers/cuda-math,target=/layers/cuda-math \
    --mount=type=bind,from=installer-torch,source=/opt/spark/layers/torch,target=/layers/torch \
    --mount=type=bind,from=installer-cuda,source=/opt/spark/layers/cuda,target=/layers/cuda \
    --mount=type=bind,from=installer-python,source=/opt/spark/layers/python,target=/layers/python \
    --mount=type=bind,from=installer-vllm,source=/opt/spark/vllm,target=/layers/vllm \
    cd /layers \
    && for layer in *; do (cd "$layer" && find site bin ! -type d -printf "%p\t$layer\n"); done | LC_ALL=C sort > /tmp/paths.txt \
    && awk -F '\t' '$1 == path { print "spark-images: " $1 " is in two lock layers (" layer ", " $2 "): put both packages in one layer (spark_images.defaults.LOCK_LAYERS)"; bad = 1 } { path = $1; layer = $2 } END { exit bad }' /tmp/paths.txt \
    && rm /tmp/paths.txt \
    && mkdir -p /opt/spark/bin \
    && cp -a /layers/cuda-math/bin/. /opt/spark/bin/ \
    && cp -a /layers/torch/bin/. /opt/spark/bin/ \
    && cp -a /layers/cuda/bin/. /opt/spark/bin/ \
    && cp -a /layers/python/bin/. /opt/spark/bin/

########## toolchain: the digest-pinned CUDA devel base, a Python venv, nvcc checked ##########
FROM nvidia/cuda:13.0.2-devel-ubuntu24.04@sha256:5dc1bca23d05bd37b011be68ec470c03b403a5da07ec3a86e41af9470e9d0cc6 AS toolchain
# Declared in every stage so RUN steps see it: pip and Python then write hash-based
# .pyc files and tools clamp embedded times, so two builds give one digest.
ARG SOURCE_DATE_EPOCH
SHELL ["/bin/bash", "-o", "pipefail", "-euc"]
ENV DEBIAN_FRONTEND=noninteractive \
    LANG=C.UTF-8 \
    LC_ALL=C.UTF-8 \
    CUDA_HOME="/usr/local/cuda" \
    VIRTUAL_ENV=/opt/venv \
    PATH="/opt/venv/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
# What apt leaves that differs from run to run goes too: its binary caches
# (pkgcache.bin differed between two builds of one plan) and the logs that
# carry the time of the install.
RUN --mount=type=secret,id=cacert,target=/run/secrets/cacert,required=false \
    if [ -s /run/secrets/cacert ]; then export SSL_CERT_FILE=/run/secrets/cacert PIP_CERT=/run/secrets/cacert REQUESTS_CA_BUNDLE=/run/secrets/cacert CURL_CA_BUNDLE=/run/secrets/cacert GIT_SSL_CAINFO=/run/secrets/cacert APT_CA=/run/secrets/cacert; fi; \
    apt-get ${APT_CA:+-o Acquire::https::CAInfo=$APT_CA} update -q \
    && apt-get ${APT_CA:+-o Acquire::https::CAInfo=$APT_CA} install -y -q --no-install-recommends \
        ca-certificates \
        ccache \
        curl \
        git \
        python3.12 \
        python3.12-dev \
        python3.12-venv \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt/* /var/log/dpkg.log /var/log/alternatives.log \
        /var/cache/ldconfig/aux-cache /var/cache/debconf/*-old /var/lib/dpkg/*-old
# FlashInfer JIT-compiles its Spark kernels at run time: the image must keep nvcc
# (13.0.2), and it must be the toolkit the profile pins. The version text is
# captured first: `nvcc --version | grep -q` can fail under pipefail when grep
# exits early and nvcc gets SIGPIPE.
RUN test -x "$CUDA_HOME/bin/nvcc" || { echo "no nvcc at $CUDA_HOME/bin: the base must be a CUDA devel image" >&2; exit 1; }; \
    nvcc_version="$(nvcc --version)"; \
    case "$nvcc_version" in *'release 13.0, V13.0.'*) ;; *) echo 'nvcc is not CUDA 13.0:' "$nvcc_version" >&2; exit 1;; esac; \
    python3.12 -m venv /opt/venv

########## deps: torch, FlashInfer and CUTLASS DSL at the profile's pins ##########
FROM toolchain AS deps
ARG SOURCE_DATE_EPOCH
# Unpacked natively by the installer stages: copied, not installed, here, one layer each.
COPY --from=installer-cuda-math /opt/spark/layers/cuda-math/site/ /opt/venv/lib/python3.12/site-packages/
COPY --from=installer-torch /opt/spark/layers/torch/site/ /opt/venv/lib/python3.12/site-packages/
COPY --from=installer-cuda /opt/spark/layers/cuda/site/ /opt/venv/lib/python3.12/site-packages/
COPY --from=installer-python /opt/spark/layers/python/site/ /opt/venv/lib/python3.12/site-packages/
COPY --from=installer-checked /opt/spark/bin/ /opt/venv/bin/

########## runtime: the devel base (nvcc for FlashInfer JIT) with vLLM installed ##########
FROM deps AS runtime
ARG SOURCE_DATE_EPOCH
# The vLLM wheel, unpacked natively by its sha256; its requirements came from the lock.
COPY --from=installer-vllm /opt/spark/vllm/site/ /opt/venv/lib/python3.12/site-packages/
COPY --from=installer-vllm /opt/spark/vllm/bin/ /opt/venv/bin/
# The checks run on arm64 (emulated on another host): every installed
# distribution has what it requires (the lock installs with --no-deps, so
# nothing else would notice a missing or conflicting package), the installed
# vLLM is the pinned commit (its _version.py records it), and it imports.
RUN { pip check > /tmp/pip-check.txt || python -c 'import importlib.metadata as m, re, sys; lines = open(sys.argv[1]).read().splitlines(); tags = lambda n: [t for t in (m.distribution(n).read_text("WHEEL") or "").splitlines() if t.startswith("Tag:")]; ok = lambda line: (hit := re.fullmatch(r"(\S+) \S+ is not supported on this platform", line)) is not None and bool(tags(hit[1])) and all(t.endswith("_sbsa") for t in tags(hit[1])); [print("pip check:", line, "(its WHEEL names sbsa, NVIDIA server aarch64: accepted)") for line in lines if ok(line)]; sys.exit(chr(10).join(line for line in lines if not ok(line)) or None)' /tmp/pip-check.txt; } \
    && rm -f /tmp/pip-check.txt \
    && python -c 'import importlib.util, pathlib, sys; t = pathlib.Path(importlib.util.find_spec("vllm").origin).with_name("_version.py").read_text(); sys.exit(0 if sys.argv[1] in t else "vllm/_version.py does not name commit " + sys.argv[2])' \
        g98dff2a81 98dff2a81d747d1dba01a47f939f48c3526d4206 \
    && python -c 'import vllm'
ENV TORCH_CUDA_ARCH_LIST="12.0f" \
    TRITON_PTXAS_PATH="/usr/local/cuda/bin/ptxas"
# Triton's bundled ptxas can predate sm_121a: use the image's CUDA ptxas.
RUN test -x "$TRITON_PTXAS_PATH" && "$TRITON_PTXAS_PATH" --version
COPY plan.json /opt/spark-images/plan.json
ARG IMAGE_CREATED=""
# Labels come from the plan alone (fixes.required, patches, pins): what the
# audit found on the build host goes to the record and lock, never in here.
LABEL org.opencontainers.image.created="${IMAGE_CREATED}" \
    io.spark-images.arch-list="12.0f" \
    io.spark-images.cuda.line="cu130" \
    io.spark-images.cuda.version="13.0.2" \
    io.spark-images.fixes.required="38126,38423,35568,40082,41215,40923,48245" \
    io.spark-images.patches="" \
    io.spark-images.pins="flashinfer-python==0.6.18,nvidia-cutlass-dsl==4.6.2,torch==2.13.0" \
    io.spark-images.profile="cu130" \
    io.spark-images.strategy="wheel" \
    io.spark-images.vllm.commit="98dff2a81d747d1dba01a47f939f48c3526d4206" \
    io.spark-images.vllm.version="0.29.0" \
    org.opencontainers.image.base.digest="sha256:5dc1bca23d05bd37b011be68ec470c03b403a5da07ec3a86e41af9470e9d0cc6" \
    org.opencontainers.image.base.name="nvidia/cuda:13.0.2-devel-ubuntu24.04" \
    org.opencontainers.image.description="vLLM 0.29.0 for the NVIDIA DGX Spark (GB10, sm_121), CUDA 13.0.2" \
    org.opencontainers.image.revision="98dff2a81d747d1dba01a47f939f48c3526d4206" \
    org.opencontainers.image.source="https://github.com/spark-images/spark-images" \
    org.opencontainers.image.title="spark-vllm cu130" \
    org.opencontainers.image.version="0.29.0-cu130"
EXPOSE 8000
ENTRYPOINT ["vllm", "serve", "--host", "0.0.0.0", "--port", "8000"]

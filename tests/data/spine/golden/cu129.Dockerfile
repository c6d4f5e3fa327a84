# Rendered by spark-images from profiles/cu129.yaml (profile cu129). Do not edit: re-render.
# vLLM 0.29.0 @ 98dff2a81d747d1dba01a47f939f48c3526d4206 for the NVIDIA DGX Spark (GB10, sm_121).
# CUDA 12.9.1 (cu129), TORCH_CUDA_ARCH_LIST=12.1a (derived), strategy: source.
# Build: docker buildx build --platform linux/arm64 [--secret id=cacert,src=CA_BUNDLE.pem] .
# The optional cacert secret is trusted by every download of the build and never lands in a layer.

########## toolchain: the digest-pinned CUDA devel base, a Python venv, nvcc checked ##########
FROM nvidia/cuda:12.9.1-devel-ubuntu24.04@sha256:020bc241a628776338f4d4053fed4c38f6f7f3d7eb5919fecb8de313bb8ba47c AS toolchain
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
# (12.9.1), and it must be the toolkit the profile pins. The version text is
# captured first: `nvcc --version | grep -q` can fail under pipefail when grep
# exits early and nvcc gets SIGPIPE.
RUN test -x "$CUDA_HOME/bin/nvcc" || { echo "no nvcc at $CUDA_HOME/bin: the base must be a CUDA devel image" >&2; exit 1; }; \
    nvcc_version="$(nvcc --version)"; \
    case "$nvcc_version" in *'release 12.9, V12.9.'*) ;; *) echo 'nvcc is not CUDA 12.9:' "$nvcc_version" >&2; exit 1;; esac; \
    python3.12 -m venv /opt/venv

########## deps: torch, FlashInfer and CUTLASS DSL at the profile's pins ##########
FROM toolchain AS deps
ARG SOURCE_DATE_EPOCH
RUN mkdir -p /tmp/spark && printf '%s\n' \
        flashinfer-cubin==0.6.18 \
        flashinfer-python==0.6.18 \
        nvidia-cutlass-dsl==4.6.2 \
        torch==2.13.0 \
        > /tmp/spark/constraints.txt
RUN --mount=type=secret,id=cacert,target=/run/secrets/cacert,required=false \
    if [ -s /run/secrets/cacert ]; then export SSL_CERT_FILE=/run/secrets/cacert PIP_CERT=/run/secrets/cacert REQUESTS_CA_BUNDLE=/run/secrets/cacert CURL_CA_BUNDLE=/run/secrets/cacert GIT_SSL_CAINFO=/run/secrets/cacert APT_CA=/run/secrets/cacert; fi; \
    pip install --index-url https://download.pytorch.org/whl/cu128 torch==2.13.0 \
    && pip install -c /tmp/spark/constraints.txt --extra-index-url https://flashinfer.ai/whl/ \
        flashinfer-python==0.6.18 \
        flashinfer-cubin==0.6.18 \
        nvidia-cutlass-dsl==4.6.2

########## vllm-build: vLLM compiled at the pinned commit for 12.1a ##########
FROM deps AS vllm-build
ARG SOURCE_DATE_EPOCH
ENV TORCH_CUDA_ARCH_LIST="12.1a" \
    MAX_JOBS=8 \
    NVCC_THREADS=2 \
    VLLM_TARGET_DEVICE=cuda \
    CCACHE_DIR=/root/.cache/ccache
WORKDIR /workspace/vllm
# A branch or tag moves: fetch the one commit and prove HEAD is it. The local
# tag lets setuptools-scm stamp the release version and commit into the wheel.
RUN --mount=type=secret,id=cacert,target=/run/secrets/cacert,required=false \
    if [ -s /run/secrets/cacert ]; then export SSL_CERT_FILE=/run/secrets/cacert PIP_CERT=/run/secrets/cacert REQUESTS_CA_BUNDLE=/run/secrets/cacert CURL_CA_BUNDLE=/run/secrets/cacert GIT_SSL_CAINFO=/run/secrets/cacert APT_CA=/run/secrets/cacert; fi; \
    git init -q . \
    && git remote add origin https://github.com/vllm-project/vllm.git \
    && git fetch -q --depth 1 origin 98dff2a81d747d1dba01a47f939f48c3526d4206 \
    && git checkout -q --detach FETCH_HEAD \
    && head="$(git rev-parse HEAD)" \
    && { [ "$head" = 98dff2a81d747d1dba01a47f939f48c3526d4206 ] || { echo "vLLM checkout is $head, expected" 98dff2a81d747d1dba01a47f939f48c3526d4206 >&2; exit 1; }; } \
    && git tag v0.29.0
# Keep the torch installed above; pin FlashInfer and CUTLASS DSL to the profile.
RUN python use_existing_torch.py --prefix \
    && sed -Ei \
        -e 's/^flashinfer-python==[^ ;#]*/flashinfer-python==0.6.18/' \
        -e 's/^flashinfer-cubin==[^ ;#]*/flashinfer-cubin==0.6.18/' \
        -e 's/^nvidia-cutlass-dsl(\[[a-z0-9]+\])?==[^ ;#]*/nvidia-cutlass-dsl==4.6.2/' \
        requirements/cuda.txt
RUN --mount=type=cache,target=/root/.cache/ccache \
    --mount=type=secret,id=cacert,target=/run/secrets/cacert,required=false \
    if [ -s /run/secrets/cacert ]; then export SSL_CERT_FILE=/run/secrets/cacert PIP_CERT=/run/secrets/cacert REQUESTS_CA_BUNDLE=/run/secrets/cacert CURL_CA_BUNDLE=/run/secrets/cacert GIT_SSL_CAINFO=/run/secrets/cacert APT_CA=/run/secrets/cacert; fi; \
    pip install -c /tmp/spark/constraints.txt -r requirements/build/cuda.txt \
    && python setup.py bdist_wheel --dist-dir=/tmp/spark/dist --py-limited-api=cp38

########## runtime: the devel base (nvcc for FlashInfer JIT) with vLLM installed ##########
FROM deps AS runtime
ARG SOURCE_DATE_EPOCH
COPY --from=vllm-build /tmp/spark/dist/ /tmp/spark/dist/
RUN --mount=type=secret,id=cacert,target=/run/secrets/cacert,required=false \
    if [ -s /run/secrets/cacert ]; then export SSL_CERT_FILE=/run/secrets/cacert PIP_CERT=/run/secrets/cacert REQUESTS_CA_BUNDLE=/run/secrets/cacert CURL_CA_BUNDLE=/run/secrets/cacert GIT_SSL_CAINFO=/run/secrets/cacert APT_CA=/run/secrets/cacert; fi; \
    pip install -c /tmp/spark/constraints.txt /tmp/spark/dist/vllm-*.whl \
    && rm -rf /tmp/spark/dist
# The checks run on arm64 (emulated on another host): every installed
# distribution has what it requires (the lock installs with --no-deps, so
# nothing else would notice a missing or conflicting package), the installed
# vLLM is the pinned commit (its _version.py records it), and it imports.
RUN { pip check > /tmp/pip-check.txt || python -c 'import importlib.metadata as m, re, sys; lines = open(sys.argv[1]).read().splitlines(); tags = lambda n: [t for t in (m.distribution(n).read_text("WHEEL") or "").splitlines() if t.startswith("Tag:")]; ok = lambda line: (hit := re.fullmatch(r"(\S+) \S+ is not supported on this platform", line)) is not None and bool(tags(hit[1])) and all(t.endswith("_sbsa") for t in tags(hit[1])); [print("pip check:", line, "(its WHEEL names sbsa, NVIDIA server aarch64: accepted)") for line in lines if ok(line)]; sys.exit(chr(10).join(line for line in lines if not ok(line)) or None)' /tmp/pip-check.txt; } \
    && rm -f /tmp/pip-check.txt \
    && python -c 'import importlib.util, pathlib, sys; t = pathlib.Path(importlib.util.find_spec("vllm").origin).with_name("_version.py").read_text(); sys.exit(0 if sys.argv[1] in t else "vllm/_version.py does not name commit " + sys.argv[2])' \
        g98dff2a81 98dff2a81d747d1dba01a47f939f48c3526d4206 \
    && python -c 'import vllm'
ENV TORCH_CUDA_ARCH_LIST="12.1a" \
    TRITON_PTXAS_PATH="/usr/local/cuda/bin/ptxas"
# Triton's bundled ptxas can predate sm_121a: use the image's CUDA ptxas.
RUN test -x "$TRITON_PTXAS_PATH" && "$TRITON_PTXAS_PATH" --version
COPY plan.json /opt/spark-images/plan.json
ARG IMAGE_CREATED=""
# Labels come from the plan alone (fixes.required, patches, pins): what the
# audit found on the build host goes to the record and lock, never in here.
LABEL org.opencontainers.image.created="${IMAGE_CREATED}" \
    io.spark-images.arch-list="12.1a" \
    io.spark-images.cuda.line="cu129" \
    io.spark-images.cuda.version="12.9.1" \
    io.spark-images.fixes.required="38126,38423,35568,40082,41215,40923,48245" \
    io.spark-images.patches="" \
    io.spark-images.pins="flashinfer-cubin==0.6.18,flashinfer-python==0.6.18,nvidia-cutlass-dsl==4.6.2,torch==2.13.0" \
    io.spark-images.profile="cu129" \
    io.spark-images.strategy="source" \
    io.spark-images.vllm.commit="98dff2a81d747d1dba01a47f939f48c3526d4206" \
    io.spark-images.vllm.version="0.29.0" \
    org.opencontainers.image.base.digest="sha256:020bc241a628776338f4d4053fed4c38f6f7f3d7eb5919fecb8de313bb8ba47c" \
    org.opencontainers.image.base.name="nvidia/cuda:12.9.1-devel-ubuntu24.04" \
    org.opencontainers.image.description="vLLM 0.29.0 for the NVIDIA DGX Spark (GB10, sm_121), CUDA 12.9.1" \
    org.opencontainers.image.revision="98dff2a81d747d1dba01a47f939f48c3526d4206" \
    org.opencontainers.image.source="https://github.com/spark-images/spark-images" \
    org.opencontainers.image.title="spark-vllm cu129" \
    org.opencontainers.image.version="0.29.0-cu129"
EXPOSE 8000
ENTRYPOINT ["vllm", "serve", "--host", "0.0.0.0", "--port", "8000"]

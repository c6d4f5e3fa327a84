#!/usr/bin/env bash
# The local stand-in for nvidia/cuda:13.0.2-devel-ubuntu24.04, for hosts that
# cannot pull it (the acceptance run): a two-platform image in the loopback
# registry, pinned by its index digest as the real base is.
#   linux/arm64: Debian 13 minbase + CUDA 13.0.2's compiler from PyPI's
#                nvidia-* wheels at /usr/local/cuda-13.0 (nvcc V13.0.88, ptxas,
#                nvvm, cudart 13.0.96, cccl) -- the toolkit half of the real base;
#   linux/amd64: Ubuntu 24.04 minbase, for the native installer stage.
# What it lacks against the real base: cuDNN, NCCL and the rest of the devel
# toolkit (the lock's nvidia-* wheels bring the runtime libraries vLLM uses).
# Prints REF@sha256:INDEX on stdout. Idempotent; the rootfs tarballs and the
# wheels are cached under $CACHE.
set -euo pipefail
cd "$(dirname "$0")/.."
umask 022  # the stand-in's file modes are its bytes: not the caller's umask
CACHE="${SPARK_IMAGES_TEST_CACHE:-$HOME/.cache/spark-images-test}"
REGISTRY="${SPARK_IMAGES_TEST_REGISTRY:-127.0.0.1:5000}"
NAME="$REGISTRY/spark-images-standin/cuda:13.0.2-devel-trixie-arm64-noble-amd64"
log() { printf '[standin-base] %s\n' "$*" >&2; }

bash .ci/standin-rootfs.sh amd64
bash .ci/standin-rootfs.sh arm64

cuda="$CACHE/cuda-13.0.88-aarch64"
if [ ! -x "$cuda/bin/nvcc" ]; then
  log "fetching CUDA 13.0 compiler wheels for aarch64 from PyPI"
  wheels="$CACHE/cuda-13.0.88-aarch64-wheels"; mkdir -p "$wheels"
  cat >"$wheels/requirements.txt" <<'REQ'
nvidia-cuda-nvcc==13.0.88 --hash=sha256:c7ff28f86a24effdc6c034fa15230c549a273e4771b10a7fec14996f8cf3307f
nvidia-cuda-crt==13.0.88 --hash=sha256:ee2ea2a97073e02ee62bb27841f437332be2c248e3eac013df07997ada39c003
nvidia-nvvm==13.0.88 --hash=sha256:c4376a291d72d22a315d9d2f69bdae8f8cd83a627f75bad395cee49a0fe65dc1
nvidia-cuda-runtime==13.0.96 --hash=sha256:ef9bcbe90493a2b9d810e43d249adb3d02e98dd30200d86607d8d02687c43f55
nvidia-cuda-cccl==13.0.85 --hash=sha256:6f0203e29fed809ee2b7fe9b1344df66ecab990c37d6a2e0e189b26d6c97ed7c
REQ
  rm -rf "$cuda.tmp"
  python3 -m pip install --quiet --disable-pip-version-check --require-hashes --no-deps --only-binary=:all: \
    --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64 --python-version 3.12 --implementation cp \
    --no-compile --target "$cuda.tmp/site" -r "$wheels/requirements.txt"
  mv "$cuda.tmp/site/nvidia/cu13" "$cuda.tmp/cu13"
  # the wheels' nvcc.profile links from lib64, and `-cudart shared` needs the unversioned name
  ln -s lib "$cuda.tmp/cu13/lib64"
  ln -s libcudart.so.13 "$cuda.tmp/cu13/lib/libcudart.so"
  chmod 0755 "$cuda.tmp"/cu13/bin/*
  rm -rf "$cuda"; mv "$cuda.tmp/cu13" "$cuda"; rm -rf "$cuda.tmp"
fi

ctx=$(mktemp -d); trap 'rm -rf "$ctx"' EXIT
ln "$CACHE/trixie-arm64.tar" "$ctx/trixie-arm64.tar" 2>/dev/null || cp "$CACHE/trixie-arm64.tar" "$ctx/"
ln "$CACHE/noble-amd64.tar" "$ctx/noble-amd64.tar" 2>/dev/null || cp "$CACHE/noble-amd64.tar" "$ctx/"
mkdir -p "$ctx/usr-local"
cp -a "$cuda" "$ctx/usr-local/cuda-13.0"
ln -s cuda-13.0 "$ctx/usr-local/cuda"
cat >"$ctx/Dockerfile" <<'DF'
FROM scratch AS base-amd64
ADD noble-amd64.tar /
FROM scratch AS base-arm64
ADD trixie-arm64.tar /
COPY usr-local/ /usr/local/
FROM base-${TARGETARCH}
ENV PATH=/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
CMD ["/bin/bash"]
DF
log "building $NAME (linux/arm64 + linux/amd64) and pushing it to $REGISTRY"
SOURCE_DATE_EPOCH=0 docker buildx build --quiet --platform linux/arm64,linux/amd64 --provenance false --sbom false \
  --metadata-file "$ctx/meta.json" --output "type=image,name=$NAME,push=true" "$ctx" >/dev/null
digest=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["containerimage.digest"])' "$ctx/meta.json")
echo "$NAME@$digest"

#!/usr/bin/env bash
# Compile every fixture variant of the cubin inspector tests into OUTDIR.
# Usage: build.sh OUTDIR   (NVCC may name the compiler; default: nvcc on PATH)
# The same script builds the oracle binaries on a machine with cuobjdump and
# the local fixtures during the test run, so both see identical commands.
set -euo pipefail
out=${1:?usage: build.sh OUTDIR}
nvcc=${NVCC:-nvcc}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out/lib" "$out/cubins" "$out/fatbin"
so() { # so NAME SOURCES... -- FLAGS...
  local name=$1; shift
  local srcs=()
  while [ "$1" != "--" ]; do srcs+=("$here/$1"); shift; done
  shift
  "$nvcc" -shared -cudart shared -Xcompiler -fPIC -o "$out/lib/lib$name.so" "$@" "${srcs[@]}"
}
cubin() { # cubin NAME ARCH
  "$nvcc" -cubin -arch="$2" -o "$out/cubins/$1.cubin" "$here/common.cu"
}
pids=()
so sm121a common.cu -- -gencode arch=compute_121a,code=sm_121a & pids+=($!)
so sm120a common.cu -- -gencode arch=compute_120a,code=sm_120a & pids+=($!)
so sm120f common.cu -- -gencode arch=compute_120f,code=sm_120f & pids+=($!)
so sm120 common.cu -- -gencode arch=compute_120,code=sm_120 & pids+=($!)
so ptx120 common.cu -- -gencode arch=compute_120,code=compute_120 & pids+=($!)
so sm90 common.cu -- -gencode arch=compute_90,code=sm_90 & pids+=($!)
for p in "${pids[@]}"; do wait "$p"; done; pids=()
# mixed: two translation units, one with a broad target list, one compiled for
# sm_120a only (the way a build compiles block-scaled FP4 kernels for one 'a' target)
broad=(-gencode arch=compute_90,code=sm_90 -gencode arch=compute_120a,code=sm_120a
  -gencode arch=compute_120f,code=sm_120f -gencode arch=compute_120,code=compute_120)
(
  mkdir -p "$out/obj"
  "$nvcc" -c -Xcompiler -fPIC -o "$out/obj/common.o" "${broad[@]}" "$here/common.cu" &
  "$nvcc" -c -Xcompiler -fPIC -o "$out/obj/blockscaled.o" \
    -gencode arch=compute_120a,code=sm_120a "$here/blockscaled.cu" &
  wait
  "$nvcc" -shared -cudart shared -o "$out/lib/libmixed.so" "${broad[@]}" \
    "$out/obj/common.o" "$out/obj/blockscaled.o"
  rm -rf "$out/obj"
) & pids+=($!)
so zstd common.cu -- -Xfatbin=-compress-all \
  -gencode arch=compute_120f,code=sm_120f -gencode arch=compute_120,code=compute_120 & pids+=($!)
so lz4 common.cu -- --compress-mode=speed \
  -gencode arch=compute_120a,code=sm_120a -gencode arch=compute_120,code=compute_120 & pids+=($!)
so rdc rdc_a.cu rdc_b.cu -- -rdc=true \
  -gencode arch=compute_90,code=sm_90 -gencode arch=compute_120f,code=sm_120f & pids+=($!)
for p in "${pids[@]}"; do wait "$p"; done; pids=()
# the mixed-split variant: blockscaled alone (sm_120a only), to be combined by tests
cubin k_sm121a sm_121a & pids+=($!)
cubin k_sm120f sm_120f & pids+=($!)
cubin k_sm120 sm_120 & pids+=($!)
cubin k_sm90 sm_90 & pids+=($!)
"$nvcc" -fatbin -o "$out/fatbin/mixed.fatbin" \
  -gencode arch=compute_90,code=sm_90 -gencode arch=compute_120f,code=sm_120f \
  -gencode arch=compute_120,code=compute_120 "$here/common.cu" & pids+=($!)
for p in "${pids[@]}"; do wait "$p"; done
# stripped: symbols and debug info gone (section headers stay; tests also remove those)
cp "$out/lib/libmixed.so" "$out/lib/libstripped.so"
strip --strip-all "$out/lib/libstripped.so"

#!/usr/bin/env bash
# Build the fixture binaries with build.sh and list them with NVIDIA's
# cuobjdump: the pair (bin/, listings/) is the oracle the parser is tested
# against. Run on a machine with the CUDA toolkit: make_oracle.sh OUTDIR
set -uo pipefail
out=${1:?usage: make_oracle.sh OUTDIR}
export PATH="$PATH:/usr/local/cuda/bin"
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out/listings"
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  echo "host: $(uname -m) $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-}")"
  echo "--- nvcc --version"; nvcc --version
  echo "--- cuobjdump --version"; cuobjdump --version
} >"$out/versions.txt" 2>&1
NVCC=nvcc bash "$here/../kernels/build.sh" "$out/bin" >"$out/build.log" 2>&1
echo "build rc=$?" >>"$out/build.log"
cd "$out/bin"
for f in lib/*.so cubins/*.cubin fatbin/*.fatbin; do
  name=$(echo "$f" | tr '/' '_')
  cuobjdump --list-elf --list-ptx "$f" >"$out/listings/$name.list.txt" 2>&1
  echo "rc=$?" >>"$out/listings/$name.list.txt"
  cuobjdump --dump-resource-usage "$f" >"$out/listings/$name.res.txt" 2>&1
  echo "rc=$?" >>"$out/listings/$name.res.txt"
done

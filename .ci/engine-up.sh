#!/usr/bin/env bash
# Bring up a real Docker engine (with BuildKit/buildx and the containerd image
# store), arm64 emulation, a loopback registry and a locally bootstrapped arm64
# base rootfs on a Debian 12/13 machine that cannot pull images.
# Idempotent: every step checks before it acts. See README "Local engine".
set -euo pipefail

CACHE="${SPARK_IMAGES_TEST_CACHE:-$HOME/.cache/spark-images-test}"
REGISTRY_ADDR="${SPARK_IMAGES_TEST_REGISTRY:-127.0.0.1:5000}"
mkdir -p "$CACHE"
log() { printf '[engine-up] %s\n' "$*" >&2; }
# The mirror this machine's apt already uses (one-line or deb822 sources).
debian_mirror() {
  { cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null || true; } |
    grep -vE '^[[:space:]]*#' | grep -oE 'https?://[^ ]+/debian/?' | grep -v -- '-security' | head -n1 | sed 's:/*$::' || true
}

export DEBIAN_FRONTEND=noninteractive
need_pkgs=()
for p in qemu-user-static binfmt-support docker-registry debootstrap skopeo containerd runc iptables tini curl ca-certificates; do
  dpkg -s "$p" >/dev/null 2>&1 || need_pkgs+=("$p")
done
if ((${#need_pkgs[@]})); then
  log "installing ${need_pkgs[*]}"
  apt-get update -qq
  apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

# docker.io >= 26 and docker-buildx: BuildKit in 20.10 ignores SOURCE_DATE_EPOCH.
debian_major=$(cut -d. -f1 /etc/debian_version)
dockerd_ok() { command -v dockerd >/dev/null && dockerd --version | grep -qE 'version (2[6-9]|[3-9][0-9])'; }
if ! dockerd_ok || ! dpkg -s docker-buildx >/dev/null 2>&1; then
  if [ "$debian_major" -ge 13 ] 2>/dev/null; then
    apt-get install -y -qq docker.io docker-buildx >/dev/null
  else
    log "fetching docker.io and docker-buildx from the trixie suite"
    mirror=$(debian_mirror)
    tdir="$CACHE/trixie-apt"; mkdir -p "$tdir/lists/partial" "$tdir/debs"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] ${mirror:-http://deb.debian.org/debian} trixie main" >"$tdir/sources.list"
    opts=(-o Dir::Etc::SourceList="$tdir/sources.list" -o Dir::Etc::SourceParts=/dev/null -o Dir::State::Lists="$tdir/lists")
    apt-get "${opts[@]}" update -qq
    (cd "$tdir/debs" && rm -f ./*.deb && apt-get "${opts[@]}" download docker.io docker-buildx >/dev/null)
    # they need only libc6 >= 2.34, tini and bookworm's containerd/runc (installed above)
    dpkg -i "$tdir"/debs/*.deb >/dev/null
  fi
fi

mkdir -p /etc/docker
want='{"features":{"containerd-snapshotter":true}}'
if [ "$(cat /etc/docker/daemon.json 2>/dev/null)" != "$want" ]; then
  echo "$want" >/etc/docker/daemon.json
  pkill -x dockerd 2>/dev/null && sleep 2 || true
fi

if ! docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
  log "starting dockerd"
  # use the distribution's dockerd, not a client-only binary earlier on PATH
  nohup /usr/sbin/dockerd >"$CACHE/dockerd.log" 2>&1 &
  for _ in $(seq 1 60); do
    docker version --format '{{.Server.Version}}' >/dev/null 2>&1 && break
    sleep 1
  done
fi
docker version --format 'engine {{.Server.Version}}' >&2
docker buildx version >&2

# arm64 emulation
if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
  mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
fi
update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || { log "qemu-aarch64 binfmt not registered"; exit 2; }
# qemu-user 7.2 (Debian 12) passes the x86 host's /proc/cpuinfo to arm64 programs
# and `import torch` (hence `import vllm`, a check of the Dockerfile) dies in its
# CPU probe with signal 11; qemu-user 8.1 and newer emulate an arm64 /proc/cpuinfo.
# On an older host, trixie's qemu-user (static binaries; 71 MB) is unpacked into the
# cache and registered in its place, with the same magic and flags (F: the kernel
# opens it now, so it runs inside containers too).
# (Debian's entry is aarch64-binfmt-P, a link that runs only under binfmt: ask its target)
binfmt_interpreter() { readlink -f "$(sed -n 's/^interpreter //p' /proc/sys/fs/binfmt_misc/qemu-aarch64)"; }
qemu_major() { "$1" --version 2>/dev/null | sed -n 's/^qemu-aarch64 version \([0-9]*\).*/\1/p'; }
if [ "$(qemu_major "$(binfmt_interpreter)")" -lt 8 ] 2>/dev/null; then
  qemu_new="$CACHE/qemu-user-trixie/qemu-aarch64"
  if [ "$(qemu_major "$qemu_new")" -lt 8 ] 2>/dev/null || [ ! -x "$qemu_new" ]; then
    log "fetching qemu-user from the trixie suite (qemu-user $(qemu_major "$(binfmt_interpreter)") cannot run torch's CPU probe)"
    mirror=$(debian_mirror)
    tdir="$CACHE/trixie-apt"; mkdir -p "$tdir/lists/partial"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] ${mirror:-http://deb.debian.org/debian} trixie main" >"$tdir/sources.list"
    opts=(-o Dir::Etc::SourceList="$tdir/sources.list" -o Dir::Etc::SourceParts=/dev/null -o Dir::State::Lists="$tdir/lists")
    [ -n "$(ls "$tdir/lists" 2>/dev/null | grep -v partial)" ] || apt-get "${opts[@]}" update -qq
    work=$(mktemp -d)
    (cd "$work" && apt-get "${opts[@]}" download qemu-user >/dev/null 2>&1 && dpkg-deb -x qemu-user_*.deb x)
    mkdir -p "$(dirname "$qemu_new")"
    cp "$work/x/usr/bin/qemu-aarch64" "$qemu_new.tmp" && mv "$qemu_new.tmp" "$qemu_new"
    rm -rf "$work"
  fi
  magic='\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00'
  mask='\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff'
  echo -1 >/proc/sys/fs/binfmt_misc/qemu-aarch64
  printf ':qemu-aarch64:M::%s:%s:%s:PF\n' "$magic" "$mask" "$qemu_new" >/proc/sys/fs/binfmt_misc/register
  log "arm64 emulation: $("$qemu_new" --version | head -n1)"
fi

# loopback registry
if ! curl -fsS "http://$REGISTRY_ADDR/v2/" >/dev/null 2>&1; then
  log "starting registry on $REGISTRY_ADDR"
  mkdir -p "$CACHE/registry"
  cat >"$CACHE/registry.yml" <<YML
version: 0.1
storage:
  filesystem:
    rootdirectory: $CACHE/registry
  delete:
    enabled: true
http:
  addr: $REGISTRY_ADDR
YML
  nohup docker-registry serve "$CACHE/registry.yml" >"$CACHE/registry.log" 2>&1 &
  for _ in $(seq 1 30); do curl -fsS "http://$REGISTRY_ADDR/v2/" >/dev/null 2>&1 && break; sleep 0.5; done
fi

# arm64 base rootfs (debootstrap, cached)
if [ ! -s "$CACHE/rootfs-arm64.tar" ]; then
  log "debootstrapping an arm64 rootfs (about 4 minutes)"
  mirror=$(debian_mirror)
  root="$CACHE/rootfs-arm64"; rm -rf "$root"
  debootstrap --arch=arm64 --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates \
    bookworm "$root" "${mirror:-http://deb.debian.org/debian}" >"$CACHE/debootstrap.log" 2>&1
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$root" -cf "$CACHE/rootfs-arm64.tar.tmp" .
  mv "$CACHE/rootfs-arm64.tar.tmp" "$CACHE/rootfs-arm64.tar"
  rm -rf "$root"
fi
# amd64 base rootfs (Ubuntu 24.04 minbase, cached): the build-platform half of the
# tests' two-platform CUDA base, on which the native installer stage runs
bash "$(dirname "$0")/standin-rootfs.sh" amd64
log "ready: engine, buildx, qemu-aarch64, registry $REGISTRY_ADDR, rootfs $CACHE/rootfs-arm64.tar and noble-amd64.tar"

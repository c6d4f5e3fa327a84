#!/usr/bin/env bash
# Minbase root filesystems, cached as tarballs, standing in for the two halves
# of the multi-arch nvidia/cuda devel base where no image can be pulled:
#   standin-rootfs.sh amd64 -> $CACHE/noble-amd64.tar   Ubuntu 24.04 (what nvidia/cuda's
#       amd64 half is built on): runs the native installer stage on an x86-64 host;
#   standin-rootfs.sh arm64 -> $CACHE/trixie-arm64.tar  Debian 13 with python3.13 and the
#       toolchain packages preinstalled: the runtime half (the acceptance run adds
#       CUDA 13.0 from PyPI's nvidia-* wheels). Not Ubuntu: ports.ubuntu.com, the
#       only Ubuntu arm64 archive, is not reachable from every CI host.
# The Ubuntu archive key comes from Debian's ubuntu-keyring package, so
# debootstrap checks every Release file it downloads.
set -euo pipefail
arch="${1:?usage: standin-rootfs.sh arm64|amd64}"
CACHE="${SPARK_IMAGES_TEST_CACHE:-$HOME/.cache/spark-images-test}"
case "$arch" in
  arm64) suite=trixie ;;
  amd64) suite=noble ;;
  *) echo "unknown arch $arch (arm64 or amd64)" >&2; exit 2 ;;
esac
out="$CACHE/$suite-$arch.tar"
[ -s "$out" ] && exit 0
log() { printf '[standin-rootfs] %s\n' "$*" >&2; }
debian_mirror() {
  { cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null || true; } |
    grep -vE '^[[:space:]]*#' | grep -oE 'https?://[^ ]+/debian/?' | grep -v -- '-security' | head -n1 | sed 's:/*$::' || true
}
if [ "$suite" = trixie ]; then
  mirror=$(debian_mirror); mirror=${mirror:-http://deb.debian.org/debian}
  log "debootstrapping Debian 13 $arch (a few minutes)"
  root="$CACHE/$suite-$arch"; rm -rf "$root"
  debootstrap --arch="$arch" --variant=minbase \
    --include=python3.13,python3.13-dev,python3.13-venv,ca-certificates,ccache,curl,git \
    trixie "$root" "$mirror" >"$CACHE/$suite-$arch.log" 2>&1
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$root" -cf "$out.tmp" .
  mv "$out.tmp" "$out"; rm -rf "$root"
  log "ready: $out"
  exit 0
fi
mirror=http://archive.ubuntu.com/ubuntu
keyring="$CACHE/ubuntu-archive-keyring.gpg"
if [ ! -s "$keyring" ]; then
  # the trixie suite has ubuntu-keyring; engine-up.sh set up its lists on Debian 12
  tdir="$CACHE/trixie-apt"; mkdir -p "$tdir/lists/partial" "$tdir/debs"
  [ -s "$tdir/sources.list" ] || echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" >"$tdir/sources.list"
  opts=(-o Dir::Etc::SourceList="$tdir/sources.list" -o Dir::Etc::SourceParts=/dev/null -o Dir::State::Lists="$tdir/lists")
  [ -n "$(ls "$tdir/lists" 2>/dev/null | grep -v partial)" ] || apt-get "${opts[@]}" update -qq
  work=$(mktemp -d)
  (cd "$work" && apt-get "${opts[@]}" download ubuntu-keyring >/dev/null 2>&1 && dpkg-deb -x ubuntu-keyring_*.deb x)
  cp "$work/x/usr/share/keyrings/ubuntu-archive-keyring.gpg" "$keyring.tmp" && mv "$keyring.tmp" "$keyring"
  rm -rf "$work"
fi
log "debootstrapping Ubuntu 24.04 $arch (a few minutes)"
root="$CACHE/$suite-$arch"; rm -rf "$root"
# python3.12-venv brings ensurepip's pip; nothing else of the toolchain is preinstalled
debootstrap --arch="$arch" --variant=minbase --keyring="$keyring" --components=main,universe \
  --include=python3.12,python3.12-venv,ca-certificates \
  noble "$root" "$mirror" /usr/share/debootstrap/scripts/gutsy >"$CACHE/$suite-$arch.log" 2>&1
# the sources an Ubuntu image (and nvidia/cuda's) comes with
printf 'deb %s %s main universe\n' "$mirror" noble "$mirror" noble-updates "$mirror" noble-security >"$root/etc/apt/sources.list"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$root" -cf "$out.tmp" .
mv "$out.tmp" "$out"
rm -rf "$root"
log "ready: $out"

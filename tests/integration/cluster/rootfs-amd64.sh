#!/usr/bin/env bash
# An amd64 Debian bookworm minbase rootfs as a tarball, for the cluster tests'
# images (Ray nodes, the sshd host). No image can be pulled here, so the base
# is debootstrapped the way .ci/engine-up.sh makes the arm64 one: same mirror,
# same reproducible tar flags. Usage: rootfs-amd64.sh DEST.tar PACKAGE,PACKAGE...
# Idempotent: an existing DEST is kept (its name carries the package list's hash).
set -euo pipefail
dest=$1 include=$2
[ -s "$dest" ] && exit 0
mirror=$({ cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null || true; } |
  grep -vE '^[[:space:]]*#' | grep -oE 'https?://[^ ]+/debian/?' | grep -v -- '-security' | head -n1 | sed 's:/*$::' || true)
root="$dest.root"
rm -rf "$root"
debootstrap --arch=amd64 --variant=minbase --include="$include" bookworm "$root" "${mirror:-http://deb.debian.org/debian}" >"$dest.log" 2>&1
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$root" -cf "$dest.tmp" .
mv "$dest.tmp" "$dest"
rm -rf "$root"

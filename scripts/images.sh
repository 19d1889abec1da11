#!/usr/bin/env bash
# Builds, once, the real distribution image the kubernetes tier's pods run
# in the control-plane simulator: Debian bookworm (minbase) by debootstrap
# from Debian's own mirror, packed as a one-layer `docker save` tarball at
# target/images/debian-bookworm.tar. Idempotent: an existing tarball is kept
# (delete it to rebuild), and one in the machine cache (scripts/cache.sh) is
# copied from there instead of fetched again. Needs root (debootstrap) and
# apt-get for debootstrap itself on a fresh machine.
set -euo pipefail

cd "$(dirname "$0")/.."
out=target/images/debian-bookworm.tar
[ -s "$out" ] && exit 0
. scripts/cache.sh
cached=$cache/debian-bookworm.tar
if [ -s "$cached" ]; then
    mkdir -p "$(dirname "$out")"
    cp "$cached" "$out.part"
    mv "$out.part" "$out"
    exit 0
fi

if ! command -v debootstrap >/dev/null; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "images: need debootstrap (root and apt-get to install it)" >&2
        exit 1
    fi
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

work=$(mktemp -d /var/tmp/namzu-images.XXXXXX)
trap 'rm -rf "$work"' EXIT
mirror=${NAMZU_DEBIAN_MIRROR:-http://deb.debian.org/debian}
debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || {
    tail -20 "$work/debootstrap.log" >&2
    exit 1
}
# What a container image holds: no package caches, no device nodes (the
# runtime provides /dev).
rm -rf "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/var/lib/apt/lists/* "$work"/rootfs/dev/*

mkdir -p "$work/img"
tar --numeric-owner --xattrs -C "$work/rootfs" -cf "$work/img/layer.tar" .
layer=$(sha256sum "$work/img/layer.tar" | cut -d' ' -f1)
mv "$work/img/layer.tar" "$work/img/$layer.tar"
cat >"$work/img/config.json" <<EOF
{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Cmd":["bash"]},"rootfs":{"type":"layers","diff_ids":["sha256:$layer"]}}
EOF
config=$(sha256sum "$work/img/config.json" | cut -d' ' -f1)
mv "$work/img/config.json" "$work/img/$config.json"
cat >"$work/img/manifest.json" <<EOF
[{"Config":"$config.json","RepoTags":["debian:bookworm"],"Layers":["$layer.tar"]}]
EOF
mkdir -p "$(dirname "$out")"
tar -C "$work/img" -cf "$out.part" manifest.json "$config.json" "$layer.tar"
mv "$out.part" "$out"
cp "$out" "$cached.part" && mv "$cached.part" "$cached"
echo "images: built $out ($(du -h "$out" | cut -f1))"

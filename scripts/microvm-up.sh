#!/usr/bin/env bash
# What the microvm tier needs on this host, installed if missing and
# idempotent: qemu (Debian's qemu-system-x86), e2fsprogs (mkfs.ext4 -d),
# and a guest kernel: Debian's linux-image-cloud-amd64, fetched with
# `apt-get download` (a registry package, never a URL), unpacked into
# <cache>/microvm/kernel/<package>_<version>/ (the machine cache of
# scripts/cache.sh) and kept by version; with no package index to ask
# (offline, no lists), the newest kernel already there. Linked (or copied)
# into target/microvm/kernel/ and printed from there, so the confined VMM's
# view of the host holds no /var.
# Prints the kernel directory last (the tier takes it as
# NAMZU_MICROVM_KERNEL). Needs root and apt-get for the installs.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
# qemu-img (forks' copy-on-write disks) comes from qemu-utils, which must
# be qemu-system's own version: a newer one (a backport) conflicts with
# qemu-system-common and is removed by its install.
command -v qemu-system-x86_64 >/dev/null && command -v qemu-img >/dev/null || need+=(qemu-system-x86 qemu-utils)
command -v mkfs.ext4 >/dev/null || [ -x /usr/sbin/mkfs.ext4 ] || [ -x /sbin/mkfs.ext4 ] || need+=(e2fsprogs)
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "microvm-up: need ${need[*]} (root and apt-get to install them)" >&2
        exit 1
    fi
    apt-get update -qq >/dev/null
    qv=$(apt-cache policy qemu-system-x86 | awk '/Candidate:/{print $2}')
    pinned=()
    for p in "${need[@]}"; do
        case $p in
            qemu-system-x86|qemu-utils) pinned+=("$p=$qv") ;;
            *) pinned+=("$p") ;;
        esac
    done
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends --allow-downgrades "${pinned[@]}" >/dev/null
fi

. scripts/cache.sh
kernels=$cache/microvm/kernel
# The metapackage names the current kernel package; its version is the
# cache key.
meta=${NAMZU_MICROVM_KERNEL_PACKAGE:-linux-image-cloud-amd64}
pkg=$(apt-cache depends "$meta" 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}')
if [ -z "$pkg" ]; then
    apt-get update -qq >/dev/null 2>&1 || true
    pkg=$(apt-cache depends "$meta" 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}')
fi
# The cached kernel $1 as a tree in target/, printed.
in_target() {
    local out
    out=target/microvm/kernel/$(basename "$1")
    if ! [ -d "$out/boot" ]; then
        mkdir -p target/microvm/kernel
        rm -rf "$out.part"
        cp -al "$1" "$out.part" 2>/dev/null || cp -a "$1" "$out.part"
        mv "$out.part" "$out"
    fi
    echo "$(pwd)/$out"
}
if [ -z "$pkg" ]; then
    newest=$(ls -d "$kernels"/*/boot 2>/dev/null | sort -V | tail -1)
    [ -n "$newest" ] || { echo "microvm-up: cannot resolve $meta to a kernel package" >&2; exit 1; }
    in_target "$(dirname "$newest")"
    exit 0
fi
ver=$(apt-cache policy "$pkg" | awk '/Candidate:/{print $2}')
dir=$kernels/${pkg}_${ver}
if ! [ -d "$dir/boot" ]; then
    mkdir -p "$kernels"
    work=$(mktemp -d "$kernels/.fetch.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    (cd "$work" && apt-get download "$pkg=$ver" >/dev/null 2>&1) || {
        echo "microvm-up: apt-get download $pkg=$ver failed" >&2
        exit 1
    }
    dpkg-deb -x "$work"/*.deb "$work/root"
    # Only what a guest boots: the kernel and its modules.
    mkdir -p "$(dirname "$dir")"
    rm -rf "$dir.part"
    mkdir "$dir.part"
    mv "$work/root/boot" "$dir.part/boot"
    mkdir -p "$dir.part/lib"
    if [ -d "$work/root/lib/modules" ]; then mv "$work/root/lib/modules" "$dir.part/lib/modules"; else mv "$work/root/usr/lib/modules" "$dir.part/lib/modules"; fi
    chmod -R a+rX "$dir.part"
    mv "$dir.part" "$dir"
fi
in_target "$dir"

#!/usr/bin/env bash
# The microvm tier's figures next to what they are made of, in one run:
# boot to the agent against the same kernel booting a trivial init, create
# + first exec, the exec round trip against host fork+exec, a 1 GiB copy in
# against a raw socket copy. Installs what the tier needs (scripts/
# microvm-up.sh) and the image (scripts/images.sh). Under TCG where KVM is
# unusable. Not a test: nothing here gates anything.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/images.sh
# The trivial-init line boots the kernel to a static busybox.
if ! [ -x /bin/busybox ] && ! [ -x /usr/bin/busybox ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends busybox-static >/dev/null
fi
NAMZU_MICROVM_KERNEL=$(./scripts/microvm-up.sh | tail -1)
export NAMZU_MICROVM_KERNEL
cargo build --release --locked --bin namzu-agent --bin namzu-vmm --bin namzu-egress --bin namzu-bench-microvm
exec ./target/x86_64-unknown-linux-gnu/release/namzu-bench-microvm "$@"

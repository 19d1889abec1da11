#!/usr/bin/env bash
# The test command: builds every binary (the tests drive the real agent and
# CLI), then runs every test of the workspace, and ends with one summary line
# over all test binaries. Safe to run on a fresh machine with the Rust
# toolchain: protoc comes from a crate, nothing else is needed for the host
# tier; as root it also brings up Docker for the docker tier and qemu with a
# guest kernel for the microvm tier. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

# Network labs a killed run left behind (the egress tests' and benches'
# namespaces; their veths hold routes on the host): removed before anything
# here reaches a registry, which such a route could shadow.
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null; then
    for ns in $(ip netns list 2>/dev/null | awk '/^nz-(egress|bench)-/ { print $1 }'); do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
fi

# What the tests need from the system, installed if missing (root, apt):
# newuidmap/newgidmap for the subordinate-id-range test of the local tier.
if [ "$(id -u)" = 0 ] && ! command -v newuidmap >/dev/null && command -v apt-get >/dev/null; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq uidmap >/dev/null
fi

# The docker tier's tests need dockerd with runc and runsc, busybox for
# their image and a registry to pull from; the egress tests need iproute2,
# curl and openssl. Installed and started here (root), and then required, so
# a missing piece fails the run instead of skipping the tests.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    ./scripts/docker-up.sh
    export NAMZU_REQUIRE_DOCKER=1
    export NAMZU_TEST_REGISTRY=localhost:5000
    ./scripts/net-up.sh
    export NAMZU_REQUIRE_NET=1
    # Root: the tests that need it (loop devices and mounts for the
    # workspace device rule) fail instead of skipping.
    export NAMZU_REQUIRE_ROOT=1
fi

# The kubernetes tier's simulated pods run a real distribution image
# (Debian bookworm, debootstrapped once into target/images/); the microvm
# tier boots the same image.
./scripts/images.sh

# The microvm tier: qemu, e2fsprogs and a guest kernel (Debian's cloud
# kernel, by apt-get download), installed and fetched here (root), and then
# required. Its tests run under TCG where KVM is unusable.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    NAMZU_MICROVM_KERNEL=$(./scripts/microvm-up.sh | tail -1)
    export NAMZU_MICROVM_KERNEL
    export NAMZU_REQUIRE_MICROVM=1
fi

# Binaries first: the conformance and link tests exec target/.../namzu-agent.
cargo build --workspace --bins --locked
# The escape suite's layer-removal test: a test build of the agent that can
# take one defence away (feature `weaken`), kept in its own target directory
# so it never replaces the real agent.
cargo build -p namzu-agent --features weaken --target-dir target/weaken --locked

# The library's promises about itself: no two modules import each other,
# its docs build without a broken link, the kubernetes tier builds with
# its internals private, and a local-only build (no default features) compiles neither
# bollard nor kube.
if ! command -v python3 >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 >/dev/null
fi
python3 scripts/module-cycles.py
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --locked -p namzu-core -p namzu -p namzu-kubernetes -p namzu-server
cargo build -p namzu --no-default-features --locked
# The kubernetes tier as a user gets it: its building blocks private.
cargo build -p namzu-kubernetes --locked
if cargo tree -p namzu --no-default-features -e normal --prefix none --locked | grep -Eq '^(kube|bollard|k8s-openapi) '; then
    echo "namzu without default features still depends on kube or bollard" >&2
    exit 1
fi

# The HTTP API's suite and the Python client's (clients/python), run by
# pytest against a live `namzu serve` on the local tier: a venv with pinned
# packages from PyPI (python3-venv from apt where the interpreter lacks it),
# kept in the machine cache (scripts/cache.sh) under the hash of the pins so
# a clean clone reuses it without the network. The client is imported from
# the tree (PYTHONPATH), not installed into the shared venv.
pins="httpx==0.28.1 pytest==9.2.0 websockets==17.4 openapi-spec-validator==0.9.0 e2b==2.63.0"
. scripts/cache.sh
venv=$cache/py-venv-$(echo "$pins" | sha256sum | cut -c1-16)
if ! [ -f "$venv/.complete" ]; then
    rm -rf "$venv"
    if ! python3 -m venv "$venv" && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
        rm -rf "$venv"
        python3 -m venv "$venv"
    fi
    # shellcheck disable=SC2086 # the pins are separate words
    "$venv/bin/pip" install -q --disable-pip-version-check $pins
    touch "$venv/.complete"
fi
export PYTHONPATH=$(pwd)/clients/python${PYTHONPATH:+:$PYTHONPATH}
# The E2B JavaScript SDK, pinned by clients/e2b-js/package-lock.json (Node.js
# and npm are on the machine).
# --prefer-offline: npm's own cache answers when it holds the pinned tarballs.
(cd clients/e2b-js && npm ci --no-audit --no-fund --silent --prefer-offline)

log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace --locked --no-fail-fast -- "$@" 2>&1 | tee "$log" || status=$?
# pytest's "no tests ran" (exit 5) fails the run like any other failure.
(cd clients/python && "$venv/bin/pytest" -q -rs -p no:cacheprovider) 2>&1 | tee -a "$log" || status=$?
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) s += $i } }
     / (passed|failed|skipped|errors?)[ ,].*in [0-9.]+s/ && !/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^error/) f += $i; if ($(i+1) ~ /^skipped/) s += $i } }
     END { printf "summary: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"
exit "$status"

#!/usr/bin/env bash
# Builds release binaries and prints namzu's figures next to the direct
# alternative on this machine (bwrap, unshare, fork+exec, a raw socket
# copy). Not a test: nothing here gates anything. Installs bubblewrap for the
# comparison when it is missing and we may (root with apt).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v bwrap >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap) >/dev/null 2>&1 || true
fi
# NAMZU_BENCH_PROFILE=fast: an optimised build without LTO, for quick looks
# (README's figures come from release).
P=${NAMZU_BENCH_PROFILE:-release}
cargo build --profile "$P" --locked --bins
# The agent's start-up layout (crates/namzu-agent/build.rs) matches only the
# build it was measured on; say how much of it this one still links.
if [ "$P" = release ] && command -v nm >/dev/null; then
    echo "agent start-up order: $(python3 bench/agent_order.py coverage \
        target/x86_64-unknown-linux-gnu/release/namzu-agent crates/namzu-agent/startup.order) names linked \
        (bench/agent-order.sh remeasures it)"
fi
exec ./target/x86_64-unknown-linux-gnu/$P/namzu-bench "$@"

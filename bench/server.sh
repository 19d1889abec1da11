#!/usr/bin/env bash
# The HTTP API under load next to the library, in one run: N local
# sandboxes × M commands at once (default 100 × 20), through `namzu serve`
# and through the library; failures, p50/p99 round trip, the API's added
# latency, the server's RSS with N idle sandboxes. Not a test.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --bins
exec ./target/x86_64-unknown-linux-gnu/release/namzu-bench-server "$@"

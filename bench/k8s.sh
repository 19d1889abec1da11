#!/usr/bin/env bash
# The kubernetes tier against the control-plane SIMULATOR (pods are real
# local sandboxes; as root, on a simulated veth pod network): host-side
# cost of an acquire beyond the simulated API latency, next to a
# hand-written client doing the same requests, and N concurrent acquires
# with a cross-talk check, and persistent workspaces (create, suspend,
# resume with data on the disk) next to a task sandbox plus re-upload.
# Figures only; nothing here gates anything.
#   bench/k8s.sh [--iters 10] [--latency-ms 5] [--concurrent 50] [--workspaces 5] [--workspace-mib 64]
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/images.sh
cargo build --release --locked --bins
exec ./target/x86_64-unknown-linux-gnu/release/namzu-bench-k8s "$@"

#!/usr/bin/env bash
# Builds release binaries and prints namzu's figures next to the direct
# alternative on this machine. Not a test: nothing here gates anything.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --bins
exec ./target/x86_64-unknown-linux-gnu/release/namzu-bench "$@"

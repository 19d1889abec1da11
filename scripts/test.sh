#!/usr/bin/env bash
# The test command: builds every binary (the tests drive the real agent and
# CLI), then runs every test of the workspace. Safe to run on a fresh machine
# with the Rust toolchain: protoc comes from a crate, nothing else is needed
# for the host tier. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

# Binaries first: the conformance and link tests exec target/.../namzu-agent.
cargo build --workspace --bins --locked
cargo test --workspace --locked -- "$@"

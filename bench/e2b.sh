#!/usr/bin/env bash
# The E2B SDK's create + run("true") + kill through `namzu serve`, median of
# 20, with the server's own share (bench/e2b_sdk.py). Uses the test command's
# venv (target/py-venv, which has e2b from PyPI). Not a test.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --bins
[ -x target/py-venv/bin/python ] || { python3 -m venv target/py-venv; target/py-venv/bin/pip install -q e2b==2.63.0 httpx==0.28.1; }
exec target/py-venv/bin/python bench/e2b_sdk.py "${1:-20}" target/x86_64-unknown-linux-gnu/release/namzu

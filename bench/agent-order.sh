#!/usr/bin/env bash
# Measures which of the agent's functions a sandbox's start runs and writes
# them to crates/namzu-agent/startup.order, which release builds link first
# (crates/namzu-agent/build.rs). Rerun it after a dependency, lockfile or
# compiler change: "before:" below says how much of the old list is left.
#
# How: the agent is copied to the disk and dropped from the page cache,
# the disk's readahead is turned off for the few seconds of the measurement
# (and restored), and a local sandbox is created and runs `true`. Each page
# of the agent's text is then mapped in its processes only if one of them
# faulted on it, since fault-around maps only pages already cached. Needs
# root (readahead, the local tier) and the file on a block device.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "agent-order.sh: needs root" >&2; exit 1; }
ORDER=crates/namzu-agent/startup.order
BIN=target/x86_64-unknown-linux-gnu/release
# The list is measured on a binary laid out without it, so names that are no
# longer run drop out instead of riding along with their old neighbours. The
# whole workspace's bins, as README and bench/run.sh build them: features are
# unified over what a build selects, and they are in every crate's hash, so
# `-p namzu-agent` alone would link other names.
NAMZU_AGENT_NO_ORDER=1 cargo build --release --locked --bins
W=$(mktemp -d "$PWD/target/agent-order.XXXX")
S=$(mktemp -d)
cp "$BIN/namzu-agent" "$W/namzu-agent"
sync
echo "before: $(python3 bench/agent_order.py coverage "$W/namzu-agent" "$ORDER") names of $ORDER are in this build"

dev=$(stat -c %d "$W/namzu-agent")
sys=/sys/dev/block/$((dev >> 8)):$((dev & 255))
ra=$sys/queue/read_ahead_kb
[ -e "$ra" ] || ra=$sys/../queue/read_ahead_kb
[ -e "$ra" ] || { echo "agent-order.sh: $W is not on a block device" >&2; exit 1; }
old=$(cat "$ra")
cleanup() {
    echo "$old" > "$ra"
    "$BIN/namzu" --state-dir "$S" rm "${id:-none}" >/dev/null 2>&1 || true
    rm -rf "$W" "$S"
}
trap cleanup EXIT
"$BIN/namzu" --version >/dev/null  # the CLI's pages are not what we measure
echo 0 > "$ra"
python3 bench/agent_order.py evict "$W/namzu-agent"
export NAMZU_AGENT_BIN=$W/namzu-agent
id=$("$BIN/namzu" --state-dir "$S" create | tail -1)
sleep 0.5
# First what the idle in-sandbox agent (the newest of the three processes)
# holds, so that is the densest; then what its first command adds; then
# the launcher's and the middle process's own.
python3 bench/agent_order.py pages "$W/namzu-agent" "$(pgrep -n -f "$W/namzu-agent")" | sort -u > "$W/idle"
"$BIN/namzu" --state-dir "$S" exec "$id" -- true
python3 bench/agent_order.py pages "$W/namzu-agent" "$(pgrep -n -f "$W/namzu-agent")" | sort -u > "$W/exec"
echo "$old" > "$ra"
python3 bench/agent_order.py pages "$W/namzu-agent" $(pgrep -f "$W/namzu-agent") | sort -u > "$W/all"
python3 bench/agent_order.py symbols "$W/namzu-agent" "$W/idle" "$W/exec" "$W/all" > "$W/order"
mv "$W/order" "$ORDER"
echo "wrote $ORDER; rebuild release (cargo build --release --bins) to link with it"

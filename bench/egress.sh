#!/usr/bin/env bash
# Egress through the relay next to the host's own network, in one run: a
# 1 GiB download (throughput) and a small request's time to first byte
# (connection setup: for the sandbox that is the proxy, the host's decision,
# its connect and the splice), both with curl on both sides, from a server
# in a network namespace behind a veth (busybox httpd, sendfile). Tiers:
# local, and docker runc/runsc when the egress tests' curl image exists.
# Needs root. Not a test: nothing here gates anything.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/net-up.sh
# busybox's httpd serves the downloads (installed by the docker tier's setup
# too; here for a machine that ran no tests).
if ! command -v busybox >/dev/null && command -v apt-get >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq busybox-static) >/dev/null
fi
# NAMZU_BENCH_PROFILE=fast: an optimised build without LTO, for quick looks
# (README's figures come from release).
P=${NAMZU_BENCH_PROFILE:-release}
cargo build --profile "$P" --locked --bins >/dev/null
N=${NAMZU_BENCH_BIN:-./target/x86_64-unknown-linux-gnu/$P/namzu}
export NAMZU_STATE_DIR; NAMZU_STATE_DIR=$(mktemp -d)
# TEST-NET-2, as the conformance lab (netlab.rs says why not 203.0.113.0/24),
# and refused if the host already routes or talks to it.
NS=nz-bench-$$ VH=nzbh$$ VN=nzbn$$ ADDR=198.51.100.20 NET=198.51.100.0/24
if ip -4 route show match "$NET" | grep -qv '^default' || [ -n "$(ss -Htun dst "$NET")" ]; then
    echo "egress.sh: $NET is in use on this host; not taking it" >&2; exit 1
fi
www=$(mktemp -d)
cleanup() { ip netns pids "$NS" 2>/dev/null | xargs -r kill; ip netns del "$NS" 2>/dev/null || true; rm -rf "$www" "$NAMZU_STATE_DIR"; }
trap cleanup EXIT
ip netns add "$NS"
ip link add "$VH" type veth peer name "$VN" netns "$NS"
ip addr add 198.51.100.1/24 dev "$VH" 2>/dev/null || true
ip link set "$VH" up
ip -n "$NS" addr add "$ADDR/24" dev "$VN"
ip -n "$NS" link set "$VN" up
ip -n "$NS" link set lo up
truncate -s 1G "$www/1g"; echo ok > "$www/small"
ip netns exec "$NS" busybox httpd -f -p "$ADDR:8000" -h "$www" &
sleep 0.5
URL=http://bench.test:8000
median() { sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }'; }
# Each tier's figures are taken interleaved with the host's own (a host
# download, then the sandbox's, round by round), so both see the same
# machine: this VM's speed drifts by tens of percent within minutes.
# Throughput is compared as host time / sandbox time (1.00x: as fast as
# the host), time to first byte as sandbox / host.
ROUNDS=${NAMZU_BENCH_ROUNDS:-5}
printf '%-14s %-34s %12s %12s %10s\n' tier measure sandbox host ratio
run_tier() { # $1 label, rest: create flags
    local label=$1; shift
    local id; id=$($N create "$@" --allow-host bench.test --egress-host "bench.test=$ADDR")
    local hb=() sb=() ht=() st=()
    for _ in $(seq "$ROUNDS"); do
        hb+=("$(curl -s -o /dev/null -w '%{time_total}' "http://$ADDR:8000/1g")")
        sb+=("$($N exec "$id" -- curl -s -o /dev/null -w '%{time_total}' "$URL/1g")")
        ht+=("$(for _ in $(seq 20); do curl -s -o /dev/null -w '%{time_starttransfer}\n' "http://$ADDR:8000/small"; done | median)")
        st+=("$($N exec "$id" -- sh -c "for i in \$(seq 20); do curl -s -o /dev/null -w '%{time_starttransfer}\n' $URL/small; done" | median)")
    done
    $N rm "$id" >/dev/null
    local big hbig t ht1
    big=$(printf '%s\n' "${sb[@]}" | median); hbig=$(printf '%s\n' "${hb[@]}" | median)
    t=$(printf '%s\n' "${st[@]}" | median); ht1=$(printf '%s\n' "${ht[@]}" | median)
    printf '%-14s %-34s %11.3fs %11.3fs %9s\n' "$label" "1 GiB download (throughput)" "$big" "$hbig" "$(ratio "$hbig" "$big")"
    printf '%-14s %-34s %10.2fms %10.2fms %9s\n' "$label" "time to first byte (median/20)" \
        "$(awk -v t="$t" 'BEGIN { print t * 1000 }')" "$(awk -v t="$ht1" 'BEGIN { print t * 1000 }')" "$(ratio "$t" "$ht1")"
}
run_tier local --tier local
# Two downloads at once (local): both cores busy, so the relay's own CPU
# shows, and the supervisor's one thread would if it were the bound.
two='a=$(date +%s.%N); curl -s -o /dev/null URL/1g & curl -s -o /dev/null URL/1g & wait; b=$(date +%s.%N); awk -v a=$a -v b=$b "BEGIN { print b - a }"'
id=$($N create --tier local --allow-host bench.test --egress-host "bench.test=$ADDR")
th=() ts=()
for _ in $(seq "$ROUNDS"); do
    th+=("$(sh -c "${two//URL/http://$ADDR:8000}")")
    ts+=("$($N exec "$id" -- sh -c "${two//URL/$URL}")")
done
$N rm "$id" >/dev/null
t2=$(printf '%s\n' "${ts[@]}" | median); h2=$(printf '%s\n' "${th[@]}" | median)
printf '%-14s %-34s %11.3fs %11.3fs %9s\n' local "two 1 GiB downloads at once" "$t2" "$h2" "$(ratio "$h2" "$t2")"
# The floor of any relay here: a bare splice(2) relay on the host's
# loopback, no sandbox in it, round by round with the direct download. The
# egress relay crosses the same one hop more than the host's curl does.
python3 bench/splice_relay.py "$ADDR" 8000 18077 & relay=$!
sleep 0.3
rh=() rr=()
for _ in $(seq "$ROUNDS"); do
    rh+=("$(curl -s -o /dev/null -w '%{time_total}' "http://$ADDR:8000/1g")")
    rr+=("$(curl -s -o /dev/null -w '%{time_total}' "http://127.0.0.1:18077/1g")")
done
kill "$relay"
r1=$(printf '%s\n' "${rr[@]}" | median); h1=$(printf '%s\n' "${rh[@]}" | median)
printf '%-14s %-34s %11.3fs %11.3fs %9s\n' "relay-floor" "1 GiB through a bare splice relay" "$r1" "$h1" "$(ratio "$h1" "$r1")"
if docker image inspect namzu-test/busybox-curl:2 >/dev/null 2>&1; then
    run_tier docker-runc --tier docker --runtime runc --image namzu-test/busybox-curl:2
    # A runsc download takes seconds a round.
    ROUNDS=${NAMZU_BENCH_RUNSC_ROUNDS:-3} run_tier docker-runsc --tier docker --runtime runsc --image namzu-test/busybox-curl:2
    # gVisor's own loopback, for reference: the same 1 GiB from busybox
    # httpd to curl INSIDE one runsc container, no namzu and no host network
    # in the path. The sandbox's egress crosses gVisor's loopback once too
    # (the command to the agent's proxy), and its link to the host after.
    floor=$(docker run --rm --runtime runsc --network none namzu-test/busybox-curl:2 sh -c \
        'mkdir -p /tmp/w && truncate -s 1G /tmp/w/1g && { busybox httpd -f -p 127.0.0.1:8000 -h /tmp/w & } && sleep 0.5 &&
         for i in 1 2 3; do curl -s -o /dev/null -w "%{time_total}\n" http://127.0.0.1:8000/1g; done' | median)
    direct=$(for _ in 1 2 3; do curl -s -o /dev/null -w '%{time_total}\n' "http://$ADDR:8000/1g"; done | median)
    printf '%-14s %-34s %11.3fs %11.3fs %9s\n' "runsc-floor" "1 GiB over loopback inside" "$floor" "$direct" "$(ratio "$direct" "$floor")"
fi

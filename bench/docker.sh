#!/usr/bin/env bash
# The docker tier next to the docker CLI, in one run, on the same image and
# runtime: create + first exec (+ destroy) vs `docker run --rm IMG true`,
# exec round trip vs `docker exec`, pause + resume vs `docker pause` +
# `docker unpause`, suspend + resume vs `docker stop` + `docker start`,
# a 1 GiB copy in vs `docker cp`. Both
# sides are whole CLI invocations, so both pay process start and connect.
# Not a test: nothing here gates anything.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/docker-up.sh
# NAMZU_BENCH_PROFILE=fast: an optimised build without LTO, for quick looks
# (README's figures come from release).
P=${NAMZU_BENCH_PROFILE:-release}
cargo build --profile "$P" --locked --bins >/dev/null
N=./target/x86_64-unknown-linux-gnu/$P/namzu
export NAMZU_STATE_DIR; NAMZU_STATE_DIR=$(mktemp -d)
IMG=namzu-bench/busybox:1
if ! docker image inspect "$IMG" >/dev/null 2>&1; then
    root=$(mktemp -d); mkdir -p "$root/bin" "$root/etc" "$root/tmp" "$root/workspace"
    cp /bin/busybox "$root/bin/"
    for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -s busybox "$root/bin/$a"; done
    echo 'root:x:0:0:root:/root:/bin/sh' > "$root/etc/passwd"
    tar -C "$root" -c . | docker import - "$IMG" >/dev/null
    rm -rf "$root"
fi
now() { date +%s%N; }
per() { echo $(( ($2 - $1) / $3 / 1000 )); } # microseconds per iteration
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }'; }
big=$(mktemp); head -c $((1 << 30)) /dev/zero > "$big"
trap 'rm -f "$big"; rm -rf "$NAMZU_STATE_DIR"' EXIT
# The disk's own limit for a durable copy, on the filesystem the
# containers' writable layers live on: the same 1 GiB written with dd and
# fsynced (what namzu's copy-in promises and `docker cp` does not).
droot=$(docker info -f '{{.DockerRootDir}}' 2>/dev/null || echo /var/lib/docker)
t0=$(now); dd if="$big" of="$droot/namzu-bench-raw" bs=4M conv=fsync status=none; t1=$(now)
rm -f "$droot/namzu-bench-raw"
raw=$(per "$t0" "$t1" 1)
printf '%-8s %-34s %12s\n' host "1 GiB dd + fsync into $droot" "$raw"
printf '%-8s %-34s %12s %12s %8s\n' runtime operation namzu_us docker_us ratio
for rt in runc runsc; do
    R=10
    t0=$(now); for _ in $(seq $R); do $N run --tier docker --runtime "$rt" --image "$IMG" -- true; done; t1=$(now)
    a=$(per "$t0" "$t1" $R)
    t0=$(now); for _ in $(seq $R); do docker run --rm --runtime "$rt" --network none "$IMG" true; done; t1=$(now)
    b=$(per "$t0" "$t1" $R)
    printf '%-8s %-34s %12s %12s %8s\n' "$rt" "create+exec+destroy / run --rm" "$a" "$b" "$(ratio "$a" "$b")"

    id=$($N create --tier docker --runtime "$rt" --image "$IMG")
    c="namzu-$id"
    R=20
    t0=$(now); for _ in $(seq $R); do $N exec "$id" -- true; done; t1=$(now)
    a=$(per "$t0" "$t1" $R)
    t0=$(now); for _ in $(seq $R); do docker exec "$c" true; done; t1=$(now)
    b=$(per "$t0" "$t1" $R)
    printf '%-8s %-34s %12s %12s %8s\n' "$rt" "exec true (CLI) / docker exec" "$a" "$b" "$(ratio "$a" "$b")"
    # The library's round trip on a live handle (one connection, no
    # process start) next to the same `docker exec`.
    l=$(NAMZU_BENCH_ONLY=docker-rtt NAMZU_BENCH_DOCKER_IMAGE="$IMG" NAMZU_BENCH_DOCKER_RUNTIME="$rt" NAMZU_BENCH_ITERS=200 \
        ./target/x86_64-unknown-linux-gnu/$P/namzu-bench)
    printf '%-8s %-34s %12s %12s %8s\n' "$rt" "exec true (library) / docker exec" "$l" "$b" "$(ratio "$l" "$b")"
    # The runtime's own floor: fork + exec + wait of /bin/true by a shell
    # INSIDE the container, no namzu and no docker in the path.
    f=$(docker exec "$c" sh -c 'time sh -c "i=0; while [ \$i -lt 200 ]; do /bin/true; i=\$((i+1)); done"' 2>&1 |
        awk '/^real/ { m = $2; sub(/m$/, "", m); t = $3; sub(/s$/, "", t); printf "%d", (m * 60 + t) * 1e6 / 200 }')
    printf '%-8s %-34s %12s %12s %8s\n' "$rt" "floor: fork+exec of true inside" "$f" "$b" "$(ratio "$f" "$b")"

    # Pause + resume: namzu's (every process but the agent stopped in
    # place; the link stays up) next to docker's cgroup freezer.
    R=10
    t0=$(now); for _ in $(seq $R); do $N pause "$id" >/dev/null 2>&1; $N resume "$id" >/dev/null 2>&1; done; t1=$(now)
    a=$(per "$t0" "$t1" $R)
    t0=$(now); for _ in $(seq $R); do docker pause "$c" >/dev/null; docker unpause "$c" >/dev/null; done; t1=$(now)
    b=$(per "$t0" "$t1" $R)
    printf '%-8s %-34s %12s %12s %8s\n' "$rt" "pause+resume (CLI) / docker pause+unpause" "$a" "$b" "$(ratio "$a" "$b")"

    # Suspend + resume from disk: namzu's (the tmpfs's archived and put
    # back, the container stopped and started) next to docker stop + start
    # of a plain container with a tmpfs /tmp (which a stop empties).
    $N exec "$id" -- sh -c 'head -c 8388608 /dev/urandom > /tmp/data' >/dev/null
    R=5
    t0=$(now); for _ in $(seq $R); do $N suspend "$id" >/dev/null 2>&1; $N resume "$id" >/dev/null 2>&1; done; t1=$(now)
    a=$(per "$t0" "$t1" $R)
    plain=$(docker run -d --runtime "$rt" --network none --read-only --tmpfs /tmp "$IMG" sh -c 'trap "exit 0" TERM; sleep 100000 & wait')
    t0=$(now); for _ in $(seq $R); do docker stop -t 1 "$plain" >/dev/null; docker start "$plain" >/dev/null; done; t1=$(now)
    b=$(per "$t0" "$t1" $R)
    docker rm -f "$plain" >/dev/null
    printf '%-8s %-34s %12s %12s %8s\n' "$rt" "suspend+resume, 8 MiB /tmp (CLI) / docker stop+start" "$a" "$b" "$(ratio "$a" "$b")"

    t0=$(now); $N cp "$big" "$id:/workspace/big"; t1=$(now)
    a=$(per "$t0" "$t1" 1)
    t0=$(now); docker cp "$big" "$c:/workspace/big2"; t1=$(now)
    b=$(per "$t0" "$t1" 1)
    printf '%-8s %-34s %12s %12s %8s\n' "$rt" "1 GiB copy in / docker cp" "$a" "$b" "$(ratio "$a" "$b")"
    printf '%-8s %-34s %12s %12s %8s\n' "$rt" "1 GiB copy in / dd + fsync (raw)" "$a" "$raw" "$(ratio "$a" "$raw")"
    $N rm "$id" >/dev/null
done

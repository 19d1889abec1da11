#!/usr/bin/env bash
# `namzu image pull` next to `docker pull` of the same multi-layer image
# from the same loopback registry, in one run. The image is real: Debian
# bookworm (scripts/images.sh) with two more layers docker builds on it (a
# file added, /usr/share/doc and /usr/share/man deleted: whiteouts), pushed
# to Debian's docker-registry on 127.0.0.1:5000. Each side starts cold
# (namzu: an empty state directory; docker: the image removed, which drops
# its layers) and ends with the image unpacked and usable: namzu's rootfs
# published, docker's layers extracted into its storage. Not a test:
# nothing here gates anything.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/docker-up.sh
./scripts/images.sh
P=${NAMZU_BENCH_PROFILE:-release}
cargo build --profile "$P" --locked --bins >/dev/null
N=./target/x86_64-unknown-linux-gnu/$P/namzu
RUNS=${RUNS:-3}
REF=127.0.0.1:5000/namzu-bench/debian-layers:1
if ! docker image inspect debian:bookworm >/dev/null 2>&1; then
    docker load -q -i target/images/debian-bookworm.tar >/dev/null
fi
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
head -c $((8 << 20)) /dev/urandom > "$ctx/blob"
cat > "$ctx/Dockerfile" <<'DOCKERFILE'
FROM debian:bookworm
COPY blob /opt/blob
RUN rm -rf /usr/share/doc /usr/share/man
DOCKERFILE
docker build -q -t "$REF" "$ctx" >/dev/null
docker push -q "$REF" >/dev/null
layers=$(docker image inspect -f '{{len .RootFS.Layers}}' "$REF")
# Cold for docker too: without its base image, no layer is already there.
docker rmi -f "$REF" debian:bookworm >/dev/null
now() { date +%s%N; }
ms() { echo $(( ($2 - $1) / 1000000 )); }
printf '%-4s %12s %12s %8s\n' run namzu_ms docker_ms ratio
tn=0; td=0
for i in $(seq 1 "$RUNS"); do
    st=$(mktemp -d)
    t0=$(now); "$N" --state-dir "$st" image pull "$REF" >/dev/null 2>&1; t1=$(now)
    size=$("$N" --state-dir "$st" image ls | awk -F'\t' '{print $4}')
    rm -rf "$st"
    t2=$(now); docker pull -q "$REF" >/dev/null; t3=$(now)
    docker rmi -f "$REF" >/dev/null
    a=$(ms "$t0" "$t1"); b=$(ms "$t2" "$t3")
    tn=$((tn + a)); td=$((td + b))
    printf '%-4s %12s %12s %8s\n' "$i" "$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2fx", a / b }')"
done
docker load -q -i target/images/debian-bookworm.tar >/dev/null
printf '%-4s %12s %12s %8s\n' mean $((tn / RUNS)) $((td / RUNS)) "$(awk -v a="$tn" -v b="$td" 'BEGIN { printf "%.2fx", a / b }')"
echo "image: $REF, $layers layers, $size unpacked (namzu)"

#!/usr/bin/env bash
# Brings up what the docker tier's tests need, idempotently: Debian's
# docker.io and runsc (gVisor) plus busybox-static (the tests build their
# own image from it), runsc registered with the daemon, and dockerd running;
# and Debian's docker-registry on 127.0.0.1:5000 (no auth, loopback only),
# which the pull test pushes to and pulls from.
#
# runsc is registered with `--network=none`: the sandboxes it runs have no
# network anyway, and gVisor's own netstack setup is what fails on hosts
# like this one. `--oci-seccomp` is left off on purpose: with it, Debian's
# runsc (20221219) answers the default profile's clone3 rule with EPERM and
# no threaded program starts (see backend/docker in the namzu crate).
# `--host-uds=open` lets a sandbox connect to a host unix socket bind-mounted
# into it (never create one): the agent dials the host back through it
# (the docker tier's `back` transport) instead of a `docker exec` relay.
# `runsc-nohostuds` is the same runtime without it, for the test that the
# tier falls back to the relay there.
set -euo pipefail

need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v runsc >/dev/null || need+=(runsc)
[ -x /bin/busybox ] && /bin/busybox --list >/dev/null 2>&1 && file -L /bin/busybox 2>/dev/null | grep -q static \
    || need+=(busybox-static)
command -v file >/dev/null || need+=(file)
command -v docker-registry >/dev/null || need+=(docker-registry)
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "docker-up: need ${need[*]} (root and apt-get to install them)" >&2
        exit 1
    fi
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

want='{
  "runtimes": {
    "runsc": { "path": "/usr/bin/runsc", "runtimeArgs": ["--network=none", "--host-uds=open"] },
    "runsc-nohostuds": { "path": "/usr/bin/runsc", "runtimeArgs": ["--network=none"] }
  }
}'
reload=0
if [ ! -f /etc/docker/daemon.json ] || [ "$(cat /etc/docker/daemon.json)" != "$want" ]; then
    mkdir -p /etc/docker
    printf '%s\n' "$want" > /etc/docker/daemon.json
    reload=1
fi

if docker info >/dev/null 2>&1; then
    if [ "$reload" = 1 ]; then
        kill -HUP "$(pidof dockerd)"
        sleep 1
    fi
else
    # No init system to ask: start it ourselves, detached from this shell.
    setsid dockerd >/var/log/namzu-dockerd.log 2>&1 < /dev/null &
    for _ in $(seq 1 100); do
        docker info >/dev/null 2>&1 && break
        sleep 0.2
    done
fi
# A busy daemon (cleaning up containers) may miss one `docker info`: ask
# for up to 20 s before calling it down.
registered=0
for _ in $(seq 1 100); do
    if docker info 2>/dev/null | grep -q runsc; then
        registered=1
        break
    fi
    sleep 0.2
done
if [ "$registered" != 1 ]; then
    echo "docker-up: dockerd is not answering with runsc registered; see /var/log/namzu-dockerd.log" >&2
    exit 1
fi

# The registry: loopback only, no auth (the package's own config asks for
# htpasswd), storage of its own. The daemon trusts 127.0.0.0/8 over HTTP.
registry_up() { (exec 3<>/dev/tcp/127.0.0.1/5000) 2>/dev/null; }
if ! registry_up; then
    mkdir -p /etc/namzu /var/lib/namzu-registry
    cat > /etc/namzu/registry.yml <<'YAML'
version: 0.1
storage:
  filesystem:
    rootdirectory: /var/lib/namzu-registry
  delete:
    enabled: true
http:
  addr: 127.0.0.1:5000
YAML
    setsid docker-registry serve /etc/namzu/registry.yml >/var/log/namzu-registry.log 2>&1 < /dev/null &
    for _ in $(seq 1 50); do
        registry_up && break
        sleep 0.1
    done
    registry_up || { echo "docker-up: the registry did not start; see /var/log/namzu-registry.log" >&2; exit 1; }
fi

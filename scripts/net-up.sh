#!/usr/bin/env bash
# What the egress tests need, installed if missing (idempotent): iproute2
# for network namespaces and veth pairs, curl as the client inside the
# sandboxes, openssl for the TLS test server and its certificate, nsenter
# for the simulated pod network.
set -euo pipefail
need=()
command -v ip >/dev/null || need+=(iproute2)
command -v curl >/dev/null || need+=(curl)
command -v openssl >/dev/null || need+=(openssl)
# nsenter: the Kubernetes simulator configures each pod's veth inside the
# pod sandbox's network namespace.
command -v nsenter >/dev/null || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "net-up: need ${need[*]} (root and apt-get to install them)" >&2
        exit 1
    fi
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

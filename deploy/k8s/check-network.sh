#!/usr/bin/env bash
# The live check of namzu's network boundary on a real cluster. namzu's own
# tests prove the TRANSLATION and the VERIFICATION logic against a
# control-plane simulator; only a cluster whose CNI enforces policy can
# prove ENFORCEMENT, and this is how. It needs kubectl with rights to run
# pods in NAMESPACE and in a scratch namespace it creates and deletes.
#
#   deploy/k8s/check-network.sh [NAMESPACE] [ALLOWED_URL]
#
# A probe pod carrying a sandbox pod's labels (policies select by label,
# so it lives under exactly the policies a sandbox does) is tested from
# both sides. Positive controls run first and must pass, or every "it was
# blocked" below would pass for the wrong reason (a CNI that enforces
# nothing blocks nothing, and a dead probe "blocks" everything).
#
# Egress (from the probe):
#   + the cluster resolver answers            (skip with NO_NETWORK=1)
#   + ALLOWED_URL is fetched, when given      (a host your policy allows)
#   - 1.1.1.1:443 is unreachable              (unless the policy is allow-all
#                                              or public-internet)
#   - 169.254.169.254:80 (metadata) is unreachable
# Ingress (to the probe's agent port, 1024):
#   + a pod labelled app.kubernetes.io/name=namzu-host connects
#   - an unlabelled pod in NAMESPACE does not
#   - a pod in another namespace does not
#
# Exit status 0 only if every line passed. Not run by namzu's CI (no
# cluster there); run it after applying deploy/k8s/ and after any change
# to a policy in NAMESPACE.
set -uo pipefail
ns=${1:-sandboxes}
allowed=${2:-}
image=${PROBE_IMAGE:-busybox:1.36}
labels=${PROBE_LABELS:-app.kubernetes.io/managed-by=namzu}
id=$RANDOM
probe=namzu-netcheck-$id
outside_ns=namzu-netcheck-$id
failed=0

run_pod() { # NS NAME LABELS CMD…
    local n=$1 name=$2 l=$3
    shift 3
    kubectl -n "$n" run "$name" --image="$image" --restart=Never ${l:+--labels="$l"} --command -- "$@" >/dev/null
    kubectl -n "$n" wait --for=condition=Ready "pod/$name" --timeout=180s >/dev/null
}
check() { # EXPECT(ok|blocked) WHAT CMD…
    local want=$1 what=$2
    shift 2
    if "$@" >/dev/null 2>&1; then got=ok; else got=blocked; fi
    if [ "$got" = "$want" ]; then echo "PASS  $what ($got)"; else echo "FAIL  $what (wanted $want, got $got)"; failed=1; fi
}
cleanup() {
    kubectl -n "$ns" delete pod "$probe" "$probe-host" "$probe-stranger" --ignore-not-found --wait=false >/dev/null 2>&1
    kubectl delete namespace "$outside_ns" --ignore-not-found --wait=false >/dev/null 2>&1
}
trap cleanup EXIT

# The probe serves on 1024 like an agent, and is the client for egress.
run_pod "$ns" "$probe" "$labels" sh -c 'mkdir -p /w && echo namzu > /w/index.html && httpd -f -p 1024 -h /w'
ip=$(kubectl -n "$ns" get pod "$probe" -o jsonpath='{.status.podIP}')
in_probe() { kubectl -n "$ns" exec "$probe" -- "$@"; }

echo "== egress from a pod labelled $labels in $ns"
if [ "${NO_NETWORK:-0}" != 1 ]; then
    check ok "cluster resolver answers (positive control)" in_probe nslookup kubernetes.default.svc.cluster.local
fi
if [ -n "$allowed" ]; then
    check ok "allowed $allowed is fetched (positive control)" in_probe wget -q -T 10 -O /dev/null "$allowed"
fi
check blocked "1.1.1.1:443" in_probe nc -z -w 5 1.1.1.1 443
check blocked "169.254.169.254:80 (instance metadata)" in_probe nc -z -w 5 169.254.169.254 80

echo "== ingress to $probe ($ip):1024"
run_pod "$ns" "$probe-host" "app.kubernetes.io/name=namzu-host" sleep 600
check ok "the namzu host's pod connects (positive control)" kubectl -n "$ns" exec "$probe-host" -- wget -q -T 5 -O /dev/null "http://$ip:1024/"
run_pod "$ns" "$probe-stranger" "" sleep 600
check blocked "an unlabelled pod in $ns" kubectl -n "$ns" exec "$probe-stranger" -- wget -q -T 5 -O /dev/null "http://$ip:1024/"
kubectl create namespace "$outside_ns" >/dev/null
run_pod "$outside_ns" "$probe" "" sleep 600
check blocked "a pod in another namespace" kubectl -n "$outside_ns" exec "$probe" -- wget -q -T 5 -O /dev/null "http://$ip:1024/"

if [ "$failed" = 0 ]; then echo "network boundary: every check passed"; else echo "network boundary: FAILED"; fi
exit "$failed"

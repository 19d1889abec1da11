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
# The link (with LINK_POD=<a running namzu sandbox pod in NAMESPACE> and
# LINK_DIR=<the host's credentials, `namzu kube link-init`>; needs openssl
# and python3 here, and reaches the pod through `kubectl port-forward`):
#   + the host's certificate opens TLS 1.3 and the agent proves itself
#     (positive control)
#   - TLS without a client certificate is refused by the agent
#   - the pod's uid in a plaintext preface gets no link
#   - a command in the pod, speaking to 127.0.0.1:1024 with the pod's uid,
#     gets no link
#   - the agent's key is gone from the pod, and the Secret is not mounted
#     where commands run
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

if [ -n "${LINK_POD:-}" ] && [ -n "${LINK_DIR:-}" ]; then
    echo "== the link of $LINK_POD"
    uid=$(kubectl -n "$ns" get pod "$LINK_POD" -o jsonpath='{.metadata.uid}')
    port=$((20000 + RANDOM % 20000))
    kubectl -n "$ns" port-forward "pod/$LINK_POD" "$port:1024" >/dev/null 2>&1 &
    pf=$!
    sleep 2
    tls() { # extra openssl args…: succeeds when the agent proved itself and sent no alert
        # (stdin held open 2 s: a refusal comes as an alert after the handshake)
        local out
        out=$(sleep 2 | timeout 10 openssl s_client -connect "127.0.0.1:$port" -tls1_3 \
            -servername namzu-agent -CAfile "$LINK_DIR/ca.crt" -verify_return_error "$@" 2>&1)
        grep -q 'Verify return code: 0 (ok)' <<<"$out" && ! grep -qi 'alert' <<<"$out"
    }
    check ok "the host's certificate opens the link (positive control)" \
        tls -cert "$LINK_DIR/client.crt" -key "$LINK_DIR/client.key"
    check blocked "TLS without a client certificate" tls
    preface_accepted() { # HOST PORT UID [kubectl exec prefix…]: exits 0 only on the agent's 0x00
        local h=$1 p=$2 u=$3
        shift 3
        "$@" python3 -c 'import socket,struct,sys
s=socket.create_connection((sys.argv[1],int(sys.argv[2])),5); t=sys.argv[3].encode()
s.sendall(b"NZL1"+struct.pack(">H",len(t))+t); s.settimeout(5)
sys.exit(0 if s.recv(1)==b"\x00" else 1)' "$h" "$p" "$u"
    }
    check blocked "the pod's uid in a plaintext preface" preface_accepted 127.0.0.1 "$port" "$uid"
    check blocked "a command in the pod, as the host, on 127.0.0.1:1024" \
        preface_accepted 127.0.0.1 1024 "$uid" kubectl -n "$ns" exec "$LINK_POD" --
    check blocked "the agent's key left in the pod" kubectl -n "$ns" exec "$LINK_POD" -- ls /namzu-link/tls.key
    check blocked "the Secret mounted where commands run" kubectl -n "$ns" exec "$LINK_POD" -- ls /namzu-link-secret
    kill "$pf" 2>/dev/null
fi

if [ "$failed" = 0 ]; then echo "network boundary: every check passed"; else echo "network boundary: FAILED"; fi
exit "$failed"

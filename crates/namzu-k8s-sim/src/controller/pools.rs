//! Templates and warm pools, as `sandboxtemplate_controller.go` and
//! `sandboxwarmpool_controller.go` keep them: a template labelled with its
//! ref hash and its managed NetworkPolicy; a pool's Sandboxes made from the
//! template's blueprint, refilled, trimmed, and counted in its status.

use serde_json::{json, Value};

use super::*;

/// What the secure default policy lets out: everything public, nothing
/// private, link-local or (so) in-cluster — cluster DNS included.
fn default_policy_spec(template: &str) -> Value {
    json!({
        "podSelector": {"matchLabels": {TEMPLATE_HASH_LABEL: name_hash(template)}},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [{"from": [{
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "agent-sandbox-system"}},
            "podSelector": {"matchLabels": {"app": "sandbox-router"}},
        }]}],
        "egress": [{"to": [
            {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"]}},
            {"ipBlock": {"cidr": "::/0", "except": ["fc00::/7", "fe80::/10"]}},
        ]}],
    })
}

/// Whether a template leaves its pods on the secure default policy (then
/// the controller also points their DNS away from the cluster's).
pub(super) fn secure_by_default(template: &Value) -> bool {
    template["spec"]["networkPolicy"].is_null() && template["spec"]["networkPolicyManagement"] != "Unmanaged"
}

/// The pod template a Sandbox made from `template` runs: the template's,
/// with the ref-hash label, `extra` labels, and the secure defaults (no
/// service-account token unless asked; public resolvers under the default
/// policy).
pub(super) fn blueprint_pod(template: &Value, extra: &serde_json::Map<String, Value>) -> Value {
    let mut pod = template["spec"]["podTemplate"].clone();
    if !pod["metadata"]["labels"].is_object() {
        pod["metadata"]["labels"] = json!({});
    }
    pod["metadata"]["labels"][TEMPLATE_HASH_LABEL] = json!(name_hash(meta(template, "name")));
    for (k, v) in extra {
        pod["metadata"]["labels"][k] = v.clone();
    }
    if pod["spec"]["automountServiceAccountToken"].is_null() {
        pod["spec"]["automountServiceAccountToken"] = json!(false);
    }
    if secure_by_default(template) && pod["spec"]["dnsPolicy"].is_null() {
        pod["spec"]["dnsPolicy"] = json!("None");
        pod["spec"]["dnsConfig"] = json!({"nameservers": ["8.8.8.8", "1.1.1.1"]});
    }
    pod
}

/// Whether the pod of pool Sandbox `sb` is `PodScheduled=False`,
/// `Unschedulable`.
fn pod_unschedulable(sim: &Simulator, sb: &Value) -> bool {
    let pod_name = sb["metadata"]["annotations"][POD_NAME_ANNOTATION]
        .as_str()
        .unwrap_or(meta(sb, "name"));
    sim.object(PODS.0, PODS.1, PODS.2, meta(sb, "namespace"), pod_name)
        .is_some_and(|p| {
            p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "PodScheduled" && c["status"] == "False" && c["reason"] == "Unschedulable")
        })
}

/// A duration as Go prints one (`5m0s`, `2s`, `1.5s`, `300ms`).
fn go_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (h, m) = (ms / 3_600_000, (ms / 60_000) % 60);
    let s = (ms % 60_000) as f64 / 1000.0;
    let mut out = String::new();
    if h > 0 {
        out += &format!("{h}h");
    }
    if h > 0 || m > 0 {
        out += &format!("{m}m");
    }
    out + &format!("{s}s")
}

impl Controller {
    /// The pool's not-progressing signal, as `setNotProgressing`: an Event
    /// on each transition only — a Warning when unschedulable Sandboxes
    /// are held, a Normal one when that ends.
    fn progress_event(&self, sim: &Simulator, pool: &Value, unschedulable: usize, want: usize, grace: Duration) {
        let k = key(meta(pool, "namespace"), meta(pool, "name"));
        let stuck = unschedulable > 0;
        let was = self.lock().not_progressing.contains(&k);
        if stuck == was {
            return;
        }
        if stuck {
            self.lock().not_progressing.insert(k);
            let note = format!(
                "{unschedulable}/{want} sandboxes are unschedulable past the {} readiness grace period; holding them instead of replacing (replacements would be equally unschedulable)",
                go_duration(grace)
            );
            record_event(sim, pool, "Warning", "WarmPoolNotProgressing", "Reconciling", &note);
        } else {
            self.lock().not_progressing.remove(&k);
            record_event(
                sim,
                pool,
                "Normal",
                "WarmPoolProgressing",
                "Reconciling",
                "Warm pool is progressing again",
            );
        }
    }

    pub(super) fn templates(&self, sim: &Simulator) {
        for t in sim.all(TEMPLATES) {
            let (ns, name) = (meta(&t, "namespace").to_owned(), meta(&t, "name").to_owned());
            let hash = name_hash(&name);
            if t["metadata"]["labels"][TEMPLATE_HASH_LABEL] != hash.as_str() {
                sim.update(TEMPLATES, &ns, &name, |o| {
                    if !o["metadata"]["labels"].is_object() {
                        o["metadata"]["labels"] = json!({});
                    }
                    o["metadata"]["labels"][TEMPLATE_HASH_LABEL] = json!(hash);
                });
            }
            let np_name = format!("{name}-network-policy");
            let standing = Self::lookup(sim, NETWORK_POLICIES, &ns, &np_name);
            let ours = standing
                .as_ref()
                .is_some_and(|p| owner_of(p, "SandboxTemplate").is_some_and(|(_, u)| u == meta(&t, "uid")));
            if t["spec"]["networkPolicyManagement"] == "Unmanaged" {
                if ours {
                    sim.remove(NETWORK_POLICIES, &ns, &np_name);
                }
                continue;
            }
            let spec = if t["spec"]["networkPolicy"].is_null() {
                default_policy_spec(&name)
            } else {
                let given = &t["spec"]["networkPolicy"];
                let mut spec = json!({
                    "podSelector": {"matchLabels": {TEMPLATE_HASH_LABEL: hash}},
                    "policyTypes": ["Ingress", "Egress"],
                });
                for k in ["ingress", "egress"] {
                    spec[k] = if given[k].is_null() {
                        json!([])
                    } else {
                        given[k].clone()
                    };
                }
                spec
            };
            match standing {
                // Someone else's policy under that name is left alone.
                Some(_) if !ours => {}
                Some(p) if p["spec"] == spec => {}
                Some(_) => {
                    sim.update(NETWORK_POLICIES, &ns, &np_name, |o| o["spec"] = spec);
                }
                None => {
                    sim.put(
                        NETWORK_POLICIES,
                        json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                            "metadata": {"name": np_name, "namespace": ns,
                                "ownerReferences": owner_ref("extensions.agents.x-k8s.io/v1beta1", "SandboxTemplate", &t)},
                            "spec": spec}),
                    );
                }
            }
        }
    }

    pub(super) fn pools(&self, sim: &Simulator) {
        let sandboxes = sim.all(SANDBOXES);
        for pool in sim.all(POOLS) {
            let (ns, name) = (meta(&pool, "namespace"), meta(&pool, "name"));
            let mut held: Vec<&Value> = sandboxes
                .iter()
                .filter(|s| owner_of(s, "SandboxWarmPool").is_some_and(|(_, u)| u == meta(&pool, "uid")))
                .collect();
            // CRD default: 1.
            let want = usize::try_from(pool["spec"]["replicas"].as_i64().unwrap_or(1)).unwrap_or(0);
            // Past the readiness grace, a not-Ready Sandbox is replaced —
            // unless its pod cannot be scheduled: a replacement could not
            // be either, so it is held and the pool reported stuck.
            let grace = self.cfg.pool_readiness_grace;
            let mut unschedulable = 0;
            held.retain(|s| {
                let age = s["metadata"]["creationTimestamp"]
                    .as_str()
                    .and_then(|t| k8s_openapi::chrono::DateTime::parse_from_rfc3339(t).ok())
                    .and_then(|t| SystemTime::now().duration_since(SystemTime::from(t)).ok())
                    .unwrap_or_default();
                if is_ready(s) || age <= grace {
                    return true;
                }
                if pod_unschedulable(sim, s) {
                    unschedulable += 1;
                    return true;
                }
                sim.remove(SANDBOXES, ns, meta(s, "name"));
                false
            });
            self.progress_event(sim, &pool, unschedulable, want, grace);
            let tname = pool["spec"]["sandboxTemplateRef"]["name"].as_str().unwrap_or_default();
            if let Some(t) = Self::template(sim, ns, tname) {
                for _ in held.len()..want {
                    // generateName: `<pool>-` and a random suffix.
                    let sname = format!("{name}-{:05x}", rand::random::<u32>() & 0xfffff);
                    let owner = owner_ref("extensions.agents.x-k8s.io/v1beta1", "SandboxWarmPool", &pool);
                    let mut pod = blueprint_pod(&t, &serde_json::Map::new());
                    pod["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] = json!("true");
                    sim.put(
                        SANDBOXES,
                        json!({
                            "apiVersion": "agents.x-k8s.io/v1beta1",
                            "kind": "Sandbox",
                            "metadata": {"name": sname, "namespace": ns, "ownerReferences": owner, "labels": {
                                POOL_LABEL: name_hash(name), TEMPLATE_HASH_LABEL: name_hash(tname),
                                LAUNCH_TYPE_LABEL: "warm", "agents.x-k8s.io/created-by": "controller"}},
                            "spec": {"podTemplate": pod, "service": t["spec"]["service"].clone(),
                                "volumeClaimTemplates": t["spec"]["volumeClaimTemplates"].clone()},
                        }),
                    );
                }
            }
            // Surplus: the unready first, then the newest.
            if held.len() > want {
                held.sort_by(|a, b| {
                    is_ready(a)
                        .cmp(&is_ready(b))
                        .then_with(|| meta(b, "creationTimestamp").cmp(meta(a, "creationTimestamp")))
                });
                for s in &held[..held.len() - want] {
                    sim.remove(SANDBOXES, ns, meta(s, "name"));
                }
                held.truncate(want);
            }
            let ready = held.iter().filter(|s| is_ready(s)).count();
            let status = json!({"replicas": held.len(), "readyReplicas": ready,
                "selector": format!("{POOL_LABEL}={}", name_hash(name)),
                "observedGeneration": pool["metadata"]["generation"].clone()});
            if status != pool["status"] {
                write_status(sim, POOLS, ns, name, status);
            }
        }
    }
}

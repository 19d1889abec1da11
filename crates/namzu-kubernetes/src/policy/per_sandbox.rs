//! Per-sandbox egress: `Sandbox::set_network_policy` on a task handle,
//! available exactly when `egress.per_sandbox` is configured (refused by
//! name otherwise).
//!
//! Each sandbox gets one CiliumNetworkPolicy, `namzu-sbx-<owner uid>`.
//! * It is owned by the claim (or Sandbox) through `ownerReferences`, so it
//!   goes when the sandbox does.
//! * It selects the per-sandbox pod label, which the acquire confirmed on
//!   the bound pod.
//! * It allows the cluster resolver plus the hostname list. An exact name is
//!   a `matchName`; a `.domain` is its name plus `*.domain`. The configured
//!   narrowing applies as for the template's policy, and a host's own ports
//!   narrow it further.
//!
//! A write resolves only after a read-back deep-equals what was sent.
//!
//! Deny-all (or an empty list) means what it means on every tier: names
//! resolve, no connection leaves. A per-sandbox policy can only ADD to what
//! the cluster's other policies allow, so deny-all deletes it and then
//! proves the union of what still selects the pod is no wider than
//! deny-all (the egress union check, under Cilium); a baseline that lets
//! more out is `EgressUnion` (`PolicyWidensEgress`, naming the policy),
//! never a silent fall back to it.
//!
//! Before the first write, the admission fence (a ValidatingAdmissionPolicy
//! and its binding, shipped in `deploy/k8s/admission-fence.yaml`) is proven
//! applied, because it bounds what such a policy may contain. Missing (404)
//! and unreadable (401/403) are distinct errors, and nothing is written in
//! either case.

use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{json, Value};

use super::{
    first_difference, policy_resource, translate, CiliumNarrowing, Engine, KubeEgressConfig, KubeEgressPolicy,
};
use crate::api::{Api, ApiError, Resource};
use crate::bound::Bound;
use crate::crd::{Kind, Sandbox, SandboxClaim, VERSION};
use crate::labels::{MANAGED_BY, MANAGED_BY_LABEL};
use crate::lease::Leased;
use namzu_core::egress::policy::{HostPattern, HostRule};
use namzu_core::egress::EgressPolicy;

pub use super::config::{PerSandboxEgress, DEFAULT_FENCE, DEFAULT_LABEL_KEY, POLICY_NAME_PREFIX};

/// A per-sandbox write refused or failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PerSandboxError {
    /// Set_network_policy: per-sandbox egress is not configured (egress.per_sandbox); this task handle has no per-sandbox policy to change.
    #[error("set_network_policy: per-sandbox egress is not configured (egress.per_sandbox); this task handle has no per-sandbox policy to change")]
    NotConfigured,
    /// Set_network_policy: a per-sandbox policy is a hostname allowlist (an empty one, or deny-all, removes it); cannot be expressed per sandbox.
    #[error("set_network_policy: a per-sandbox policy is a hostname allowlist (an empty one, or deny-all, removes it); {policy} cannot be expressed per sandbox")]
    PolicyRefused {
        /// What may leave.
        policy: &'static str,
    },
    /// The admission fence is not applied (404): apply deploy/k8s/admission-fence.yaml; nothing was written.
    #[error("the admission fence {kind} {name:?} is not applied (404): apply deploy/k8s/admission-fence.yaml; nothing was written")]
    FenceMissing {
        /// What kind of entry.
        kind: &'static str,
        /// The entry name.
        name: String,
    },
    /// The admission fence cannot be read (): grant get on it (deploy/k8s/rbac-fence-reader.yaml); nothing was written.
    #[error("the admission fence {kind} {name:?} cannot be read ({status}): grant get on it (deploy/k8s/rbac-fence-reader.yaml); nothing was written")]
    FenceUnreadable {
        /// What kind of entry.
        kind: &'static str,
        /// The entry name.
        name: String,
        /// How it ended.
        status: u16,
    },
    /// Sandbox : its claim (or Sandbox) reported no uid; a policy written for it would be an orphan.
    #[error("sandbox {id}: its claim (or Sandbox) reported no uid; a policy written for it would be an orphan")]
    OwnerUidMissing {
        /// The sandbox's id.
        id: String,
    },
    /// Per-sandbox policy read back different at : sent , found.
    #[error("per-sandbox policy {name} read back different at {path}: sent {expected}, found {found}")]
    ReadBackMismatch {
        /// The entry name.
        name: String,
        /// The path as the caller gave it.
        path: String,
        /// What the translation says at that path.
        expected: String,
        /// What the cluster holds there.
        found: String,
    },
}

/// The policy's name for a sandbox whose owner has `uid`.
pub fn policy_name(uid: &str) -> String {
    format!("{POLICY_NAME_PREFIX}{uid}")
}

/// The policy allowing `hosts` to the sandbox `bound`.
pub fn policy_for(
    cfg: &PerSandboxEgress,
    namespace: &str,
    bound: &Bound,
    hosts: &[HostRule],
) -> namzu_core::Result<Value> {
    let uid = bound
        .owner_uid
        .clone()
        .ok_or_else(|| PerSandboxError::OwnerUidMissing { id: bound.id.clone() })?;
    let mut narrowing = cfg.narrowing.clone().unwrap_or_default();
    let entries: Vec<String> = hosts
        .iter()
        .map(|h| {
            let entry = match &h.host {
                HostPattern::Exact(n) => n.clone(),
                HostPattern::Domain(d) => format!(".{d}"),
            };
            if let Some(ports) = &h.ports {
                narrowing
                    .host_ports
                    .insert(entry.clone(), ports.iter().map(|p| u32::from(*p)).collect());
            }
            entry
        })
        .collect();
    let k = KubeEgressConfig {
        engine: Engine::Cilium,
        narrowing: (narrowing != CiliumNarrowing::default()).then_some(narrowing),
        ..KubeEgressConfig::new("per-sandbox", KubeEgressPolicy::Static { hosts: entries })
    };
    k.validate()?;
    let t = translate(&k, namespace);
    let (api_version, kind) = match bound.owner {
        Leased::Claim => (format!("{}/{VERSION}", SandboxClaim::GROUP), SandboxClaim::KIND),
        Leased::Sandbox => (format!("{}/{VERSION}", Sandbox::GROUP), Sandbox::KIND),
    };
    Ok(json!({
        "apiVersion": "cilium.io/v2",
        "kind": "CiliumNetworkPolicy",
        "metadata": {
            "name": policy_name(&uid),
            "namespace": namespace,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
            // No blockOwnerDeletion: setting it needs rights on the owner's
            // finalizers, which the fence refuses a host should hold.
            "ownerReferences": [{"apiVersion": api_version, "kind": kind, "name": bound.owner_name,
                "uid": uid, "controller": true}]
        },
        "spec": {
            "endpointSelector": {"matchLabels": {cfg.label_key.clone(): bound.id}},
            "egress": t["spec"]["egress"].clone()
        }
    }))
}

/// Proves the fence's policy and binding are applied.
async fn prove_fence(api: &Api, cfg: &PerSandboxEgress) -> namzu_core::Result<()> {
    for (kind, plural, name) in [
        (
            "ValidatingAdmissionPolicy",
            "validatingadmissionpolicies",
            &cfg.fence_policy,
        ),
        (
            "ValidatingAdmissionPolicyBinding",
            "validatingadmissionpolicybindings",
            &cfg.fence_binding,
        ),
    ] {
        let r = Resource {
            group: "admissionregistration.k8s.io".into(),
            version: "v1".into(),
            plural: plural.into(),
            namespace: String::new(),
        };
        match api.get(&r, name).await {
            Ok(_) => {}
            Err(ApiError::AlreadyGone { .. }) => {
                return Err(PerSandboxError::FenceMissing {
                    kind,
                    name: name.clone(),
                }
                .into())
            }
            Err(ApiError::Credential { status, .. }) => {
                return Err(PerSandboxError::FenceUnreadable {
                    kind,
                    name: name.clone(),
                    status,
                }
                .into())
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Replaces sandbox `bound`'s per-sandbox policy with `policy`.
/// `fence_proven` remembers, per handle, that the fence stood.
pub async fn apply(
    api: &Api,
    cfg: &PerSandboxEgress,
    namespace: &str,
    bound: &Bound,
    policy: &EgressPolicy,
    fence_proven: &AtomicBool,
) -> namzu_core::Result<()> {
    policy.validate()?;
    let hosts = match policy {
        EgressPolicy::Allowlist { hosts } if hosts.is_empty() => None,
        EgressPolicy::Allowlist { hosts } => Some(hosts.as_slice()),
        EgressPolicy::DenyAll => None,
        other => return Err(PerSandboxError::PolicyRefused { policy: other.kind() }.into()),
    };
    // Everything refusable is refused before any request.
    let body = hosts.map(|h| policy_for(cfg, namespace, bound, h)).transpose()?;
    let uid = bound
        .owner_uid
        .clone()
        .ok_or_else(|| PerSandboxError::OwnerUidMissing { id: bound.id.clone() })?;
    if !fence_proven.load(Ordering::SeqCst) {
        prove_fence(api, cfg).await?;
        fence_proven.store(true, Ordering::SeqCst);
    }
    let r = policy_resource(Engine::Cilium, namespace);
    let name = policy_name(&uid);
    let Some(body) = body else {
        match api.delete(&r, &name).await {
            Ok(_) | Err(ApiError::AlreadyGone { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        // What is left must be deny-all for this pod.
        let deny = KubeEgressConfig {
            engine: Engine::Cilium,
            ..KubeEgressConfig::new("per-sandbox", KubeEgressPolicy::DenyAll)
        };
        let (lists, unread) = super::union::list_policies(api, Engine::Cilium, namespace).await;
        super::union::evaluate(&deny, namespace, &bound.pod.labels, &lists, unread)?;
        return Ok(());
    };
    match api.create(&r, &body).await {
        Ok(_) => {}
        Err(ApiError::Conflict { .. }) => {
            let patch = json!({"metadata": {"labels": body["metadata"]["labels"], "ownerReferences": body["metadata"]["ownerReferences"]},
                "spec": body["spec"]});
            api.merge_patch(&r, &name, &patch).await?;
        }
        Err(e) => return Err(e.into()),
    }
    let found = api.get(&r, &name).await?;
    match first_difference(&body["spec"], &found["spec"], "/spec") {
        None => Ok(()),
        Some((path, expected, found)) => Err(PerSandboxError::ReadBackMismatch {
            name,
            path,
            expected,
            found,
        }
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bound::BoundPod;
    use crate::policy::DnsNames;

    fn bound() -> Bound {
        Bound {
            id: "sb-000000000001".into(),
            owner: Leased::Claim,
            owner_name: "namzu-sb-000000000001".into(),
            owner_uid: Some("u-1".into()),
            sandbox: "pool-abcde".into(),
            sandbox_uid: None,
            fqdn: None,
            pod: BoundPod {
                name: "pool-abcde".into(),
                uid: "p-1".into(),
                ip: None,
                labels: Default::default(),
            },
        }
    }

    fn hosts(entries: &[&str]) -> Vec<HostRule> {
        entries.iter().map(|e| HostRule::parse(e, None).unwrap()).collect()
    }

    #[test]
    fn the_same_narrowing_applies_per_sandbox() {
        let cfg = PerSandboxEgress {
            narrowing: Some(CiliumNarrowing {
                tls_server_names: true,
                dns_names: Some(DnsNames::default()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let p = policy_for(&cfg, "sandboxes", &bound(), &hosts(&["api.example.com"])).unwrap();
        assert_eq!(p["metadata"]["name"], "namzu-sbx-u-1");
        assert_eq!(
            p["spec"]["egress"][1],
            json!({"toFQDNs": [{"matchName": "api.example.com"}],
                "toPorts": [{"ports": [{"port": "443", "protocol": "TCP"}], "serverNames": ["api.example.com"]}]})
        );
        let dns = p["spec"]["egress"][0]["toPorts"][0]["rules"]["dns"].as_array().unwrap();
        assert!(dns.contains(&json!({"matchName": "api.example.com"})));
        assert!(!dns.contains(&json!({"matchPattern": "*"})));
        // SNI needs exact names: a .domain is refused, as for the template.
        let e = policy_for(&cfg, "sandboxes", &bound(), &hosts(&[".example.com"])).unwrap_err();
        assert!(matches!(e, namzu_core::Error::Tier { .. }), "{e:?}");
        // Without a uid there is nothing to own the policy.
        let mut orphan = bound();
        orphan.owner_uid = None;
        let e = policy_for(
            &PerSandboxEgress::default(),
            "sandboxes",
            &orphan,
            &hosts(&["a.example.com"]),
        )
        .unwrap_err();
        assert!(
            e.tier_error::<crate::KubernetesError>()
                .is_some_and(|k| matches!(k, crate::KubernetesError::PerSandbox(_))),
            "{e:?}"
        );
        // host_ports has no hosts to name at configuration time.
        let bad = PerSandboxEgress {
            narrowing: Some(CiliumNarrowing {
                host_ports: [("a.example.com".to_owned(), vec![443])].into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(bad.validate().is_err());
    }
}

//! The objects the backend sends, built from its options: a claim on a warm
//! pool, or a Sandbox from a template. Both carry the metadata labels the
//! backend finds them by (never policed), the pod labels an egress policy
//! selects by (only those, under the one pod-label domain), a shutdown time
//! `claim_ttl` ahead (the lease the handle renews), and `Delete` at that
//! time, so an abandoned sandbox goes away on its own.

use std::collections::BTreeMap;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{ContainerPort, EnvVar, EnvVarSource, ObjectFieldSelector};

use super::crd::{ClaimEnv, Lifecycle, NameRef, PodMetadata, Sandbox, SandboxClaim, SandboxTemplate};
use super::{AddressMode, KubernetesOptions};
// Re-exported for the simulator, which reads and writes these times too.
#[allow(unused_imports)]
pub use crate::clock::{rfc3339, rfc3339_ceil, until};
#[allow(unused_imports)]
pub use crate::labels::{check_label, key_in_domain, DEFAULT_POD_LABEL_DOMAIN, MANAGED_BY, MANAGED_BY_LABEL, SANDBOX_LABEL};

/// The agent container's environment variable holding its bind token: the
/// pod's own uid, through the downward API.
pub const TOKEN_ENV: &str = "NAMZU_AGENT_TOKEN";
/// The agent's container port name.
pub const AGENT_PORT_NAME: &str = "namzu-agent";

/// The metadata labels of the claim (or Sandbox) of sandbox `id`: the
/// caller's `claim_labels`, and namzu's own, which find it again.
pub fn object_labels(opts: &KubernetesOptions, id: &str) -> BTreeMap<String, String> {
    let mut l = opts.claim_labels.clone();
    l.insert(SANDBOX_LABEL.to_owned(), id.to_owned());
    l.insert(MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned());
    l
}

/// The labels the backend asks for on sandbox `id`'s pod under `opts`:
/// the egress profile's when one is configured, and the per-sandbox
/// policy's selector label when that is — nothing else, so a claim without
/// them carries no pod label the controller could refuse.
pub fn pod_labels_for(opts: &KubernetesOptions, id: &str) -> BTreeMap<String, String> {
    let mut l = BTreeMap::new();
    if let Some(e) = &opts.egress {
        if let Some(p) = &e.profile {
            l.insert(e.profile_label_key.clone(), p.clone());
        }
        if let Some(ps) = &e.per_sandbox {
            l.insert(ps.label_key.clone(), id.to_owned());
        }
    }
    l
}

/// The shutdown time of a lease taken at `now`.
pub fn shutdown_time(opts: &KubernetesOptions, now: SystemTime) -> String {
    rfc3339_ceil(now + opts.claim_ttl)
}

/// A claim named `name` on the configured warm pool for sandbox `id`.
/// `claim_labels` go on the claim's metadata only; the pod's labels go in
/// `spec.additionalPodMetadata`.
pub fn claim(opts: &KubernetesOptions, name: &str, id: &str, now: SystemTime) -> SandboxClaim {
    let mut c = SandboxClaim::named(&opts.namespace, name);
    c.metadata.labels = Some(object_labels(opts, id));
    c.spec.warm_pool_ref = NameRef {
        name: opts.warm_pool_name.clone().unwrap_or_default(),
    };
    let labels = pod_labels_for(opts, id);
    if !labels.is_empty() {
        c.spec.additional_pod_metadata = Some(PodMetadata {
            labels,
            annotations: BTreeMap::new(),
        });
    }
    c.spec.lifecycle = Some(Lifecycle {
        shutdown_policy: Some("Delete".into()),
        shutdown_time: Some(shutdown_time(opts, now)),
        ttl_seconds_after_finished: None,
    });
    c
}

/// A Sandbox named `name` made from `template` for sandbox `id`: the
/// template's pod, labelled, with the agent container told its bind token
/// (the pod uid) and given its port.
pub fn sandbox(opts: &KubernetesOptions, template: &SandboxTemplate, name: &str, id: &str, now: SystemTime) -> Sandbox {
    let mut s = Sandbox::named(&opts.namespace, name);
    s.metadata.labels = Some(object_labels(opts, id));
    let mut pod = template.spec.pod_template.clone();
    let meta = pod.metadata.get_or_insert_with(Default::default);
    meta.labels
        .get_or_insert_with(BTreeMap::new)
        .extend(pod_labels_for(opts, id));
    if let Some(spec) = pod.spec.as_mut() {
        let agent = match &opts.agent_container {
            Some(n) => spec.containers.iter_mut().find(|c| &c.name == n),
            None => spec.containers.first_mut(),
        };
        if let Some(c) = agent {
            let env = c.env.get_or_insert_with(Vec::new);
            env.retain(|e| e.name != TOKEN_ENV);
            env.push(EnvVar {
                name: TOKEN_ENV.into(),
                value: None,
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        api_version: Some("v1".into()),
                        field_path: "metadata.uid".into(),
                    }),
                    ..Default::default()
                }),
            });
            let ports = c.ports.get_or_insert_with(Vec::new);
            if !ports.iter().any(|p| p.container_port == i32::from(opts.agent_port)) {
                ports.push(ContainerPort {
                    name: Some(AGENT_PORT_NAME.into()),
                    container_port: i32::from(opts.agent_port),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                });
            }
        }
    }
    s.spec.pod_template = pod;
    // The whole blueprint, as the controller's cold path copies it: a
    // template's PVCs would otherwise be silently dropped.
    s.spec.volume_claim_templates = template.spec.volume_claim_templates.clone();
    s.spec.service = Some(opts.address_mode == AddressMode::Service || template.spec.service == Some(true));
    s.spec.shutdown_policy = Some("Delete".into());
    s.spec.shutdown_time = Some(shutdown_time(opts, now));
    s
}

/// The environment a sandbox's spec asks of its agent: its `env`, and its
/// agent-limit overrides under the names the agent reads them by
/// (`NAMZU_<LIMIT>`).
pub fn agent_env(spec: &namzu_core::spec::SandboxSpec) -> Vec<(String, String)> {
    let mut env = spec.env.clone();
    env.extend(
        spec.limits
            .iter()
            .map(|(k, v)| (namzu_proto::limits::env_var(k), v.to_string())),
    );
    env
}

/// Asks the controller to inject `env` into the claimed pod's agent
/// container (the template must allow it, else the claim is refused with
/// `EnvVarsInjectionRejected`).
pub fn claim_env(claim: &mut SandboxClaim, opts: &KubernetesOptions, env: &[(String, String)]) {
    if env.is_empty() {
        return;
    }
    claim.spec.env = Some(
        env.iter()
            .map(|(name, value)| ClaimEnv {
                name: name.clone(),
                value: value.clone(),
                container_name: opts.agent_container.clone(),
            })
            .collect(),
    );
}

/// Puts `env` on a directly made Sandbox's agent container; a name the
/// template already sets is refused, as a claim's would be.
pub fn sandbox_env(
    sandbox: &mut Sandbox,
    opts: &KubernetesOptions,
    env: &[(String, String)],
) -> std::result::Result<(), String> {
    let Some(spec) = sandbox.spec.pod_template.spec.as_mut() else {
        return Err("the template has no pod spec".into());
    };
    let agent = match &opts.agent_container {
        Some(n) => spec.containers.iter_mut().find(|c| &c.name == n),
        None => spec.containers.first_mut(),
    };
    let Some(c) = agent else {
        return Err("the template has no agent container".into());
    };
    let have = c.env.get_or_insert_with(Vec::new);
    for (name, value) in env {
        if have.iter().any(|e| &e.name == name) {
            return Err(format!("the template already sets {name}"));
        }
        have.push(EnvVar {
            name: name.clone(),
            value: Some(value.clone()),
            value_from: None,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn times_round_trip_through_rfc3339() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00Z"
        );
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(1_795_958_982)),
            "2026-11-29T13:29:42Z"
        );
        let now = UNIX_EPOCH + Duration::from_secs(1_795_958_982);
        assert_eq!(
            rfc3339_ceil(now + Duration::from_millis(1)),
            "2026-11-29T13:29:43Z",
            "a deadline is never rounded down"
        );
        assert_eq!(rfc3339_ceil(now), "2026-11-29T13:29:42Z");
        let later = rfc3339(now + Duration::from_secs(3600));
        assert_eq!(until(&later, now), Some(Duration::from_secs(3600)));
        assert_eq!(until("1970-01-01T00:00:00Z", now), None);
    }

    #[test]
    fn labels_are_checked_as_kubernetes_does() {
        for (k, v) in [
            ("app", "x"),
            ("io.namzu/sandbox", "sb-1"),
            ("team", ""),
            ("a.b-c/d_e.f", "G-h"),
        ] {
            assert_eq!(check_label(k, v), Ok(()), "{k}={v}");
        }
        for (k, v) in [
            ("", "x"),
            ("-a", "x"),
            ("UPPER.Prefix/a", "x"),
            ("a", "-bad"),
            (&"x".repeat(64), "v"),
        ] {
            assert!(check_label(k, v).is_err(), "{k}={v}");
        }
    }
}

//! The labels namzu writes, and the check every label key and value passes
//! before it is sent (the API server's own rules).
//!
//! Two places, two rules. namzu finds its OWN objects (claims, Sandboxes,
//! per-sandbox policies) by their metadata labels, which no controller
//! polices. Labels on PODS pass the agent-sandbox controller's allowlist
//! (`allowed-label-domains`, built-in `sandbox.users.io`): namzu asks for
//! pod labels only when an egress policy must select the pod, all under
//! one domain ([`DEFAULT_POD_LABEL_DOMAIN`] unless configured).

/// The label naming the namzu sandbox id on its claim or Sandbox.
pub const SANDBOX_LABEL: &str = "io.namzu/sandbox";
/// The label marking objects namzu made (and, from the shipped template,
/// its pods).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The domain of every pod label namzu asks the controller for: a
/// subdomain of the controller's built-in allowlist entry, so an operator
/// who kept the default allowlist configures nothing; one who set
/// `allowed-label-domains` must list it (or the domain namzu is given).
pub const DEFAULT_POD_LABEL_DOMAIN: &str = "namzu.sandbox.users.io";

/// Whether label `key`'s domain prefix is `domain` or a subdomain of it
/// (the controller's own test).
pub fn key_in_domain(key: &str, domain: &str) -> bool {
    key.split_once('/')
        .is_some_and(|(d, _)| d == domain || d.ends_with(&format!(".{domain}")))
}
/// The `app.kubernetes.io/managed-by` value on objects namzu makes.
pub const MANAGED_BY: &str = "namzu";
/// A label key and value as Kubernetes accepts them: an optional DNS
/// subdomain prefix and `/`, a name of at most 63 alphanumerics, `-`, `_`,
/// `.` (alphanumeric at both ends); a value the same, or empty.
pub fn check_label(key: &str, value: &str) -> std::result::Result<(), String> {
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.len() <= 63
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && n.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && n.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
    };
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        let ok = !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
        if !ok {
            return Err(format!("label key prefix {p:?} is not a DNS subdomain"));
        }
    }
    if !name_ok(name) {
        return Err(format!("label key {key:?} is not a valid name"));
    }
    if !value.is_empty() && !name_ok(value) {
        return Err(format!("label value {value:?} of {key:?} is not valid"));
    }
    Ok(())
}

/// A JSON label map (`metadata.labels`, `additionalPodMetadata.labels`) as
/// strings; absent or not a map is empty.
pub fn string_map(v: &serde_json::Value) -> std::collections::BTreeMap<String, String> {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

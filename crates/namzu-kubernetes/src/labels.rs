//! The pod labels namzu writes and finds its pods by, and the check every
//! label key and value passes before it is sent (the API server's own
//! rules).

/// The label naming the namzu sandbox id on a pod (and so its Service).
pub const SANDBOX_LABEL: &str = "io.namzu/sandbox";
/// The label marking pods namzu acquired.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
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

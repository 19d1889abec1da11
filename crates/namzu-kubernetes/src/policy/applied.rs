//! The check that the named policy object is applied exactly as
//! translated: the first difference, by JSON path.

use super::config::KubeEgressConfig;
use super::translate::translate;
use crate::api::{Api, ApiError};
use serde_json::Value;

/// Why the named policy does not stand as translated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressPolicyError {
    /// Egress policy / is not applied; apply the translation of the backend's egress configuration.
    #[error("egress policy {kind} {namespace}/{name} is not applied; apply the translation of the backend's egress configuration")]
    NotApplied {
        /// What kind of entry.
        kind: String,
        /// The namespace.
        namespace: String,
        /// The entry name.
        name: String,
    },
    /// Egress policy / differs from the translation at : expected , found.
    #[error("egress policy {kind} {namespace}/{name} differs from the translation at {path}: expected {expected}, found {found}")]
    Mismatch {
        /// What kind of entry.
        kind: String,
        /// The namespace.
        namespace: String,
        /// The entry name.
        name: String,
        /// The first difference, as a JSON pointer into `spec`.
        path: String,
        /// What the translation says at that path.
        expected: String,
        /// What the cluster holds there.
        found: String,
    },
}

/// The first place `found` differs from `want`, as (pointer, want, found).
pub fn first_difference(want: &Value, found: &Value, at: &str) -> Option<(String, String, String)> {
    match (want, found) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter().find_map(|k| {
                let (x, y) = (a.get(k).unwrap_or(&Value::Null), b.get(k).unwrap_or(&Value::Null));
                first_difference(x, y, &format!("{at}/{k}"))
            })
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(i, (x, y))| first_difference(x, y, &format!("{at}/{i}"))),
        _ if want == found => None,
        _ => Some((at.to_owned(), want.to_string(), found.to_string())),
    }
}

/// Reads the named policy and requires its `spec` to equal the
/// translation's. A 404 is [`EgressPolicyError::NotApplied`]; any other
/// API failure travels as itself.
pub async fn verify_named(api: &Api, cfg: &KubeEgressConfig, namespace: &str) -> namzu_core::Result<()> {
    let want = translate(cfg, namespace);
    let r = cfg.resource(namespace);
    let kind = want["kind"].as_str().unwrap_or_default().to_owned();
    let name = cfg.policy_name();
    let found = match api.get(&r, &name).await {
        Ok(v) => v,
        Err(ApiError::AlreadyGone { .. }) => {
            return Err(EgressPolicyError::NotApplied {
                kind,
                namespace: namespace.into(),
                name,
            }
            .into())
        }
        Err(e) => return Err(e.into()),
    };
    match first_difference(&want["spec"], &found["spec"], "/spec") {
        None => Ok(()),
        Some((path, expected, found)) => Err(EgressPolicyError::Mismatch {
            kind,
            namespace: namespace.into(),
            name,
            path,
            expected,
            found,
        }
        .into()),
    }
}

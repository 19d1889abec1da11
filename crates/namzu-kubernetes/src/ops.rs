//! Crash recovery and headroom: what a host runs outside any one handle.

use serde_json::Value;

use super::api::{Api, ApiError, Resource};
use super::crd::{Sandbox, SandboxClaim, SandboxWarmPool};
use super::{build, KubernetesOptions};
use namzu_core::error::{Error, Result};

fn api_err(e: ApiError) -> Error {
    e.into()
}

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["metadata"]["name"].as_str().map(String::from))
        .collect()
}

/// Gives back every task sandbox whose claim (or, without a pool, whose
/// Sandbox) matches `label_selector` — what a restarted host runs to
/// release what its previous life held. Only the kind this backend creates
/// is touched, so the claim-only path needs nothing on Sandboxes. An empty
/// selector would release everything in the namespace and is refused
/// before any request. Returns what was released; already-gone objects
/// count as released.
pub async fn release_task_sandboxes(api: &Api, opts: &KubernetesOptions, label_selector: &str) -> Result<Vec<String>> {
    if label_selector.trim().is_empty() {
        return Err(Error::OptionRefused {
            tier: namzu_core::spec::Tier::Kubernetes,
            option: "label_selector".into(),
            reason: "empty: it would release every sandbox in the namespace".into(),
        });
    }
    let r = if opts.warm_pool_name.is_some() {
        Resource::of::<SandboxClaim>(&opts.namespace)
    } else {
        Resource::of::<Sandbox>(&opts.namespace)
    };
    let mut released = Vec::new();
    let list = api.list(&r, Some(label_selector)).await.map_err(api_err)?;
    for name in names(&list) {
        match api.delete(&r, &name).await {
            Ok(_) | Err(ApiError::AlreadyGone { .. }) => released.push(name),
            Err(e) => return Err(api_err(e)),
        }
    }
    Ok(released)
}

/// Headroom, as the cluster reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TaskCapacity {
    /// The warm pool's ready pods, and how many it wants.
    pub warm_ready: i64,
    /// Warm sandboxes the pool asks for.
    pub warm_desired: i64,
    /// Claims on the pool that exist now.
    pub active_claims: usize,
    /// namzu's pods not yet running (scheduling, pulling).
    pub pending_pods: usize,
}

/// Reads the warm pool, its claims and namzu's pending pods.
pub async fn read_task_capacity(api: &Api, opts: &KubernetesOptions) -> Result<TaskCapacity> {
    let mut cap = TaskCapacity::default();
    if let Some(pool) = &opts.warm_pool_name {
        let p = api
            .get(&Resource::of::<SandboxWarmPool>(&opts.namespace), pool)
            .await
            .map_err(api_err)?;
        cap.warm_desired = p["spec"]["replicas"].as_i64().unwrap_or(0);
        cap.warm_ready = p["status"]["readyReplicas"].as_i64().unwrap_or(0);
        let claims = api
            .list(&Resource::of::<SandboxClaim>(&opts.namespace), None)
            .await
            .map_err(api_err)?;
        cap.active_claims = claims["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["spec"]["warmPoolRef"]["name"].as_str() == Some(pool.as_str()))
            .count();
    }
    // namzu's pods carry no label of namzu's own (the controller polices
    // pod labels): they are the pods of the Sandboxes namzu's claims (or
    // namzu's Sandboxes) are bound to.
    let selector = format!("{}={}", build::MANAGED_BY_LABEL, build::MANAGED_BY);
    let owner = crate::acquire::owner_resource(crate::acquire::owner_kind(opts), &opts.namespace);
    let ours = api.list(&owner, Some(&selector)).await.map_err(api_err)?;
    let sandboxes: std::collections::HashSet<String> = ours["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|o| {
            o["status"]["sandbox"]["name"]
                .as_str()
                .or_else(|| {
                    o["spec"]["podTemplate"]
                        .is_object()
                        .then(|| o["metadata"]["name"].as_str())
                        .flatten()
                })
                .map(String::from)
        })
        .collect();
    let pods = api
        .list(&Resource::core("pods", &opts.namespace), None)
        .await
        .map_err(api_err)?;
    cap.pending_pods = pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| {
            p["metadata"]["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|r| r["kind"] == "Sandbox" && r["name"].as_str().is_some_and(|n| sandboxes.contains(n)))
        })
        .filter(|p| p["status"]["phase"].as_str().is_none_or(|ph| ph == "Pending"))
        .count();
    Ok(cap)
}

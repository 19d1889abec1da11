//! Helpers the kubernetes tier's simulator tests share.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod sim;
pub mod workspace;

use std::time::{Duration, Instant};

use namzu::Error;
use namzu_k8s_sim::cluster::Cluster;
use namzu_k8s_sim::controller::{CLAIMS, SANDBOXES};
use namzu_kubernetes::api::{Call, Verb};
use namzu_kubernetes::{KubernetesOptions, KubernetesProvider};

pub fn provider(c: &Cluster, opts: KubernetesOptions) -> KubernetesProvider {
    KubernetesProvider::new(c.client(), opts).unwrap()
}

pub fn calls(p: &KubernetesProvider) -> Vec<(String, Verb)> {
    p.api()
        .calls()
        .into_iter()
        .map(|Call { resource, verb, .. }| (resource, verb))
        .collect()
}

/// The calls with runs of one repeated call folded into one: what a
/// sequence is, whatever the number of polls.
pub fn folded(p: &KubernetesProvider) -> Vec<(String, Verb)> {
    let mut out: Vec<(String, Verb)> = Vec::new();
    for c in calls(p) {
        if out.last() != Some(&c) {
            out.push(c);
        }
    }
    out
}

pub fn call(resource: &str, verb: Verb) -> (String, Verb) {
    (resource.into(), verb)
}

pub fn exists(c: &Cluster, gvr: namzu_k8s_sim::Gvr, name: &str) -> bool {
    c.get(gvr, name).is_some()
}

pub fn acquire_error(e: Error) -> namzu_kubernetes::acquire_error::AcquireError {
    match e.into_tier_error::<namzu_kubernetes::KubernetesError>() {
        Ok(namzu_kubernetes::KubernetesError::Acquire(a)) => a,
        other => panic!("not an acquire error: {other:?}"),
    }
}

/// Nothing namzu made is left once the garbage collector (asynchronous,
/// as a cluster's is) has followed the owner references.
pub async fn no_objects_left(c: &Cluster) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while [CLAIMS, SANDBOXES].iter().any(|g| c.sandbox_objects(*g) > 0) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for gvr in [CLAIMS, SANDBOXES] {
        assert_eq!(c.sandbox_objects(gvr), 0, "left behind in {}", gvr.2);
    }
}

/// The Kubernetes backend behind a handle.
pub fn k8s(sb: &namzu::Sandbox) -> &namzu_kubernetes::KubernetesSandbox {
    sb.backend().expect("a kubernetes sandbox")
}

/// Cancels a command whose group the agent cannot prove dead (a zombie
/// kept in the group by a parent that left it) and returns the retirement
/// note of the `RemoteCancellationUnknown` it ends with (the sandbox needs
/// `cancel_confirm_ms` low, e.g. 400).
pub async fn unconfirmed_cancel(sb: &namzu::Sandbox) -> String {
    use namzu::{ExecEvent, ExecRequest};
    use tokio_stream::StreamExt;
    let token = tokio_util::sync::CancellationToken::new();
    let mut s = sb
        .commands()
        .stream(ExecRequest::shell("(sleep 30 & exec setsid sleep 30) & echo ready; wait").cancel_token(token.clone()))
        .await
        .unwrap();
    let mut last = None;
    while let Some(ev) = s.next().await {
        match ev {
            Ok(ExecEvent::Stdout { data, .. }) if data.starts_with(b"ready") => {
                tokio::time::sleep(Duration::from_millis(300)).await;
                token.cancel();
            }
            Ok(_) => {}
            Err(e) => {
                last = Some(e);
                break;
            }
        }
    }
    match last {
        Some(Error::RemoteCancellationUnknown {
            retirement: Some(note), ..
        }) => note,
        other => panic!("{other:?}"),
    }
}

//! The RBAC the backend needs, proven from what it DOES: every API call
//! goes through the one typed layer, which records (group, resource,
//! verb). The claim-only path is driven end to end against the simulator —
//! acquire, use, lease renewal, reattach by id, listing, destroy, a failed
//! acquire's diagnosis and cleanup, crash recovery — and the recorded set
//! must equal `CLAIMANT_RBAC` and the parsed claimant Role, both ways. The
//! template path, headroom included, must stay inside the full Role.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use namzu::{Provider, SandboxSpec};
use namzu_k8s_sim::cluster::Cluster;
use namzu_k8s_sim::PodFault;
use namzu_kubernetes::api::Api;
use namzu_kubernetes::ops::{read_task_capacity, release_task_sandboxes};
use namzu_kubernetes::{KubernetesProvider, CLAIMANT_RBAC};
use serde_json::Value;

type Triple = (String, String, String);

fn recorded(apis: &[&Api]) -> BTreeSet<Triple> {
    apis.iter()
        .flat_map(|a| a.calls())
        .map(|c| (c.group, c.resource, c.verb.as_str().to_owned()))
        .collect()
}

fn role(file: &str) -> BTreeSet<Triple> {
    let path = format!("{}/../../deploy/k8s/{file}", env!("CARGO_MANIFEST_DIR"));
    let role: Value = serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let strs = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_owned())
            .collect()
    };
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        for g in strs(&rule["apiGroups"]) {
            for r in strs(&rule["resources"]) {
                for v in strs(&rule["verbs"]) {
                    out.insert((g.clone(), r.clone(), v));
                }
            }
        }
    }
    out
}

fn both_ways(what: &str, a: &BTreeSet<Triple>, b: &BTreeSet<Triple>) {
    let only_a: Vec<_> = a.difference(b).collect();
    let only_b: Vec<_> = b.difference(a).collect();
    assert!(
        only_a.is_empty() && only_b.is_empty(),
        "{what}: issued but not granted {only_a:?}; granted but never issued {only_b:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claim_only_path_issues_exactly_the_claimant_role() {
    let c = Cluster::start(Some(1)).await.unwrap();
    assert!(c.pool_ready(1, Duration::from_secs(30)).await);
    let mut opts = c.options(true);
    opts.claim_ttl = Duration::from_secs(2);
    let p = KubernetesProvider::new(c.client(), opts.clone()).unwrap();
    let sb = p.create_task(SandboxSpec::default()).await.unwrap();
    sb.commands().run("true").await.unwrap();
    // One renewal at half the TTL.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let again = p.connect(sb.id()).await.unwrap();
    again.commands().run("true").await.unwrap();
    assert!(p.list().await.unwrap().iter().any(|i| i.id == sb.id()));
    sb.destroy().await.unwrap();
    // A failed acquire: the pod diagnosed, the claim given back.
    c.ctl.set_pod_fault(Some(PodFault::Unschedulable));
    let mut slow = opts.clone();
    // Past the controller's 2 s wait for a warm candidate with pod IPs:
    // the claim cold-starts, and that pod is what gets diagnosed.
    slow.ready_timeout = Duration::from_secs(4);
    slow.claim_ttl = Duration::from_secs(60);
    slow.warm_pool_name = Some("namzu-pool".into());
    let failing = KubernetesProvider::new(c.client(), slow).unwrap();
    // The pool's ready pod would be claimed at once; empty it first.
    let hold = p.create_task(SandboxSpec::default()).await.unwrap();
    let r = failing.create(SandboxSpec::default()).await;
    assert!(
        matches!(r.as_ref().err().and_then(|e| e.tier_error::<namzu_kubernetes::KubernetesError>()), Some(namzu_kubernetes::KubernetesError::Acquire(a)) if a.reason == namzu_kubernetes::acquire_error::AcquireReason::Capacity),
        "{:?}",
        r.err()
    );
    // Crash recovery by the backend's pod label.
    let released = release_task_sandboxes(p.api(), &opts, "team!=nobody").await;
    assert!(released.is_ok(), "{released:?}");
    drop(hold);
    let issued = recorded(&[p.api(), failing.api()]);
    let constant: BTreeSet<Triple> = CLAIMANT_RBAC
        .iter()
        .flat_map(|(g, r, vs)| {
            vs.iter()
                .map(move |v| ((*g).to_owned(), (*r).to_owned(), (*v).to_owned()))
        })
        .collect();
    both_ways("CLAIMANT_RBAC", &issued, &constant);
    both_ways("deploy/k8s/rbac-claimant.yaml", &issued, &role("rbac-claimant.yaml"));
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_template_path_and_headroom_stay_inside_the_full_role() {
    use namzu_kubernetes::policy::{translate, KubeEgressConfig, KubeEgressPolicy};
    let c = Cluster::start(Some(1)).await.unwrap();
    // Egress verified too: the named policy and the union.
    let egress = KubeEgressConfig::new(namzu_k8s_sim::cluster::TEMPLATE, KubeEgressPolicy::DenyAll);
    c.sim.put(
        namzu_k8s_sim::controller::NETWORK_POLICIES,
        translate(&egress, namzu_k8s_sim::cluster::NAMESPACE),
    );
    let opts = namzu_kubernetes::KubernetesOptions {
        egress: Some(egress),
        ..c.options(false)
    };
    let p = KubernetesProvider::new(c.client(), opts.clone()).unwrap();
    let sb = p.create_task(SandboxSpec::default()).await.unwrap();
    sb.commands().run("true").await.unwrap();
    sb.destroy().await.unwrap();
    let mut pooled = c.options(true);
    pooled.namespace = opts.namespace.clone();
    read_task_capacity(p.api(), &pooled).await.unwrap();
    let issued = recorded(&[p.api()]);
    let full = role("rbac.yaml");
    let outside: Vec<_> = issued.difference(&full).collect();
    assert!(outside.is_empty(), "issued beyond the full Role: {outside:?}");
    assert!(issued.contains(&("agents.x-k8s.io".into(), "sandboxes".into(), "create".into())));
    assert!(issued.contains(&("networking.k8s.io".into(), "networkpolicies".into(), "list".into())));
    c.stop().await;
}

//! The RBAC the backend needs, proven from what it DOES: every API call
//! goes through the one typed layer, which records (group, resource,
//! verb). The claim path is driven end to end against the simulator with
//! every feature it may turn on — acquire, use, lease renewal, reattach by
//! id, listing, egress verification under core and Cilium, per-sandbox
//! egress (written, replaced, removed), destroy, a failed acquire's
//! diagnosis and cleanup, headroom, crash recovery — and the recorded set,
//! split by Role, must equal the claimant Role (and `CLAIMANT_RBAC`), the
//! opt-in policy-writer Role and the fence reader, each both ways. The
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
    use serde::Deserialize;
    let path = format!("{}/../../deploy/k8s/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(path).unwrap();
    // The Role is the file's first document (its binding follows).
    let role = Value::deserialize(serde_yaml::Deserializer::from_str(&text).next().unwrap()).unwrap();
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

fn triples(rbac: &[(&str, &str, &[&str])]) -> BTreeSet<Triple> {
    rbac.iter()
        .flat_map(|(g, r, vs)| {
            vs.iter()
                .map(move |v| ((*g).to_owned(), (*r).to_owned(), (*v).to_owned()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claim_path_with_every_feature_issues_exactly_the_split_roles() {
    use namzu::egress::policy::{HostPattern, HostRule};
    use namzu::egress::EgressPolicy;
    use namzu_k8s_sim::cluster::{NAMESPACE, TEMPLATE};
    use namzu_k8s_sim::controller::{ADMISSION_BINDINGS, ADMISSION_POLICIES, CILIUM_POLICIES, NETWORK_POLICIES};
    use namzu_kubernetes::policy::per_sandbox::PerSandboxEgress;
    use namzu_kubernetes::policy::{translate, Engine, KubeEgressConfig, KubeEgressPolicy};
    let c = Cluster::start(Some(1)).await.unwrap();
    assert!(c.pool_ready(1, Duration::from_secs(30)).await);
    let fence = |f: &str| -> Value {
        let p = format!("{}/../../deploy/k8s/{f}", env!("CARGO_MANIFEST_DIR"));
        serde_yaml::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    };
    c.sim.put(ADMISSION_POLICIES, fence("admission-fence.yaml"));
    c.sim.put(ADMISSION_BINDINGS, fence("admission-fence-binding.yaml"));
    // Cilium, verified (the named policy and the union), and per-sandbox.
    let cilium = KubeEgressConfig {
        engine: Engine::Cilium,
        per_sandbox: Some(PerSandboxEgress::default()),
        ..KubeEgressConfig::new(TEMPLATE, KubeEgressPolicy::DenyAll)
    };
    c.sim.put(CILIUM_POLICIES, translate(&cilium, NAMESPACE));
    let mut opts = c.options(true);
    opts.claim_ttl = Duration::from_secs(2);
    opts.egress = Some(cilium);
    let p = KubernetesProvider::new(c.client(), opts.clone()).unwrap();
    let sb = p.create_task(SandboxSpec::default()).await.unwrap();
    sb.commands().run("true").await.unwrap();
    // One renewal at half the TTL.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let again = p.connect(sb.id()).await.unwrap();
    again.commands().run("true").await.unwrap();
    assert!(p.list().await.unwrap().iter().any(|i| i.id == sb.id()));
    // Per-sandbox egress: written, replaced (a 409, then a patch), removed.
    let allow = |host: &str| EgressPolicy::Allowlist {
        hosts: vec![HostRule {
            host: HostPattern::Exact(host.into()),
            ports: None,
        }],
    };
    sb.network().set_policy(allow("api.example.com")).await.unwrap();
    sb.network().set_policy(allow("pypi.org")).await.unwrap();
    sb.network()
        .set_policy(EgressPolicy::Allowlist { hosts: vec![] })
        .await
        .unwrap();
    sb.destroy().await.unwrap();
    // Core, verified, on its own provider.
    let core = KubeEgressConfig::new(TEMPLATE, KubeEgressPolicy::DenyAll);
    c.sim.put(NETWORK_POLICIES, translate(&core, NAMESPACE));
    let core_p = KubernetesProvider::new(
        c.client(),
        namzu_kubernetes::KubernetesOptions {
            egress: Some(core),
            ..c.options(true)
        },
    )
    .unwrap();
    core_p
        .create_task(SandboxSpec::default())
        .await
        .unwrap()
        .destroy()
        .await
        .unwrap();
    // A failed acquire: the pod diagnosed, the claim given back.
    c.ctl.set_pod_fault(Some(PodFault::Unschedulable));
    let mut slow = c.options(true);
    // Past the controller's 2 s wait for a warm candidate with pod IPs:
    // the claim cold-starts, and that pod is what gets diagnosed.
    slow.ready_timeout = Duration::from_secs(4);
    let failing = KubernetesProvider::new(c.client(), slow).unwrap();
    // The pool's ready pod would be claimed at once; empty it first.
    let hold = KubernetesProvider::new(c.client(), c.options(true))
        .unwrap()
        .create_task(SandboxSpec::default())
        .await
        .unwrap();
    let r = failing.create(SandboxSpec::default()).await;
    assert!(
        matches!(r.as_ref().err().and_then(|e| e.tier_error::<namzu_kubernetes::KubernetesError>()), Some(namzu_kubernetes::KubernetesError::Acquire(a)) if a.reason == namzu_kubernetes::acquire_error::AcquireReason::Capacity),
        "{:?}",
        r.err()
    );
    // Headroom, and crash recovery by the claims' labels.
    read_task_capacity(p.api(), &opts).await.unwrap();
    let released = release_task_sandboxes(p.api(), &opts, "team!=nobody").await;
    assert!(released.is_ok(), "{released:?}");
    drop(hold);
    let issued = recorded(&[p.api(), core_p.api(), failing.api()]);
    // Split by Role: the fence reads, the opt-in writes, the claimant's rest.
    let fence_reads: BTreeSet<Triple> = issued
        .iter()
        .filter(|t| t.0 == "admissionregistration.k8s.io")
        .cloned()
        .collect();
    let writer = triples(namzu_kubernetes::POLICY_WRITER_RBAC);
    let writes: BTreeSet<Triple> = issued.intersection(&writer).cloned().collect();
    let claimant: BTreeSet<Triple> = issued
        .difference(&fence_reads)
        .filter(|t| !writer.contains(*t))
        .cloned()
        .collect();
    both_ways("CLAIMANT_RBAC", &claimant, &triples(CLAIMANT_RBAC));
    both_ways("deploy/k8s/rbac-claimant.yaml", &claimant, &role("rbac-claimant.yaml"));
    both_ways(
        "deploy/k8s/rbac-policy-writer.yaml",
        &writes,
        &role("rbac-policy-writer.yaml"),
    );
    both_ways(
        "deploy/k8s/rbac-fence-reader.yaml",
        &fence_reads,
        &role("rbac-fence-reader.yaml"),
    );
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

/// Every workspace path — create, use, suspend (flushed), resume, adopt
/// and take over under an epoch, list, the standalone suspend and delete —
/// issues only what the full Role grants; and the verbs a workspace needs
/// beyond a task's reads (patch for the mode and the fence, delete with a
/// precondition) are among what it issued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workspace_paths_stay_inside_the_full_role() {
    use namzu_kubernetes::workspace::{Flush, SuspendOptions};
    use namzu_kubernetes::WorkspaceOptions;
    let c = Cluster::start(None).await.unwrap();
    let p = KubernetesProvider::new(c.client(), c.options(false)).unwrap();
    let q = KubernetesProvider::new(c.client(), c.options(false)).unwrap();
    let ws = p.workspace("rbac", WorkspaceOptions::default()).await.unwrap();
    ws.sandbox().await.unwrap().commands().run("true").await.unwrap();
    ws.suspend(SuspendOptions::default()).await.unwrap();
    ws.resume(Default::default()).await.unwrap();
    let held = WorkspaceOptions {
        epoch: Some(4),
        ..Default::default()
    };
    let other = q.workspace("rbac", held).await.unwrap();
    other.refresh().await.unwrap();
    q.list_workspaces().await.unwrap();
    let skip = SuspendOptions {
        epoch: Some(4),
        flush: Flush::Skip,
        ..Default::default()
    };
    q.suspend_workspace("rbac", skip).await.unwrap();
    q.delete_workspace("rbac", Some(4)).await.unwrap();
    let issued = recorded(&[p.api(), q.api()]);
    let full = role("rbac.yaml");
    let outside: Vec<_> = issued.difference(&full).collect();
    assert!(outside.is_empty(), "issued beyond the full Role: {outside:?}");
    for verb in ["create", "get", "list", "patch", "delete"] {
        assert!(
            issued.contains(&("agents.x-k8s.io".into(), "sandboxes".into(), verb.into())),
            "{verb} sandboxes never issued"
        );
    }
    assert!(issued.contains(&("".into(), "pods".into(), "get".into())));
    c.stop().await;
}

//! Crash recovery and headroom against the simulator, and the status
//! subresource they read: status is set only through `/status`, which
//! changes nothing else.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, SystemTime};

use namzu_k8s_sim::Simulator;
use namzu_kubernetes::api::{Api, Resource, Verb};
use namzu_kubernetes::crd::{NameRef, Sandbox, SandboxClaim, SandboxWarmPool};
use namzu_kubernetes::ops::{read_task_capacity, release_task_sandboxes, TaskCapacity};
use namzu_kubernetes::{build, KubernetesOptions};
use serde_json::json;

async fn api() -> Api {
    let sim = Simulator::new();
    let url = sim.serve().await.unwrap();
    let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
    Api::new(client, Duration::from_secs(5)).unwrap()
}

fn options() -> KubernetesOptions {
    KubernetesOptions {
        namespace: "ns".into(),
        warm_pool_name: Some("pool".into()),
        ..Default::default()
    }
}

fn pool(replicas: i32) -> serde_json::Value {
    let mut p = SandboxWarmPool::named("ns", "pool");
    p.spec.replicas = Some(replicas);
    p.spec.sandbox_template_ref = NameRef { name: "t".into() };
    let mut v = serde_json::to_value(p).unwrap();
    v["status"] = json!({"readyReplicas": 99});
    v
}

#[tokio::test]
async fn status_changes_only_through_its_subresource() {
    let a = api().await;
    let r = Resource::of::<SandboxWarmPool>("ns");
    let made = a.create(&r, &pool(3)).await.unwrap();
    assert!(made.get("status").is_none(), "create kept status: {made}");
    let p = a
        .merge_patch(&r, "pool", &json!({"status": {"readyReplicas": 5}}))
        .await
        .unwrap();
    assert!(p.get("status").is_none(), "the main resource changed status: {p}");
    let s = a
        .merge_patch_status(
            &r,
            "pool",
            &json!({"status": {"readyReplicas": 2}, "spec": {"replicas": 9}}),
        )
        .await
        .unwrap();
    assert_eq!(s["status"]["readyReplicas"], 2);
    assert_eq!(s["spec"]["replicas"], 3, "/status changed spec");
    assert_eq!(s["metadata"]["generation"], 1);
    assert!(a
        .calls()
        .iter()
        .any(|c| c.resource == "sandboxwarmpools/status" && c.verb == Verb::Patch));
}

#[tokio::test]
async fn release_gives_back_exactly_what_matches_and_refuses_an_empty_selector() {
    let a = api().await;
    let opts = options();
    match release_task_sandboxes(&a, &opts, "  ").await {
        Err(namzu::Error::OptionRefused { option, .. }) => assert_eq!(option, "label_selector"),
        other => panic!("{other:?}"),
    }
    assert!(a.calls().is_empty(), "a request went out: {:?}", a.calls());
    let claims = Resource::of::<SandboxClaim>("ns");
    for (name, run) in [("c1", "r1"), ("c2", "r1"), ("c3", "r2")] {
        let mut c = serde_json::to_value(build::claim(&opts, name, name, SystemTime::now())).unwrap();
        c["metadata"]["labels"] = json!({"run": run});
        a.create(&claims, &c).await.unwrap();
    }
    let mut s = serde_json::to_value(Sandbox::named("ns", "s1")).unwrap();
    s["metadata"]["labels"] = json!({"run": "r1"});
    s["spec"]["podTemplate"] = json!({"spec": {"containers": [{"name": "agent"}]}});
    a.create(&Resource::of::<Sandbox>("ns"), &s).await.unwrap();
    let mut released = release_task_sandboxes(&a, &opts, "run=r1").await.unwrap();
    released.sort();
    // A claiming backend gives back claims only (it holds no Sandbox).
    assert_eq!(released, ["c1", "c2"]);
    let direct = KubernetesOptions {
        warm_pool_name: None,
        template_name: Some("t".into()),
        ..options()
    };
    assert_eq!(release_task_sandboxes(&a, &direct, "run=r1").await.unwrap(), ["s1"]);
    let left = a.list(&claims, None).await.unwrap();
    let left: Vec<&str> = left["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(left, ["c3"]);
}

#[tokio::test]
async fn capacity_reads_the_pool_its_claims_and_pending_pods() {
    let a = api().await;
    let opts = options();
    let pools = Resource::of::<SandboxWarmPool>("ns");
    a.create(&pools, &pool(3)).await.unwrap();
    a.merge_patch_status(&pools, "pool", &json!({"status": {"readyReplicas": 2}}))
        .await
        .unwrap();
    let claims = Resource::of::<SandboxClaim>("ns");
    for (name, p, bound) in [("c1", "pool", "s1"), ("c2", "pool", "s2"), ("c3", "other", "s3")] {
        let o = KubernetesOptions {
            warm_pool_name: Some(p.into()),
            ..options()
        };
        a.create(
            &claims,
            &serde_json::to_value(build::claim(&o, name, name, SystemTime::now())).unwrap(),
        )
        .await
        .unwrap();
        a.merge_patch_status(&claims, name, &json!({"status": {"sandbox": {"name": bound}}}))
            .await
            .unwrap();
    }
    // namzu's pods carry no label of namzu's: they are found as the pods
    // of the Sandboxes its claims are bound to.
    let pods = Resource::core("pods", "ns");
    for (name, owner, phase) in [
        ("p1", "s1", Some("Pending")),
        ("p2", "s2", Some("Running")),
        ("p3", "s1", None),
        ("p4", "someone-else", Some("Pending")),
    ] {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "ownerReferences": [{"apiVersion": "agents.x-k8s.io/v1beta1",
                "kind": "Sandbox", "name": owner, "uid": "u", "controller": true}]},
            "spec": {"containers": [{"name": "agent"}]}});
        a.create(&pods, &pod).await.unwrap();
        if let Some(ph) = phase {
            a.merge_patch_status(&pods, name, &json!({"status": {"phase": ph}}))
                .await
                .unwrap();
        }
    }
    assert_eq!(
        read_task_capacity(&a, &opts).await.unwrap(),
        TaskCapacity {
            warm_ready: 2,
            warm_desired: 3,
            active_claims: 2,
            pending_pods: 2,
        }
    );
}

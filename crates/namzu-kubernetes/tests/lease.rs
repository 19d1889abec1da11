//! The lease against the simulator: renewed at half its TTL, failures
//! handed to the callback and retried on the capped backoff until one
//! lands, and a deleted claim stops the loop so the next call is a typed
//! `SandboxGone`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::http::Method;
use namzu_k8s_sim::{Fault, Simulator};
use namzu_kubernetes::api::{Api, ApiError, Resource};
use namzu_kubernetes::crd::SandboxClaim;
use namzu_kubernetes::lease::{Lease, Leased};
use namzu_kubernetes::{build, KubernetesOptions};

const TTL: Duration = Duration::from_secs(2);

async fn setup() -> (Arc<Simulator>, Api, Resource) {
    let sim = Simulator::new();
    let url = sim.serve().await.unwrap();
    let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
    let api = Api::new(client, Duration::from_secs(5)).unwrap();
    let opts = KubernetesOptions {
        namespace: "ns".into(),
        warm_pool_name: Some("pool".into()),
        claim_ttl: TTL,
        ..Default::default()
    };
    let r = Resource::of::<SandboxClaim>("ns");
    let c = build::claim(&opts, "c1", "sb-1", SystemTime::now());
    api.create(&r, &serde_json::to_value(c).unwrap()).await.unwrap();
    (sim, api, r)
}

fn shutdown_of(sim: &Simulator) -> String {
    sim.object("extensions.agents.x-k8s.io", "v1beta1", "sandboxclaims", "ns", "c1")
        .unwrap()["spec"]["lifecycle"]["shutdownTime"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn renewals_move_the_shutdown_time_and_failures_are_retried() {
    let (sim, api, r) = setup().await;
    let first = shutdown_of(&sim);
    let errors = Arc::new(Mutex::new(Vec::new()));
    let seen = errors.clone();
    // The first two renewal attempts fail with 503.
    sim.inject(Fault {
        method: Some(Method::PATCH),
        target: "sandboxclaims/c1".into(),
        status: 503,
        retry_after: None,
        times: 2,
    });
    let lease = Lease::start(
        api.clone(),
        r,
        "c1".into(),
        Leased::Claim,
        TTL,
        Some(Arc::new(move |e: &ApiError| seen.lock().unwrap().push(e.clone()))),
    );
    // Half the TTL, two retries at the 100 ms cap, then a renewal.
    let mut moved = false;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if shutdown_of(&sim) > first {
            moved = true;
            break;
        }
    }
    assert!(moved, "the shutdown time never moved from {first}");
    let errors = errors.lock().unwrap().clone();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(errors
        .iter()
        .all(|e| matches!(e, ApiError::Api { status: Some(503), .. })));
    assert!(lease.check("sb-1").is_ok());
    // Every PATCH went through the recorded layer.
    assert!(
        api.calls()
            .iter()
            .filter(|c| c.verb == namzu_kubernetes::api::Verb::Patch)
            .count()
            >= 3
    );
}

#[tokio::test]
async fn a_deleted_claim_stops_the_lease_and_is_sandbox_gone() {
    let (_sim, api, r) = setup().await;
    let lease = Lease::start(api.clone(), r.clone(), "c1".into(), Leased::Claim, TTL, None);
    api.delete(&r, "c1").await.unwrap();
    let mut gone = None;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Err(e) = lease.check("sb-1") {
            gone = Some(e);
            break;
        }
    }
    assert!(
        matches!(gone, Some(namzu::Error::SandboxGone { ref id }) if id == "sb-1"),
        "{gone:?}"
    );
    // And it stopped: no more PATCHes after the 404.
    let patches = || {
        api.calls()
            .iter()
            .filter(|c| c.verb == namzu_kubernetes::api::Verb::Patch)
            .count()
    };
    let n = patches();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(patches(), n);
}

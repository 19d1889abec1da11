//! The simulator's REST semantics, driven through namzu's own typed API
//! layer (so both are exercised): create with server-owned metadata,
//! AlreadyExists, the CRD schema enforced (unknown fields too), merge patch
//! with a resourceVersion precondition, JSON patch with `test`, label
//! selectors, delete with preconditions, NotFound after.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, SystemTime};

use namzu_k8s_sim::Simulator;
use namzu_kubernetes::api::{Api, ApiError, Resource};
use namzu_kubernetes::crd::SandboxClaim;
use namzu_kubernetes::{build, KubernetesOptions};
use serde_json::json;

async fn api() -> (std::sync::Arc<Simulator>, Api) {
    let sim = Simulator::new();
    let url = sim.serve().await.unwrap();
    let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
    (sim, Api::new(client, Duration::from_secs(5)).unwrap())
}

fn options() -> KubernetesOptions {
    KubernetesOptions {
        namespace: "ns".into(),
        warm_pool_name: Some("pool".into()),
        ..Default::default()
    }
}

fn claim(name: &str, id: &str) -> serde_json::Value {
    serde_json::to_value(build::claim(&options(), name, id, SystemTime::now())).unwrap()
}

#[tokio::test]
async fn create_read_patch_list_delete_follow_the_api_semantics() {
    let (sim, a) = api().await;
    let r = Resource::of::<SandboxClaim>("ns");

    let made = a.create(&r, &claim("c1", "sb-1")).await.unwrap();
    let meta = &made["metadata"];
    assert!(meta["uid"].as_str().is_some_and(|u| u.len() == 36), "{meta}");
    assert_eq!(meta["generation"], 1);
    let rv1 = meta["resourceVersion"].as_str().unwrap().to_owned();
    assert_eq!(
        sim.object("extensions.agents.x-k8s.io", "v1beta1", "sandboxclaims", "ns", "c1")
            .unwrap(),
        made
    );

    // The same name again.
    let again = a.create(&r, &claim("c1", "sb-1")).await.unwrap_err();
    assert!(
        matches!(&again, ApiError::Conflict { message, .. } if message.contains("already exists")),
        "{again:?}"
    );

    // The schema holds: a misspelt field and a missing required one.
    let mut bad = claim("c2", "sb-2");
    bad["spec"]["warmPoolRefs"] = bad["spec"]["warmPoolRef"].take();
    bad["spec"].as_object_mut().unwrap().remove("warmPoolRef");
    let e = a.create(&r, &bad).await.unwrap_err();
    assert!(
        matches!(&e, ApiError::Api { status: Some(422), message, .. }
            if message.contains(".spec.warmPoolRefs: unknown field") && message.contains("\"warmPoolRef\" is missing")),
        "{e:?}"
    );

    // generateName.
    let mut gen = claim("", "sb-3");
    gen["metadata"].as_object_mut().unwrap().remove("name");
    gen["metadata"]["generateName"] = json!("namzu-");
    let g = a.create(&r, &gen).await.unwrap();
    assert!(g["metadata"]["name"].as_str().unwrap().starts_with("namzu-"));

    // Merge patch: a stale resourceVersion is a Conflict, the current one
    // applies; a spec change bumps generation.
    let renew = |rv: &str| json!({"metadata": {"resourceVersion": rv}, "spec": {"lifecycle": {"shutdownTime": "2030-01-01T00:00:00Z"}}});
    let patched = a.merge_patch(&r, "c1", &renew(&rv1)).await.unwrap();
    assert_eq!(patched["spec"]["lifecycle"]["shutdownTime"], "2030-01-01T00:00:00Z");
    assert_eq!(patched["metadata"]["generation"], 2);
    assert_ne!(patched["metadata"]["resourceVersion"].as_str().unwrap(), rv1);
    let stale = a.merge_patch(&r, "c1", &renew(&rv1)).await.unwrap_err();
    assert!(matches!(stale, ApiError::Conflict { .. }), "{stale:?}");
    // A patch the schema refuses leaves the object as it was.
    let e = a
        .merge_patch(&r, "c1", &json!({"spec": {"lifecycle": {"shutdownPolicy": "Never"}}}))
        .await
        .unwrap_err();
    assert!(matches!(e, ApiError::Api { status: Some(422), .. }), "{e:?}");

    // JSON patch: a failing test refuses the whole patch.
    let ops = json!([
        {"op": "test", "path": "/spec/warmPoolRef/name", "value": "other-pool"},
        {"op": "replace", "path": "/spec/lifecycle/shutdownTime", "value": "2031-01-01T00:00:00Z"},
    ]);
    let e = a.json_patch(&r, "c1", &ops).await.unwrap_err();
    assert!(matches!(e, ApiError::Api { status: Some(422), .. }), "{e:?}");
    let ops = json!([
        {"op": "test", "path": "/spec/warmPoolRef/name", "value": "pool"},
        {"op": "replace", "path": "/spec/lifecycle/shutdownTime", "value": "2031-01-01T00:00:00Z"},
    ]);
    let p = a.json_patch(&r, "c1", &ops).await.unwrap();
    assert_eq!(p["spec"]["lifecycle"]["shutdownTime"], "2031-01-01T00:00:00Z");

    // Label selectors: claim labels are on the claims.
    let mut labelled = claim("c4", "sb-4");
    labelled["metadata"]["labels"] = json!({"team": "agents", "run": "r1"});
    a.create(&r, &labelled).await.unwrap();
    let names = |v: serde_json::Value| -> Vec<String> {
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        names(a.list(&r, Some("team=agents,run in (r1,r2)")).await.unwrap()),
        ["c4"]
    );
    assert_eq!(names(a.list(&r, Some("!team")).await.unwrap()).len(), 2);
    let e = a.list(&r, Some("run in r1")).await.unwrap_err();
    assert!(matches!(e, ApiError::Api { status: Some(400), .. }), "{e:?}");

    // Delete, then it is gone; a second delete is AlreadyGone.
    a.delete(&r, "c1").await.unwrap();
    assert!(matches!(
        a.get(&r, "c1").await.unwrap_err(),
        ApiError::AlreadyGone { status: 404, .. }
    ));
    assert!(matches!(
        a.delete(&r, "c1").await.unwrap_err(),
        ApiError::AlreadyGone { status: 404, .. }
    ));
    // Fault knobs: a 429 with Retry-After for the next GET of c4, then
    // normal service.
    sim.inject(namzu_k8s_sim::Fault {
        method: Some(axum::http::Method::GET),
        target: "sandboxclaims/c4".into(),
        status: 429,
        retry_after: Some(2),
        times: 1,
    });
    let e = a.get(&r, "c4").await.unwrap_err();
    assert!(
        matches!(e, ApiError::Api { status: Some(429), retry_after: Some(d), .. } if d == Duration::from_secs(2)),
        "{e:?}"
    );
    assert!(a.get(&r, "c4").await.is_ok());
    // Unknown resources are NotFound too.
    let e = a.get(&Resource::core("secrets", "ns"), "x").await.unwrap_err();
    assert!(matches!(e, ApiError::AlreadyGone { status: 404, .. }), "{e:?}");
}

//! The control-plane SIMULATOR's lifecycle points beyond binding, against
//! how the real API server and agent-sandbox controller behave
//! (`shared/reference/agent-sandbox-controller.md`): graceful pod
//! termination (`deletionTimestamp`, the grace period, the kubelet's last
//! delete), the PVCs of volumeClaimTemplates (made, owned, refused, kept
//! through a pod's replacement, gone with the Sandbox) and the claim's
//! `volumeClaimTemplatesPolicy`, the Events the controller records, a
//! warm pool's readiness grace (replace, or hold the unschedulable and say
//! so), and the CRDs' CEL rules (a Sandbox's volume claim templates are
//! immutable).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use namzu_k8s_sim::cluster::{Cluster, NAMESPACE, POOL, TEMPLATE};
use namzu_k8s_sim::controller::{
    PodFault, ADOPTABLE_LABEL, CLAIMS, EVENTS, NAME_HASH_LABEL, NODE_NAME, PODS, POOLS, PVCS, SANDBOXES, TEMPLATES,
};
use namzu_kubernetes::api::Resource;
use namzu_kubernetes::crd::{Sandbox, SandboxTemplate, SandboxWarmPool};
use serde_json::{json, Value};

mod common;
use common::sim::*;

/// The events recorded about `name`, as (type, reason, action, note).
fn events(c: &Cluster, name: &str) -> Vec<(String, String, String, String)> {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let mut all = c.sim.all(EVENTS);
    // In the order recorded.
    all.sort_by_key(|e| {
        e["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|v| v.parse::<u64>().ok())
    });
    all.iter()
        .filter(|e| e["regarding"]["name"] == name)
        .map(|e| (s(&e["type"]), s(&e["reason"]), s(&e["action"]), s(&e["note"])))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pod_terminates_gracefully_and_only_then_is_replaced() {
    let c = Cluster::start(None).await.unwrap();
    let a = api(&c);
    a.create(
        &Resource::of::<Sandbox>(NAMESPACE),
        &sandbox(&c, "grace", Some(true), json!({})),
    )
    .await
    .unwrap();
    reason_of(&c, SANDBOXES, "grace", "DependenciesReady").await;
    let pod = c.get(PODS, "grace").unwrap();
    assert_eq!(pod["spec"]["nodeName"], NODE_NAME, "a running pod is bound to the node");
    let uid = pod["metadata"]["uid"].clone();
    // DELETE answers with the pod still there, marked.
    let pods = Resource::core("pods", NAMESPACE);
    let client = c.client();
    let req = http::Request::delete(format!("/api/v1/namespaces/{NAMESPACE}/pods/grace"))
        .body(Vec::new())
        .unwrap();
    let answered: Value = client.request(req).await.unwrap();
    assert_eq!(answered["metadata"]["uid"], uid);
    assert!(answered["metadata"]["deletionTimestamp"].is_string(), "{answered}");
    assert_eq!(answered["metadata"]["deletionGracePeriodSeconds"], 30);
    // While it terminates: the same pod, not Ready, and the Sandbox not
    // Ready either; no second pod of that name is made.
    let terminating = until(5, || {
        let p = c.get(PODS, "grace")?;
        (p["metadata"]["uid"] == uid && ready(&p).0.starts_with("False")).then_some(p)
    })
    .await;
    if let Some(p) = terminating {
        assert!(p["metadata"]["deletionTimestamp"].is_string());
    }
    // Stopped by its kubelet, then gone, then replaced (a new uid).
    let next = until(20, || {
        c.get(PODS, "grace")
            .filter(|p| p["metadata"]["uid"] != uid && p["status"]["phase"] == "Running")
    })
    .await
    .expect("never replaced");
    assert!(next["metadata"]["deletionTimestamp"].is_null());
    reason_of(&c, SANDBOXES, "grace", "DependenciesReady").await;
    // A second DELETE of a terminating pod changes nothing; grace 0 is at once.
    let _ = a.get(&pods, "grace").await.unwrap();
    let req = http::Request::delete(format!("/api/v1/namespaces/{NAMESPACE}/pods/grace"))
        .body(serde_json::to_vec(&json!({"gracePeriodSeconds": 0})).unwrap())
        .unwrap();
    let _: Value = client.request(req).await.unwrap();
    assert!(
        c.get(PODS, "grace")
            .is_none_or(|p| p["metadata"]["uid"] != next["metadata"]["uid"]),
        "a zero grace period still waited"
    );
    // A pod never scheduled has no kubelet to wait for: gone at once.
    c.ctl.set_pod_fault(Some(PodFault::Unschedulable));
    a.create(
        &Resource::of::<Sandbox>(NAMESPACE),
        &sandbox(&c, "nowhere", Some(true), json!({})),
    )
    .await
    .unwrap();
    let p = until(10, || {
        c.get(PODS, "nowhere").filter(|p| !p["status"]["conditions"].is_null())
    })
    .await
    .unwrap();
    assert!(p["spec"]["nodeName"].is_null());
    c.sim.remove(PODS, NAMESPACE, "nowhere");
    assert!(
        c.get(PODS, "nowhere")
            .is_none_or(|q| q["metadata"]["uid"] != p["metadata"]["uid"]),
        "an unscheduled pod was kept terminating"
    );
    c.ctl.set_pod_fault(None);
    c.stop().await;
}

/// Retries `f` every 100 ms until it succeeds, for at most `secs`.
async fn until_ok<T, F, Fut>(secs: u64, f: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = namzu::Result<T>>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) if std::time::Instant::now() < deadline => {
                tracing::debug!("not yet: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("never succeeded: {e}"),
        }
    }
}

/// A template whose pods mount a volumeClaimTemplate `data` at /data.
fn with_data(t: &mut Value) {
    t["spec"]["volumeClaimTemplates"] = json!([{"metadata": {"name": "data", "labels": {"tier": "scratch"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]);
    let mounts = &mut t["spec"]["podTemplate"]["spec"]["containers"][0]["volumeMounts"];
    mounts
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "data", "mountPath": "/data"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_claim_templates_make_owned_pvcs_that_outlive_the_pod_not_the_sandbox() {
    let c = Cluster::start(None).await.unwrap();
    let a = api(&c);
    a.create(
        &Resource::of::<SandboxTemplate>(NAMESPACE),
        &template_like(&c, "disk", with_data),
    )
    .await
    .unwrap();
    let p = namzu_kubernetes::KubernetesProvider::new(
        c.client(),
        namzu_kubernetes::KubernetesOptions {
            template_name: Some("disk".into()),
            ..c.options(false)
        },
    )
    .unwrap()
    // A replaced pod says nothing: the link notices by its keepalive.
    .with_client_options(namzu::ClientOptions {
        keepalive: Duration::from_secs(1),
        ..Default::default()
    });
    let sb = p.create_task(namzu::SandboxSpec::default()).await.unwrap();
    let name = sb
        .backend::<namzu_kubernetes::KubernetesSandbox>()
        .unwrap()
        .bound()
        .sandbox
        .clone();
    let pvc = c.get(PVCS, &format!("data-{name}")).expect("no PVC data-<sandbox>");
    let sandbox = c.get(SANDBOXES, &name).unwrap();
    let owner = &pvc["metadata"]["ownerReferences"][0];
    assert_eq!(
        (
            owner["kind"].as_str(),
            owner["uid"].clone(),
            owner["controller"].as_bool()
        ),
        (Some("Sandbox"), sandbox["metadata"]["uid"].clone(), Some(true))
    );
    assert_eq!(pvc["metadata"]["labels"]["tier"], "scratch");
    assert_eq!(
        pvc["metadata"]["labels"][NAME_HASH_LABEL],
        json!(namzu_k8s_sim::controller::name_hash(&name))
    );
    let pod = c.get(PODS, &name).unwrap();
    let vol = pod["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "data")
        .cloned()
        .unwrap();
    assert_eq!(vol["persistentVolumeClaim"]["claimName"], format!("data-{name}"));
    // What is written there outlives the pod.
    let out = sb.commands().run("echo kept > /data/f && cat /data/f").await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "kept\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.ctl.replace_pod(&c.sim, NAMESPACE, &name).await;
    let back = until(20, || {
        c.get(PODS, &name)
            .filter(|p| p["metadata"]["uid"] != pod["metadata"]["uid"] && p["status"]["phase"] == "Running")
    })
    .await
    .expect("no new pod");
    assert_ne!(back["status"]["podIP"], Value::Null);
    // The handle follows the new pod (a call in flight on the dead link
    // may fail first).
    let out = until_ok(30, || sb.commands().run("cat /data/f")).await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "kept\n",
        "the PVC's data did not outlive the pod"
    );
    // The Sandbox gone, its PVC follows (the garbage collector).
    sb.destroy().await.unwrap();
    assert!(
        until(10, || c.get(PVCS, &format!("data-{name}")).is_none().then_some(()))
            .await
            .is_some()
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pvc_someone_else_owns_stops_the_sandbox_and_an_unowned_one_needs_a_label() {
    let c = Cluster::start(None).await.unwrap();
    let a = api(&c);
    let pvc = |name: &str, meta_extra: Value| {
        let mut m = json!({"name": name, "namespace": NAMESPACE});
        json_patch::merge(&mut m, &meta_extra);
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": m,
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
    };
    let t = c.get(TEMPLATES, TEMPLATE).unwrap();
    let mut blueprint = json!({"spec": t["spec"].clone()});
    with_data(&mut blueprint);
    let vcts = blueprint["spec"]["volumeClaimTemplates"].clone();
    // Another Sandbox's (an owner that exists: the garbage collector
    // takes a dependent whose owner does not).
    let sandboxes = Resource::of::<Sandbox>(NAMESPACE);
    let other = a
        .create(&sandboxes, &sandbox(&c, "other", Some(true), json!({})))
        .await
        .unwrap();
    let other_uid = other["metadata"]["uid"].as_str().unwrap().to_owned();
    c.sim.put(
        PVCS,
        pvc(
            "data-taken",
            json!({"ownerReferences": [{"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox", "name": "other",
                "uid": other_uid, "controller": true}]}),
        ),
    );
    c.sim.put(PVCS, pvc("data-stray", json!({})));
    c.sim
        .put(PVCS, pvc("data-offered", json!({"labels": {ADOPTABLE_LABEL: "true"}})));
    for name in ["taken", "stray", "offered"] {
        a.create(
            &sandboxes,
            &sandbox(&c, name, Some(true), json!({"volumeClaimTemplates": vcts.clone()})),
        )
        .await
        .unwrap();
    }
    let (_, msg) = reason_of(&c, SANDBOXES, "taken", "ReconcilerError").await;
    assert!(
        msg.contains(&format!(
            "PVC \"data-taken\" is owned by Sandbox/other (UID: {other_uid}), not by sandbox \"taken\""
        )),
        "{msg}"
    );
    let (_, msg) = reason_of(&c, SANDBOXES, "stray", "ReconcilerError").await;
    assert!(msg.contains("cannot adopt unowned PVC \"data-stray\""), "{msg}");
    assert!(c.get(PODS, "taken").is_none() && c.get(PODS, "stray").is_none());
    // Offered by the adoptable label: adopted, and the Sandbox runs.
    reason_of(&c, SANDBOXES, "offered", "DependenciesReady").await;
    let adopted = c.get(PVCS, "data-offered").unwrap();
    assert_eq!(
        adopted["metadata"]["ownerReferences"][0]["uid"],
        c.get(SANDBOXES, "offered").unwrap()["metadata"]["uid"]
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claims_volume_claim_templates_follow_the_templates_policy_and_go_cold() {
    let c = Cluster::start(Some(1)).await.unwrap();
    assert!(c.pool_ready(1, Duration::from_secs(30)).await);
    let a = api(&c);
    let scratch = json!([{"metadata": {"name": "scratch"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]);
    // The CRD default, Disallowed: refused, for good.
    a.create(
        &claims(),
        &claim("vct-no", POOL, json!({"volumeClaimTemplates": scratch.clone()})),
    )
    .await
    .unwrap();
    let (_, msg) = reason_of(&c, CLAIMS, "vct-no", "VolumeClaimTemplatesError").await;
    assert!(
        msg.contains("volume claim templates are disallowed by the template"),
        "{msg}"
    );
    assert!(c.get(SANDBOXES, "vct-no").is_none());
    assert_eq!(
        c.get(TEMPLATES, TEMPLATE).unwrap()["spec"]["volumeClaimTemplatesPolicy"],
        "Disallowed",
        "the CRD default"
    );
    // Allowed: appended, never overriding the template's own; cold.
    a.create(
        &Resource::of::<SandboxTemplate>(NAMESPACE),
        &template_like(&c, "disky", |t| {
            with_data(t);
            t["spec"]["volumeClaimTemplatesPolicy"] = json!("Allowed");
        }),
    )
    .await
    .unwrap();
    a.create(
        &Resource::of::<SandboxWarmPool>(NAMESPACE),
        &json!({"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
            "metadata": {"name": "disky", "namespace": NAMESPACE},
            "spec": {"replicas": 1, "sandboxTemplateRef": {"name": "disky"}}}),
    )
    .await
    .unwrap();
    let data = json!([{"metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "2Gi"}}}}]);
    a.create(
        &claims(),
        &claim("vct-over", "disky", json!({"volumeClaimTemplates": data})),
    )
    .await
    .unwrap();
    let (_, msg) = reason_of(&c, CLAIMS, "vct-over", "VolumeClaimTemplatesError").await;
    assert!(msg.contains("cannot override template volume \"data\""), "{msg}");
    a.create(
        &claims(),
        &claim("vct-yes", "disky", json!({"volumeClaimTemplates": scratch})),
    )
    .await
    .unwrap();
    reason_of(&c, CLAIMS, "vct-yes", "DependenciesReady").await;
    let sb = c
        .get(SANDBOXES, "vct-yes")
        .expect("a cold Sandbox named after the claim");
    assert_eq!(sb["metadata"]["labels"]["agents.x-k8s.io/launch-type"], "cold");
    let names: Vec<&str> = sb["spec"]["volumeClaimTemplates"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, ["data", "scratch"]);
    assert!(c.get(PVCS, "data-vct-yes").is_some() && c.get(PVCS, "scratch-vct-yes").is_some());
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_records_adoption_and_expiry_as_events() {
    let c = Cluster::start(Some(1)).await.unwrap();
    assert!(c.pool_ready(1, Duration::from_secs(30)).await);
    let a = api(&c);
    let soon = namzu_kubernetes::build::rfc3339(std::time::SystemTime::now() + Duration::from_secs(3));
    a.create(
        &claims(),
        &claim(
            "noted",
            POOL,
            json!({"lifecycle": {"shutdownTime": soon, "shutdownPolicy": "Delete"}}),
        ),
    )
    .await
    .unwrap();
    reason_of(&c, CLAIMS, "noted", "DependenciesReady").await;
    let adopted = events(&c, "noted");
    assert_eq!(adopted.len(), 1, "{adopted:?}");
    let (ty, reason, action, note) = &adopted[0];
    assert_eq!(
        (ty.as_str(), reason.as_str(), action.as_str()),
        ("Normal", "SandboxAdopted", "Adoption")
    );
    assert!(note.starts_with("Adopted warm pool Sandbox \"namzu-pool-"), "{note}");
    let e = c
        .sim
        .all(EVENTS)
        .into_iter()
        .find(|e| e["regarding"]["name"] == "noted")
        .unwrap();
    assert_eq!(e["regarding"]["kind"], "SandboxClaim");
    assert_eq!(e["reportingController"], "agent-sandbox-controller");
    // Expiry: marked (one event), then deleted under Delete (another).
    until(15, || c.get(CLAIMS, "noted").is_none().then_some(()))
        .await
        .expect("the claim outlived its shutdown time");
    let reasons: Vec<(String, String)> = events(&c, "noted")
        .into_iter()
        .skip(1)
        .map(|(_, r, a, _)| (r, a))
        .collect();
    assert_eq!(
        reasons,
        [
            ("ClaimExpired".to_owned(), "Claim Expired".to_owned()),
            ("ClaimExpired".to_owned(), "Deleting".to_owned())
        ]
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_replaces_sandboxes_not_ready_past_its_grace_but_holds_unschedulable_ones() {
    let c = Cluster::start_with(None, |cfg| cfg.pool_readiness_grace = Duration::from_secs(1))
        .await
        .unwrap();
    let pool_sandboxes = |c: &Cluster| -> Vec<String> {
        c.sim
            .all(SANDBOXES)
            .iter()
            .filter(|s| s["metadata"]["ownerReferences"][0]["kind"] == "SandboxWarmPool")
            .map(|s| s["metadata"]["name"].as_str().unwrap().to_owned())
            .collect()
    };
    // A pull that never succeeds: past the grace, the Sandbox is replaced.
    c.ctl.set_pod_fault(Some(PodFault::ImagePull));
    c.add_pool(1).unwrap();
    let first = until(10, || pool_sandboxes(&c).pop()).await.unwrap();
    let replaced = until(15, || pool_sandboxes(&c).into_iter().find(|n| *n != first)).await;
    assert!(
        replaced.is_some(),
        "a Sandbox stuck in ImagePullBackOff was never replaced"
    );
    assert!(events(&c, POOL).is_empty(), "{:?}", events(&c, POOL));
    // Unschedulable: held past the grace, and the pool says so, once.
    c.ctl.set_pod_fault(Some(PodFault::Unschedulable));
    for n in pool_sandboxes(&c) {
        c.sim.remove(SANDBOXES, NAMESPACE, &n);
    }
    let held = until(10, || {
        pool_sandboxes(&c)
            .into_iter()
            .find(|n| Some(n) != replaced.as_ref() && *n != first)
    })
    .await
    .unwrap();
    let warned = until(15, || {
        let e = events(&c, POOL);
        (!e.is_empty()).then_some(e)
    })
    .await
    .expect("no event about the stuck pool");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        pool_sandboxes(&c).as_slice(),
        std::slice::from_ref(&held),
        "an unschedulable Sandbox was replaced"
    );
    assert_eq!(events(&c, POOL).len(), 1, "re-emitted: {:?}", events(&c, POOL));
    let (ty, reason, action, note) = &warned[0];
    assert_eq!(
        (ty.as_str(), reason.as_str(), action.as_str()),
        ("Warning", "WarmPoolNotProgressing", "Reconciling")
    );
    assert_eq!(
        note,
        "1/1 sandboxes are unschedulable past the 1s readiness grace period; holding them instead of replacing (replacements would be equally unschedulable)"
    );
    // Capacity back (the held one given up): progressing again, said once.
    c.ctl.set_pod_fault(None);
    c.sim.remove(SANDBOXES, NAMESPACE, &held);
    assert!(c.pool_ready(1, Duration::from_secs(30)).await);
    let e = until(10, || {
        let e = events(&c, POOL);
        (e.len() == 2).then_some(e)
    })
    .await
    .expect("no progressing-again event");
    assert_eq!(
        (e[1].0.as_str(), e[1].1.as_str(), e[1].3.as_str()),
        ("Normal", "WarmPoolProgressing", "Warm pool is progressing again")
    );
    assert!(c.get(POOLS, POOL).is_some());
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxs_volume_claim_templates_are_immutable_as_the_crds_cel_rule_says() {
    use namzu_kubernetes::api::ApiError;
    let c = Cluster::start(None).await.unwrap();
    let a = api(&c);
    let sandboxes = Resource::of::<Sandbox>(NAMESPACE);
    let vct = |size: &str| {
        json!([{"metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}}])
    };
    let suspended = json!({"operatingMode": "Suspended"});
    a.create(
        &sandboxes,
        &sandbox(
            &c,
            "fixed",
            Some(true),
            json!({"volumeClaimTemplates": vct("1Gi"), "operatingMode": "Suspended"}),
        ),
    )
    .await
    .unwrap();
    a.create(&sandboxes, &sandbox(&c, "bare", Some(true), suspended))
        .await
        .unwrap();
    let refused = |r: Result<Value, ApiError>| match r {
        Err(ApiError::Api {
            status: Some(422),
            message,
            ..
        }) => message,
        other => panic!("not refused: {other:?}"),
    };
    for (name, patch) in [
        ("fixed", json!({"spec": {"volumeClaimTemplates": vct("2Gi")}})),
        ("fixed", json!({"spec": {"volumeClaimTemplates": null}})),
        ("bare", json!({"spec": {"volumeClaimTemplates": vct("1Gi")}})),
    ] {
        let m = refused(a.merge_patch(&sandboxes, name, &patch).await);
        assert!(m.contains("volumeClaimTemplates is immutable"), "{name}: {m}");
        assert!(!m.contains("evaluation error"), "the rule did not evaluate: {m}");
        assert!(m.contains("spec"), "{m}");
    }
    assert_eq!(
        c.get(SANDBOXES, "fixed").unwrap()["spec"]["volumeClaimTemplates"],
        vct("1Gi"),
        "a refused patch changed the object"
    );
    // Another field of the same spec is free to change.
    a.merge_patch(&sandboxes, "fixed", &json!({"spec": {"operatingMode": "Running"}}))
        .await
        .unwrap();
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_mirrors_its_pods_scheduling_and_says_it_is_not_suspended() {
    let c = Cluster::start(None).await.unwrap();
    let a = api(&c);
    let sandboxes = Resource::of::<Sandbox>(NAMESPACE);
    let cond = |c: &Cluster, name: &str, kind: &str| {
        c.get(SANDBOXES, name)?["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|x| x["type"] == kind)
            .cloned()
    };
    a.create(&sandboxes, &sandbox(&c, "placed", Some(true), json!({})))
        .await
        .unwrap();
    reason_of(&c, SANDBOXES, "placed", "DependenciesReady").await;
    let s = cond(&c, "placed", "PodScheduled").unwrap();
    assert_eq!(
        (s["status"].as_str(), s["reason"].as_str()),
        (Some("True"), Some("PodScheduled"))
    );
    let s = cond(&c, "placed", "Suspended").unwrap();
    assert_eq!(
        (s["status"].as_str(), s["reason"].as_str()),
        (Some("False"), Some("NotSuspended"))
    );
    // The scheduler's reason and message, verbatim.
    c.ctl.set_pod_fault(Some(PodFault::Unschedulable));
    a.create(&sandboxes, &sandbox(&c, "unplaced", Some(true), json!({})))
        .await
        .unwrap();
    let s = until(10, || {
        cond(&c, "unplaced", "PodScheduled").filter(|s| s["status"] == "False")
    })
    .await
    .expect("PodScheduled not mirrored");
    assert_eq!(s["reason"], "Unschedulable");
    assert!(
        s["message"].as_str().unwrap().starts_with("0/1 nodes are available"),
        "{s}"
    );
    c.ctl.set_pod_fault(None);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_claim_expires_ttl_seconds_after_it_finished() {
    let c = Cluster::start(Some(1)).await.unwrap();
    assert!(c.pool_ready(1, Duration::from_secs(30)).await);
    let a = api(&c);
    a.create(
        &claims(),
        &claim(
            "done",
            POOL,
            json!({"lifecycle": {"shutdownPolicy": "Delete", "ttlSecondsAfterFinished": 1}}),
        ),
    )
    .await
    .unwrap();
    reason_of(&c, CLAIMS, "done", "DependenciesReady").await;
    // No shutdown time and not finished: it stays.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(c.get(CLAIMS, "done").is_some(), "expired before it finished");
    // Its pod fails: the claim mirrors Finished, and a second later it goes.
    let sb = c.get(CLAIMS, "done").unwrap()["status"]["sandbox"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    c.ctl.evict_pod(&c.sim, NAMESPACE, &sb).await;
    let finished = until(10, || {
        let cl = c.get(CLAIMS, "done")?;
        cl["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|x| x["type"] == "Finished" && x["status"] == "True")
            .cloned()
    })
    .await
    .expect("the claim never mirrored Finished");
    assert_eq!(finished["reason"], "PodFailed");
    if until(10, || c.get(CLAIMS, "done").is_none().then_some(()))
        .await
        .is_none()
    {
        panic!(
            "the finished claim outlived its TTL: {:?}",
            c.get(CLAIMS, "done").map(|c| (c["spec"].clone(), c["status"].clone()))
        );
    }
    let reasons: Vec<String> = events(&c, "done").into_iter().map(|e| e.2).collect();
    assert!(
        reasons.ends_with(&["Claim Expired".to_owned(), "Deleting".to_owned()]),
        "{reasons:?}"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_controlling_two_pods_refuses_to_choose_and_says_so() {
    let c = Cluster::start(None).await.unwrap();
    let a = api(&c);
    let made = a
        .create(
            &Resource::of::<Sandbox>(NAMESPACE),
            &sandbox(&c, "twin", Some(true), json!({})),
        )
        .await
        .unwrap();
    reason_of(&c, SANDBOXES, "twin", "DependenciesReady").await;
    // A second pod naming the Sandbox its controller (never scheduled).
    c.ctl.set_pod_fault(Some(PodFault::Unschedulable));
    let mut twin = c.get(PODS, "twin").unwrap();
    twin["metadata"] = json!({"name": "twin-2", "namespace": NAMESPACE,
        "ownerReferences": twin["metadata"]["ownerReferences"].clone()});
    twin["status"] = json!({"phase": "Pending"});
    c.sim.put(PODS, twin);
    let (_, msg) = reason_of(&c, SANDBOXES, "twin", "MultiplePods").await;
    assert_eq!(
        msg,
        "multiple Pods (2) are controlled by this Sandbox; refusing to choose or create a Pod"
    );
    assert_eq!(
        c.get(SANDBOXES, "twin").unwrap()["metadata"]["uid"],
        made["metadata"]["uid"]
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let warned: Vec<_> = events(&c, "twin")
        .into_iter()
        .filter(|e| e.1 == "MultiplePods")
        .collect();
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert_eq!(warned[0].0, "Warning");
    // The stray gone: back to its one pod.
    c.sim.purge(PODS, NAMESPACE, "twin-2");
    reason_of(&c, SANDBOXES, "twin", "DependenciesReady").await;
    c.ctl.set_pod_fault(None);
    c.stop().await;
}

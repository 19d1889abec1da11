//! The control-plane SIMULATOR's agent-sandbox controller, point by point
//! against how the real controller behaves (kubernetes-sigs/agent-sandbox
//! v1beta1; `shared/reference/agent-sandbox-controller.md` names the source
//! file of each point): claims refused or bound as it refuses and binds
//! them, warm adoption, the cold path, Services, readiness, expiry, pod
//! replacement and eviction, pools, templates and their NetworkPolicy, and
//! the API server's defaulting and naming. Objects go in through the API
//! (POST, PATCH) as a host's would; pods are real local sandboxes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use namzu_k8s_sim::cluster::{Cluster, NAMESPACE, POOL, TEMPLATE};
use namzu_k8s_sim::controller::{
    name_hash, PodFault, CLAIMS, CLAIM_UID_LABEL, LAUNCH_TYPE_LABEL, NAME_HASH_LABEL, NETWORK_POLICIES, PODS,
    POD_NAME_ANNOTATION, POOLS, POOL_LABEL, SANDBOXES, SANDBOX_NAME_ANNOTATION, SERVICES, TEMPLATES,
    TEMPLATE_HASH_LABEL,
};
use namzu_kubernetes::api::{ApiError, Resource};
use namzu_kubernetes::crd::{Sandbox, SandboxTemplate, SandboxWarmPool};
use serde_json::{json, Value};

mod common;
use common::sim::*;

#[test]
fn the_name_hash_is_fnv1a_32() {
    // The published FNV-1a test vectors.
    assert_eq!(name_hash(""), "811c9dc5");
    assert_eq!(name_hash("a"), "e40c292c");
    assert_eq!(name_hash("foobar"), "bf9cf968");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_metadata_is_checked_first_against_the_label_allowlist() {
    let c = Cluster::start(None).await.unwrap();
    let a = api(&c);
    // Past the check, the claim meets the missing pool: the reason tells
    // which side of the check it landed on.
    let cases: [(&str, Value, &str, &str); 8] = [
        (
            "ok-default",
            json!({"labels": {"sandbox.users.io/who": "me"}}),
            "WarmPoolNotFound",
            "",
        ),
        (
            "ok-sub",
            json!({"labels": {"team.sandbox.users.io/who": "me"}}),
            "WarmPoolNotFound",
            "",
        ),
        (
            "ok-annotation",
            json!({"annotations": {"example.com/note": "x"}}),
            "WarmPoolNotFound",
            "",
        ),
        (
            "other-domain",
            json!({"labels": {"io.namzu/sandbox": "sb-1"}}),
            "InvalidMetadata",
            "label domain \"io.namzu\" is not in the allowlist",
        ),
        (
            "managed-by",
            json!({"labels": {"app.kubernetes.io/managed-by": "namzu"}}),
            "InvalidMetadata",
            "not in the allowlist",
        ),
        (
            "no-prefix",
            json!({"labels": {"tier": "task"}}),
            "InvalidMetadata",
            "must have a domain prefix",
        ),
        (
            "router",
            json!({"labels": {"app": "sandbox-router"}}),
            "InvalidMetadata",
            "restricted system label",
        ),
        (
            "annotation",
            json!({"annotations": {"agents.x-k8s.io/pod-name": "x"}}),
            "InvalidMetadata",
            "restricted system domain",
        ),
    ];
    for (name, md, reason, words) in &cases {
        a.create(&claims(), &claim(name, "nope", json!({"additionalPodMetadata": md})))
            .await
            .unwrap();
        let (_, message) = reason_of(&c, CLAIMS, name, reason).await;
        assert!(message.contains(words), "{name}: {message}");
        if *reason == "InvalidMetadata" {
            assert!(message.starts_with("invalid additionalPodMetadata: "), "{message}");
        }
    }
    c.stop().await;
    // An operator's allowlist replaces the built-in one.
    let c = Cluster::start_with(None, |cfg| cfg.allowed_label_domains = Some(" Example.com\n".into()))
        .await
        .unwrap();
    let a = api(&c);
    for (name, key, reason) in [
        ("ours", "x.example.com/who", "WarmPoolNotFound"),
        ("builtin", "sandbox.users.io/who", "InvalidMetadata"),
    ] {
        a.create(
            &claims(),
            &claim(name, "nope", json!({"additionalPodMetadata": {"labels": {key: "me"}}})),
        )
        .await
        .unwrap();
        reason_of(&c, CLAIMS, name, reason).await;
    }
    // A missing pool is not final: the claim binds once it appears.
    a.create(&Resource::of::<SandboxWarmPool>(NAMESPACE), &pool("nope", TEMPLATE, 0))
        .await
        .unwrap();
    let bound = until(10, || {
        c.get(CLAIMS, "ours")?["status"]["sandbox"]["name"]
            .as_str()
            .map(String::from)
    })
    .await;
    assert_eq!(
        bound.as_deref(),
        Some("ours"),
        "cold-started after the grace, named after the claim"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_injection_and_label_overrides_follow_the_template() {
    let c = Cluster::start(None).await.unwrap();
    let a = api(&c);
    let templates = Resource::of::<SandboxTemplate>(NAMESPACE);
    let pools = Resource::of::<SandboxWarmPool>(NAMESPACE);
    let token = namzu_kubernetes::build::TOKEN_ENV;
    for (t, edit) in [
        ("t-disallowed", json!({"envVarsInjectionPolicy": null})),
        ("t-allowed", json!({})),
        ("t-overrides", json!({"envVarsInjectionPolicy": "Overrides"})),
    ] {
        let body = template_like(&c, t, |v| json_patch::merge(&mut v["spec"], &edit));
        a.create(&templates, &body).await.unwrap();
        a.create(&pools, &pool(t, t, 0)).await.unwrap();
    }
    let env_from = template_like(&c, "t-envfrom", |v| {
        v["spec"]["podTemplate"]["spec"]["containers"][0]["envFrom"] = json!([{"configMapRef": {"name": "cm"}}]);
    });
    a.create(&templates, &env_from).await.unwrap();
    a.create(&pools, &pool("t-envfrom", "t-envfrom", 0)).await.unwrap();
    let labelled = template_like(&c, "t-labelled", |v| {
        v["spec"]["podTemplate"]["metadata"]["labels"]["sandbox.users.io/tier"] = json!("a");
    });
    a.create(&templates, &labelled).await.unwrap();
    a.create(&pools, &pool("t-labelled", "t-labelled", 0)).await.unwrap();
    let env = |name: &str, container: Option<&str>| {
        let mut e = json!({"name": name, "value": "v"});
        if let Some(c) = container {
            e["containerName"] = json!(c);
        }
        json!({"env": [e]})
    };
    for (name, pool_name, spec, reason, words) in [
        // CRD default Disallowed: any env at all.
        (
            "c-disallowed",
            "t-disallowed",
            env("X", None),
            "EnvVarsInjectionRejected",
            "not allowed by the template policy",
        ),
        (
            "c-envfrom",
            "t-envfrom",
            env("X", None),
            "EnvVarsInjectionRejected",
            "EnvFrom",
        ),
        // Retried, not terminal — though only a changed claim can pass.
        (
            "c-clash",
            "t-allowed",
            env(token, None),
            "ReconcilerError",
            "environment variable override is not allowed",
        ),
        (
            "c-unknown",
            "t-allowed",
            env("X", Some("sidecar")),
            "ReconcilerError",
            "\"sidecar\" not found in template",
        ),
        (
            "c-label",
            "t-labelled",
            json!({"additionalPodMetadata": {"labels": {"sandbox.users.io/tier": "b"}}}),
            "ReconcilerError",
            "metadata override conflict",
        ),
    ] {
        a.create(&claims(), &claim(name, pool_name, spec)).await.unwrap();
        let (_, message) = reason_of(&c, CLAIMS, name, reason).await;
        assert!(message.contains(words), "{name}: {message}");
        assert!(c.get(SANDBOXES, name).is_none(), "{name} made a Sandbox");
    }
    // Overrides replaces what the template sets; env forces the cold path.
    a.create(&claims(), &claim("c-overrides", "t-overrides", env(token, None)))
        .await
        .unwrap();
    let sb = until(10, || c.get(SANDBOXES, "c-overrides")).await.unwrap();
    let envs = &sb["spec"]["podTemplate"]["spec"]["containers"][0]["env"];
    let tokens: Vec<&Value> = envs.as_array().unwrap().iter().filter(|e| e["name"] == token).collect();
    assert_eq!(tokens.len(), 1, "{envs}");
    assert_eq!(tokens[0]["value"], "v");
    assert_eq!(sb["metadata"]["labels"][LAUNCH_TYPE_LABEL], "cold");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_waits_two_seconds_for_a_warm_pod_with_ips_then_cold_starts() {
    let c = Cluster::start(None).await.unwrap();
    // The pool's pod never schedules: a warm Sandbox with no pod IPs is no
    // candidate.
    c.ctl.set_pod_fault(Some(PodFault::Unschedulable));
    c.add_pool(1).unwrap();
    let warm = until(10, || {
        c.sim
            .all(SANDBOXES)
            .into_iter()
            .find(|s| s["metadata"]["labels"][POOL_LABEL].is_string())
    })
    .await
    .unwrap();
    let started = Instant::now();
    api(&c)
        .create(&claims(), &claim("late", POOL, json!({})))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(c.get(SANDBOXES, "late").is_none(), "cold-started inside the grace");
    assert!(c.get(CLAIMS, "late").unwrap()["status"]["sandbox"]["name"].is_null());
    let cold = until(10, || c.get(SANDBOXES, "late")).await.unwrap();
    assert!(started.elapsed() >= Duration::from_secs(2), "{:?}", started.elapsed());
    let claim = c.get(CLAIMS, "late").unwrap();
    // Named after the claim, owned by it, labelled as the controller does.
    let owner = &cold["metadata"]["ownerReferences"][0];
    assert_eq!(
        (owner["kind"].as_str(), owner["uid"].as_str()),
        (Some("SandboxClaim"), claim["metadata"]["uid"].as_str())
    );
    assert_eq!(
        (owner["controller"].as_bool(), owner["blockOwnerDeletion"].as_bool()),
        (Some(true), Some(true))
    );
    let l = &cold["metadata"]["labels"];
    assert_eq!(l[LAUNCH_TYPE_LABEL], "cold");
    assert_eq!(l[CLAIM_UID_LABEL], claim["metadata"]["uid"]);
    assert_eq!(l[TEMPLATE_HASH_LABEL].as_str(), Some(name_hash(TEMPLATE).as_str()));
    assert_eq!(claim["metadata"]["annotations"][SANDBOX_NAME_ANNOTATION], "late");
    // The warm one is still the pool's.
    let still = c.get(SANDBOXES, warm["metadata"]["name"].as_str().unwrap()).unwrap();
    assert_eq!(still["metadata"]["ownerReferences"][0]["kind"], "SandboxWarmPool");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_adoption_reads_ready_before_the_pod_carries_the_claims_labels() {
    let c = Cluster::start_with(Some(1), |cfg| cfg.label_delay = Duration::from_millis(1500))
        .await
        .unwrap();
    assert!(c.pool_ready(1, Duration::from_secs(30)).await);
    let md = json!({"additionalPodMetadata": {"labels": {"sandbox.users.io/who": "me"}}});
    api(&c).create(&claims(), &claim("warm", POOL, md)).await.unwrap();
    let claim = until(10, || {
        c.get(CLAIMS, "warm").filter(|c| ready(c).0 == "True/DependenciesReady")
    })
    .await
    .expect("the claim never read Ready");
    let sname = claim["status"]["sandbox"]["name"].as_str().unwrap().to_owned();
    assert!(
        sname.starts_with(&format!("{POOL}-")),
        "a pool Sandbox (generateName): {sname}"
    );
    assert!(claim["status"]["sandbox"]["podIPs"]
        .as_array()
        .is_some_and(|a| !a.is_empty()));
    let sb = c.get(SANDBOXES, &sname).unwrap();
    let pod_name = sb["metadata"]["annotations"][POD_NAME_ANNOTATION]
        .as_str()
        .unwrap()
        .to_owned();
    let pod = c.get(PODS, &pod_name).unwrap();
    // Ready already — and the running pod does not carry the label yet.
    assert!(pod["metadata"]["labels"].get("sandbox.users.io/who").is_none(), "{pod}");
    let labelled = until(5, || {
        c.get(PODS, &pod_name)
            .filter(|p| p["metadata"]["labels"]["sandbox.users.io/who"] == "me")
    })
    .await;
    let labelled = labelled.expect("the claim's label never reached the pod");
    assert_eq!(
        labelled["metadata"]["uid"], pod["metadata"]["uid"],
        "patched onto the same pod"
    );
    // The Sandbox, rewired to the claim.
    let l = &sb["metadata"]["labels"];
    assert!(l.get(POOL_LABEL).is_none(), "{l}");
    assert_eq!(l[LAUNCH_TYPE_LABEL], "warm");
    assert_eq!(l[CLAIM_UID_LABEL], claim["metadata"]["uid"]);
    assert_eq!(sb["metadata"]["ownerReferences"][0]["kind"], "SandboxClaim");
    assert_eq!(
        claim["metadata"]["annotations"][SANDBOX_NAME_ANNOTATION],
        sname.as_str()
    );
    // The pod, and the Sandbox's selector for it.
    let pl = &labelled["metadata"]["labels"];
    assert_eq!(pl[NAME_HASH_LABEL].as_str(), Some(name_hash(&sname).as_str()));
    assert_eq!(pl[TEMPLATE_HASH_LABEL].as_str(), Some(name_hash(TEMPLATE).as_str()));
    assert_eq!(
        sb["status"]["selector"].as_str(),
        Some(format!("{NAME_HASH_LABEL}={}", name_hash(&sname)).as_str())
    );
    // The pool refills behind it and reports itself.
    assert!(c.pool_ready(1, Duration::from_secs(30)).await);
    let p = c.get(POOLS, POOL).unwrap();
    assert_eq!(
        p["status"]["selector"].as_str(),
        Some(format!("{POOL_LABEL}={}", name_hash(POOL)).as_str())
    );
    assert_eq!(p["status"]["observedGeneration"], p["metadata"]["generation"]);
    c.stop().await;
}

/// A Sandbox straight from the shipped template's pod, `service` as given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_and_its_fqdn_exist_only_when_the_blueprint_asks() {
    let c = Cluster::start(None).await.unwrap();
    let a = api(&c);
    let sandboxes = Resource::of::<Sandbox>(NAMESPACE);
    a.create(&sandboxes, &sandbox(&c, "plain", None, json!({})))
        .await
        .unwrap();
    a.create(&sandboxes, &sandbox(&c, "served", Some(true), json!({})))
        .await
        .unwrap();
    for name in ["plain", "served"] {
        reason_of(&c, SANDBOXES, name, "DependenciesReady").await;
    }
    let plain = c.get(SANDBOXES, "plain").unwrap();
    assert!(plain["status"]["serviceFQDN"].is_null(), "{plain}");
    assert!(c.get(SERVICES, "plain").is_none());
    let served = c.get(SANDBOXES, "served").unwrap();
    assert_eq!(
        served["status"]["serviceFQDN"],
        format!("served.{NAMESPACE}.svc.cluster.local")
    );
    let svc = c.get(SERVICES, "served").unwrap();
    assert_eq!(svc["spec"]["clusterIP"], "None");
    assert_eq!(
        svc["spec"]["selector"][NAME_HASH_LABEL].as_str(),
        Some(name_hash("served").as_str())
    );
    assert!(ready(&served).1.contains("Service Exists"), "{served}");
    // Cluster DNS knows the Service's name, and nothing without one.
    let dns = c.ctl.resolution();
    assert!(dns
        .resolve(&format!("served.{NAMESPACE}.svc.cluster.local"))
        .await
        .is_ok());
    assert!(dns
        .resolve(&format!("plain.{NAMESPACE}.svc.cluster.local"))
        .await
        .is_err());
    // A name too long for a Service: the Sandbox cannot be Ready.
    let long = "s".repeat(70);
    a.create(&sandboxes, &sandbox(&c, &long, Some(true), json!({})))
        .await
        .unwrap();
    let (_, message) = reason_of(&c, SANDBOXES, &long, "ReconcilerError").await;
    assert!(message.contains("DNS-1035"), "{message}");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_is_marked_first_and_retain_keeps_the_claim() {
    let c = Cluster::start(None).await.unwrap();
    let a = api(&c);
    a.create(&Resource::of::<SandboxWarmPool>(NAMESPACE), &pool("p0", TEMPLATE, 0))
        .await
        .unwrap();
    let soon = namzu_kubernetes::build::rfc3339(std::time::SystemTime::now() + Duration::from_secs(4));
    // No policy given: the CRD's default, Retain, as stored.
    let made = a
        .create(
            &claims(),
            &claim("kept", "p0", json!({"lifecycle": {"shutdownTime": soon}})),
        )
        .await
        .unwrap();
    assert_eq!(made["spec"]["lifecycle"]["shutdownPolicy"], "Retain");
    a.create(
        &claims(),
        &claim(
            "dropped",
            "p0",
            json!({"lifecycle": {"shutdownTime": soon, "shutdownPolicy": "Delete"}}),
        ),
    )
    .await
    .unwrap();
    until(10, || c.get(SANDBOXES, "kept")).await.expect("cold Sandbox");
    let (_, message) = reason_of(&c, CLAIMS, "kept", "ClaimExpired").await;
    assert!(message.contains("expired"), "{message}");
    // Retain: the Sandbox goes, the claim stays.
    assert!(until(10, || c.get(SANDBOXES, "kept").is_none().then_some(()))
        .await
        .is_some());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(c.get(CLAIMS, "kept").is_some(), "a Retain claim was deleted");
    // Delete: the claim goes too (its Sandbox by the cascade).
    assert!(until(10, || c.get(CLAIMS, "dropped").is_none().then_some(()))
        .await
        .is_some());
    assert!(until(10, || c.get(SANDBOXES, "dropped").is_none().then_some(()))
        .await
        .is_some());
    // A Sandbox of its own expiring under Retain: pod and Service gone,
    // the Sandbox kept and marked.
    let soon = namzu_kubernetes::build::rfc3339(std::time::SystemTime::now() + Duration::from_secs(3));
    let sb = a
        .create(
            &Resource::of::<Sandbox>(NAMESPACE),
            &sandbox(&c, "lone", Some(true), json!({"shutdownTime": soon})),
        )
        .await
        .unwrap();
    assert_eq!(sb["spec"]["shutdownPolicy"], "Retain");
    assert_eq!(sb["spec"]["operatingMode"], "Running");
    reason_of(&c, SANDBOXES, "lone", "SandboxExpired").await;
    // The pod terminates gracefully: gone once its kubelet stopped it.
    assert!(until(10, || c.get(PODS, "lone").is_none().then_some(()))
        .await
        .is_some());
    assert!(c.get(SERVICES, "lone").is_none());
    assert!(c.get(SANDBOXES, "lone").is_some());
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_are_replaced_only_when_gone_suspend_keeps_the_rest_and_a_lost_sandbox_is_rebound() {
    let c = Cluster::start(None).await.unwrap();
    let a = api(&c);
    let sandboxes = Resource::of::<Sandbox>(NAMESPACE);
    a.create(&sandboxes, &sandbox(&c, "life", Some(true), json!({})))
        .await
        .unwrap();
    reason_of(&c, SANDBOXES, "life", "DependenciesReady").await;
    let first = c.get(PODS, "life").unwrap()["metadata"]["uid"].clone();
    // Deleted: a new pod of the same name.
    c.sim.remove(PODS, NAMESPACE, "life");
    let second = until(10, || {
        c.get(PODS, "life")
            .filter(|p| p["metadata"]["uid"] != first && p["status"]["phase"] == "Running")
    })
    .await
    .expect("no replacement");
    reason_of(&c, SANDBOXES, "life", "DependenciesReady").await;
    // Evicted: left Failed, not replaced.
    c.ctl.evict_pod(&c.sim, NAMESPACE, "life").await;
    reason_of(&c, SANDBOXES, "life", "PodFailed").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pod = c.get(PODS, "life").unwrap();
    assert_eq!(
        (pod["metadata"]["uid"].clone(), pod["status"]["phase"].as_str()),
        (second["metadata"]["uid"].clone(), Some("Failed"))
    );
    let sb = c.get(SANDBOXES, "life").unwrap();
    let finished = sb["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["type"] == "Finished" && c["status"] == "True");
    assert!(finished, "{sb}");
    // Suspended: the pod goes, the Service stays; resumed: a new pod.
    a.create(&sandboxes, &sandbox(&c, "nap", Some(true), json!({})))
        .await
        .unwrap();
    reason_of(&c, SANDBOXES, "nap", "DependenciesReady").await;
    let before = c.get(PODS, "nap").unwrap()["metadata"]["uid"].clone();
    a.merge_patch(&sandboxes, "nap", &json!({"spec": {"operatingMode": "Suspended"}}))
        .await
        .unwrap();
    reason_of(&c, SANDBOXES, "nap", "SandboxSuspended").await;
    assert!(until(10, || c.get(PODS, "nap").is_none().then_some(())).await.is_some());
    assert!(c.get(SERVICES, "nap").is_some(), "suspend took the Service");
    a.merge_patch(&sandboxes, "nap", &json!({"spec": {"operatingMode": "Running"}}))
        .await
        .unwrap();
    reason_of(&c, SANDBOXES, "nap", "DependenciesReady").await;
    assert_ne!(c.get(PODS, "nap").unwrap()["metadata"]["uid"], before);
    // A claim whose Sandbox vanished binds a new, empty one.
    a.create(&Resource::of::<SandboxWarmPool>(NAMESPACE), &pool("p1", TEMPLATE, 0))
        .await
        .unwrap();
    a.create(&claims(), &claim("again", "p1", json!({}))).await.unwrap();
    let old = until(10, || c.get(SANDBOXES, "again")).await.unwrap();
    c.sim.remove(SANDBOXES, NAMESPACE, "again");
    let new = until(10, || {
        c.get(SANDBOXES, "again")
            .filter(|s| s["metadata"]["uid"] != old["metadata"]["uid"])
    })
    .await;
    assert!(new.is_some(), "the claim was not rebound");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_writes_never_undo_a_hosts_concurrent_patch() {
    let c = Cluster::start(Some(1)).await.unwrap();
    assert!(c.pool_ready(1, Duration::from_secs(30)).await);
    let a = api(&c);
    a.create(&claims(), &claim("busy", POOL, json!({}))).await.unwrap();
    until(10, || {
        c.get(CLAIMS, "busy").filter(|c| ready(c).0 == "True/DependenciesReady")
    })
    .await
    .unwrap();
    // The controller writes status every few ticks (pods, pool, claim);
    // every renewal a host patches must stand.
    for i in 0..30u64 {
        let t = namzu_kubernetes::build::rfc3339(std::time::SystemTime::now() + Duration::from_secs(3600 + i));
        a.merge_patch(&claims(), "busy", &json!({"spec": {"lifecycle": {"shutdownTime": t}}}))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(25)).await;
        let now = c.get(CLAIMS, "busy").unwrap();
        assert_eq!(
            now["spec"]["lifecycle"]["shutdownTime"].as_str(),
            Some(t.as_str()),
            "renewal {i} undone"
        );
    }
    // And the main resource never takes status from a host.
    let r = a
        .merge_patch(&claims(), "busy", &json!({"status": {"conditions": []}}))
        .await
        .unwrap();
    assert_eq!(ready(&r).0, "True/DependenciesReady");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn templates_get_their_hash_label_and_the_managed_network_policy() {
    let c = Cluster::start(None).await.unwrap();
    let a = api(&c);
    let templates = Resource::of::<SandboxTemplate>(NAMESPACE);
    let bare = template_like(&c, "bare", |v| {
        v["spec"].as_object_mut().unwrap().remove("networkPolicy");
    });
    let made = a.create(&templates, &bare).await.unwrap();
    assert_eq!(made["spec"]["networkPolicyManagement"], "Managed", "CRD default");
    let np = until(10, || c.get(NETWORK_POLICIES, "bare-network-policy"))
        .await
        .unwrap();
    assert_eq!(np["metadata"]["ownerReferences"][0]["kind"], "SandboxTemplate");
    let hash = name_hash("bare");
    assert_eq!(
        np["spec"]["podSelector"]["matchLabels"][TEMPLATE_HASH_LABEL].as_str(),
        Some(hash.as_str())
    );
    assert_eq!(np["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
    // The secure default: public egress minus private ranges (so no
    // cluster DNS), ingress from the router alone.
    let to = &np["spec"]["egress"][0]["to"];
    assert_eq!(to[0]["ipBlock"]["cidr"], "0.0.0.0/0");
    assert!(to[0]["ipBlock"]["except"]
        .as_array()
        .unwrap()
        .contains(&json!("10.0.0.0/8")));
    assert_eq!(
        np["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]["app"],
        "sandbox-router"
    );
    let labelled = until(10, || {
        c.get(TEMPLATES, "bare")
            .filter(|t| t["metadata"]["labels"][TEMPLATE_HASH_LABEL] == hash.as_str())
    })
    .await;
    assert!(labelled.is_some());
    // The template's own networkPolicy (the shipped one), verbatim.
    let shipped = until(10, || c.get(NETWORK_POLICIES, &format!("{TEMPLATE}-network-policy")))
        .await
        .unwrap();
    let t = c.get(TEMPLATES, TEMPLATE).unwrap();
    assert_eq!(shipped["spec"]["ingress"], t["spec"]["networkPolicy"]["ingress"]);
    assert_eq!(shipped["spec"]["egress"], json!([]));
    // Pods of a secure-default template resolve through public DNS only,
    // and get no service-account token.
    a.create(&Resource::of::<SandboxWarmPool>(NAMESPACE), &pool("bare", "bare", 1))
        .await
        .unwrap();
    let sb = until(10, || {
        c.sim
            .all(SANDBOXES)
            .into_iter()
            .find(|s| s["metadata"]["name"].as_str().is_some_and(|n| n.starts_with("bare-")))
    })
    .await
    .unwrap();
    let spec = &sb["spec"]["podTemplate"]["spec"];
    assert_eq!(
        (
            spec["dnsPolicy"].as_str(),
            spec["automountServiceAccountToken"].as_bool()
        ),
        (Some("None"), Some(false))
    );
    assert_eq!(spec["dnsConfig"]["nameservers"], json!(["8.8.8.8", "1.1.1.1"]));
    // Unmanaged: the controller deletes its policy.
    a.merge_patch(
        &templates,
        "bare",
        &json!({"spec": {"networkPolicyManagement": "Unmanaged"}}),
    )
    .await
    .unwrap();
    assert!(until(10, || c
        .get(NETWORK_POLICIES, "bare-network-policy")
        .is_none()
        .then_some(()))
    .await
    .is_some());
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_default_to_one_and_trim_their_surplus() {
    let c = Cluster::start(None).await.unwrap();
    let a = api(&c);
    let pools = Resource::of::<SandboxWarmPool>(NAMESPACE);
    let mut p = pool("one", TEMPLATE, 0);
    p["spec"].as_object_mut().unwrap().remove("replicas");
    let made = a.create(&pools, &p).await.unwrap();
    assert_eq!(made["spec"]["replicas"], 1, "CRD default");
    let held = |c: &Cluster| {
        c.sim
            .all(SANDBOXES)
            .into_iter()
            .filter(|s| s["metadata"]["labels"][POOL_LABEL] == name_hash("one").as_str())
            .count()
    };
    assert!(until(10, || (held(&c) == 1).then_some(())).await.is_some());
    a.merge_patch(&pools, "one", &json!({"spec": {"replicas": 3}}))
        .await
        .unwrap();
    assert!(until(10, || (held(&c) == 3).then_some(())).await.is_some());
    a.merge_patch(&pools, "one", &json!({"spec": {"replicas": 1}}))
        .await
        .unwrap();
    assert!(until(10, || (held(&c) == 1).then_some(())).await.is_some());
    let s = until(10, || c.get(POOLS, "one").filter(|p| p["status"]["replicas"] == 1)).await;
    assert!(s.is_some());
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_are_dns_subdomains_as_the_api_server_requires() {
    let c = Cluster::start(None).await.unwrap();
    let a = api(&c);
    for bad in ["Upper", "under_score", "-lead", &"x".repeat(254)] {
        let r = a.create(&claims(), &claim(bad, POOL, json!({}))).await;
        assert!(
            matches!(&r, Err(ApiError::Api { status: Some(422), message, .. }) if message.contains("RFC 1123")),
            "{bad}: {r:?}"
        );
    }
    a.create(&claims(), &claim("dotted.name-1", POOL, json!({})))
        .await
        .unwrap();
    c.stop().await;
}

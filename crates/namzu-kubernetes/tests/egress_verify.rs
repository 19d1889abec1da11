//! Egress verification against the control-plane SIMULATOR, at the two
//! points it runs: after a claim's bind (the bound pod's real labels) and
//! before a direct Sandbox's POST. Each refusal is provoked; each releases
//! what it made; a pass is remembered, a failure never.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use namzu::SandboxSpec;
use namzu_k8s_sim::cluster::{Cluster, NAMESPACE, TEMPLATE};
use namzu_k8s_sim::controller::{CLAIMS, NETWORK_POLICIES, SANDBOXES};
use namzu_kubernetes::acquire_error::AcquireReason;
use namzu_kubernetes::api::Verb;
use namzu_kubernetes::policy::union::{UnionRefusal, Verdict};
use namzu_kubernetes::policy::{translate, EgressPolicyError, KubeEgressConfig, KubeEgressPolicy, Verification};
use namzu_kubernetes::{KubernetesOptions, KubernetesProvider};
use serde_json::json;

fn options(c: &Cluster, pool: bool, policy: KubeEgressPolicy) -> KubernetesOptions {
    KubernetesOptions {
        egress: Some(KubeEgressConfig::new(TEMPLATE, policy)),
        ..c.options(pool)
    }
}

fn count(p: &KubernetesProvider, resource: &str, verb: Verb) -> usize {
    p.api()
        .calls()
        .iter()
        .filter(|c| c.resource == resource && c.verb == verb)
        .count()
}

fn ours(c: &Cluster, gvr: namzu_k8s_sim::Gvr) -> usize {
    c.sandbox_objects(gvr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_named_policy_must_stand_exactly_as_translated() {
    let c = Cluster::start(Some(1)).await.unwrap();
    assert!(c.pool_ready(1, Duration::from_secs(30)).await);
    let opts = options(&c, true, KubeEgressPolicy::DenyAll);
    let p = KubernetesProvider::new(c.client(), opts.clone()).unwrap();
    // Not applied: refused after the bind, the claim given back.
    let e = p.create_task(SandboxSpec::default()).await.err().unwrap();
    let Ok(namzu_kubernetes::KubernetesError::EgressPolicy(e)) =
        e.into_tier_error::<namzu_kubernetes::KubernetesError>()
    else {
        panic!("not a kubernetes EgressPolicy error")
    };
    assert!(
        matches!(*e, EgressPolicyError::NotApplied { ref name, .. } if name == "namzu-task-egress"),
        "{e}"
    );
    assert_eq!(ours(&c, CLAIMS), 0);
    // Applied with one port changed: the mismatch names where.
    let cfg = opts.egress.clone().unwrap();
    let mut drifted = translate(&cfg, NAMESPACE);
    drifted["spec"]["egress"][0]["ports"][0]["port"] = json!(5353);
    c.sim.put(NETWORK_POLICIES, drifted);
    let e = p.create_task(SandboxSpec::default()).await.err().unwrap();
    let Ok(namzu_kubernetes::KubernetesError::EgressPolicy(e)) =
        e.into_tier_error::<namzu_kubernetes::KubernetesError>()
    else {
        panic!("not a kubernetes EgressPolicy error")
    };
    match *e {
        EgressPolicyError::Mismatch {
            path, expected, found, ..
        } => {
            assert_eq!(
                (path.as_str(), expected.as_str(), found.as_str()),
                ("/spec/egress/0/ports/0/port", "53", "5353")
            );
        }
        other => panic!("{other:?}"),
    }
    // Applied exactly: the sandbox is handed out.
    c.sim.put(NETWORK_POLICIES, translate(&cfg, NAMESPACE));
    let sb = p.create_task(SandboxSpec::default()).await.unwrap();
    sb.commands().run("true").await.unwrap();
    sb.destroy().await.unwrap();
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_policy_over_the_pods_is_refused_unless_named_object_only_is_chosen() {
    let c = Cluster::start(None).await.unwrap();
    let opts = options(&c, false, KubeEgressPolicy::DenyAll);
    let cfg = opts.egress.clone().unwrap();
    c.sim.put(NETWORK_POLICIES, translate(&cfg, NAMESPACE));
    // A placeholder the operator left: every namzu pod may reach anything.
    c.sim.put(
        NETWORK_POLICIES,
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "placeholder", "namespace": NAMESPACE},
            "spec": {"podSelector": {"matchLabels": {"app.kubernetes.io/managed-by": "namzu"}},
                "policyTypes": ["Egress"], "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]}}),
    );
    let p = KubernetesProvider::new(c.client(), opts.clone()).unwrap();
    let e = p.create_task(SandboxSpec::default()).await.err().unwrap();
    let Ok(namzu_kubernetes::KubernetesError::EgressUnion(e)) =
        e.into_tier_error::<namzu_kubernetes::KubernetesError>()
    else {
        panic!("not a kubernetes EgressUnion error")
    };
    assert_eq!(e.refusal, UnionRefusal::PolicyWidensEgress);
    assert_eq!(e.pod_labels["app.kubernetes.io/managed-by"], "namzu");
    let placeholder = e.examined.iter().find(|x| x.name == "placeholder").unwrap();
    assert!(matches!(placeholder.verdict, Verdict::Widens { .. }));
    // Refused before the POST: no Sandbox was ever made.
    assert_eq!(count(&p, "sandboxes", Verb::Create), 0);
    assert_eq!(ours(&c, SANDBOXES), 0);
    // A failure is never remembered: the next acquire lists again.
    let lists = count(&p, "networkpolicies", Verb::List);
    let r = p.create_task(SandboxSpec::default()).await;
    assert!(
        matches!(r.as_ref().err().and_then(|e| e.tier_error::<namzu_kubernetes::KubernetesError>()), Some(namzu_kubernetes::KubernetesError::EgressUnion(u)) if u.refusal == namzu_kubernetes::policy::union::UnionRefusal::PolicyWidensEgress),
        "{:?}",
        r.err()
    );
    assert_eq!(count(&p, "networkpolicies", Verb::List), lists + 1);
    // named-object-only, on purpose: the union is not read.
    let mut named_only = opts.clone();
    named_only.egress.as_mut().unwrap().verify = Verification::NamedObjectOnly;
    let q = KubernetesProvider::new(c.client(), named_only).unwrap();
    // (The one list it makes is the agent-port check's.)
    let sb = q.create_task(SandboxSpec::default()).await.unwrap();
    assert_eq!(count(&q, "networkpolicies", Verb::List), 1);
    sb.destroy().await.unwrap();
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_is_remembered_for_the_label_set() {
    let c = Cluster::start(None).await.unwrap();
    let opts = options(&c, false, KubeEgressPolicy::DenyAll);
    c.sim
        .put(NETWORK_POLICIES, translate(opts.egress.as_ref().unwrap(), NAMESPACE));
    let p = KubernetesProvider::new(c.client(), opts).unwrap();
    let a = p.create_task(SandboxSpec::default()).await.unwrap();
    let b = p.create_task(SandboxSpec::default()).await.unwrap();
    // Two sandboxes, one label set (their ids aside): one read of each.
    assert_eq!(count(&p, "networkpolicies", Verb::Get), 1);
    assert_eq!(count(&p, "networkpolicies", Verb::List), 1);
    a.destroy().await.unwrap();
    b.destroy().await.unwrap();
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_enforcing_policy_and_unreadable_collections_are_told_apart() {
    use namzu_k8s_sim::controller::TEMPLATES;
    use namzu_k8s_sim::Fault;
    let c = Cluster::start(None).await.unwrap();
    // A template whose pods carry no label of namzu's and that leaves no
    // policy of its own (Unmanaged), and a controller that drops the
    // claim's labels: the named policy selects nothing of ours.
    let mut t = c.get(TEMPLATES, TEMPLATE).unwrap();
    t["spec"]["podTemplate"]["metadata"]["labels"] = json!({"app": "bare"});
    t["spec"]["networkPolicyManagement"] = json!("Unmanaged");
    c.sim.put(TEMPLATES, t);
    c.ctl.drop_claim_pod_labels(true);
    c.add_pool(1).unwrap();
    assert!(c.pool_ready(1, Duration::from_secs(30)).await);
    // (The agent-port check would refuse these pods first: it is not what
    // this test is about.)
    let opts = KubernetesOptions {
        ingress: namzu_kubernetes::policy::ingress::IngressVerification::Unverified,
        ..options(&c, true, KubeEgressPolicy::DenyAll)
    };
    c.sim
        .put(NETWORK_POLICIES, translate(opts.egress.as_ref().unwrap(), NAMESPACE));
    let p = KubernetesProvider::new(c.client(), opts.clone()).unwrap();
    let e = p.create_task(SandboxSpec::default()).await.err().unwrap();
    let Ok(namzu_kubernetes::KubernetesError::EgressUnion(e)) =
        e.into_tier_error::<namzu_kubernetes::KubernetesError>()
    else {
        panic!("not a kubernetes EgressUnion error")
    };
    assert_eq!(e.refusal, UnionRefusal::NoEnforcingPolicy, "{e}");
    assert_eq!(e.pod_labels.get("app").map(String::as_str), Some("bare"));
    assert_eq!(e.examined[0].verdict, Verdict::NotSelecting);
    assert_eq!(ours(&c, CLAIMS), 0);
    // The list refused (403): not evaluable, and the refusal says which
    // collection and why.
    c.ctl.drop_claim_pod_labels(false);
    c.sim.inject(Fault {
        method: None,
        target: "=networkpolicies".into(),
        status: 403,
        retry_after: None,
        times: 1,
    });
    let e = p.create_task(SandboxSpec::default()).await.err().unwrap();
    let Ok(namzu_kubernetes::KubernetesError::EgressUnion(e)) =
        e.into_tier_error::<namzu_kubernetes::KubernetesError>()
    else {
        panic!("not a kubernetes EgressUnion error")
    };
    assert_eq!(e.refusal, UnionRefusal::NotEvaluable, "{e}");
    assert_eq!(e.unread[0].status, Some(403));
    assert_eq!(e.unread[0].resource, "networking.k8s.io/networkpolicies");
    // With the agent-port check on, the same unread list refuses there
    // first, as its own error.
    let checked = KubernetesProvider::new(c.client(), options(&c, true, KubeEgressPolicy::DenyAll)).unwrap();
    c.sim.inject(Fault {
        method: None,
        target: "=networkpolicies".into(),
        status: 404,
        retry_after: None,
        times: 1,
    });
    let e = checked.create_task(SandboxSpec::default()).await.err().unwrap();
    let Ok(namzu_kubernetes::KubernetesError::Ingress(e)) = e.into_tier_error::<namzu_kubernetes::KubernetesError>()
    else {
        panic!("not a kubernetes Ingress error")
    };
    assert_eq!(e.unread[0].status, Some(404));
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_pod_without_the_profile_label_is_refused_and_released() {
    let c = Cluster::start(Some(1)).await.unwrap();
    assert!(c.pool_ready(1, Duration::from_secs(30)).await);
    let mut cfg = KubeEgressConfig::new(TEMPLATE, KubeEgressPolicy::DenyAll);
    cfg.profile = Some("builders".into());
    c.sim.put(NETWORK_POLICIES, translate(&cfg, NAMESPACE));
    let opts = KubernetesOptions {
        egress: Some(cfg),
        ..c.options(true)
    };
    let p = KubernetesProvider::new(c.client(), opts).unwrap();
    // The profile label reaches the pod: the policy selects it.
    let sb = p.create_task(SandboxSpec::default()).await.unwrap();
    assert_eq!(
        k8s(&sb).bound().pod.labels["namzu.sandbox.users.io/egress-profile"],
        "builders"
    );
    sb.destroy().await.unwrap();
    // A controller that drops the claim's pod labels binds a pod the
    // profile's policy does not select: waited for (the real controller
    // patches them on late) until the budget runs out, then refused.
    c.ctl.drop_claim_pod_labels(true);
    let p = KubernetesProvider::new(
        c.client(),
        KubernetesOptions {
            ready_timeout: Duration::from_secs(3),
            ..p.options().clone()
        },
    )
    .unwrap();
    let e = p.create_task(SandboxSpec::default()).await.err().unwrap();
    assert!(
        matches!(e.tier_error::<namzu_kubernetes::KubernetesError>(), Some(namzu_kubernetes::KubernetesError::PodLabelMissing { key, value, .. }) if key == "namzu.sandbox.users.io/egress-profile" && value == "builders"),
        "{e:?}"
    );
    assert_eq!(ours(&c, CLAIMS), 0);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_labels_outside_the_allowlist_are_refused_by_name_and_move_with_the_domain() {
    use namzu_kubernetes::acquire_error::ClaimRejection;
    // An operator whose agent-sandbox-config allows only example.com (and
    // a controller that patches a warm pod's labels a second after the
    // claim reads Ready, as the real one may).
    let c = Cluster::start_with(Some(1), |cfg| {
        cfg.allowed_label_domains = Some("example.com,\nteam.example.org".into());
        cfg.label_delay = Duration::from_secs(1);
    })
    .await
    .unwrap();
    assert!(c.pool_ready(1, Duration::from_secs(30)).await);
    let mut cfg = KubeEgressConfig::new(TEMPLATE, KubeEgressPolicy::DenyAll);
    cfg.profile = Some("builders".into());
    let opts = KubernetesOptions {
        egress: Some(cfg.clone()),
        ..c.options(true)
    };
    let p = KubernetesProvider::new(c.client(), opts.clone()).unwrap();
    let e = p.create_task(SandboxSpec::default()).await.err().unwrap();
    let Some(namzu_kubernetes::KubernetesError::Acquire(e)) = e.tier_error::<namzu_kubernetes::KubernetesError>()
    else {
        panic!("not an acquire error: {e:?}")
    };
    assert_eq!((e.reason, e.retryable), (AcquireReason::ClaimRejected, false), "{e}");
    assert_eq!(e.controller_reason.as_deref(), Some("InvalidMetadata"));
    assert!(
        e.controller_message
            .as_deref()
            .unwrap_or_default()
            .contains("\"namzu.sandbox.users.io\" is not in the allowlist"),
        "{e}"
    );
    let Some(ClaimRejection::PodLabelsRejected { labels, option }) = &e.rejection else {
        panic!("no typed rejection: {e:?}")
    };
    assert_eq!(
        labels.get("namzu.sandbox.users.io/egress-profile").map(String::as_str),
        Some("builders")
    );
    assert_eq!(*option, "egress.pod_label_domain");
    assert_eq!(ours(&c, CLAIMS), 0, "the refused claim was given back");
    // The same profile under an allowed domain (a subdomain counts):
    // claimed, the labels waited for, the policy verified.
    let moved = cfg.with_pod_label_domain("agents.team.example.org");
    assert_eq!(moved.profile_label_key, "agents.team.example.org/egress-profile");
    c.sim.put(NETWORK_POLICIES, translate(&moved, NAMESPACE));
    let p = KubernetesProvider::new(
        c.client(),
        KubernetesOptions {
            egress: Some(moved),
            ..opts
        },
    )
    .unwrap();
    let sb = p.create_task(SandboxSpec::default()).await.unwrap();
    assert_eq!(
        k8s(&sb).bound().pod.labels["agents.team.example.org/egress-profile"],
        "builders"
    );
    sb.destroy().await.unwrap();
    c.stop().await;
}

/// The Kubernetes backend behind a handle.
fn k8s(sb: &namzu::Sandbox) -> &namzu_kubernetes::KubernetesSandbox {
    sb.backend().expect("a kubernetes sandbox")
}

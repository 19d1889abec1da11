//! Per-sandbox egress against the control-plane SIMULATOR:
//! `set_network_policy` on a task handle writes one CiliumNetworkPolicy
//! owned by the claim, selecting the sandbox's own pod label. The write
//! resolves after the read-back matches, and `[]` deletes it. Nothing is
//! written until the admission fence is shown applied; the fence missing
//! and the fence unreadable are distinct errors.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use axum::http::Method;
use namzu::egress::policy::HostRule;
use namzu::egress::EgressPolicy;
use namzu::{Error, SandboxSpec};
use namzu_k8s_sim::cluster::{Cluster, NAMESPACE, TEMPLATE};
use namzu_k8s_sim::controller::{ADMISSION_BINDINGS, ADMISSION_POLICIES, CILIUM_POLICIES};
use namzu_k8s_sim::Fault;
use namzu_kubernetes::api::Verb;
use namzu_kubernetes::policy::per_sandbox::{policy_name, PerSandboxEgress, PerSandboxError};
use namzu_kubernetes::policy::{translate, Engine, KubeEgressConfig, KubeEgressPolicy};
use namzu_kubernetes::{KubernetesOptions, KubernetesProvider};
use serde_json::{json, Value};

fn egress() -> KubeEgressConfig {
    KubeEgressConfig {
        engine: Engine::Cilium,
        per_sandbox: Some(PerSandboxEgress::default()),
        ..KubeEgressConfig::new(TEMPLATE, KubeEgressPolicy::DenyAll)
    }
}

/// A provider claiming from the pool (or making Sandboxes) with
/// per-sandbox egress configured.
fn with_per_sandbox(c: &Cluster, pool: bool) -> KubernetesProvider {
    KubernetesProvider::new(
        c.client(),
        KubernetesOptions {
            egress: Some(egress()),
            ..c.options(pool)
        },
    )
    .unwrap()
}

fn fence(c: &Cluster) {
    let parse = |y: &str| serde_yaml::from_str::<Value>(y).unwrap();
    c.sim.put(
        ADMISSION_POLICIES,
        parse(include_str!("../../../deploy/k8s/admission-fence.yaml")),
    );
    c.sim.put(
        ADMISSION_BINDINGS,
        parse(include_str!("../../../deploy/k8s/admission-fence-binding.yaml")),
    );
}

/// A cluster with the template's Cilium policy applied and a claimed
/// sandbox whose backend has per-sandbox egress.
async fn setup() -> (Cluster, KubernetesProvider, namzu::Sandbox) {
    let c = Cluster::start(Some(1)).await.unwrap();
    assert!(c.pool_ready(1, Duration::from_secs(30)).await);
    c.sim.put(CILIUM_POLICIES, translate(&egress(), NAMESPACE));
    let p = with_per_sandbox(&c, true);
    let sb = p.create_task(SandboxSpec::default()).await.unwrap();
    (c, p, sb)
}

fn allow(hosts: &[&str]) -> EgressPolicy {
    EgressPolicy::Allowlist {
        hosts: hosts.iter().map(|h| HostRule::parse(h, None).unwrap()).collect(),
    }
}

fn writes(p: &KubernetesProvider) -> usize {
    p.api()
        .calls()
        .iter()
        .filter(|c| {
            c.resource == "ciliumnetworkpolicies" && matches!(c.verb, Verb::Create | Verb::Patch | Verb::Delete)
        })
        .count()
}

fn per_sandbox_error(e: Error) -> PerSandboxError {
    match e.into_tier_error::<namzu_kubernetes::KubernetesError>() {
        Ok(namzu_kubernetes::KubernetesError::PerSandbox(e)) => *e,
        other => panic!("not a per-sandbox error: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_written_until_the_fence_stands() {
    let (c, p, sb) = setup().await;
    let e = per_sandbox_error(sb.network().set_policy(allow(&["api.example.com"])).await.unwrap_err());
    assert!(
        matches!(&e, PerSandboxError::FenceMissing { kind: "ValidatingAdmissionPolicy", name } if name == "namzu-per-sandbox-egress"),
        "{e}"
    );
    c.sim.inject(Fault {
        method: Some(Method::GET),
        target: "validatingadmissionpolicies/".into(),
        status: 403,
        retry_after: None,
        times: 1,
    });
    let e = per_sandbox_error(sb.network().set_policy(allow(&["api.example.com"])).await.unwrap_err());
    assert!(matches!(e, PerSandboxError::FenceUnreadable { status: 403, .. }), "{e}");
    assert_eq!(writes(&p), 0, "{:?}", p.api().calls());
    // The policy stands, the binding does not: still missing, still nothing.
    let parse = |y: &str| serde_yaml::from_str::<Value>(y).unwrap();
    c.sim.put(
        ADMISSION_POLICIES,
        parse(include_str!("../../../deploy/k8s/admission-fence.yaml")),
    );
    let e = per_sandbox_error(sb.network().set_policy(allow(&["api.example.com"])).await.unwrap_err());
    assert!(
        matches!(
            e,
            PerSandboxError::FenceMissing {
                kind: "ValidatingAdmissionPolicyBinding",
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(writes(&p), 0);
    sb.destroy().await.unwrap();
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_is_owned_selects_the_sandbox_and_reads_back_as_sent() {
    let (c, p, sb) = setup().await;
    fence(&c);
    sb.network()
        .set_policy(allow(&["api.example.com", ".pkg.dev"]))
        .await
        .unwrap();
    let uid = k8s(&sb).bound().owner_uid.clone().unwrap();
    let name = policy_name(&uid);
    let got = c.get(CILIUM_POLICIES, &name).unwrap();
    assert_eq!(got["metadata"]["ownerReferences"][0]["kind"], "SandboxClaim");
    assert_eq!(got["metadata"]["ownerReferences"][0]["uid"], uid.as_str());
    assert_eq!(
        got["spec"]["endpointSelector"],
        json!({"matchLabels": {"namzu.sandbox.users.io/egress-sandbox": sb.id()}})
    );
    // The label it selects is on the pod: the acquire confirmed it.
    assert_eq!(
        k8s(&sb).bound().pod.labels["namzu.sandbox.users.io/egress-sandbox"],
        sb.id()
    );
    assert_eq!(
        got["spec"]["egress"][1],
        json!({"toFQDNs": [{"matchName": "api.example.com"}, {"matchName": "pkg.dev"}, {"matchPattern": "*.pkg.dev"}]})
    );
    assert_eq!(
        got["spec"]["egress"][0]["toEndpoints"],
        json!([{"matchLabels": {"k8s:io.kubernetes.pod.namespace": "kube-system", "k8s:k8s-app": "kube-dns"}}])
    );
    // A replacement is the whole list; a host's ports narrow it.
    let with_ports = EgressPolicy::Allowlist {
        hosts: vec![HostRule::parse("git.example.com", Some(vec![22, 443])).unwrap()],
    };
    sb.network().set_policy(with_ports).await.unwrap();
    let got = c.get(CILIUM_POLICIES, &name).unwrap();
    assert_eq!(
        got["spec"]["egress"][1],
        json!({"toFQDNs": [{"matchName": "git.example.com"}],
            "toPorts": [{"ports": [{"port": "22", "protocol": "TCP"}, {"port": "443", "protocol": "TCP"}]}]})
    );
    // The fence is proven once per handle.
    let fence_reads = p
        .api()
        .calls()
        .iter()
        .filter(|c| c.resource == "validatingadmissionpolicies")
        .count();
    assert_eq!(fence_reads, 1);
    // [] removes it; deny-all too (and is idempotent): the baseline left
    // (the template's deny-all) is proven no wider.
    sb.network().set_policy(allow(&[])).await.unwrap();
    assert!(c.get(CILIUM_POLICIES, &name).is_none());
    sb.network().set_policy(EgressPolicy::DenyAll).await.unwrap();
    // The policy goes with the claim.
    sb.network().set_policy(allow(&["api.example.com"])).await.unwrap();
    sb.destroy().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while c.get(CILIUM_POLICIES, &name).is_some() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(c.get(CILIUM_POLICIES, &name).is_none());
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewritten_policy_does_not_resolve_and_bad_input_writes_nothing() {
    let (c, p, sb) = setup().await;
    fence(&c);
    // Something on the cluster widens what was written.
    c.sim.rewrite_on_write(
        "ciliumnetworkpolicies/namzu-sbx-",
        json!({"spec": {"endpointSelector": {"matchLabels": {"namzu.sandbox.users.io/egress-sandbox": null, "app.kubernetes.io/managed-by": "namzu"}}}}),
    );
    let e = per_sandbox_error(sb.network().set_policy(allow(&["api.example.com"])).await.unwrap_err());
    let PerSandboxError::ReadBackMismatch { path, .. } = &e else {
        panic!("{e}")
    };
    assert!(path.starts_with("/spec/endpointSelector/matchLabels"), "{path}");
    let before = writes(&p);
    // What the per-sandbox policy cannot say is refused by name …
    for policy in [
        EgressPolicy::AllowAll,
        EgressPolicy::NoNetwork,
        EgressPolicy::PublicInternet { except_cidrs: vec![] },
    ] {
        let e = per_sandbox_error(sb.network().set_policy(policy).await.unwrap_err());
        assert!(matches!(e, PerSandboxError::PolicyRefused { .. }), "{e}");
    }
    // … and so is an entry that is not a hostname, before any request.
    let bad = EgressPolicy::Allowlist {
        hosts: vec![HostRule {
            host: namzu::egress::policy::HostPattern::Exact("*.example.com".into()),
            ports: None,
        }],
    };
    let r = sb.network().set_policy(bad).await;
    assert!(
        matches!(&r, Err(namzu::Error::EgressPolicy(namzu::egress::PolicyError::Glob { entry })) if entry == "*.example.com"),
        "{r:?}"
    );
    assert_eq!(writes(&p), before);
    sb.destroy().await.unwrap();
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_per_sandbox_egress_the_call_is_refused_by_name() {
    let c = Cluster::start(Some(1)).await.unwrap();
    assert!(c.pool_ready(1, Duration::from_secs(30)).await);
    let p = KubernetesProvider::new(c.client(), c.options(true)).unwrap();
    let sb = p.create_task(SandboxSpec::default()).await.unwrap();
    let e = per_sandbox_error(sb.network().set_policy(allow(&["api.example.com"])).await.unwrap_err());
    assert_eq!(e, PerSandboxError::NotConfigured);
    // Nor is there a record on the host to show: refused by name, saying
    // where the record is.
    match sb.network().policy().await.unwrap_err() {
        Error::OptionRefused { tier, option, reason } => {
            assert_eq!((tier, option.as_str()), (namzu::Tier::Kubernetes, "network_policy"));
            assert!(reason.contains("namzu-sbx-"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // And per-sandbox egress under core is refused at construction.
    let core = KubeEgressConfig {
        per_sandbox: Some(PerSandboxEgress::default()),
        ..KubeEgressConfig::new(TEMPLATE, KubeEgressPolicy::DenyAll)
    };
    let r = KubernetesProvider::new(
        c.client(),
        KubernetesOptions {
            egress: Some(core),
            ..c.options(true)
        },
    );
    assert!(
        matches!(
            r.as_ref()
                .err()
                .and_then(|e| e.tier_error::<namzu_kubernetes::KubernetesError>()),
            Some(namzu_kubernetes::KubernetesError::EgressConfig(_))
        ),
        "{:?}",
        r.err()
    );
    sb.destroy().await.unwrap();
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_without_a_uid_is_refused_at_acquire() {
    use namzu_k8s_sim::controller::CLAIMS;
    let c = Cluster::start(Some(1)).await.unwrap();
    assert!(c.pool_ready(1, Duration::from_secs(30)).await);
    c.sim.put(CILIUM_POLICIES, translate(&egress(), NAMESPACE));
    // Whatever stores the claim loses its uid: a policy owned by it would
    // be an orphan.
    c.sim
        .rewrite_on_write("sandboxclaims/", json!({"metadata": {"uid": ""}}));
    let p = with_per_sandbox(&c, true);
    let e = per_sandbox_error(p.create_task(SandboxSpec::default()).await.err().unwrap());
    assert!(matches!(e, PerSandboxError::OwnerUidMissing { .. }), "{e}");
    let left = c.sandbox_objects(CLAIMS);
    assert_eq!(left, 0, "the claim was not released");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_sandbox_whose_pod_lost_the_per_sandbox_label_is_refused() {
    use namzu_k8s_sim::controller::SANDBOXES;
    let c = Cluster::start(None).await.unwrap();
    c.sim.put(CILIUM_POLICIES, translate(&egress(), NAMESPACE));
    // A controller that builds pods from the template as it was, not as
    // the Sandbox asked: the per-sandbox label never reaches the pod.
    c.sim.rewrite_on_write(
        "sandboxes/",
        json!({"spec": {"podTemplate": {"metadata": {"labels": {"namzu.sandbox.users.io/egress-sandbox": null}}}}}),
    );
    // (The label is waited for within the budget: a short one.)
    let p = KubernetesProvider::new(
        c.client(),
        KubernetesOptions {
            ready_timeout: Duration::from_secs(3),
            ..with_per_sandbox(&c, false).options().clone()
        },
    )
    .unwrap();
    let e = p.create_task(SandboxSpec::default()).await.err().unwrap();
    assert!(
        matches!(e.tier_error::<namzu_kubernetes::KubernetesError>(), Some(namzu_kubernetes::KubernetesError::PodLabelMissing { key, .. }) if key == "namzu.sandbox.users.io/egress-sandbox"),
        "{e:?}"
    );
    let left = c.sandbox_objects(SANDBOXES);
    assert_eq!(left, 0, "the Sandbox was not released");
    c.stop().await;
}

/// The Kubernetes backend behind a handle.
fn k8s(sb: &namzu::Sandbox) -> &namzu_kubernetes::KubernetesSandbox {
    sb.backend().expect("a kubernetes sandbox")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_all_is_deny_all_or_refused_never_a_fall_back_to_a_wider_baseline() {
    let (c, _p, sb) = setup().await;
    fence(&c);
    sb.network().set_policy(allow(&["api.example.com"])).await.unwrap();
    // An operator's policy that lets every pod of the namespace reach the
    // whole internet: removing namzu's own policy would leave the pod
    // THAT open, so deny-all is refused, naming it.
    c.sim.put(
        CILIUM_POLICIES,
        json!({"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy",
            "metadata": {"name": "everything-out", "namespace": NAMESPACE},
            "spec": {"endpointSelector": {}, "egress": [{"toEntities": ["world"]}]}}),
    );
    let e = sb.network().set_policy(EgressPolicy::DenyAll).await.unwrap_err();
    let Ok(namzu_kubernetes::KubernetesError::EgressUnion(u)) =
        e.into_tier_error::<namzu_kubernetes::KubernetesError>()
    else {
        panic!("not an egress union refusal")
    };
    assert_eq!(
        u.refusal,
        namzu_kubernetes::policy::union::UnionRefusal::PolicyWidensEgress,
        "{u}"
    );
    assert!(u.to_string().contains("everything-out"), "{u}");
    // Without it, deny-all holds.
    c.sim.remove(CILIUM_POLICIES, NAMESPACE, "everything-out");
    sb.network().set_policy(EgressPolicy::DenyAll).await.unwrap();
    c.stop().await;
}

//! Acquire against the control-plane SIMULATOR, whose pods are real
//! `local` sandboxes running the real agent: both paths end to end, the
//! minimal request sequence, adoption of a create whose answer was lost,
//! the failure taxonomy (each reason provoked), address modes, the
//! privilege probe, and the lease ending in `SandboxGone`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant, SystemTime};

use axum::http::Method;
use namzu::{Error, ExecRequest, Provider, Sandbox, SandboxSpec};
use namzu_k8s_sim::cluster::{Cluster, NAMESPACE};
use namzu_k8s_sim::controller::{CLAIMS, PODS, SANDBOXES};
use namzu_k8s_sim::{Fault, PodFault, Stall};
use namzu_kubernetes::acquire::object_name;
use namzu_kubernetes::acquire_error::AcquireReason;
use namzu_kubernetes::api::{Api, ApiError, Resource, Verb};
use namzu_kubernetes::crd::SandboxClaim;
use namzu_kubernetes::{build, AddressMode, KubernetesProvider, NameResolution};

mod common;
use common::*;

async fn echo(sb: &Sandbox) -> String {
    let out = sb
        .commands()
        .run(ExecRequest::shell("echo hello from $(id -u)"))
        .await
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_on_the_warm_pool_issues_the_minimal_sequence() {
    let c = Cluster::start(Some(2)).await.unwrap();
    assert!(
        c.pool_ready(2, Duration::from_secs(30)).await,
        "the pool never became ready"
    );
    let mut opts = c.options(true);
    opts.claim_labels.insert("team".into(), "agents".into());
    let p = provider(&c, opts);
    let sb = p.create_task(SandboxSpec::default()).await.unwrap();
    assert!(echo(&sb).await.starts_with("hello from"));
    // POST the claim, poll it, read the Sandbox once, the pod once, list
    // the policies that must close its agent port (ingress check), and
    // record the bound Sandbox on the claim.
    assert_eq!(
        folded(&p),
        [
            call("sandboxclaims", Verb::Create),
            call("sandboxclaims", Verb::Get),
            call("sandboxes", Verb::Get),
            call("pods", Verb::Get),
            call("networkpolicies", Verb::List),
            call("sandboxclaims", Verb::Patch),
        ]
    );
    let all = calls(&p);
    assert_eq!(all.iter().filter(|c| c.0 == "sandboxes").count(), 1, "{all:?}");
    assert_eq!(all.iter().filter(|c| c.0 == "pods").count(), 1, "{all:?}");
    // claim_labels and namzu's own on the claim only; an unprofiled claim
    // asks for NO pod label (none the controller's allowlist could refuse).
    let name = object_name(sb.id());
    let claim = c.get(CLAIMS, &name).unwrap();
    assert_eq!(
        claim["metadata"]["labels"],
        serde_json::json!({"team": "agents", build::SANDBOX_LABEL: sb.id(), build::MANAGED_BY_LABEL: build::MANAGED_BY})
    );
    assert!(claim["spec"]["additionalPodMetadata"].is_null(), "{claim}");
    assert_eq!(
        claim["metadata"]["annotations"][namzu_kubernetes::acquire::BOUND_SANDBOX_ANNOTATION],
        k8s(&sb).bound().sandbox_uid.as_deref().unwrap()
    );
    let pod = c.get(PODS, &k8s(&sb).bound().pod.name).unwrap();
    assert_eq!(pod["metadata"]["labels"].get(build::SANDBOX_LABEL), None);
    assert_eq!(pod["metadata"]["labels"].get("team"), None);
    assert_eq!(pod["metadata"]["uid"], k8s(&sb).bound().pod.uid.as_str());
    // Destroy gives the claim back, and the pod goes with it; the pool
    // makes another.
    sb.destroy().await.unwrap();
    assert_eq!(calls(&p).last(), Some(&call("sandboxclaims", Verb::Delete)));
    assert!(!exists(&c, CLAIMS, &name));
    let deadline = Instant::now() + Duration::from_secs(10);
    while exists(&c, PODS, &k8s(&sb).bound().pod.name) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !exists(&c, PODS, &k8s(&sb).bound().pod.name),
        "the pod outlived its claim"
    );
    assert!(matches!(
        sb.commands().run("true").await,
        Err(Error::SandboxDestroyed { .. })
    ));
    assert!(
        c.pool_ready(2, Duration::from_secs(30)).await,
        "the pool did not refill"
    );
    // Idempotent.
    sb.destroy().await.unwrap();
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_pool_a_sandbox_is_made_from_the_template() {
    let c = Cluster::start(None).await.unwrap();
    let p = provider(&c, c.options(false));
    let sb = p.create_task(SandboxSpec::default()).await.unwrap();
    assert!(echo(&sb).await.starts_with("hello from"));
    assert_eq!(
        folded(&p),
        [
            call("sandboxtemplates", Verb::Get),
            // The ingress check runs before the POST.
            call("networkpolicies", Verb::List),
            call("sandboxes", Verb::Create),
            call("sandboxes", Verb::Get),
            call("pods", Verb::Get),
        ]
    );
    assert_eq!(calls(&p).iter().filter(|c| c.0 == "pods").count(), 1);
    let name = object_name(sb.id());
    let made = c.get(SANDBOXES, &name).unwrap();
    assert_eq!(made["spec"]["shutdownPolicy"], "Delete");
    // Another process finds it by id, and lists it.
    let other = provider(&c, c.options(false));
    let again = other.connect(sb.id()).await.unwrap();
    assert!(echo(&again).await.starts_with("hello from"));
    let listed = other.list().await.unwrap();
    assert!(listed.iter().any(|i| i.id == sb.id() && i.alive), "{listed:?}");
    other.destroy(sb.id()).await.unwrap();
    assert!(!exists(&c, SANDBOXES, &name));
    assert!(matches!(
        other.connect(sb.id()).await,
        Err(Error::SandboxNotFound { .. })
    ));
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_claim_reason_ends_the_acquire_and_releases_the_claim() {
    let c = Cluster::start(None).await.unwrap();
    let mut opts = c.options(true);
    opts.warm_pool_name = Some("no-such-pool".into());
    let budget = opts.ready_timeout;
    let p = provider(&c, opts);
    let t = Instant::now();
    let e = acquire_error(p.create(SandboxSpec::default()).await.err().unwrap());
    assert_eq!((e.reason, e.retryable), (AcquireReason::ClaimRejected, false));
    assert_eq!(e.controller_reason.as_deref(), Some("WarmPoolNotFound"));
    assert!(e.controller_message.unwrap().contains("no-such-pool"));
    // Decided, not waited out: far inside the 60 s budget.
    assert!(t.elapsed() < budget / 4, "took {:?}", t.elapsed());
    assert_eq!(calls(&p).last(), Some(&call("sandboxclaims", Verb::Delete)));
    no_objects_left(&c).await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unschedulable_pod_is_capacity_read_before_the_cleanup_delete() {
    let c = Cluster::start(None).await.unwrap();
    c.ctl.set_pod_fault(Some(PodFault::Unschedulable));
    let mut opts = c.options(false);
    opts.ready_timeout = Duration::from_secs(1);
    let p = provider(&c, opts);
    let e = acquire_error(p.create(SandboxSpec::default()).await.err().unwrap());
    assert_eq!((e.reason, e.retryable), (AcquireReason::Capacity, true), "{e}");
    assert!(e.cause.contains("Insufficient cpu"), "{e}");
    let all = calls(&p);
    assert_eq!(
        all[all.len() - 2..],
        [call("pods", Verb::Get), call("sandboxes", Verb::Delete)],
        "{all:?}"
    );
    // The one pod read came after the budget: none before it.
    assert_eq!(all.iter().filter(|c| c.0 == "pods").count(), 1, "{all:?}");
    no_objects_left(&c).await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_that_cannot_be_pulled_is_image_pull_on_the_claim_path_too() {
    let c2 = Cluster::start(None).await.unwrap();
    c2.ctl.set_pod_fault(Some(PodFault::ImagePull));
    // The pool is made after the fault: its pods cannot pull either.
    c2.add_pool(1).unwrap();
    let mut opts = c2.options(true);
    // No warm candidate ever gets a pod IP: the claim cold-starts after
    // the controller's 2 s grace, and that pod cannot pull either.
    opts.ready_timeout = Duration::from_secs(4);
    let p = provider(&c2, opts);
    let e = acquire_error(p.create(SandboxSpec::default()).await.err().unwrap());
    assert_eq!((e.reason, e.retryable), (AcquireReason::ImagePull, false), "{e}");
    assert!(e.cause.contains("ImagePullBackOff"), "{e}");
    assert_eq!(calls(&p).last(), Some(&call("sandboxclaims", Verb::Delete)));
    no_objects_left(&c2).await;
    c2.stop().await;
}

fn fault(method: Method, target: &str, status: u16, retry_after: Option<u64>, times: usize) -> Fault {
    Fault {
        method: Some(method),
        target: target.into(),
        status,
        retry_after,
        times,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_reads_are_retried_inside_the_budget_no_sooner_than_retry_after() {
    let c = Cluster::start(Some(1)).await.unwrap();
    assert!(c.pool_ready(1, Duration::from_secs(30)).await);
    // Two 503s, then a 429 asking for 2 s, on the claim reads.
    c.sim.inject(fault(Method::GET, "sandboxclaims/", 503, None, 2));
    let p = provider(&c, c.options(true));
    let t = Instant::now();
    c.sim.inject(fault(Method::GET, "sandboxclaims/", 429, Some(2), 1));
    let sb = p.create_task(SandboxSpec::default()).await.unwrap();
    assert!(
        t.elapsed() >= Duration::from_secs(2),
        "Retry-After not honoured: {:?}",
        t.elapsed()
    );
    assert!(echo(&sb).await.starts_with("hello from"));
    // Never re-POSTed: one create.
    assert_eq!(calls(&p).iter().filter(|c| c.1 == Verb::Create).count(), 1);
    sb.destroy().await.unwrap();
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_end_the_acquire_at_once_as_forbidden() {
    let c = Cluster::start(None).await.unwrap();
    c.sim.inject(fault(Method::GET, "sandboxes/", 403, None, 1));
    let p = provider(&c, c.options(false));
    let e = acquire_error(p.create(SandboxSpec::default()).await.err().unwrap());
    assert_eq!((e.reason, e.retryable), (AcquireReason::Forbidden, false), "{e}");
    assert_eq!(calls(&p).last(), Some(&call("sandboxes", Verb::Delete)));
    no_objects_left(&c).await;
    // A 403 on the create itself: nothing was made, nothing to release.
    c.sim.inject(fault(Method::POST, "sandboxes", 403, None, 1));
    let p = provider(&c, c.options(false));
    let e = acquire_error(p.create(SandboxSpec::default()).await.err().unwrap());
    assert_eq!(e.reason, AcquireReason::Forbidden);
    assert_eq!(calls(&p).last(), Some(&call("sandboxes", Verb::Create)));
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_answers_is_api_timeout_within_the_budget() {
    let c = Cluster::start(None).await.unwrap();
    c.sim.stall(Stall {
        method: Some(Method::GET),
        target: "sandboxes/".into(),
        delay: Duration::from_secs(3600),
        times: 1000,
    });
    let mut opts = c.options(false);
    opts.ready_timeout = Duration::from_secs(3);
    opts.api_request_timeout = Duration::from_secs(1);
    let p = provider(&c, opts);
    let e = acquire_error(p.create(SandboxSpec::default()).await.err().unwrap());
    assert_eq!((e.reason, e.retryable), (AcquireReason::ApiTimeout, true), "{e}");
    // The timeout names the verb, the path and the bound — never a token.
    assert!(e.cause.contains("get") && e.cause.contains("/sandboxes/"), "{e}");
    no_objects_left(&c).await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_answer_was_lost_is_adopted_not_resent() {
    let c = Cluster::start(Some(1)).await.unwrap();
    assert!(c.pool_ready(1, Duration::from_secs(30)).await);
    // The POST lands, and its answer comes after the client gave up.
    c.sim.stall(Stall {
        method: Some(Method::POST),
        target: "sandboxclaims".into(),
        delay: Duration::from_secs(3),
        times: 1,
    });
    let mut opts = c.options(true);
    opts.api_request_timeout = Duration::from_secs(1);
    let p = provider(&c, opts);
    let sb = p.create_task(SandboxSpec::default()).await.unwrap();
    assert!(echo(&sb).await.starts_with("hello from"));
    assert_eq!(calls(&p).iter().filter(|c| c.1 == Verb::Create).count(), 1);
    assert_eq!(c.sim.all(CLAIMS).len(), 1);
    sb.destroy().await.unwrap();
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_409_adopts_the_claim_made_for_this_sandbox_and_no_other() {
    let c = Cluster::start(Some(1)).await.unwrap();
    assert!(c.pool_ready(1, Duration::from_secs(30)).await);
    let opts = c.options(true);
    let claims = Resource::of::<SandboxClaim>(NAMESPACE);
    let api = Api::new(c.client(), Duration::from_secs(5)).unwrap();
    // An earlier attempt for sb-00000000000a landed.
    let id = "sb-00000000000a";
    let earlier = build::claim(&opts, &object_name(id), id, SystemTime::now());
    api.create(&claims, &serde_json::to_value(earlier).unwrap())
        .await
        .unwrap();
    let p = provider(&c, opts.clone());
    let sb = p.create_task_with_id(id).await.unwrap();
    assert!(echo(&sb).await.starts_with("hello from"));
    assert_eq!(c.sim.all(CLAIMS).len(), 1);
    sb.destroy().await.unwrap();
    // A claim of that name made for another sandbox is not ours.
    let id = "sb-00000000000b";
    let theirs = build::claim(&opts, &object_name(id), "sb-somebody-else", SystemTime::now());
    api.create(&claims, &serde_json::to_value(theirs).unwrap())
        .await
        .unwrap();
    let e = p.create_task_with_id(id).await.err().unwrap();
    assert!(
        matches!(
            e.tier_error::<namzu_kubernetes::KubernetesError>(),
            Some(namzu_kubernetes::KubernetesError::Api(ApiError::Conflict { .. }))
        ),
        "{e:?}"
    );
    assert!(exists(&c, CLAIMS, &object_name(id)), "someone else's claim was deleted");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_ip_mode_follows_a_pod_replaced_between_the_read_and_the_dial() {
    let c = Cluster::start(None).await.unwrap();
    let mut opts = c.options(false);
    opts.address_mode = AddressMode::PodIp;
    opts.resolution = NameResolution::Custom(std::sync::Arc::new(|_| None));
    let p = provider(&c, opts);
    // The pod the acquire reads is replaced at once: its IP stops
    // answering and a new pod (new uid, new IP) takes its name.
    c.ctl.replace_next_pod_read();
    let sb = p.create_task(SandboxSpec::default()).await.unwrap();
    assert!(echo(&sb).await.starts_with("hello from"));
    let pod = c.get(PODS, &k8s(&sb).bound().pod.name).unwrap();
    assert_eq!(
        pod["metadata"]["uid"],
        k8s(&sb).bound().pod.uid.as_str(),
        "not bound to the replacement"
    );
    assert_eq!(pod["status"]["podIP"], k8s(&sb).bound().pod.ip.unwrap().to_string());
    // The first read, the re-read after the failed dial, and the wait for
    // the replacement's IP: pods only, nothing else.
    let pods = calls(&p).iter().filter(|c| c.0 == "pods").count();
    assert!(pods >= 2, "{:?}", calls(&p));
    sb.destroy().await.unwrap();
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_ip_mode_without_a_replacement_keeps_the_connect_failure() {
    let c = Cluster::start(None).await.unwrap();
    let mut opts = c.options(false);
    opts.address_mode = AddressMode::PodIp;
    // The agent listens on 1024; dialing another port fails at connect,
    // and the pod read again is the same pod.
    opts.agent_port = 1025;
    let p = provider(&c, opts);
    let e = p.create_task(SandboxSpec::default()).await.err().unwrap();
    assert!(matches!(e, Error::Connect { .. }), "{e:?}");
    assert_eq!(calls(&p).iter().filter(|c| c.0 == "pods").count(), 2);
    assert_eq!(calls(&p).last(), Some(&call("sandboxes", Verb::Delete)));
    no_objects_left(&c).await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_name_that_does_not_resolve_is_typed_and_points_at_pod_ip() {
    let c = Cluster::start(None).await.unwrap();
    let mut opts = c.options(false);
    // This host's own resolver knows nothing of cluster DNS.
    opts.resolution = NameResolution::System;
    let p = provider(&c, opts);
    let e = p.create_task(SandboxSpec::default()).await.err().unwrap();
    let Some(namzu_kubernetes::KubernetesError::AgentAddressUnresolvable { fqdn, .. }) =
        e.tier_error::<namzu_kubernetes::KubernetesError>()
    else {
        panic!("{e:?}")
    };
    assert!(fqdn.ends_with(".sandboxes.svc.cluster.local"), "{fqdn}");
    let shown = e
        .tier_error::<namzu_kubernetes::KubernetesError>()
        .map(ToString::to_string);
    assert!(shown.as_deref().is_some_and(|s| s.contains("pod-ip")), "{shown:?}");
    no_objects_left(&c).await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolver_that_cannot_answer_now_is_asked_again_within_the_connect_budget() {
    use namzu_kubernetes::Lookup;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let c = Cluster::start(None).await.unwrap();
    let NameResolution::Custom(cluster_dns) = c.ctl.resolution() else {
        panic!("the simulator's DNS is a custom resolver")
    };
    // Three EAI_AGAINs, then the cluster's answer.
    let asked = Arc::new(AtomicUsize::new(0));
    let n = asked.clone();
    let dns = cluster_dns.clone();
    let mut opts = c.options(false);
    opts.resolution = NameResolution::Fallible(Arc::new(move |fqdn| {
        if n.fetch_add(1, Ordering::SeqCst) < 3 {
            return Err(Lookup::Temporary("Temporary failure in name resolution".into()));
        }
        dns(fqdn).ok_or_else(|| Lookup::NotFound("no such name".into()))
    }));
    let sb = provider(&c, opts).create_task(SandboxSpec::default()).await.unwrap();
    assert!(echo(&sb).await.starts_with("hello from"));
    assert!(asked.load(Ordering::SeqCst) > 3);
    sb.destroy().await.unwrap();
    // A resolver that never can: typed, once the connect budget is spent.
    let mut opts = c.options(false);
    opts.resolution = NameResolution::Fallible(Arc::new(|_| Err(Lookup::Temporary("try again".into()))));
    let started = Instant::now();
    let e = provider(&c, opts)
        .with_client_options(namzu::ClientOptions {
            connect_timeout: Duration::from_secs(1),
            ..Default::default()
        })
        .create_task(SandboxSpec::default())
        .await
        .unwrap_err();
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    match e.tier_error::<namzu_kubernetes::KubernetesError>() {
        Some(namzu_kubernetes::KubernetesError::AgentAddressUnresolvable { cause, .. }) => {
            assert!(cause.contains("temporary failure"), "{cause}")
        }
        other => panic!("{other:?}"),
    }
    no_objects_left(&c).await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfined_pod_is_refused_by_the_privilege_probe_and_released() {
    let c = Cluster::start(None).await.unwrap();
    // What a pod without the restricted security context amounts to: the
    // agent runs confined by nothing.
    c.ctl.set_pod_fault(Some(PodFault::Unconfined));
    let p = provider(&c, c.options(false));
    let e = p.create_task(SandboxSpec::default()).await.err().unwrap();
    assert!(matches!(e, Error::PrivilegeProbe { .. }), "{e:?}");
    assert_eq!(calls(&p).last(), Some(&call("sandboxes", Verb::Delete)));
    no_objects_left(&c).await;
    c.stop().await;
}

/// A sandbox claimed from a pool of one, on a 2 s lease.
async fn claimed_with_a_short_lease() -> (Cluster, KubernetesProvider, namzu::Sandbox) {
    let c = Cluster::start(Some(1)).await.unwrap();
    assert!(c.pool_ready(1, Duration::from_secs(30)).await);
    let mut opts = c.options(true);
    opts.claim_ttl = Duration::from_secs(2);
    let p = provider(&c, opts);
    let sb = p.create_task(SandboxSpec::default()).await.unwrap();
    (c, p, sb)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_deleted_behind_the_handle_makes_the_next_call_sandbox_gone() {
    let (c, p, sb) = claimed_with_a_short_lease().await;
    let name = object_name(sb.id());
    let claims = Resource::of::<SandboxClaim>(NAMESPACE);
    // The lease keeps the claim alive past its TTL …
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(exists(&c, CLAIMS, &name), "the lease did not renew the claim");
    assert!(calls(&p).contains(&call("sandboxclaims", Verb::Patch)));
    assert!(echo(&sb).await.starts_with("hello from"));
    // … until somebody else deletes it.
    let api = Api::new(c.client(), Duration::from_secs(5)).unwrap();
    api.delete(&claims, &name).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = None;
    while Instant::now() < deadline {
        match sb.commands().run("true").await {
            Err(Error::SandboxGone { id }) => {
                assert_eq!(id, sb.id());
                last = None;
                break;
            }
            other => last = Some(format!("{other:?}")),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(last, None, "never SandboxGone");
    assert!(matches!(k8s(&sb).check_lease(), Err(Error::SandboxGone { .. })));
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_claim_expires_at_its_shutdown_time() {
    let (c, _p, sb) = claimed_with_a_short_lease().await;
    let (name, pod) = (object_name(sb.id()), k8s(&sb).bound().pod.name.clone());
    // The host goes away without a word: no destroy, no more renewals.
    drop(sb);
    let deadline = Instant::now() + Duration::from_secs(10);
    while (exists(&c, CLAIMS, &name) || exists(&c, PODS, &pod)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!exists(&c, CLAIMS, &name), "the claim outlived its shutdown time");
    assert!(!exists(&c, PODS, &pod), "the pod outlived its claim");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_reaches_commands_only_where_the_template_allows_it() {
    use namzu_k8s_sim::cluster::TEMPLATE;
    use namzu_k8s_sim::controller::TEMPLATES;
    let c = Cluster::start(Some(1)).await.unwrap();
    let spec = SandboxSpec {
        env: vec![("GREETING".into(), "hi from the claim".into())],
        ..Default::default()
    };
    // The shipped template allows additions: the claim's env is the
    // agent's, and so every command's.
    let p = provider(&c, c.options(true));
    let sb = p.create_task(spec.clone()).await.unwrap();
    let out = sb.commands().run("echo $GREETING").await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi from the claim\n");
    sb.destroy().await.unwrap();
    // … never a replacement of what the template sets, on either path.
    let token = SandboxSpec {
        env: vec![(build::TOKEN_ENV.into(), "chosen".into())],
        ..Default::default()
    };
    // The real controller calls this clash a ReconcilerError (retried, not
    // terminal); its message shows the claim at fault, so it ends the
    // acquire at once as a refusal.
    let e = acquire_error(p.create(token.clone()).await.err().unwrap());
    assert_eq!(e.controller_reason.as_deref(), Some("ReconcilerError"), "{e}");
    assert_eq!(e.reason, AcquireReason::ClaimRejected, "{e}");
    assert!(e.cause.contains(build::TOKEN_ENV), "{e}");
    let direct = provider(&c, c.options(false));
    match direct.create(token).await.err().unwrap() {
        Error::OptionRefused { option, .. } => assert_eq!(option, "env"),
        other => panic!("{other:?}"),
    }
    // Env aimed at a container the template does not have: a
    // ReconcilerError too, the claim at fault.
    let mut aimed = c.options(true);
    aimed.agent_container = Some("sidecar".into());
    let e = acquire_error(provider(&c, aimed).create(spec.clone()).await.err().unwrap());
    assert_eq!(
        (e.reason, e.controller_reason.as_deref()),
        (AcquireReason::ClaimRejected, Some("ReconcilerError")),
        "{e}"
    );
    assert!(e.cause.contains("\"sidecar\" not found in template"), "{e}");
    // A template that disallows injection refuses the claim for good.
    let mut t = c.get(TEMPLATES, TEMPLATE).unwrap();
    t["spec"]["envVarsInjectionPolicy"] = "Disallowed".into();
    c.sim.put(TEMPLATES, t);
    let e = acquire_error(p.create(spec).await.err().unwrap());
    assert_eq!((e.reason, e.retryable), (AcquireReason::ClaimRejected, false));
    assert_eq!(e.controller_reason.as_deref(), Some("EnvVarsInjectionRejected"), "{e}");
    // Without env the same template serves claims.
    let sb = p.create_task(SandboxSpec::default()).await.unwrap();
    sb.destroy().await.unwrap();
    no_objects_left(&c).await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_whose_template_is_missing_refuses_claims_for_good() {
    use namzu_k8s_sim::cluster::TEMPLATE;
    use namzu_k8s_sim::controller::TEMPLATES;
    let c = Cluster::start(Some(1)).await.unwrap();
    c.sim.remove(TEMPLATES, NAMESPACE, TEMPLATE);
    let p = provider(&c, c.options(true));
    let e = acquire_error(p.create(SandboxSpec::default()).await.err().unwrap());
    assert_eq!((e.reason, e.retryable), (AcquireReason::ClaimRejected, false));
    assert_eq!(e.controller_reason.as_deref(), Some("TemplateNotFound"), "{e}");
    no_objects_left(&c).await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_claimed_pod_cannot_take_is_refused_by_name_before_any_request() {
    let c = Cluster::start(None).await.unwrap();
    let p = provider(&c, c.options(true));
    let refused = [
        (
            SandboxSpec {
                image: Some("alpine".into()),
                ..Default::default()
            },
            "image",
        ),
        (
            SandboxSpec {
                resources: namzu::Resources {
                    cpus: Some(1.0),
                    ..Default::default()
                },
                ..Default::default()
            },
            "resources.cpus",
        ),
        (
            SandboxSpec {
                egress: namzu::egress::EgressConfig {
                    policy: namzu::egress::EgressPolicy::AllowAll,
                    ..Default::default()
                },
                ..Default::default()
            },
            "egress",
        ),
    ];
    for (spec, field) in refused {
        match p.create(spec).await.err().unwrap() {
            Error::OptionRefused { tier, option, .. } => {
                assert_eq!((tier, option.as_str()), (namzu::Tier::Kubernetes, field))
            }
            other => panic!("{field}: {other:?}"),
        }
    }
    assert!(p.api().calls().is_empty(), "{:?}", p.api().calls());
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_port_no_policy_closes_is_refused_unless_unverified_is_chosen() {
    use namzu_k8s_sim::controller::NETWORK_POLICIES;
    use namzu_kubernetes::policy::ingress::{IngressRefusal, IngressVerification};
    let c = Cluster::start(Some(1)).await.unwrap();
    assert!(c.pool_ready(1, Duration::from_secs(30)).await);
    // The operator never applied deploy/k8s/networkpolicy.yaml, and runs
    // the template Unmanaged: the controller deletes the policy it made
    // from the template's networkPolicy.
    c.sim.remove(NETWORK_POLICIES, NAMESPACE, "namzu-agent-port");
    let tpl = namzu_k8s_sim::cluster::TEMPLATE;
    c.sim.update(namzu_k8s_sim::controller::TEMPLATES, NAMESPACE, tpl, |t| {
        t["spec"]["networkPolicyManagement"] = "Unmanaged".into();
    });
    let managed = format!("{tpl}-network-policy");
    let deadline = Instant::now() + Duration::from_secs(10);
    while exists(&c, NETWORK_POLICIES, &managed) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !exists(&c, NETWORK_POLICIES, &managed),
        "an Unmanaged template's policy stayed"
    );
    let p = provider(&c, c.options(true));
    let e = p.create_task(SandboxSpec::default()).await.err().unwrap();
    let Ok(namzu_kubernetes::KubernetesError::Ingress(e)) = e.into_tier_error::<namzu_kubernetes::KubernetesError>()
    else {
        panic!("not a kubernetes Ingress error")
    };
    assert_eq!((e.refusal, e.port), (IngressRefusal::NoCoveringPolicy, 1024));
    // The pod as the check saw it: the template's labels.
    assert_eq!(e.pod_labels[build::MANAGED_BY_LABEL], build::MANAGED_BY);
    assert_eq!(calls(&p).last(), Some(&call("sandboxclaims", Verb::Delete)));
    no_objects_left(&c).await;
    // Unverified, on purpose: no policy is read at all.
    let mut opts = c.options(true);
    opts.ingress = IngressVerification::Unverified;
    let q = provider(&c, opts);
    let sb = q.create_task(SandboxSpec::default()).await.unwrap();
    assert!(calls(&q).iter().all(|c| c.0 != "networkpolicies"), "{:?}", calls(&q));
    sb.destroy().await.unwrap();
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_claim_reasons_are_waited_through_not_refused() {
    let c = Cluster::start(Some(1)).await.unwrap();
    assert!(c.pool_ready(1, Duration::from_secs(30)).await);
    // What a real controller's cache races show a claim before it binds.
    let transient = ["AdoptionConflict", "SandboxCreatePending", "SandboxMissing"];
    c.ctl.contend(&transient, Duration::from_millis(300));
    let p = provider(&c, c.options(true));
    let sb = p.create_task(SandboxSpec::default()).await.unwrap();
    let polls = calls(&p)
        .iter()
        .filter(|c| **c == call("sandboxclaims", Verb::Get))
        .count();
    // About 900 ms of not-Ready reasons at a 50 ms poll.
    assert!(polls >= 10, "the host stopped polling after {polls} reads");
    assert!(sb.commands().run("true").await.unwrap().status.success());
    sb.destroy().await.unwrap();
    c.stop().await;
}

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
use namzu_kubernetes::api::{Api, ApiError, Call, Resource, Verb};
use namzu_kubernetes::crd::SandboxClaim;
use namzu_kubernetes::{build, AddressMode, KubernetesOptions, KubernetesProvider, NameResolution};

fn provider(c: &Cluster, opts: KubernetesOptions) -> KubernetesProvider {
    KubernetesProvider::new(c.client(), opts).unwrap()
}

fn calls(p: &KubernetesProvider) -> Vec<(String, Verb)> {
    p.api()
        .calls()
        .into_iter()
        .map(|Call { resource, verb, .. }| (resource, verb))
        .collect()
}

/// The calls with runs of one repeated call folded into one: what a
/// sequence is, whatever the number of polls.
fn folded(p: &KubernetesProvider) -> Vec<(String, Verb)> {
    let mut out: Vec<(String, Verb)> = Vec::new();
    for c in calls(p) {
        if out.last() != Some(&c) {
            out.push(c);
        }
    }
    out
}

fn call(resource: &str, verb: Verb) -> (String, Verb) {
    (resource.into(), verb)
}

fn exists(c: &Cluster, gvr: namzu_k8s_sim::Gvr, name: &str) -> bool {
    c.get(gvr, name).is_some()
}

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

fn acquire_error(e: Error) -> namzu_kubernetes::acquire_error::AcquireError {
    match e.into_tier_error::<namzu_kubernetes::KubernetesError>() {
        Ok(namzu_kubernetes::KubernetesError::Acquire(a)) => a,
        other => panic!("not an acquire error: {other:?}"),
    }
}

/// Nothing namzu made is left once the garbage collector (asynchronous,
/// as a cluster's is) has followed the owner references.
async fn no_objects_left(c: &Cluster) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while [CLAIMS, SANDBOXES].iter().any(|g| c.sandbox_objects(*g) > 0) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for gvr in [CLAIMS, SANDBOXES] {
        assert_eq!(c.sandbox_objects(gvr), 0, "left behind in {}", gvr.2);
    }
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
async fn the_pods_agent_answers_on_its_tcp_port_only_to_the_pod_uid() {
    use namzu::{AgentClient, ClientOptions};
    use namzu_k8s_sim::podnet::Mode;
    let c = Cluster::start(None).await.unwrap();
    // Where the test command sets up the machine (root, iproute2), pods
    // get a real network namespace address; elsewhere the relay.
    if std::env::var("NAMZU_REQUIRE_NET").as_deref() == Ok("1") {
        assert_eq!(c.ctl.pod_network(), Mode::Veth);
    }
    let mut opts = c.options(false);
    opts.address_mode = AddressMode::PodIp;
    let p = provider(&c, opts);
    let sb = p.create_task(SandboxSpec::default()).await.unwrap();
    let addr = std::net::SocketAddr::new(k8s(&sb).bound().pod.ip.unwrap(), 1024);
    if c.ctl.pod_network() == Mode::Veth {
        assert!(addr.ip().to_string().starts_with("10.244."), "{addr}");
    }
    let wrong = AgentClient::connect_tcp("x", addr, b"not-the-uid".to_vec(), ClientOptions::default()).await;
    assert!(matches!(wrong, Err(Error::Preface { .. })), "{wrong:?}");
    let right = AgentClient::connect_tcp(
        "x",
        addr,
        k8s(&sb).bound().pod.uid.clone().into_bytes(),
        ClientOptions::default(),
    )
    .await
    .unwrap();
    let out = right.exec(ExecRequest::shell("echo $((20+22))")).await.unwrap();
    assert_eq!(&out.stdout[..], b"42\n");
    sb.destroy().await.unwrap();
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_replaced_under_a_live_handle_is_followed_by_every_later_call_and_said_so() {
    let c = Cluster::start(None).await.unwrap();
    for mode in [AddressMode::Service, AddressMode::PodIp] {
        let told: std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>> = Default::default();
        let seen = told.clone();
        let opts = KubernetesOptions {
            address_mode: mode,
            on_pod_replaced: Some(std::sync::Arc::new(move |_id, was, now| {
                seen.lock().unwrap().push((was.uid.clone(), now.uid.clone()));
            })),
            ..c.options(false)
        };
        // An evicted pod says nothing: the link notices by its keepalive.
        let p = provider(&c, opts).with_client_options(namzu::ClientOptions {
            keepalive: Duration::from_secs(1),
            ..Default::default()
        });
        let sb = p.create_task(SandboxSpec::default()).await.unwrap();
        sb.files().write(std::path::Path::new("state"), "kept").await.unwrap();
        let was = k8s(&sb).bound().pod.clone();
        c.ctl.replace_pod(&c.sim, NAMESPACE, &was.name).await;
        // The next calls reach the replacement (its new address under
        // pod-ip; under Service the name already leads there), offering
        // ITS token: a call in flight on the dead link may fail, later
        // ones go through.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match sb.commands().run("true").await {
                Ok(_) => break,
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!("not yet: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("{mode:?}: never reached the replacement: {e}"),
            }
        }
        let now = k8s(&sb).current_pod();
        assert_ne!(now.uid, was.uid, "{mode:?}");
        assert_eq!(now.name, was.name);
        assert_eq!(c.get(PODS, &was.name).unwrap()["metadata"]["uid"], now.uid.as_str());
        // Said so, once: the old pod's files are gone with it.
        assert_eq!(
            *told.lock().unwrap(),
            vec![(was.uid.clone(), now.uid.clone())],
            "{mode:?}"
        );
        let r = sb.files().read(std::path::Path::new("state")).await;
        assert!(r.is_err(), "{mode:?}: the replacement holds the old pod's file: {r:?}");
        sb.destroy().await.unwrap();
    }
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

/// The Kubernetes backend behind a handle.
fn k8s(sb: &namzu::Sandbox) -> &namzu_kubernetes::KubernetesSandbox {
    sb.backend().expect("a kubernetes sandbox")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfirmed_cancel_releases_the_claim_and_says_so() {
    use namzu::{ExecEvent, ExecRequest};
    use tokio_stream::StreamExt;
    use tokio_util::sync::CancellationToken;
    let c = Cluster::start(Some(1)).await.unwrap();
    let p = provider(&c, c.options(true));
    let spec = SandboxSpec {
        limits: vec![("cancel_confirm_ms".into(), 400)],
        ..Default::default()
    };
    let sb = p.create_task(spec).await.unwrap();
    let claim = object_name(sb.id());
    // A zombie kept in the group: the agent cannot confirm the kill.
    let token = CancellationToken::new();
    let mut s = sb
        .commands()
        .stream(ExecRequest::shell("(sleep 30 & exec setsid sleep 30) & echo ready; wait").cancel_token(token.clone()))
        .await
        .unwrap();
    let mut last = None;
    while let Some(ev) = s.next().await {
        match ev {
            Ok(ExecEvent::Stdout { data, .. }) if data.starts_with(b"ready") => {
                tokio::time::sleep(Duration::from_millis(300)).await;
                token.cancel();
            }
            Ok(_) => {}
            Err(e) => {
                last = Some(e);
                break;
            }
        }
    }
    let Some(Error::RemoteCancellationUnknown {
        retirement: Some(note), ..
    }) = &last
    else {
        panic!("{last:?}")
    };
    assert!(note.contains(&claim) && note.contains("released"), "{note}");
    // The claim is deleted (and its Sandbox and pod with it); the handle
    // refuses every op from now on.
    let deadline = Instant::now() + Duration::from_secs(10);
    while exists(&c, CLAIMS, &claim) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!exists(&c, CLAIMS, &claim), "the claim outlived an unconfirmed cancel");
    let r = sb.commands().run("true").await;
    assert!(matches!(r, Err(Error::SandboxGone { .. })), "{r:?}");
    no_objects_left(&c).await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_refuses_a_claim_rebound_to_a_new_empty_sandbox() {
    let c = Cluster::start(Some(1)).await.unwrap();
    assert!(c.pool_ready(1, Duration::from_secs(30)).await);
    let p = provider(&c, c.options(true));
    let sb = p.create_task(SandboxSpec::default()).await.unwrap();
    sb.files()
        .write(std::path::Path::new("/workspace/state"), &b"mine"[..])
        .await
        .unwrap();
    // A reconnect while nothing changed binds the same sandbox.
    let again = p.connect(sb.id()).await.unwrap();
    assert_eq!(
        &again
            .files()
            .read(std::path::Path::new("/workspace/state"))
            .await
            .unwrap()[..],
        b"mine"
    );
    drop(again);
    // The Sandbox vanishes (deleted by someone, or by a node's loss): the
    // controller binds the claim to a new one, whose pod holds nothing.
    let was = k8s(&sb).bound().clone();
    c.sim.remove(SANDBOXES, NAMESPACE, &was.sandbox);
    let rebound = {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let cl = c.get(CLAIMS, &was.owner_name).unwrap();
            let now = cl["status"]["sandbox"]["name"].as_str().map(String::from);
            let ready = cl["status"]["conditions"][0]["status"] == "True";
            match now.and_then(|n| c.get(SANDBOXES, &n)) {
                Some(s) if ready && s["metadata"]["uid"].as_str() != was.sandbox_uid.as_deref() => break s,
                _ if Instant::now() > deadline => panic!("never rebound: {cl}"),
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    };
    let e = p.connect(sb.id()).await.err().unwrap();
    match e.tier_error::<namzu_kubernetes::KubernetesError>() {
        Some(namzu_kubernetes::KubernetesError::Rebound {
            recorded_sandbox_uid,
            sandbox_uid,
            ..
        }) => {
            assert_eq!(Some(recorded_sandbox_uid.as_str()), was.sandbox_uid.as_deref());
            assert_eq!(Some(sandbox_uid.as_str()), rebound["metadata"]["uid"].as_str());
        }
        other => panic!("{other:?} ({e})"),
    }
    sb.destroy().await.unwrap();
    no_objects_left(&c).await;
    c.stop().await;
}

/// The shipped template under `name`, its pod spec changed by `edit`.
fn template_variant(c: &Cluster, name: &str, edit: impl FnOnce(&mut serde_json::Value)) {
    use namzu_k8s_sim::cluster::TEMPLATE;
    use namzu_k8s_sim::controller::TEMPLATES;
    let mut t = c.get(TEMPLATES, TEMPLATE).unwrap();
    t["metadata"] = serde_json::json!({"name": name, "namespace": NAMESPACE});
    t.as_object_mut().unwrap().remove("status");
    edit(&mut t["spec"]["podTemplate"]["spec"]);
    c.sim.put(TEMPLATES, t);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_run_their_workload_image_with_the_agent_their_init_container_installed() {
    use namzu_k8s_sim::images::AGENT_IMAGE;
    let c = Cluster::start(Some(1)).await.unwrap();
    let p = provider(&c, c.options(true));
    let sb = p.create_task(SandboxSpec::default()).await.unwrap();
    // Commands run in the workload image (Debian bookworm, minbase): not
    // the host's filesystem, which has a compiler this image lacks.
    let out = sb
        .commands()
        .run("cat /etc/debian_version; test -e /usr/bin/gcc && echo has-gcc || echo no-gcc")
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.starts_with("12."), "{text}");
    if std::path::Path::new("/usr/bin/gcc").exists() {
        assert!(text.contains("no-gcc"), "the pod sees the host's /usr: {text}");
    }
    // The agent it runs is the copy the init container put in the pod's
    // emptyDir.
    let pod = c.get(PODS, &k8s(&sb).bound().pod.name).unwrap();
    let installed = c
        .state_dir()
        .join("sim-pods")
        .join(pod["metadata"]["uid"].as_str().unwrap())
        .join("volumes/namzu/namzu-agent");
    assert!(installed.is_file(), "{}", installed.display());
    sb.destroy().await.unwrap();

    // The template shape that shipped before: the FROM-scratch agent image
    // as the workload. The pod runs — and a shell command cannot.
    template_variant(&c, "agent-only", |spec| {
        spec.as_object_mut().unwrap().remove("initContainers");
        let ctr = &mut spec["containers"][0];
        ctr["image"] = AGENT_IMAGE.into();
        ctr["command"] = serde_json::json!(["/namzu-agent"]);
    });
    let direct = |template: &str, budget: u64| {
        provider(
            &c,
            KubernetesOptions {
                template_name: Some(template.into()),
                warm_pool_name: None,
                ready_timeout: Duration::from_secs(budget),
                ..c.options(false)
            },
        )
    };
    let bare = direct("agent-only", 60)
        .create_task(SandboxSpec::default())
        .await
        .unwrap();
    let r = bare.commands().run("echo hi").await;
    let e = r.expect_err("a shell ran in an image without one");
    assert!(e.to_string().contains("sh"), "{e}");
    let plain = bare
        .commands()
        .run(ExecRequest::new("/namzu-agent").arg("--version"))
        .await
        .unwrap();
    assert!(plain.status.success(), "{plain:?}");
    bare.destroy().await.unwrap();

    // No init container to install the agent where the command says: the
    // container cannot start, and the acquire says so.
    template_variant(&c, "no-install", |spec| {
        spec.as_object_mut().unwrap().remove("initContainers");
    });
    let e = acquire_error(
        direct("no-install", 3)
            .create(SandboxSpec::default())
            .await
            .err()
            .unwrap(),
    );
    assert_eq!((e.reason, e.retryable), (AcquireReason::ContainerError, false), "{e}");
    assert!(e.cause.contains("/namzu/namzu-agent"), "{e}");
    // A workload image the node does not have: ImagePull, the image named.
    template_variant(&c, "unpulled", |spec| {
        spec["containers"][0]["image"] = "python:3.12-slim".into();
    });
    let e = acquire_error(
        direct("unpulled", 3)
            .create(SandboxSpec::default())
            .await
            .err()
            .unwrap(),
    );
    assert_eq!(e.reason, AcquireReason::ImagePull, "{e}");
    assert!(e.cause.contains("python:3.12-slim"), "{e}");
    no_objects_left(&c).await;
    c.stop().await;
}

//! A task sandbox's life on the simulated cluster after it was handed out:
//! its pod replaced under it (followed, and said so), a cancel the agent
//! cannot confirm (the claim released), a reconnect to a claim the
//! controller re-bound (refused), and pods that run their workload image
//! with the agent an init container installed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use namzu::{Error, ExecRequest, Provider, SandboxSpec};
use namzu_k8s_sim::cluster::{Cluster, NAMESPACE};
use namzu_k8s_sim::controller::{CLAIMS, PODS, SANDBOXES};
use namzu_kubernetes::acquire::object_name;
use namzu_kubernetes::acquire_error::AcquireReason;
use namzu_kubernetes::{AddressMode, KubernetesOptions};

mod common;
use common::*;

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
async fn an_unconfirmed_cancel_releases_the_claim_and_says_so() {
    let c = Cluster::start(Some(1)).await.unwrap();
    let p = provider(&c, c.options(true));
    let spec = SandboxSpec {
        limits: vec![("cancel_confirm_ms".into(), 400)],
        ..Default::default()
    };
    let sb = p.create_task(spec).await.unwrap();
    let claim = object_name(sb.id());
    // A zombie kept in the group: the agent cannot confirm the kill.
    let note = unconfirmed_cancel(&sb).await;
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
    // as the workload (running its own agent; the init container stays for
    // the link's TLS files). The pod runs — and a shell command cannot.
    template_variant(&c, "agent-only", |spec| {
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

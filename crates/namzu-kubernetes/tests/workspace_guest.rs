//! Persistent workspaces on the control-plane SIMULATOR, seen from the
//! guest: a suspend's flush and quiesce (confirmed, unconfirmed,
//! unsupported), an unconfirmed cancel that keeps the workspace, and the
//! guest moving under a holder — a pod replaced, a container restarted —
//! told with both identities.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use namzu::Error;
use namzu_k8s_sim::cluster::Cluster;
use namzu_k8s_sim::controller::{PODS, SANDBOXES};
use namzu_kubernetes::workspace::{Flush, FlushNotice, SuspendOptions};
use namzu_kubernetes::{WorkspaceError, WorkspaceOptions};

mod common;
use common::workspace::*;
use common::*;

/// Unlike a task sandbox, a workspace whose agent cannot confirm a cancel
/// is KEPT: the error says so, nothing is deleted or suspended, the fenced
/// agent refuses work, and a suspend and resume (a new pod on the same
/// disk) is the cure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfirmed_cancel_keeps_the_workspace_and_a_suspend_and_resume_cures_it() {
    use namzu::SandboxSpec;
    let c = Cluster::start(None).await.unwrap();
    let p = provider(&c, c.options(false));
    let spec = SandboxSpec {
        limits: vec![("cancel_confirm_ms".into(), 400)],
        ..Default::default()
    };
    let (notices, tell) = recorder::<FlushNotice>();
    let w = WorkspaceOptions {
        on_flush_notice: Some(tell),
        ..WorkspaceOptions::for_spec(&spec).unwrap()
    };
    let ws = p.workspace("kept", w).await.unwrap();
    let sb = ws.sandbox().await.unwrap();
    sb.files().write(Path::new("keep.txt"), "kept").await.unwrap();
    let note = unconfirmed_cancel(&sb).await;
    assert!(note.starts_with("workspace-kept:") && note.contains("kept"), "{note}");
    let obj = c.get(SANDBOXES, "namzu-ws-kept").expect("the workspace was deleted");
    assert_eq!(obj["spec"]["operatingMode"], "Running");
    let r = sb.commands().run("true").await;
    assert!(matches!(r, Err(Error::AgentRetiring { .. })), "{r:?}");
    // The flush a fenced agent cannot do is reported, and the suspend goes on.
    ws.suspend(SuspendOptions::default()).await.unwrap();
    let n = notices.lock().unwrap().clone();
    assert!(matches!(n.as_slice(), [FlushNotice::Unreachable { .. }]), "{n:?}");
    ws.resume(Default::default()).await.unwrap();
    assert_eq!(read(&ws, "keep.txt").await, b"kept");
    assert!(ws.sandbox().await.unwrap().commands().run("true").await.is_ok());
    p.delete_workspace("kept", None).await.unwrap();
    c.stop().await;
}

/// The guest moving under a holder is said: a pod replaced under a live
/// handle is followed, announced with both pods, and — unlike a task
/// sandbox's — comes back with the disk; a workspace another host
/// suspended is named as such when a call fails; one deleted is gone for
/// good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_pod_is_followed_and_announced_and_a_foreign_suspend_or_delete_is_named() {
    use namzu_k8s_sim::cluster::NAMESPACE;
    use namzu_kubernetes::workspace::{GuestRestart, GuestRestartKind, NoticedBy};
    let c = Cluster::start(None).await.unwrap();
    // An evicted pod says nothing: the link notices by its keepalive.
    let p = keepalive_provider(&c);
    let (told, tell) = recorder::<GuestRestart>();
    let w = WorkspaceOptions {
        on_guest_restart: Some(tell),
        ..Default::default()
    };
    let ws = p.workspace("moved", w).await.unwrap();
    ws.sandbox()
        .await
        .unwrap()
        .files()
        .write(Path::new("f"), "disk")
        .await
        .unwrap();
    let before = ws.identity().await;
    // The handle's own check: the same agent, nothing to say.
    assert_eq!(ws.check_guest().await.unwrap(), before);
    c.ctl.replace_pod(&c.sim, NAMESPACE, "namzu-ws-moved").await;
    let sb = ws.sandbox().await.unwrap();
    run_once_reached(&sb, "true").await;
    let events = told.lock().unwrap().clone();
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!(e.kind, GuestRestartKind::PodReplaced);
    assert_eq!(Some(e.previous.pod_uid.clone()), before.pod_uid);
    assert_eq!(e.previous.boot_id, before.boot_id);
    assert_eq!(e.current.boot_id, None, "the replacement had not answered");
    let now = ws.check_guest().await.unwrap();
    assert_eq!(now.pod_uid.as_deref(), Some(e.current.pod_uid.as_str()));
    assert!(now.boot_id.is_some() && now.boot_id != before.boot_id);
    assert_eq!(
        told.lock().unwrap().len(),
        1,
        "a replacement's first answer is no restart"
    );
    assert_eq!(read(&ws, "f").await, b"disk", "the disk did not follow the pod");

    // Another host suspends it: the next failing call is explained.
    let q = provider(&c, c.options(false));
    q.suspend_workspace("moved", skip()).await.unwrap();
    match ws_error(ws.check_guest().await.unwrap_err()) {
        WorkspaceError::Suspended { noticed_by, .. } => assert_eq!(noticed_by, NoticedBy::Transport),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        ws_error(ws.sandbox().await.unwrap_err()),
        WorkspaceError::Suspended {
            noticed_by: NoticedBy::Transport,
            ..
        }
    ));
    // Resumed, then deleted by the other host: gone for good.
    ws.resume(Default::default()).await.unwrap();
    q.delete_workspace("moved", None).await.unwrap();
    sim::until(30, || c.get(PODS, "namzu-ws-moved").is_none().then_some(())).await;
    match ws_error(ws.check_guest().await.unwrap_err()) {
        WorkspaceError::GuestGone { reason, .. } => assert!(reason.contains("no longer exists"), "{reason}"),
        other => panic!("{other:?}"),
    }
    c.stop().await;
}

/// The handle's quiesce stops every process before the patch: a process
/// that ignores SIGTERM, which otherwise keeps the stopping pod (and the
/// suspend) waiting the agent's shutdown grace, is gone first, and the
/// pod stops inside a budget the plain suspend misses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiescing_suspend_stops_every_process_before_the_patch() {
    let c = Cluster::start(None).await.unwrap();
    let quick = namzu_kubernetes::KubernetesOptions {
        ready_timeout: std::time::Duration::from_secs(4),
        ..c.options(false)
    };
    let p = provider(&c, quick);
    let ws = p.workspace("hush", WorkspaceOptions::default()).await.unwrap();
    start_stubborn(&ws).await;
    let s = SuspendOptions {
        quiesce: Some(std::time::Duration::from_millis(200)),
        ..Default::default()
    };
    ws.suspend(s).await.unwrap();
    assert!(c.get(PODS, "namzu-ws-hush").is_none());
    p.delete_workspace("hush", None).await.unwrap();
    c.stop().await;
}

/// A flush the guest answered and could not confirm stops the suspend:
/// no patch is sent, the workspace runs on, the handle still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfirmed_flush_sends_no_patch_and_leaves_the_workspace_running() {
    let c = Cluster::start(None).await.unwrap();
    let p = provider(&c, c.options(false));
    let ws = p.workspace("dirty", WorkspaceOptions::default()).await.unwrap();
    let sb = ws.sandbox().await.unwrap();
    // Enough dirty pages that syncfs cannot finish in a millisecond.
    let out = sb
        .commands()
        .run("head -c 268435456 /dev/zero > /workspace/big && echo written")
        .await
        .unwrap();
    assert_eq!(&out.stdout[..], b"written\n");
    let before = calls(&p).len();
    let s = SuspendOptions {
        flush: Flush::Within(std::time::Duration::from_millis(1)),
        ..Default::default()
    };
    match ws_error(ws.suspend(s).await.unwrap_err()) {
        WorkspaceError::FlushUnconfirmed { message, .. } => assert!(message.contains("did not finish"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(writes_since(&p, before), vec![], "a patch was sent");
    assert_eq!(
        c.get(SANDBOXES, "namzu-ws-dirty").unwrap()["spec"]["operatingMode"],
        "Running"
    );
    assert!(sb.commands().run("true").await.is_ok(), "the handle stopped working");
    ws.suspend(SuspendOptions::default()).await.unwrap();
    p.delete_workspace("dirty", None).await.unwrap();
    c.stop().await;
}

/// A container the kubelet restarted in the same pod — a new agent, the
/// same pod uid and address, the disk kept — is found at the link's next
/// re-dial (the agent's hello names its boot id) and told once as
/// `ContainerRestarted`, naming both boot ids; results carry the new one;
/// what the old container wrote outside the disk is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_container_is_told_once_with_both_boot_ids_and_the_disk_kept() {
    use namzu_k8s_sim::cluster::NAMESPACE;
    use namzu_kubernetes::workspace::{GuestRestart, GuestRestartKind};
    let c = Cluster::start(None).await.unwrap();
    let p = keepalive_provider(&c);
    let (told, tell) = recorder::<GuestRestart>();
    let w = WorkspaceOptions {
        on_guest_restart: Some(tell),
        ..Default::default()
    };
    let ws = p.workspace("reborn", w).await.unwrap();
    let sb = ws.sandbox().await.unwrap();
    sb.files().write(Path::new("/workspace/kept"), "disk").await.unwrap();
    let first = sb.commands().run("echo x > /tmp/scratch && echo ok").await.unwrap();
    assert_eq!(&first.stdout[..], b"ok\n");
    let before = ws.identity().await;
    assert_eq!(Some(first.boot_id.clone()), before.boot_id, "a result names its agent");
    c.ctl
        .restart_container(&c.sim, NAMESPACE, "namzu-ws-reborn")
        .await
        .unwrap();
    let pod = c.get(PODS, "namzu-ws-reborn").unwrap();
    assert_eq!(
        pod["metadata"]["uid"].as_str(),
        before.pod_uid.as_deref(),
        "the same pod"
    );
    assert_eq!(pod["status"]["containerStatuses"][0]["restartCount"], 1);
    let probe = "cat /workspace/kept; test -e /tmp/scratch && echo ' scratch kept' || echo ' scratch gone'";
    let after = run_once_reached(&sb, probe).await;
    assert_eq!(&after.stdout[..], b"disk scratch gone\n", "{after:?}");
    let events = told.lock().unwrap().clone();
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!(e.kind, GuestRestartKind::ContainerRestarted);
    assert_eq!(Some(e.previous.pod_uid.clone()), before.pod_uid);
    assert_eq!(e.current.pod_uid, e.previous.pod_uid);
    assert_eq!(e.previous.boot_id, before.boot_id);
    assert_eq!(e.current.boot_id.as_deref(), Some(after.boot_id.as_str()));
    assert_ne!(Some(after.boot_id.clone()), before.boot_id);
    // The handle's own check agrees, and tells nothing twice.
    let now = ws.check_guest().await.unwrap();
    assert_eq!(now.boot_id.as_deref(), Some(after.boot_id.as_str()));
    assert_eq!(told.lock().unwrap().len(), 1);
    ws.suspend(skip()).await.unwrap();
    p.delete_workspace("reborn", None).await.unwrap();
    c.stop().await;
}

/// A guest that does not offer flush (an agent image that predates it,
/// here one with the feature switched off) is told through
/// `on_flush_notice` as `Unsupported`, and the suspend goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_without_flush_is_told_as_unsupported_and_the_suspend_goes_on() {
    let c = Cluster::start(None).await.unwrap();
    let p = provider(&c, c.options(false));
    let (notices, tell) = recorder::<FlushNotice>();
    let w = WorkspaceOptions {
        env: vec![("NAMZU_DISABLED_FEATURES".into(), namzu_proto::features::FLUSH.into())],
        on_flush_notice: Some(tell),
        ..Default::default()
    };
    let ws = p.workspace("old", w).await.unwrap();
    let sb = ws.sandbox().await.unwrap();
    assert!(
        matches!(
            sb.agent().flush(std::time::Duration::from_secs(1)).await,
            Err(Error::Unsupported { .. })
        ),
        "the guest offers flush"
    );
    ws.suspend(SuspendOptions::default()).await.unwrap();
    assert_eq!(
        *notices.lock().unwrap(),
        vec![FlushNotice::Unsupported {
            workspace: "old".into()
        }]
    );
    assert_eq!(
        c.get(SANDBOXES, "namzu-ws-old").unwrap()["spec"]["operatingMode"],
        "Suspended"
    );
    p.delete_workspace("old", None).await.unwrap();
    c.stop().await;
}

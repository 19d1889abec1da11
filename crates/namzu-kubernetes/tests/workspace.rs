//! Persistent workspaces on the control-plane SIMULATOR, whose pods are
//! real local-tier sandboxes and whose PVCs are directories on the node
//! that outlive the pods: bytes written before a suspend are read back
//! after the resume, from a new pod; adopt and resume by name report their
//! origin; a standing object that disagrees is refused by field; two hosts
//! on one workspace are fenced by the holder epoch; the standalone verbs
//! never dial a guest or wake a workspace.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use namzu::Error;
use namzu_k8s_sim::cluster::Cluster;
use namzu_k8s_sim::controller::{PODS, PVCS, SANDBOXES};
use namzu_kubernetes::api::Verb;
use namzu_kubernetes::workspace::{
    Flush, FlushNotice, SuspendOptions, WorkspaceSummary, HOLDER_EPOCH_ANNOTATION, MODE_CHANGED_AT_ANNOTATION,
};
use namzu_kubernetes::{KubernetesError, Origin, WorkspaceError, WorkspaceOptions};

mod common;
use common::*;

fn ws_error(e: Error) -> WorkspaceError {
    match e.into_tier_error::<KubernetesError>() {
        Ok(KubernetesError::Workspace(w)) => *w,
        other => panic!("not a workspace error: {other:?}"),
    }
}

/// File `path` of a running workspace.
async fn read(ws: &namzu_kubernetes::KubernetesWorkspace, path: &str) -> Vec<u8> {
    let sb = ws.sandbox().await.unwrap();
    sb.files().read(Path::new(path)).await.unwrap().to_vec()
}

/// Opened under holder epoch `e`.
fn at(e: u64) -> WorkspaceOptions {
    WorkspaceOptions {
        epoch: Some(e),
        ..Default::default()
    }
}

fn skip() -> SuspendOptions {
    SuspendOptions {
        flush: Flush::Skip,
        ..Default::default()
    }
}

/// Bytes no text round trip would keep: every byte value, and more.
fn payload() -> Vec<u8> {
    (0..300_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_written_before_a_suspend_is_read_back_byte_exact_from_the_resumed_pod() {
    let c = Cluster::start(None).await.unwrap();
    let p = provider(&c, c.options(false));
    let notices: std::sync::Arc<std::sync::Mutex<Vec<FlushNotice>>> = Default::default();
    let told = notices.clone();
    let w = WorkspaceOptions {
        on_flush_notice: Some(std::sync::Arc::new(move |n: &FlushNotice| {
            told.lock().unwrap().push(n.clone())
        })),
        ..Default::default()
    };
    let ws = p.workspace("notes", w).await.unwrap();
    assert_eq!(ws.origin(), Origin::Created);
    let first = ws.identity().await;
    assert!(first.pod_uid.is_some() && first.boot_id.as_deref().is_some_and(|b| !b.is_empty()));
    let sb = ws.sandbox().await.unwrap();
    let bytes = payload();
    sb.files().write(Path::new("blob.bin"), bytes.clone()).await.unwrap();
    let pvc = format!("workspace-{}", ws.sandbox_name());
    let pvc_uid = c.get(PVCS, &pvc).expect("the disk's claim")["metadata"]["uid"].clone();

    // Suspend (flushing first, the default): the pod is gone when it
    // returns, the claim stands, and the handle refuses before dialing.
    ws.suspend(SuspendOptions::default()).await.unwrap();
    assert_eq!(*notices.lock().unwrap(), vec![], "the guest's flush was not confirmed");
    assert!(c.get(PODS, ws.sandbox_name()).is_none(), "the pod outlived the suspend");
    assert_eq!(
        c.get(PVCS, &pvc).unwrap()["metadata"]["uid"],
        pvc_uid,
        "the disk was not kept"
    );
    let obj = c.get(SANDBOXES, ws.sandbox_name()).unwrap();
    assert_eq!(obj["spec"]["operatingMode"], "Suspended");
    assert!(obj["metadata"]["annotations"][MODE_CHANGED_AT_ANNOTATION].is_string());
    match ws_error(ws.sandbox().await.unwrap_err()) {
        WorkspaceError::Suspended { noticed_by, .. } => {
            assert_eq!(noticed_by, namzu_kubernetes::workspace::NoticedBy::Admission)
        }
        other => panic!("{other:?}"),
    }
    // The old handle's link is closed too.
    assert!(sb.files().read(Path::new("blob.bin")).await.is_err());

    // Resume: a new pod (new uid, new token), the same disk, every byte.
    ws.resume(None).await.unwrap();
    let second = ws.identity().await;
    assert_ne!(second.pod_uid, first.pod_uid, "the resumed pod is a new one");
    assert_eq!(second.sandbox_uid, first.sandbox_uid);
    let sb = ws.sandbox().await.unwrap();
    let back = sb.files().read(Path::new("blob.bin")).await.unwrap();
    assert!(back == bytes, "{} bytes back of {}", back.len(), bytes.len());
    assert_eq!(c.get(PVCS, &pvc).unwrap()["metadata"]["uid"], pvc_uid);

    // destroy keeps the disk; deleting the workspace takes it.
    ws.destroy(false, SuspendOptions::default()).await.unwrap();
    assert!(c.get(PVCS, &pvc).is_some(), "destroy without delete_disk took the disk");
    assert!(matches!(
        ws_error(ws.sandbox().await.unwrap_err()),
        WorkspaceError::Destroyed { .. }
    ));
    p.delete_workspace("notes", None).await.unwrap();
    let gone = sim::until(10, || c.get(PVCS, &pvc).is_none().then_some(())).await;
    assert!(gone.is_some(), "the disk outlived its workspace's deletion");
    // Already gone counts as deleted.
    p.delete_workspace("notes", None).await.unwrap();
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_host_adopts_a_running_workspace_and_resumes_a_suspended_one_by_name() {
    let c = Cluster::start(None).await.unwrap();
    let (a, b) = (provider(&c, c.options(false)), provider(&c, c.options(false)));
    let wa = a.workspace("shared", WorkspaceOptions::default()).await.unwrap();
    wa.sandbox()
        .await
        .unwrap()
        .files()
        .write(Path::new("from-a"), "a")
        .await
        .unwrap();
    let wb = b.workspace("shared", WorkspaceOptions::default()).await.unwrap();
    assert_eq!(wb.origin(), Origin::AdoptedRunning);
    assert_eq!(wb.identity().await.pod_uid, wa.identity().await.pod_uid, "the same pod");
    assert_eq!(read(&wb, "from-a").await, b"a");
    // A suspends; B finds out by re-reading, and refuses from then on.
    wa.suspend(SuspendOptions::default()).await.unwrap();
    wb.refresh().await.unwrap();
    match ws_error(wb.sandbox().await.unwrap_err()) {
        WorkspaceError::Suspended { noticed_by, .. } => {
            assert_eq!(noticed_by, namzu_kubernetes::workspace::NoticedBy::Refresh)
        }
        other => panic!("{other:?}"),
    }
    // A third opener wakes it, and says so.
    let wc = b.workspace("shared", WorkspaceOptions::default()).await.unwrap();
    assert_eq!(wc.origin(), Origin::Resumed);
    assert_eq!(read(&wc, "from-a").await, b"a");
    // The creator's stale handle sees a running workspace after its own
    // resume binds the pod that is there, sending no second wake.
    wa.resume(None).await.unwrap();
    assert_eq!(wa.identity().await.pod_uid, wc.identity().await.pod_uid);
    b.delete_workspace("shared", None).await.unwrap();
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standing_object_that_disagrees_is_refused_by_field_and_another_uid_is_replaced() {
    let c = Cluster::start(None).await.unwrap();
    let p = provider(&c, c.options(false));
    let ws = p.workspace("mixed", WorkspaceOptions::default()).await.unwrap();
    // Another template's name on the object: refused, nothing driven.
    c.sim
        .update(SANDBOXES, namzu_k8s_sim::cluster::NAMESPACE, ws.sandbox_name(), |o| {
            o["metadata"]["annotations"][namzu_kubernetes::workspace::TEMPLATE_ANNOTATION] = "other".into();
        });
    let before = calls(&p).len();
    match ws_error(p.workspace("mixed", WorkspaceOptions::default()).await.unwrap_err()) {
        WorkspaceError::Mismatch {
            field,
            expected,
            actual,
            ..
        } => {
            assert_eq!(field, "template");
            assert_eq!(expected, "namzu-workspace");
            assert_eq!(actual.as_deref(), Some("other"));
        }
        other => panic!("{other:?}"),
    }
    let writes: Vec<_> = calls(&p)[before..]
        .iter()
        .filter(|(_, v)| !matches!(v, Verb::Get | Verb::List))
        .cloned()
        .collect();
    assert_eq!(writes, vec![], "a mismatched object was written to");
    // Deleted and made again under the same name: the handle refuses to
    // follow it.
    ws.suspend(skip()).await.unwrap();
    p.delete_workspace("mixed", None).await.unwrap();
    sim::until(10, || c.get(SANDBOXES, ws.sandbox_name()).is_none().then_some(())).await;
    let again = p.workspace("mixed", WorkspaceOptions::default()).await.unwrap();
    assert_eq!(again.origin(), Origin::Created);
    match ws_error(ws.resume(None).await.unwrap_err()) {
        WorkspaceError::Replaced {
            bound_uid, found_uid, ..
        } => assert_ne!(bound_uid, found_uid),
        other => panic!("{other:?}"),
    }
    // A template without a disk is refused before anything is made.
    let mut t = sim::template_like(&c, "no-disk", |t| {
        t["spec"].as_object_mut().unwrap().remove("volumeClaimTemplates");
    });
    t["metadata"]["name"] = "no-disk".into();
    c.sim.put(namzu_k8s_sim::controller::TEMPLATES, t);
    let e = p
        .workspace(
            "diskless",
            WorkspaceOptions {
                template: Some("no-disk".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(ws_error(e), WorkspaceError::Disk { .. }));
    assert!(c.get(SANDBOXES, "namzu-ws-diskless").is_none());
    p.delete_workspace("mixed", None).await.unwrap();
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_the_workspace_moved_past_cannot_suspend_or_delete_it() {
    let c = Cluster::start(None).await.unwrap();
    let (a, b) = (provider(&c, c.options(false)), provider(&c, c.options(false)));
    let wa = a.workspace("fenced", at(1)).await.unwrap();
    let stored = |c: &Cluster| {
        c.get(SANDBOXES, "namzu-ws-fenced").unwrap()["metadata"]["annotations"][HOLDER_EPOCH_ANNOTATION].clone()
    };
    assert_eq!(stored(&c), "1", "the create stamps the epoch");
    // B takes it over at epoch 2: adopting a running workspace moves the fence.
    let wb = b.workspace("fenced", at(2)).await.unwrap();
    assert_eq!(wb.origin(), Origin::AdoptedRunning);
    assert_eq!(stored(&c), "2");
    let pod_uid = wb.identity().await.pod_uid;
    // A's suspend is refused, before anything happens to the guest.
    match ws_error(wa.suspend(SuspendOptions::default()).await.unwrap_err()) {
        WorkspaceError::Precondition {
            op,
            epoch,
            stored_epoch,
            ..
        } => {
            assert_eq!((op.as_str(), epoch, stored_epoch), ("suspend", 1, Some(2)));
        }
        other => panic!("{other:?}"),
    }
    let obj = c.get(SANDBOXES, "namzu-ws-fenced").unwrap();
    assert_eq!(obj["spec"]["operatingMode"], "Running");
    assert_eq!(
        c.get(PODS, "namzu-ws-fenced").unwrap()["metadata"]["uid"],
        pod_uid.clone().unwrap().as_str()
    );
    // A's handle is still running and usable: a refusal loses nothing.
    assert!(wa.sandbox().await.unwrap().commands().run("true").await.is_ok());
    // Neither destroy shape, nor the standalone verbs, at A's epoch.
    assert!(matches!(
        ws_error(wa.destroy(true, skip()).await.unwrap_err()),
        WorkspaceError::Precondition { .. }
    ));
    assert!(matches!(
        ws_error(a.delete_workspace("fenced", Some(1)).await.unwrap_err()),
        WorkspaceError::Precondition { .. }
    ));
    let s = SuspendOptions {
        epoch: Some(1),
        ..skip()
    };
    assert!(matches!(
        ws_error(a.suspend_workspace("fenced", s).await.unwrap_err()),
        WorkspaceError::Precondition { .. }
    ));
    assert!(c.get(SANDBOXES, "namzu-ws-fenced").is_some());
    // An opener below the stored epoch wakes nothing.
    assert!(matches!(
        ws_error(a.workspace("fenced", at(1)).await.unwrap_err()),
        WorkspaceError::Precondition { .. }
    ));
    // B, the holder, can.
    wb.suspend(SuspendOptions::default()).await.unwrap();
    b.delete_workspace("fenced", Some(2)).await.unwrap();
    assert!(c.get(SANDBOXES, "namzu-ws-fenced").is_none());
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writes_under_two_epochs_never_let_the_lower_undo_the_higher() {
    let c = Cluster::start(None).await.unwrap();
    let (a, b) = (provider(&c, c.options(false)), provider(&c, c.options(false)));
    let wa = a.workspace("race", at(5)).await.unwrap();
    wa.suspend(skip()).await.unwrap();
    // At once: B resumes under 7 (standalone open), A deletes under 5.
    let (opened, deleted) = tokio::join!(b.workspace("race", at(7)), a.delete_workspace("race", Some(5)));
    match (opened, deleted) {
        // B's write landed first: A's delete is refused, the workspace runs.
        (Ok(wb), Err(e)) => {
            assert!(matches!(ws_error(e), WorkspaceError::Precondition { .. }));
            assert_eq!(wb.origin(), Origin::Resumed);
            assert!(wb.sandbox().await.unwrap().commands().run("true").await.is_ok());
        }
        // A's delete landed first: B's open found nothing to adopt and
        // made a new workspace (never half of the old one).
        (Ok(wb), Ok(())) => assert_eq!(wb.origin(), Origin::Created),
        // Or B's open raced the deletion and failed; nothing is left half.
        (Err(_), Ok(())) => {}
        (Err(e1), Err(e2)) => panic!("both failed: {e1} / {e2}"),
    }
    let _ = b.delete_workspace("race", Some(7)).await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standalone_verbs_never_dial_or_wake_and_refuse_what_needs_the_guest() {
    let c = Cluster::start(None).await.unwrap();
    let p = provider(&c, c.options(false));
    let ws = p.workspace("inv-a", at(3)).await.unwrap();
    ws.suspend(skip()).await.unwrap();
    let _running = p.workspace("inv-b", WorkspaceOptions::default()).await.unwrap();
    let q = provider(&c, c.options(false));
    let list = q.list_workspaces().await.unwrap();
    let names: Vec<_> = list
        .iter()
        .map(|s| (s.name.as_str(), s.operating_mode.as_str()))
        .collect();
    assert_eq!(names, vec![("inv-a", "Suspended"), ("inv-b", "Running")]);
    let a: &WorkspaceSummary = &list[0];
    assert_eq!(
        (a.holder_epoch, a.template.as_deref()),
        (Some(3), Some("namzu-workspace"))
    );
    assert!(a.mode_changed_at.is_some() && list[1].mode_changed_at.is_none());
    assert_eq!(calls(&q), vec![call("sandboxes", Verb::List)], "a list is one LIST");
    assert_eq!(
        c.get(SANDBOXES, "namzu-ws-inv-a").unwrap()["spec"]["operatingMode"],
        "Suspended"
    );
    // The task sandbox list does not show workspaces.
    assert!(namzu::Provider::list(&q).await.unwrap().is_empty());
    // A flush or a quiesce needs the guest: refused by name.
    for s in [
        SuspendOptions::default(),
        SuspendOptions {
            quiesce: Some(std::time::Duration::from_millis(100)),
            ..skip()
        },
    ] {
        match q.suspend_workspace("inv-b", s).await.unwrap_err() {
            Error::OptionRefused { option, .. } => assert!(option == "flush" || option == "quiesce"),
            other => panic!("{other}"),
        }
    }
    q.suspend_workspace("inv-b", skip()).await.unwrap();
    assert!(
        c.get(PODS, "namzu-ws-inv-b").is_none(),
        "returned before the pod was gone"
    );
    assert!(q.suspend_workspace("nothing-here", skip()).await.is_err());
    // What it sent: reads of the Sandbox and its pod, one patch; no
    // create, no delete, no write to anything else.
    for (resource, verb) in calls(&q) {
        let ok = matches!(
            (resource.as_str(), verb),
            ("sandboxes", Verb::List | Verb::Get | Verb::Patch) | ("pods", Verb::Get)
        );
        assert!(ok, "the standalone verbs sent {verb:?} {resource}");
    }
    q.delete_workspace("inv-a", None).await.unwrap();
    q.delete_workspace("inv-b", None).await.unwrap();
    c.stop().await;
}

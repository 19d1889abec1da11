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

/// The calls `p` made after its first `before` that write (not get or list).
fn writes_since(p: &namzu_kubernetes::KubernetesProvider, before: usize) -> Vec<(String, Verb)> {
    calls(p)[before..]
        .iter()
        .filter(|(_, v)| !matches!(v, Verb::Get | Verb::List))
        .cloned()
        .collect()
}

/// Starts, in its own session, a process that ignores SIGTERM: a stopping
/// agent waits its shutdown grace (5 s) for it before the SIGKILL.
async fn start_stubborn(ws: &namzu_kubernetes::KubernetesWorkspace) {
    let sb = ws.sandbox().await.unwrap();
    let cmd = "setsid sh -c 'trap \"\" TERM; sleep 100' >/dev/null 2>&1 </dev/null & echo started";
    let out = sb.commands().run(cmd).await.unwrap();
    assert_eq!(&out.stdout[..], b"started\n");
}

/// The (field, expected, actual) of a `Mismatch` refusal.
fn mismatch(e: Error) -> (String, String, Option<String>) {
    match ws_error(e) {
        WorkspaceError::Mismatch {
            field,
            expected,
            actual,
            ..
        } => (field, expected, actual),
        other => panic!("{other:?}"),
    }
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
    ws.resume(Default::default()).await.unwrap();
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
    wa.resume(Default::default()).await.unwrap();
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
    let (field, expected, actual) = mismatch(p.workspace("mixed", WorkspaceOptions::default()).await.unwrap_err());
    assert_eq!((field.as_str(), expected.as_str()), ("template", "namzu-workspace"));
    assert_eq!(actual.as_deref(), Some("other"));
    let writes = writes_since(&p, before);
    assert_eq!(writes, vec![], "a mismatched object was written to");
    // The VM boundary: the template now asks for a runtime class the
    // standing object's pod does not carry.
    c.sim
        .update(SANDBOXES, namzu_k8s_sim::cluster::NAMESPACE, ws.sandbox_name(), |o| {
            o["metadata"]["annotations"][namzu_kubernetes::workspace::TEMPLATE_ANNOTATION] = "namzu-workspace".into();
        });
    let template = namzu_kubernetes::workspace::DEFAULT_WORKSPACE_TEMPLATE;
    c.sim.update(
        namzu_k8s_sim::controller::TEMPLATES,
        namzu_k8s_sim::cluster::NAMESPACE,
        template,
        |t| {
            t["spec"]["podTemplate"]["spec"]["runtimeClassName"] = "gvisor".into();
        },
    );
    let (field, expected, actual) = mismatch(p.workspace("mixed", WorkspaceOptions::default()).await.unwrap_err());
    assert_eq!(
        (field.as_str(), expected.as_str(), actual),
        ("runtimeClassName", "gvisor", None)
    );
    c.sim.update(
        namzu_k8s_sim::controller::TEMPLATES,
        namzu_k8s_sim::cluster::NAMESPACE,
        template,
        |t| {
            t["spec"]["podTemplate"]["spec"]
                .as_object_mut()
                .unwrap()
                .remove("runtimeClassName");
        },
    );
    // The egress profile a policy selects the pod by: configured, absent
    // from the standing object's pod.
    let mut egress =
        namzu_kubernetes::policy::KubeEgressConfig::new(template, namzu_kubernetes::policy::KubeEgressPolicy::DenyAll);
    egress.profile = Some("strict".into());
    let profiled = provider(
        &c,
        namzu_kubernetes::KubernetesOptions {
            egress: Some(egress.clone()),
            ..c.options(false)
        },
    );
    let (field, expected, actual) = mismatch(
        profiled
            .workspace("mixed", WorkspaceOptions::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(field, "egressProfile");
    assert_eq!(expected, format!("{}=strict", egress.profile_label_key));
    assert_eq!(actual, None);
    // Deleted and made again under the same name: the handle refuses to
    // follow it.
    ws.suspend(skip()).await.unwrap();
    p.delete_workspace("mixed", None).await.unwrap();
    sim::until(10, || c.get(SANDBOXES, ws.sandbox_name()).is_none().then_some(())).await;
    let again = p.workspace("mixed", WorkspaceOptions::default()).await.unwrap();
    assert_eq!(again.origin(), Origin::Created);
    match ws_error(ws.resume(Default::default()).await.unwrap_err()) {
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
    // A delete asked to quiesce or flush a disk it deletes: refused by name,
    // before any request.
    let quiesce = SuspendOptions {
        quiesce: Some(std::time::Duration::from_millis(100)),
        ..skip()
    };
    match wa.destroy(true, quiesce).await.unwrap_err() {
        Error::OptionRefused { option, .. } => assert_eq!(option, "quiesce"),
        other => panic!("{other}"),
    }
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
    let notices: std::sync::Arc<std::sync::Mutex<Vec<FlushNotice>>> = Default::default();
    let told = notices.clone();
    let w = WorkspaceOptions {
        on_flush_notice: Some(std::sync::Arc::new(move |n: &FlushNotice| {
            told.lock().unwrap().push(n.clone())
        })),
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

/// A workspace runs the pod template it was made with until a resume asks
/// for the template's current one: the handle says when they differ, a
/// plain resume keeps the stored pod, a refreshing one rewrites it on the
/// wake (disk kept), and a template that would change the disk is refused
/// before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_drift_is_reported_and_a_refreshing_resume_applies_it_keeping_the_disk() {
    use namzu_k8s_sim::cluster::NAMESPACE;
    use namzu_k8s_sim::controller::TEMPLATES;
    use namzu_kubernetes::workspace::{ResumeOptions, DEFAULT_WORKSPACE_TEMPLATE};
    let c = Cluster::start(None).await.unwrap();
    let p = provider(&c, c.options(false));
    let ws = p.workspace("drift", WorkspaceOptions::default()).await.unwrap();
    let made = ws.template_revision().expect("a revision recorded at creation");
    assert!(ws.template_revision_current());
    ws.sandbox()
        .await
        .unwrap()
        .files()
        .write(Path::new("f"), "v1")
        .await
        .unwrap();
    ws.suspend(SuspendOptions::default()).await.unwrap();
    // A new release of the template: a pod label.
    c.sim.update(TEMPLATES, NAMESPACE, DEFAULT_WORKSPACE_TEMPLATE, |t| {
        t["spec"]["podTemplate"]["metadata"]["labels"]["drift"] = "2".into();
    });
    ws.refresh().await.unwrap();
    assert_eq!(ws.template_revision().as_deref(), Some(made.as_str()));
    assert!(!ws.template_revision_current(), "drift not reported");
    let label = |c: &Cluster| c.get(PODS, "namzu-ws-drift").unwrap()["metadata"]["labels"]["drift"].clone();
    // A plain resume: the stored pod.
    ws.resume(ResumeOptions::default()).await.unwrap();
    assert!(label(&c).is_null(), "a plain resume applied the new template");
    ws.suspend(SuspendOptions::default()).await.unwrap();
    // A template that would add a disk: refused, nothing sent, still suspended.
    let vct = c.get(TEMPLATES, DEFAULT_WORKSPACE_TEMPLATE).unwrap()["spec"]["volumeClaimTemplates"].clone();
    c.sim.update(TEMPLATES, NAMESPACE, DEFAULT_WORKSPACE_TEMPLATE, |t| {
        let mut second = t["spec"]["volumeClaimTemplates"][0].clone();
        second["metadata"]["name"] = "scratch".into();
        t["spec"]["volumeClaimTemplates"].as_array_mut().unwrap().push(second);
    });
    let refresh = ResumeOptions {
        refresh_pod_template: true,
        ..Default::default()
    };
    let before = calls(&p).len();
    match ws_error(ws.resume(refresh).await.unwrap_err()) {
        WorkspaceError::Disk { reason, .. } => assert!(reason.contains("scratch"), "{reason}"),
        other => panic!("{other:?}"),
    }
    let writes = writes_since(&p, before);
    assert_eq!(writes, vec![], "a refused refresh wrote");
    let obj = c.get(SANDBOXES, "namzu-ws-drift").unwrap();
    assert_eq!(obj["spec"]["operatingMode"], "Suspended");
    c.sim.update(TEMPLATES, NAMESPACE, DEFAULT_WORKSPACE_TEMPLATE, |t| {
        t["spec"]["volumeClaimTemplates"] = vct.clone();
    });
    // The refreshing resume: the new pod, the same disk.
    ws.resume(refresh).await.unwrap();
    assert_eq!(label(&c), "2");
    assert_ne!(ws.template_revision().as_deref(), Some(made.as_str()));
    assert!(ws.template_revision_current());
    assert_eq!(read(&ws, "f").await, b"v1");
    p.delete_workspace("drift", None).await.unwrap();
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
    let p = provider(&c, c.options(false)).with_client_options(namzu::ClientOptions {
        keepalive: std::time::Duration::from_secs(1),
        ..Default::default()
    });
    let told: std::sync::Arc<std::sync::Mutex<Vec<GuestRestart>>> = Default::default();
    let seen = told.clone();
    let w = WorkspaceOptions {
        on_guest_restart: Some(std::sync::Arc::new(move |e: &GuestRestart| {
            seen.lock().unwrap().push(e.clone())
        })),
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
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while let Err(e) = sb.commands().run("true").await {
        assert!(
            std::time::Instant::now() < deadline,
            "never reached the replacement: {e}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
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

/// A start that fails puts back only what it woke: a workspace this call
/// created or resumed is suspended again (never deleted: the disk stays),
/// one it found running is left to its holder, and `Leave` never patches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_start_suspends_only_a_workspace_it_woke_and_never_deletes() {
    use namzu_k8s_sim::controller::PodFault;
    use namzu_kubernetes::workspace::StartFailure;
    let c = Cluster::start(None).await.unwrap();
    let quick = namzu_kubernetes::KubernetesOptions {
        ready_timeout: std::time::Duration::from_secs(2),
        ..c.options(false)
    };
    let p = provider(&c, quick);
    let mode =
        |c: &Cluster, n: &str| c.get(SANDBOXES, &format!("namzu-ws-{n}")).unwrap()["spec"]["operatingMode"].clone();
    c.ctl.set_pod_fault(Some(PodFault::ImagePull));
    // Created, failed: suspended, the object and its claim kept.
    assert!(p.workspace("born", WorkspaceOptions::default()).await.is_err());
    assert_eq!(mode(&c, "born"), "Suspended");
    assert!(c.get(PVCS, "workspace-namzu-ws-born").is_some());
    // Suspended, woken, failed: suspended again.
    assert!(p.workspace("born", WorkspaceOptions::default()).await.is_err());
    assert_eq!(mode(&c, "born"), "Suspended");
    // With Leave: left running.
    let leave = WorkspaceOptions {
        on_start_failure: StartFailure::Leave,
        ..Default::default()
    };
    assert!(p.workspace("born", leave.clone()).await.is_err());
    assert_eq!(mode(&c, "born"), "Running");
    // Found running, failed: not this call's to suspend.
    assert!(p.workspace("born", WorkspaceOptions::default()).await.is_err());
    assert_eq!(mode(&c, "born"), "Running");
    c.ctl.set_pod_fault(None);
    p.delete_workspace("born", None).await.unwrap();
    c.stop().await;
}

/// A suspend is a promise that nothing writes the disk any more: a pod
/// still stopping when the budget runs out is a typed timeout naming it,
/// the object left as the patch left it; a later resume binds the new pod
/// once the old one is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_outlives_the_suspend_budget_is_a_typed_timeout() {
    let c = Cluster::start(None).await.unwrap();
    let quick = namzu_kubernetes::KubernetesOptions {
        ready_timeout: std::time::Duration::from_secs(2),
        ..c.options(false)
    };
    let p = provider(&c, c.options(false));
    let ws = p.workspace("slow", WorkspaceOptions::default()).await.unwrap();
    // A process that ignores SIGTERM: the stopping agent waits its
    // shutdown grace (5 s) before the SIGKILL.
    start_stubborn(&ws).await;
    let q = provider(&c, quick);
    let pod = c.get(PODS, "namzu-ws-slow").unwrap()["metadata"]["uid"].clone();
    match ws_error(q.suspend_workspace("slow", skip()).await.unwrap_err()) {
        WorkspaceError::SuspendTimeout { pod: name, timeout, .. } => {
            assert_eq!(
                (name.as_str(), timeout),
                ("namzu-ws-slow", std::time::Duration::from_secs(2))
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        c.get(SANDBOXES, "namzu-ws-slow").unwrap()["spec"]["operatingMode"],
        "Suspended"
    );
    assert_eq!(
        c.get(PODS, "namzu-ws-slow").unwrap()["metadata"]["uid"],
        pod,
        "the pod was already gone"
    );
    // The holder's handle finds out, and its resume waits the old pod out.
    ws.refresh().await.unwrap();
    ws.resume(Default::default()).await.unwrap();
    assert_ne!(ws.identity().await.pod_uid.as_deref(), pod.as_str());
    p.delete_workspace("slow", None).await.unwrap();
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
    let p = provider(&c, c.options(false)).with_client_options(namzu::ClientOptions {
        keepalive: std::time::Duration::from_secs(1),
        ..Default::default()
    });
    let told: std::sync::Arc<std::sync::Mutex<Vec<GuestRestart>>> = Default::default();
    let seen = told.clone();
    let w = WorkspaceOptions {
        on_guest_restart: Some(std::sync::Arc::new(move |e: &GuestRestart| {
            seen.lock().unwrap().push(e.clone())
        })),
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
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let after = loop {
        match sb.commands().run(probe).await {
            Ok(out) => break out,
            Err(e) => assert!(std::time::Instant::now() < deadline, "never reached the new agent: {e}"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
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
    let notices: std::sync::Arc<std::sync::Mutex<Vec<FlushNotice>>> = Default::default();
    let seen = notices.clone();
    let w = WorkspaceOptions {
        env: vec![("NAMZU_DISABLED_FEATURES".into(), namzu_proto::features::FLUSH.into())],
        on_flush_notice: Some(std::sync::Arc::new(move |n: &FlushNotice| {
            seen.lock().unwrap().push(n.clone())
        })),
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

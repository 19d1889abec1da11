//! Persistent workspaces on the control-plane SIMULATOR, whose pods are
//! real local-tier sandboxes and whose PVCs are directories on the node
//! that outlive the pods: bytes written before a suspend are read back
//! after the resume, from a new pod; adopt and resume by name report their
//! origin; a standing object that disagrees is refused by field; two hosts
//! on one workspace are fenced by the holder epoch; the standalone verbs
//! never dial a guest or wake a workspace. The guest's side (flush,
//! quiesce, cancel, restarts) is in `workspace_guest.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use namzu::Error;
use namzu_k8s_sim::cluster::Cluster;
use namzu_k8s_sim::controller::{PODS, PVCS, SANDBOXES};
use namzu_kubernetes::api::Verb;
use namzu_kubernetes::workspace::{
    FlushNotice, SuspendOptions, WorkspaceSummary, HOLDER_EPOCH_ANNOTATION, MODE_CHANGED_AT_ANNOTATION,
};
use namzu_kubernetes::{Origin, WorkspaceError, WorkspaceOptions};

mod common;
use common::workspace::*;
use common::*;

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

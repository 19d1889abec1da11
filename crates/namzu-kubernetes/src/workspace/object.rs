//! A workspace's Sandbox object and every write to it: the name, the
//! object built from the workspace template, the checks an adopted object
//! passes, and the fenced writes — each lifecycle write carries the
//! holder epoch with a `resourceVersion` precondition, so a host the
//! workspace has moved past changes nothing.

use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

use super::error::WorkspaceError;
use crate::api::{Api, ApiError, Resource};
use crate::crd::{Sandbox, SandboxTemplate};
use crate::KubernetesOptions;
use namzu_core::error::Result;

/// Prefix of every workspace Sandbox's name.
pub const WORKSPACE_NAME_PREFIX: &str = "namzu-ws-";
/// The label on a workspace's Sandbox naming the workspace (how a list
/// finds them).
pub const WORKSPACE_LABEL: &str = "io.namzu/workspace";
/// The annotation naming the SandboxTemplate a workspace was built from.
pub const TEMPLATE_ANNOTATION: &str = "io.namzu/workspace-template";
/// The holder epoch a workspace is held at: a write under a lower one is
/// refused. Absent reads as 0.
pub const HOLDER_EPOCH_ANNOTATION: &str = "io.namzu/holder-epoch";
/// When namzu last changed the workspace's `operatingMode` (RFC 3339):
/// what an inventory reads to tell "never suspended" from "asleep a month".
pub const MODE_CHANGED_AT_ANNOTATION: &str = "io.namzu/operating-mode-changed-at";
/// The revision of the pod template a workspace's Sandbox carries: a
/// digest of the SandboxTemplate's `spec.podTemplate` it was built (or
/// last refreshed) from. The controller builds every replacement pod from
/// the Sandbox's own copy, so a workspace kept for weeks runs the pod it
/// was made with until a resume refreshes it.
pub const POD_TEMPLATE_HASH_ANNOTATION: &str = "io.namzu/pod-template-hash";
/// The SandboxTemplate workspaces are built from unless configured.
pub const DEFAULT_WORKSPACE_TEMPLATE: &str = "namzu-workspace";
/// The volumeClaimTemplate that is a workspace's disk.
pub const DISK_VOLUME: &str = "workspace";
/// A fenced write re-reads and retries at most this often when other
/// writes keep landing between its read and its write.
const FENCE_ATTEMPTS: usize = 8;

/// The Sandbox name of workspace `name`, or why `name` cannot be one: a
/// DNS label (the Service carries the name) after the prefix.
pub fn sandbox_name(name: &str) -> std::result::Result<String, WorkspaceError> {
    let refuse = |reason: &str| WorkspaceError::InvalidName {
        name: name.to_owned(),
        reason: reason.to_owned(),
    };
    let full = format!("{WORKSPACE_NAME_PREFIX}{name}");
    if name.is_empty() {
        return Err(refuse("empty"));
    }
    if full.len() > 63 {
        return Err(refuse(&format!(
            "longer than {} characters (the Sandbox's name, {WORKSPACE_NAME_PREFIX}<name>, is a DNS label)",
            63 - WORKSPACE_NAME_PREFIX.len()
        )));
    }
    let ok = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !ok || name.ends_with('-') {
        return Err(refuse(
            "only lowercase letters, digits and '-', ending in a letter or digit",
        ));
    }
    Ok(full)
}

/// The namzu id a workspace's pod and links go by.
pub fn workspace_id(name: &str) -> String {
    format!("ws-{name}")
}

/// The Sandboxes resource of the configured namespace.
pub(super) fn sandboxes(opts: &KubernetesOptions) -> Resource {
    Resource::of::<Sandbox>(&opts.namespace)
}

/// The holder epoch stored on `obj`: 0 when absent; `Err` with the raw
/// annotation when it is not a decimal integer.
pub fn stored_epoch(obj: &Value) -> std::result::Result<u64, String> {
    match obj["metadata"]["annotations"][HOLDER_EPOCH_ANNOTATION].as_str() {
        None => Ok(0),
        Some(s) => s.parse::<u64>().map_err(|_| s.to_owned()),
    }
}

/// Refuses a write under `epoch` to `obj` held at a higher (or an
/// unreadable) one.
pub(super) fn check_epoch(
    op: &str,
    workspace: &str,
    obj: &Value,
    epoch: u64,
) -> std::result::Result<(), WorkspaceError> {
    let refuse = |stored_epoch, stored_annotation| WorkspaceError::Precondition {
        op: op.to_owned(),
        workspace: workspace.to_owned(),
        sandbox: meta(obj, "name").to_owned(),
        epoch,
        stored_epoch,
        stored_annotation,
    };
    match stored_epoch(obj) {
        Ok(s) if s <= epoch => Ok(()),
        Ok(s) => Err(refuse(Some(s), Some(s.to_string()))),
        Err(raw) => Err(refuse(None, Some(raw))),
    }
}

pub(super) fn meta<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj["metadata"][field].as_str().unwrap_or_default()
}

/// `spec.operatingMode`, `Running` when unset (the CRD's default).
pub fn operating_mode(obj: &Value) -> &str {
    obj["spec"]["operatingMode"].as_str().unwrap_or("Running")
}

/// The template's disk, or why it has none this backend builds on: a
/// volumeClaimTemplate named [`DISK_VOLUME`], and a container using it
/// as the claim's mode says — a Filesystem claim mounted
/// (`volumeMounts`); a Block claim handed over as a device
/// (`volumeDevices`) to an agent told to prepare it
/// (`--workspace-device <devicePath>`: probed, formatted only when blank,
/// mounted; see `namzu_agent::disk`). Anything between is refused: a
/// block device nothing prepares, or a claim nothing uses, is a workspace
/// whose writes are not kept.
pub fn check_disk(workspace: &str, what: &str, spec: &Value) -> std::result::Result<(), WorkspaceError> {
    let disk = |reason: String| WorkspaceError::Disk {
        workspace: workspace.to_owned(),
        reason,
    };
    let vcts = spec["volumeClaimTemplates"].as_array().cloned().unwrap_or_default();
    let Some(claim) = vcts.iter().find(|v| v["metadata"]["name"] == DISK_VOLUME) else {
        return Err(disk(format!(
            "{what} has no volumeClaimTemplate named {DISK_VOLUME:?}: a workspace's disk is a PVC kept across suspends"
        )));
    };
    let containers = spec["podTemplate"]["spec"]["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let using = |field: &str| {
        containers.iter().find_map(|c| {
            c[field]
                .as_array()
                .into_iter()
                .flatten()
                .find(|m| m["name"] == DISK_VOLUME)
                .map(|m| (c.clone(), m.clone()))
        })
    };
    match claim["spec"]["volumeMode"].as_str() {
        Some("Block") => {
            let Some((c, device)) = using("volumeDevices") else {
                return Err(disk(format!(
                    "{what} claims {DISK_VOLUME:?} as a block device but no container lists it in volumeDevices"
                )));
            };
            let path = device["devicePath"].as_str().unwrap_or_default();
            let args: Vec<&str> = c["args"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let prepared = args.windows(2).any(|w| w == ["--workspace-device", path]);
            if !prepared {
                return Err(disk(format!(
                    "{what}: container {} gets the block device at {path:?} but its agent is not started with --workspace-device {path}: nothing would format or mount it",
                    c["name"].as_str().unwrap_or_default()
                )));
            }
        }
        Some("Filesystem") | None => {
            if using("volumeMounts").is_none() {
                return Err(disk(format!(
                    "{what} claims {DISK_VOLUME:?} but no container mounts it: the commands would write to a disk that is not kept"
                )));
            }
        }
        Some(other) => {
            return Err(disk(format!(
                "{what}: volumeMode {other:?} of {DISK_VOLUME:?} is neither Filesystem nor Block"
            )))
        }
    }
    Ok(())
}

/// The Sandbox of workspace `name`, built from `template`: the template's
/// pod and disk, namzu's labels and the agent's token and port (as a task
/// Sandbox), no shutdown time (a workspace does not expire), running, and
/// stamped with `epoch` when one is given; `env` is the agent's (the
/// sandbox's environment and agent limits), fixed at creation.
pub(super) fn build(
    opts: &KubernetesOptions,
    (template_name, template): (&str, &SandboxTemplate),
    name: &str,
    epoch: Option<u64>,
    env: &[(String, String)],
) -> Result<Value> {
    let id = workspace_id(name);
    let full = sandbox_name(name)?;
    let mut s = crate::build::sandbox(opts, template, &full, &id, SystemTime::now());
    crate::build::sandbox_env(&mut s, opts, env).map_err(|reason| namzu_core::Error::OptionRefused {
        tier: namzu_core::spec::Tier::Kubernetes,
        option: "env".into(),
        reason,
    })?;
    s.spec.shutdown_time = None;
    s.spec.shutdown_policy = None;
    s.spec.operating_mode = Some("Running".into());
    let labels = s.metadata.labels.get_or_insert_with(Default::default);
    labels.remove(crate::labels::SANDBOX_LABEL);
    labels.insert(WORKSPACE_LABEL.into(), name.into());
    let annotations = s.metadata.annotations.get_or_insert_with(Default::default);
    annotations.insert(TEMPLATE_ANNOTATION.into(), template_name.into());
    if let Some(e) = epoch {
        annotations.insert(HOLDER_EPOCH_ANNOTATION.into(), e.to_string());
    }
    annotations.insert(POD_TEMPLATE_HASH_ANNOTATION.into(), revision(template));
    serde_json::to_value(s).map_err(|e| namzu_core::Error::InvalidArgument {
        op: "workspace create".into(),
        message: e.to_string(),
    })
}

/// The revision of `template`'s pod template: the first 16 hex digits of
/// the SHA-256 of its JSON (what the API server serves, keys in order).
pub fn revision(template: &SandboxTemplate) -> String {
    use sha2::Digest;
    let json = serde_json::to_vec(&template.spec.pod_template).unwrap_or_default();
    sha2::Sha256::digest(&json)[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The revision `obj` records it was built from; `None` when unknown.
pub fn recorded_revision(obj: &Value) -> Option<String> {
    obj["metadata"]["annotations"][POD_TEMPLATE_HASH_ANNOTATION]
        .as_str()
        .map(String::from)
}

/// A merge patch that makes `old` into `new` (RFC 7386): every key `new`
/// lacks is nulled, objects recurse, anything else is replaced whole.
pub fn merge_replacing(old: &Value, new: &Value) -> Value {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut out = serde_json::Map::new();
            for (k, v) in n {
                let patched = match o.get(k) {
                    Some(ov) => merge_replacing(ov, v),
                    None => v.clone(),
                };
                out.insert(k.clone(), patched);
            }
            for k in o.keys().filter(|k| !n.contains_key(*k)) {
                out.insert(k.clone(), Value::Null);
            }
            Value::Object(out)
        }
        _ => new.clone(),
    }
}

/// Refuses a pod template refresh that would change the disk: the
/// volumeClaimTemplates are immutable, so the template must claim exactly
/// the disks the workspace has, and still mount [`DISK_VOLUME`].
pub(super) fn check_refresh_disk(
    workspace: &str,
    template_name: &str,
    template: &Value,
    obj: &Value,
) -> std::result::Result<(), WorkspaceError> {
    check_disk(
        workspace,
        &format!("SandboxTemplate {template_name}"),
        &template["spec"],
    )?;
    let names = |v: &Value| -> std::collections::BTreeSet<String> {
        v["spec"]["volumeClaimTemplates"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["metadata"]["name"].as_str().map(String::from))
            .collect()
    };
    let (want, have) = (names(template), names(obj));
    if want != have {
        return Err(WorkspaceError::Disk {
            workspace: workspace.to_owned(),
            reason: format!(
                "SandboxTemplate {template_name} claims disks {want:?}, this workspace has {have:?}; volumeClaimTemplates cannot change, so its pod template is not refreshed (make a new workspace from the new template and move the data)"
            ),
        });
    }
    Ok(())
}

/// Checks a standing object against what this configuration would build:
/// the template it came from, the VM boundary (`runtimeClassName`), the
/// egress profile label a policy selects it by, and its disk.
pub(super) fn check_adopted(
    opts: &KubernetesOptions,
    workspace: &str,
    template_name: &str,
    template: &SandboxTemplate,
    obj: &Value,
) -> std::result::Result<(), WorkspaceError> {
    let mismatch = |field: &str, expected: String, actual: Option<String>| WorkspaceError::Mismatch {
        workspace: workspace.to_owned(),
        sandbox: meta(obj, "name").to_owned(),
        field: field.to_owned(),
        expected,
        actual,
    };
    let stood = obj["metadata"]["annotations"][TEMPLATE_ANNOTATION].as_str();
    if stood != Some(template_name) {
        return Err(mismatch("template", template_name.to_owned(), stood.map(String::from)));
    }
    let want_rc = template
        .spec
        .pod_template
        .spec
        .as_ref()
        .and_then(|s| s.runtime_class_name.clone());
    let have_rc = obj["spec"]["podTemplate"]["spec"]["runtimeClassName"]
        .as_str()
        .map(String::from);
    if want_rc.is_some() && have_rc != want_rc {
        return Err(mismatch("runtimeClassName", want_rc.unwrap_or_default(), have_rc));
    }
    if let Some((key, value)) = opts
        .egress
        .as_ref()
        .and_then(|e| e.profile.as_ref().map(|p| (e.profile_label_key.clone(), p.clone())))
    {
        let have = obj["spec"]["podTemplate"]["metadata"]["labels"][&key]
            .as_str()
            .map(String::from);
        if have.as_deref() != Some(value.as_str()) {
            return Err(mismatch("egressProfile", format!("{key}={value}"), have));
        }
    }
    check_disk(workspace, &format!("Sandbox {}", meta(obj, "name")), &obj["spec"])
}

/// A merge patch of workspace `name`'s Sandbox under holder `epoch`: read,
/// refused when the stored epoch is above it, else sent with the read's
/// `resourceVersion` as a precondition and the epoch stamped in the same
/// write; a write that landed in between (409) makes it read again.
/// Without an epoch the patch goes out as is, fencing nothing.
pub(super) async fn fenced_patch(
    api: &Api,
    opts: &KubernetesOptions,
    op: &str,
    name: &str,
    epoch: Option<u64>,
    mut patch: Value,
) -> Result<Value> {
    let r = sandboxes(opts);
    let full = sandbox_name(name)?;
    let Some(epoch) = epoch else {
        return Ok(api.merge_patch(&r, &full, &patch).await?);
    };
    patch["metadata"]["annotations"][HOLDER_EPOCH_ANNOTATION] = json!(epoch.to_string());
    for attempt in 1.. {
        let obj = api.get(&r, &full).await?;
        check_epoch(op, name, &obj, epoch)?;
        patch["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"].clone();
        match api.merge_patch(&r, &full, &patch).await {
            Err(ApiError::Conflict { .. }) if attempt < FENCE_ATTEMPTS => {}
            other => return Ok(other?),
        }
    }
    unreachable!("an unbounded range ends only by returning")
}

/// Deletes workspace `name`'s Sandbox (and with it, through the owner
/// references, its pod, Service and disk) under holder `epoch`: refused
/// above it, else a DELETE with the read's `resourceVersion` as a
/// precondition. Already gone counts as deleted.
pub(super) async fn fenced_delete(
    api: &Api,
    opts: &KubernetesOptions,
    op: &str,
    name: &str,
    epoch: Option<u64>,
) -> Result<()> {
    let r = sandboxes(opts);
    let full = sandbox_name(name)?;
    let gone = |e: &ApiError| matches!(e, ApiError::AlreadyGone { .. });
    let Some(epoch) = epoch else {
        return match api.delete(&r, &full).await {
            Err(e) if !gone(&e) => Err(e.into()),
            _ => Ok(()),
        };
    };
    for attempt in 1.. {
        let obj = match api.get(&r, &full).await {
            Err(e) if gone(&e) => return Ok(()),
            other => other?,
        };
        check_epoch(op, name, &obj, epoch)?;
        match api.delete_at(&r, &full, meta(&obj, "resourceVersion")).await {
            Err(ApiError::Conflict { .. }) if attempt < FENCE_ATTEMPTS => {}
            Err(e) if gone(&e) => return Ok(()),
            other => return other.map(|_| ()).map_err(Into::into),
        }
    }
    unreachable!("an unbounded range ends only by returning")
}

/// The patch that changes the operating mode, stamped with when.
pub(super) fn mode_patch(mode: &str) -> Value {
    json!({"spec": {"operatingMode": mode},
        "metadata": {"annotations": {MODE_CHANGED_AT_ANNOTATION: crate::build::rfc3339(SystemTime::now())}}})
}

/// Waits until pod `pod` (of uid `uid`, when known) is gone or ended:
/// what a suspend promises, since an accepted patch says only that the
/// controller was asked.
pub(super) async fn wait_pod_gone(
    api: &Api,
    opts: &KubernetesOptions,
    workspace: &str,
    pod: &str,
    uid: Option<&str>,
    timeout: Duration,
) -> Result<()> {
    let pods = Resource::core("pods", &opts.namespace);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match api.get(&pods, pod).await {
            Err(ApiError::AlreadyGone { .. }) => return Ok(()),
            Ok(p) => {
                let other = uid.is_some_and(|u| meta(&p, "uid") != u);
                let ended = matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed"));
                // A pod of that name with another uid is a replacement made
                // after a resume: the one waited for is gone.
                if other || ended {
                    return Ok(());
                }
            }
            Err(e) if e.is_transient() => tracing::debug!(error = %e, "suspend wait: transient failure"),
            Err(e) => return Err(e.into()),
        }
        if tokio::time::Instant::now() + opts.poll_interval > deadline {
            return Err(WorkspaceError::SuspendTimeout {
                workspace: workspace.to_owned(),
                pod: pod.to_owned(),
                timeout,
            }
            .into());
        }
        tokio::time::sleep(opts.poll_interval).await;
    }
}

/// The pod standing for a Sandbox object: its `pod-name` annotation, else
/// the Sandbox's own name.
pub(super) fn pod_name(obj: &Value) -> String {
    obj["metadata"]["annotations"][crate::acquire::POD_NAME_ANNOTATION]
        .as_str()
        .unwrap_or_else(|| meta(obj, "name"))
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns_labels_after_the_prefix() {
        assert_eq!(sandbox_name("proj-1").unwrap(), "namzu-ws-proj-1");
        for bad in ["", "Proj", "a_b", "x-", &"a".repeat(55), "a.b"] {
            assert!(
                matches!(sandbox_name(bad), Err(WorkspaceError::InvalidName { .. })),
                "{bad:?} accepted"
            );
        }
        assert!(sandbox_name(&"a".repeat(54)).is_ok());
    }

    #[test]
    fn an_epoch_is_refused_below_the_stored_one_and_when_unreadable() {
        let held = |a: Value| json!({"metadata": {"name": "namzu-ws-w", "annotations": a}});
        assert!(check_epoch("suspend", "w", &json!({"metadata": {}}), 0).is_ok());
        assert!(check_epoch("suspend", "w", &held(json!({HOLDER_EPOCH_ANNOTATION: "3"})), 3).is_ok());
        assert!(check_epoch("suspend", "w", &held(json!({HOLDER_EPOCH_ANNOTATION: "3"})), 4).is_ok());
        match check_epoch("suspend", "w", &held(json!({HOLDER_EPOCH_ANNOTATION: "3"})), 2) {
            Err(WorkspaceError::Precondition {
                epoch: 2,
                stored_epoch: Some(3),
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        match check_epoch("delete", "w", &held(json!({HOLDER_EPOCH_ANNOTATION: "x7"})), 99) {
            Err(WorkspaceError::Precondition {
                stored_epoch: None,
                stored_annotation: Some(a),
                ..
            }) => assert_eq!(a, "x7"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_replacing_merge_patch_nulls_what_the_new_value_lacks() {
        let old = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"containers": [{"name": "x"}], "gone": true}});
        let new = json!({"metadata": {"labels": {"a": "3"}}, "spec": {"containers": [{"name": "y"}]}});
        let patch = merge_replacing(&old, &new);
        let mut applied = old.clone();
        json_patch::merge(&mut applied, &patch);
        assert_eq!(applied, new);
    }

    #[test]
    fn a_block_disk_must_be_handed_to_an_agent_that_prepares_it() {
        let vct = json!([{"metadata": {"name": "workspace"}, "spec": {"volumeMode": "Block"}}]);
        let agent = |args: Value| {
            json!({"volumeClaimTemplates": vct, "podTemplate": {"spec": {"containers": [{"name": "agent", "args": args,
                "volumeDevices": [{"name": "workspace", "devicePath": "/dev/ws"}]}]}}})
        };
        assert!(check_disk(
            "w",
            "t",
            &agent(json!(["--root", "/workspace", "--workspace-device", "/dev/ws"]))
        )
        .is_ok());
        let e = check_disk("w", "t", &agent(json!(["--root", "/workspace"]))).unwrap_err();
        assert!(e.to_string().contains("--workspace-device /dev/ws"), "{e}");
        let e = check_disk("w", "t", &agent(json!(["--workspace-device", "/dev/other"]))).unwrap_err();
        assert!(e.to_string().contains("nothing would format"), "{e}");
        // Mounted as a filesystem while claimed as a block device: refused.
        let mounted = json!({"volumeClaimTemplates": vct, "podTemplate": {"spec": {"containers": [{"name": "agent",
            "volumeMounts": [{"name": "workspace", "mountPath": "/workspace"}]}]}}});
        assert!(check_disk("w", "t", &mounted)
            .unwrap_err()
            .to_string()
            .contains("volumeDevices"));
    }

    #[test]
    fn a_disk_must_be_claimed_and_mounted() {
        let mounted = json!({"containers": [{"name": "agent", "volumeMounts": [{"name": "workspace", "mountPath": "/workspace"}]}]});
        let vct = json!([{"metadata": {"name": "workspace"}, "spec": {}}]);
        assert!(check_disk(
            "w",
            "t",
            &json!({"volumeClaimTemplates": vct, "podTemplate": {"spec": mounted}})
        )
        .is_ok());
        let e = check_disk("w", "t", &json!({"podTemplate": {"spec": mounted}})).unwrap_err();
        assert!(e.to_string().contains("no volumeClaimTemplate"), "{e}");
        let e = check_disk(
            "w",
            "t",
            &json!({"volumeClaimTemplates": vct, "podTemplate": {"spec": {"containers": [{"name": "agent"}]}}}),
        )
        .unwrap_err();
        assert!(e.to_string().contains("no container mounts it"), "{e}");
    }
}

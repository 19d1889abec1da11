//! The verbs about a workspace's OBJECT, reachable without a handle:
//! list, suspend and delete. None of them creates a pod, dials an agent or
//! resumes anything — an inventory of a namespace must not wake every
//! suspended workspace in it — and an option that would need the guest
//! (a flush, a quiesce) is refused by name, never ignored.

use serde_json::Value;

use super::object::{self, meta, operating_mode, sandboxes, HOLDER_EPOCH_ANNOTATION, WORKSPACE_LABEL};
use super::options::{Flush, SuspendOptions};
use crate::provider::KubernetesProvider;
use namzu_core::error::{Error, Result};
use namzu_core::spec::Tier;

/// One workspace as an inventory reads it, all from the Sandbox object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceSummary {
    /// The workspace's name.
    pub name: String,
    /// `spec.operatingMode` as asked for (`Running` or `Suspended`), not
    /// whether a pod runs.
    pub operating_mode: String,
    /// The SandboxTemplate it was built from.
    pub template: Option<String>,
    /// `metadata.creationTimestamp`.
    pub created_at: Option<String>,
    /// When namzu last changed its mode; `None` when never.
    pub mode_changed_at: Option<String>,
    /// The holder epoch it is held at (0 when unfenced); `None` when the
    /// annotation is unreadable — reporting 0 would call it free.
    pub holder_epoch: Option<u64>,
}

fn summary(obj: &Value) -> Option<WorkspaceSummary> {
    let name = meta(obj, "name").strip_prefix(object::WORKSPACE_NAME_PREFIX)?;
    if obj["metadata"]["labels"][WORKSPACE_LABEL] != name {
        return None;
    }
    let annotation = |k: &str| obj["metadata"]["annotations"][k].as_str().map(String::from);
    Some(WorkspaceSummary {
        name: name.to_owned(),
        operating_mode: operating_mode(obj).to_owned(),
        template: annotation(object::TEMPLATE_ANNOTATION),
        created_at: obj["metadata"]["creationTimestamp"].as_str().map(String::from),
        mode_changed_at: annotation(object::MODE_CHANGED_AT_ANNOTATION),
        holder_epoch: annotation(HOLDER_EPOCH_ANNOTATION).map_or(Some(0), |s| s.parse().ok()),
    })
}

impl KubernetesProvider {
    /// Every workspace in the namespace, by name: one LIST of Sandboxes,
    /// nothing else read or written.
    pub async fn list_workspaces(&self) -> Result<Vec<WorkspaceSummary>> {
        let list = self
            .api()
            .list(&sandboxes(self.options()), Some(WORKSPACE_LABEL))
            .await?;
        let mut out: Vec<_> = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(summary)
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Suspends workspace `name` without opening it: the patch (fenced
    /// under `s.epoch`), then a wait for its pod to be gone. A flush or a
    /// quiesce needs the guest and is refused: pass [`Flush::Skip`]. A
    /// workspace that does not exist is an error (there is nothing to
    /// suspend).
    pub async fn suspend_workspace(&self, name: &str, s: SuspendOptions) -> Result<()> {
        let refuse = |option: &str| Error::OptionRefused {
            tier: Tier::Kubernetes,
            option: option.into(),
            reason:
                "the standalone suspend never dials the guest; suspend through an open workspace, or pass Flush::Skip"
                    .into(),
        };
        if s.flush != Flush::Skip {
            return Err(refuse("flush"));
        }
        if s.quiesce.is_some() {
            return Err(refuse("quiesce"));
        }
        let (api, opts) = (self.api(), self.options());
        let full = object::sandbox_name(name)?;
        let obj = api.get(&sandboxes(opts), &full).await?;
        let pod = object::pod_name(&obj);
        let pod_uid = match api
            .get(&crate::api::Resource::core("pods", &opts.namespace), &pod)
            .await
        {
            Ok(p) => Some(meta(&p, "uid").to_owned()),
            Err(_) => None,
        };
        object::fenced_patch(api, opts, "suspend", name, s.epoch, object::mode_patch("Suspended")).await?;
        object::wait_pod_gone(api, opts, name, &pod, pod_uid.as_deref(), opts.ready_timeout).await
    }

    /// Deletes workspace `name` — its Sandbox, and through the owner
    /// references its pod, Service and disk — without opening it, fenced
    /// under `epoch`. Already gone counts as deleted.
    pub async fn delete_workspace(&self, name: &str, epoch: Option<u64>) -> Result<()> {
        object::fenced_delete(self.api(), self.options(), "delete", name, epoch).await
    }
}

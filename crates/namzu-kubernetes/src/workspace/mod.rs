//! Persistent workspaces: a named Sandbox with a disk of its own (a PVC
//! from the workspace template's volumeClaimTemplate), suspended when idle
//! (`operatingMode: Suspended`: the controller deletes the pod and keeps
//! the disk) and resumed later with everything on the disk.
//!
//! What this module promises:
//! * **Open by name** ([`KubernetesProvider::workspace`]): the
//!   deterministic name `namzu-ws-<name>` is created, adopted (checked
//!   field by field against the configuration: [`WorkspaceError::Mismatch`])
//!   or resumed, and the handle says which ([`Origin`]). A pod being
//!   deleted under the name is waited past, within the readiness budget.
//! * **A state is committed when the cluster confirms it**: a suspend
//!   resolves once the pod is gone ([`WorkspaceError::SuspendTimeout`]
//!   otherwise); a suspended handle refuses with
//!   [`WorkspaceError::Suspended`] before dialing anything.
//! * **Flush before suspend, by default**: the guest `syncfs`es the
//!   workspace first; a guest that answers and cannot confirm stops the
//!   suspend ([`WorkspaceError::FlushUnconfirmed`], no patch sent); one that
//!   cannot do it or cannot be reached is reported ([`FlushNotice`]) and
//!   the suspend goes on.
//! * **Fencing**: with a holder epoch, every lifecycle write is refused
//!   when the workspace is held at a higher one
//!   ([`WorkspaceError::Precondition`]) and otherwise sent with the read's
//!   `resourceVersion` as a precondition and the epoch stamped in the same
//!   write ([`object`]).
//! * **Exactly two DELETEs**, both asked for by name: `destroy` with
//!   `delete_disk`, and [`KubernetesProvider::delete_workspace`]. No
//!   failure path deletes anything.
//! * The standalone verbs ([`standalone`]) never dial a guest.

pub mod error;
pub mod object;
mod options;
pub mod standalone;

use serde_json::{json, Value};

pub use error::{FlushNotice, FlushNoticeCallback, NoticedBy, WorkspaceError};
pub use object::{
    sandbox_name, DEFAULT_WORKSPACE_TEMPLATE, HOLDER_EPOCH_ANNOTATION, MODE_CHANGED_AT_ANNOTATION, TEMPLATE_ANNOTATION,
    WORKSPACE_LABEL, WORKSPACE_NAME_PREFIX,
};
pub use options::{Flush, Origin, StartFailure, SuspendOptions, WorkspaceOptions, DEFAULT_FLUSH_TIMEOUT};
pub use standalone::WorkspaceSummary;

use crate::api::{ApiError, Resource};
use crate::crd::SandboxTemplate;
use crate::provider::KubernetesProvider;
use crate::KubernetesOptions;
use namzu_core::client::AgentClient;
use namzu_core::error::{Error, Result};
use namzu_core::handle::{Sandbox, SandboxBackend};
use namzu_core::spec::Tier;
use object::{meta, operating_mode, sandboxes, workspace_id};

/// The objects and guest a handle is bound to now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceIdentity {
    /// The Sandbox's uid: fixed for the handle's life.
    pub sandbox_uid: String,
    /// The pod's uid; `None` while suspended.
    pub pod_uid: Option<String>,
    /// The guest agent's boot id; `None` while suspended.
    pub boot_id: Option<String>,
}

enum State {
    Running {
        sb: Sandbox,
        pod_name: String,
        pod_uid: String,
    },
    Suspended(NoticedBy),
    Destroyed,
}

/// A handle on one persistent workspace. Its commands, files and
/// terminals are those of [`KubernetesWorkspace::sandbox`] while it runs.
pub struct KubernetesWorkspace {
    provider: KubernetesProvider,
    name: String,
    sandbox: String,
    sandbox_uid: String,
    origin: Origin,
    opts: WorkspaceOptions,
    state: tokio::sync::Mutex<State>,
}

impl std::fmt::Debug for KubernetesWorkspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesWorkspace")
            .field("name", &self.name)
            .field("sandbox", &self.sandbox)
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

/// The live link of a running workspace, as a [`Sandbox`] backend.
struct Guest {
    id: String,
    client: AgentClient,
}

#[async_trait::async_trait]
impl SandboxBackend for Guest {
    fn id(&self) -> &str {
        &self.id
    }
    fn tier(&self) -> Tier {
        Tier::Kubernetes
    }
    fn agent(&self) -> &AgentClient {
        &self.client
    }
    /// Refused: a workspace is suspended or deleted through its
    /// [`KubernetesWorkspace`] handle, which decides what happens to the disk.
    async fn destroy(&self) -> Result<()> {
        Err(Error::OptionRefused {
            tier: Tier::Kubernetes,
            option: "destroy".into(),
            reason: format!(
                "{} is a workspace: KubernetesWorkspace::destroy suspends it (keeping the disk) or deletes it",
                self.id
            ),
        })
    }
}

impl KubernetesProvider {
    /// Opens workspace `name`: creates it, adopts it, or resumes it, and
    /// binds a handle to its running pod.
    pub async fn workspace(&self, name: &str, w: WorkspaceOptions) -> Result<KubernetesWorkspace> {
        self.link_ready()?;
        let (api, opts) = (self.api(), self.options());
        let full = sandbox_name(name)?;
        let template_name = w.template_name();
        let (template, template_json) = read_template(self, &template_name).await?;
        object::check_disk(
            name,
            &format!("SandboxTemplate {template_name}"),
            &template_json["spec"],
        )?;
        let r = sandboxes(opts);
        let standing = match api.get(&r, &full).await {
            Ok(obj) => Some(obj),
            Err(ApiError::AlreadyGone { .. }) => {
                let body = object::build(opts, &template_name, &template, name, w.epoch)?;
                let labels = crate::labels::string_map(&body["spec"]["podTemplate"]["metadata"]["labels"]);
                self.verifier().verify(api, opts, &labels).await?;
                match api.create(&r, &body).await {
                    Ok(_) => None,
                    // Made by another host in between: adopted like any.
                    Err(ApiError::Conflict { .. }) => Some(api.get(&r, &full).await?),
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        };
        let (origin, woke) = match &standing {
            None => (Origin::Created, true),
            Some(obj) => {
                object::check_adopted(opts, name, &template_name, &template, obj)?;
                if let Some(e) = w.epoch {
                    object::check_epoch("open", name, obj, e)?;
                }
                if operating_mode(obj) == "Suspended" {
                    object::fenced_patch(api, opts, "open", name, w.epoch, object::mode_patch("Running")).await?;
                    (Origin::Resumed, true)
                } else {
                    // Taking a workspace over is when the fence moves.
                    if w.epoch.is_some() {
                        object::fenced_patch(api, opts, "open", name, w.epoch, json!({})).await?;
                    }
                    (Origin::AdoptedRunning, false)
                }
            }
        };
        let started = start(self, name, &full, None).await;
        let (state, sandbox_uid) = match started {
            Ok(s) => s,
            Err(e) => {
                put_back(self, name, woke, w.on_start_failure, w.epoch).await;
                return Err(e);
            }
        };
        Ok(KubernetesWorkspace {
            provider: self.clone(),
            name: name.to_owned(),
            sandbox: full,
            sandbox_uid,
            origin,
            opts: w,
            state: tokio::sync::Mutex::new(state),
        })
    }
}

/// The workspace template, typed and as JSON.
async fn read_template(p: &KubernetesProvider, name: &str) -> Result<(SandboxTemplate, Value)> {
    let v = p
        .api()
        .get(&Resource::of::<SandboxTemplate>(&p.options().namespace), name)
        .await?;
    let t = serde_json::from_value(v.clone()).map_err(|e| Error::InvalidArgument {
        op: "workspace open".into(),
        message: format!("SandboxTemplate {name:?} is not one: {e}"),
    })?;
    Ok((t, v))
}

/// Waits for the workspace's Sandbox to be Ready with a live pod, dials
/// the agent and runs the privilege probe; with `uid`, a Sandbox of
/// another uid is [`WorkspaceError::Replaced`].
async fn start(p: &KubernetesProvider, name: &str, full: &str, uid: Option<&str>) -> Result<(State, String)> {
    let (api, opts) = (p.api(), p.options());
    let id = workspace_id(name);
    let bound = crate::acquire::bind_sandbox(api, opts, full, &id).await?;
    let found = bound.sandbox_uid.clone().unwrap_or_default();
    if let Some(want) = uid.filter(|u| *u != found) {
        return Err(WorkspaceError::Replaced {
            workspace: name.to_owned(),
            sandbox: full.to_owned(),
            bound_uid: want.to_owned(),
            found_uid: found,
        }
        .into());
    }
    let (client, pod) = crate::rebind::dial(api, opts, &bound, p.client_options()).await?;
    namzu_core::check::privilege_probe(&id, &client).await?;
    let pod = pod.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let sb = Sandbox::new(Guest { id, client });
    Ok((
        State::Running {
            sb,
            pod_name: pod.name,
            pod_uid: pod.uid,
        },
        found,
    ))
}

/// After a failed start: suspends the workspace again when this call woke
/// it and the policy allows (logged, never raised: the start's failure is
/// what the caller is told).
async fn put_back(p: &KubernetesProvider, name: &str, woke: bool, policy: StartFailure, epoch: Option<u64>) {
    if !woke || policy == StartFailure::Leave {
        return;
    }
    let patch = object::mode_patch("Suspended");
    if let Err(e) = object::fenced_patch(p.api(), p.options(), "suspend", name, epoch, patch).await {
        tracing::warn!(workspace = %name, error = %e, "a workspace woken for a failed start could not be suspended again");
    }
}

/// Whether a flush failure means the guest could not be asked (so the
/// suspend goes on) rather than that it answered and could not confirm.
fn unreachable(e: &Error) -> bool {
    matches!(
        e,
        Error::LinkLost { .. }
            | Error::ConnectionRefused { .. }
            | Error::SandboxDead { .. }
            | Error::SandboxGone { .. }
            | Error::SandboxDestroyed { .. }
            | Error::AgentRetiring { .. }
    )
}

impl KubernetesWorkspace {
    /// The workspace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its Sandbox's name (`namzu-ws-<name>`).
    pub fn sandbox_name(&self) -> &str {
        &self.sandbox
    }

    /// How this handle came by the workspace.
    pub fn origin(&self) -> Origin {
        self.origin
    }

    /// The running workspace as a [`Sandbox`]: commands, files, terminals.
    /// Refused while suspended (nothing is dialed) or destroyed.
    pub async fn sandbox(&self) -> Result<Sandbox> {
        match &*self.state.lock().await {
            State::Running { sb, .. } => Ok(sb.clone()),
            State::Suspended(noticed_by) => Err(self.suspended("sandbox", *noticed_by)),
            State::Destroyed => Err(self.destroyed("sandbox")),
        }
    }

    /// Whether the handle holds the workspace suspended.
    pub async fn is_suspended(&self) -> bool {
        matches!(&*self.state.lock().await, State::Suspended(_))
    }

    /// The objects and guest bound now.
    pub async fn identity(&self) -> WorkspaceIdentity {
        let (pod_uid, boot_id) = match &*self.state.lock().await {
            State::Running { sb, pod_uid, .. } => (Some(pod_uid.clone()), Some(sb.agent().info().boot_id.clone())),
            _ => (None, None),
        };
        WorkspaceIdentity {
            sandbox_uid: self.sandbox_uid.clone(),
            pod_uid,
            boot_id,
        }
    }

    fn suspended(&self, op: &str, noticed_by: NoticedBy) -> Error {
        WorkspaceError::Suspended {
            op: op.to_owned(),
            workspace: self.name.clone(),
            sandbox: self.sandbox.clone(),
            noticed_by,
        }
        .into()
    }

    fn destroyed(&self, op: &str) -> Error {
        WorkspaceError::Destroyed {
            op: op.to_owned(),
            workspace: self.name.clone(),
        }
        .into()
    }

    fn opts(&self) -> &KubernetesOptions {
        self.provider.options()
    }

    /// Reads the Sandbox, refusing one of another uid than this handle's.
    async fn read(&self) -> Result<Value> {
        let obj = self.provider.api().get(&sandboxes(self.opts()), &self.sandbox).await?;
        if meta(&obj, "uid") != self.sandbox_uid {
            return Err(WorkspaceError::Replaced {
                workspace: self.name.clone(),
                sandbox: self.sandbox.clone(),
                bound_uid: self.sandbox_uid.clone(),
                found_uid: meta(&obj, "uid").to_owned(),
            }
            .into());
        }
        Ok(obj)
    }

    /// Suspends the workspace: (quiesce,) flush, patch `Suspended`, and
    /// wait for the pod to be gone. Already suspended is done. A refused
    /// fence or an unconfirmed flush leaves the handle running.
    pub async fn suspend(&self, s: SuspendOptions) -> Result<()> {
        let mut st = self.state.lock().await;
        let (sb, pod_name, pod_uid) = match &*st {
            State::Running { sb, pod_name, pod_uid } => (sb.clone(), pod_name.clone(), pod_uid.clone()),
            State::Suspended(_) => return Ok(()),
            State::Destroyed => return Err(self.destroyed("suspend")),
        };
        let epoch = s.epoch.or(self.opts.epoch);
        // Decided before the guest is touched: a superseded holder stops
        // nothing of the holder that superseded it.
        if let Some(e) = epoch {
            object::check_epoch("suspend", &self.name, &self.read().await?, e)?;
        }
        if let Some(grace) = s.quiesce {
            sb.agent().quiesce(grace).await?;
        }
        self.flush_before(&sb, s.flush).await?;
        let patch = object::mode_patch("Suspended");
        object::fenced_patch(self.provider.api(), self.opts(), "suspend", &self.name, epoch, patch).await?;
        sb.agent().close();
        *st = State::Suspended(NoticedBy::Admission);
        drop(st);
        object::wait_pod_gone(
            self.provider.api(),
            self.opts(),
            &self.name,
            &pod_name,
            Some(&pod_uid),
            self.opts().ready_timeout,
        )
        .await
    }

    async fn flush_before(&self, sb: &Sandbox, flush: Flush) -> Result<()> {
        let timeout = match flush {
            Flush::Skip => return Ok(()),
            Flush::Default => DEFAULT_FLUSH_TIMEOUT,
            Flush::Within(t) => t,
        };
        let notice = match sb.agent().flush(timeout).await {
            Ok(took) => {
                tracing::debug!(workspace = %self.name, ?took, "flushed before suspend");
                return Ok(());
            }
            Err(Error::Unsupported { .. }) => FlushNotice::Unsupported {
                workspace: self.name.clone(),
            },
            Err(e) if unreachable(&e) => FlushNotice::Unreachable {
                workspace: self.name.clone(),
                message: e.to_string(),
            },
            Err(e) => {
                return Err(WorkspaceError::FlushUnconfirmed {
                    workspace: self.name.clone(),
                    message: e.to_string(),
                }
                .into())
            }
        };
        tracing::warn!(workspace = %self.name, ?notice, "suspending without a flush");
        if let Some(cb) = &self.opts.on_flush_notice {
            cb(&notice);
        }
        Ok(())
    }

    /// Resumes a suspended workspace (a running one is done): patch
    /// `Running` when the object is suspended, then bind the new pod —
    /// its address and token read afresh.
    pub async fn resume(&self, epoch: Option<u64>) -> Result<()> {
        let mut st = self.state.lock().await;
        match &*st {
            State::Running { .. } => return Ok(()),
            State::Destroyed => return Err(self.destroyed("resume")),
            State::Suspended(_) => {}
        }
        let epoch = epoch.or(self.opts.epoch);
        let obj = self.read().await?;
        if let Some(e) = epoch {
            object::check_epoch("resume", &self.name, &obj, e)?;
        }
        let woke = operating_mode(&obj) == "Suspended";
        let (api, opts) = (self.provider.api(), self.opts());
        if woke {
            object::fenced_patch(api, opts, "resume", &self.name, epoch, object::mode_patch("Running")).await?;
        }
        match start(&self.provider, &self.name, &self.sandbox, Some(&self.sandbox_uid)).await {
            Ok((state, _)) => {
                *st = state;
                Ok(())
            }
            Err(e) => {
                put_back(&self.provider, &self.name, woke, self.opts.on_start_failure, epoch).await;
                Err(e)
            }
        }
    }

    /// Re-reads the object: a workspace another process suspended is
    /// recorded as such (later operations refuse, noticed by refresh);
    /// one of another uid is [`WorkspaceError::Replaced`]. Sends no write.
    pub async fn refresh(&self) -> Result<()> {
        let obj = self.read().await?;
        let mut st = self.state.lock().await;
        if operating_mode(&obj) == "Suspended" {
            if let State::Running { sb, .. } = &*st {
                sb.agent().close();
                *st = State::Suspended(NoticedBy::Refresh);
            }
        }
        Ok(())
    }

    /// Ends this handle: suspends the workspace (keeping its disk), or,
    /// with `delete_disk`, deletes its Sandbox and with it the disk.
    pub async fn destroy(&self, delete_disk: bool, s: SuspendOptions) -> Result<()> {
        if !delete_disk {
            self.suspend(s).await?;
        } else {
            let epoch = s.epoch.or(self.opts.epoch);
            object::fenced_delete(self.provider.api(), self.opts(), "destroy", &self.name, epoch).await?;
        }
        let mut st = self.state.lock().await;
        if let State::Running { sb, .. } = &*st {
            sb.agent().close();
        }
        *st = State::Destroyed;
        Ok(())
    }
}

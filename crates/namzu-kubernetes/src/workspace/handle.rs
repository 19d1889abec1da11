//! The workspace handle: opening by name (create, adopt, resume), and
//! every transition of one open workspace — suspend, resume, refresh,
//! destroy — with its identity, template revision and guest checks.

use serde_json::{json, Value};

use super::error::{FlushNotice, NoticedBy, WorkspaceError};
use super::guest::{self, Guest};
use super::object::{self, meta, operating_mode, sandbox_name, sandboxes, workspace_id};
use super::options::{
    Flush, Origin, ResumeOptions, StartFailure, SuspendOptions, WorkspaceOptions, DEFAULT_FLUSH_TIMEOUT,
};

use crate::api::{ApiError, Resource};
use crate::crd::SandboxTemplate;
use crate::provider::KubernetesProvider;
use crate::KubernetesOptions;
use namzu_core::client::AgentClient;
use namzu_core::error::{Error, Result};
use namzu_core::handle::Sandbox;

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
        client: AgentClient,
        pod_name: String,
        /// The pod the link is bound to now (it follows a replacement).
        pod: crate::rebind::CurrentPod,
        boot: guest::Boot,
    },
    Suspended(NoticedBy),
    Destroyed,
}

/// A handle on one persistent workspace (cheap to clone: clones share
/// it). Its commands, files and terminals are those of
/// [`KubernetesWorkspace::sandbox`] while it runs.
#[derive(Clone)]
pub struct KubernetesWorkspace {
    inner: std::sync::Arc<Core>,
}

struct Core {
    provider: KubernetesProvider,
    name: String,
    sandbox: String,
    sandbox_uid: String,
    origin: Origin,
    opts: WorkspaceOptions,
    state: tokio::sync::Mutex<State>,
    /// (the revision the bound Sandbox records, the template's last read).
    revision: std::sync::Mutex<(Option<String>, String)>,
}

impl std::fmt::Debug for KubernetesWorkspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesWorkspace")
            .field("name", &self.inner.name)
            .field("sandbox", &self.inner.sandbox)
            .field("origin", &self.inner.origin)
            .finish_non_exhaustive()
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
        let mut made_uid = None;
        let standing = match api.get(&r, &full).await {
            Ok(obj) => Some(obj),
            Err(ApiError::AlreadyGone { .. }) => {
                let body = object::build(opts, (&template_name, &template), name, w.epoch, &w.env)?;
                let labels = crate::labels::string_map(&body["spec"]["podTemplate"]["metadata"]["labels"]);
                self.verifier().verify(api, opts, &labels).await?;
                match api.create(&r, &body).await {
                    Ok(made) => {
                        made_uid = Some(meta(&made, "uid").to_owned());
                        None
                    }
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
                    let refresh = w
                        .refresh_pod_template
                        .then_some((&template_name, &template, &template_json));
                    let patch = wake_patch(opts, name, &w.env, refresh, obj)?;
                    object::fenced_patch(api, opts, "open", name, w.epoch, patch).await?;
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
        let current = object::revision(&template);
        let bound = match &standing {
            Some(obj) if !(w.refresh_pod_template && origin == Origin::Resumed) => object::recorded_revision(obj),
            _ => Some(current.clone()),
        };
        // The object checked (or made) is the one bound: one deleted and
        // made again in between is another workspace.
        let uid = standing.as_ref().map(|o| meta(o, "uid").to_owned()).or(made_uid);
        let started = start(self, (name, &full), uid.as_deref(), w.on_guest_restart.clone()).await;
        let (state, sandbox_uid) = match started {
            Ok(s) => s,
            Err(e) => {
                put_back(self, name, woke, w.on_start_failure, w.epoch).await;
                return Err(e);
            }
        };
        Ok(KubernetesWorkspace {
            inner: std::sync::Arc::new(Core {
                provider: self.clone(),
                name: name.to_owned(),
                sandbox: full,
                sandbox_uid,
                origin,
                opts: w,
                state: tokio::sync::Mutex::new(state),
                revision: std::sync::Mutex::new((bound, current)),
            }),
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

/// The patch that wakes a suspended workspace: `Running`, and with
/// `refresh` (the template's name, typed and as served) the template's
/// current pod template written over the Sandbox's copy — the overlays
/// (token, port, labels, `env`) applied as at creation — with its
/// revision; refused when it would change the disk, before anything is
/// sent.
fn wake_patch(
    opts: &KubernetesOptions,
    name: &str,
    env: &[(String, String)],
    refresh: Option<(&String, &SandboxTemplate, &Value)>,
    obj: &Value,
) -> Result<Value> {
    let mut patch = object::mode_patch("Running");
    let Some((template_name, template, served)) = refresh else {
        return Ok(patch);
    };
    object::check_refresh_disk(name, template_name, served, obj)?;
    let built = object::build(opts, (template_name, template), name, None, env)?;
    patch["spec"]["podTemplate"] = object::merge_replacing(&obj["spec"]["podTemplate"], &built["spec"]["podTemplate"]);
    patch["metadata"]["annotations"][object::POD_TEMPLATE_HASH_ANNOTATION] = json!(object::revision(template));
    Ok(patch)
}

/// Waits for the workspace's Sandbox to be Ready with a live pod, dials
/// the agent and runs the privilege probe; with `uid`, a Sandbox of
/// another uid is [`WorkspaceError::Replaced`].
async fn start(
    p: &KubernetesProvider,
    (name, full): (&str, &str),
    uid: Option<&str>,
    listener: Option<guest::GuestRestartCallback>,
) -> Result<(State, String)> {
    let boot = guest::Boot::default();
    let opts = &guest::following(p.options(), name, listener.clone(), &boot);
    let api = p.api();
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
    client.guard_with(std::sync::Arc::new(guest::Kept(name.to_owned())));
    namzu_core::check::privilege_probe(&id, &client).await?;
    *boot.lock().unwrap_or_else(|e| e.into_inner()) = Some(client.info().boot_id.clone());
    // Every boot id the link learns from here on (a re-dial's hello, a
    // result) is checked: the same pod's agent under another id restarted.
    let (ws, at, seen_boot) = (name.to_owned(), pod.clone(), boot.clone());
    client.on_agent_restart(std::sync::Arc::new(move |_, now| {
        guest::seen(&ws, &at, &seen_boot, listener.as_ref(), now);
    }));
    let pod_name = pod.lock().unwrap_or_else(|e| e.into_inner()).name.clone();
    Ok((
        State::Running {
            client,
            pod_name,
            pod,
            boot,
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
        &self.inner.name
    }

    /// Its Sandbox's name (`namzu-ws-<name>`).
    pub fn sandbox_name(&self) -> &str {
        &self.inner.sandbox
    }

    /// How this handle came by the workspace.
    pub fn origin(&self) -> Origin {
        self.inner.origin
    }

    /// The running workspace as a [`Sandbox`]: commands, files, terminals.
    /// Refused while suspended (nothing is dialed) or destroyed.
    pub async fn sandbox(&self) -> Result<Sandbox> {
        match &*self.inner.state.lock().await {
            State::Running { client, .. } => {
                let ws = self.clone();
                Ok(Sandbox::new(Guest {
                    id: workspace_id(&self.inner.name),
                    client: client.clone(),
                    destroy: std::sync::Arc::new(move || {
                        let ws = ws.clone();
                        Box::pin(async move { ws.destroy(false, SuspendOptions::default()).await })
                    }),
                }))
            }
            State::Suspended(noticed_by) => Err(self.suspended("sandbox", *noticed_by)),
            State::Destroyed => Err(self.destroyed("sandbox")),
        }
    }

    /// Whether the handle holds the workspace suspended.
    pub async fn is_suspended(&self) -> bool {
        matches!(&*self.inner.state.lock().await, State::Suspended(_))
    }

    /// The revision of the pod template the Sandbox carries (its
    /// `io.namzu/pod-template-hash`); `None` when it records none.
    pub fn template_revision(&self) -> Option<String> {
        self.inner.revision.lock().unwrap_or_else(|p| p.into_inner()).0.clone()
    }

    /// Whether [`Self::template_revision`] is the template's as this
    /// handle last read it (at open, `refresh`, or a refreshing resume).
    /// Unknown is not current. `false`: a suspend and a resume with
    /// `refresh_pod_template` would change what the workspace runs.
    pub fn template_revision_current(&self) -> bool {
        let r = self.inner.revision.lock().unwrap_or_else(|p| p.into_inner());
        r.0.as_deref() == Some(r.1.as_str())
    }

    fn set_revision(&self, bound: Option<String>, template: Option<String>) {
        let mut r = self.inner.revision.lock().unwrap_or_else(|p| p.into_inner());
        r.0 = bound;
        if let Some(t) = template {
            r.1 = t;
        }
    }

    /// The objects and guest bound now.
    pub async fn identity(&self) -> WorkspaceIdentity {
        let (pod_uid, boot_id) = match &*self.inner.state.lock().await {
            State::Running { pod, boot, .. } => (
                Some(pod.lock().unwrap_or_else(|e| e.into_inner()).uid.clone()),
                boot.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            ),
            _ => (None, None),
        };
        WorkspaceIdentity {
            sandbox_uid: self.inner.sandbox_uid.clone(),
            pod_uid,
            boot_id,
        }
    }

    fn suspended(&self, op: &str, noticed_by: NoticedBy) -> Error {
        WorkspaceError::Suspended {
            op: op.to_owned(),
            workspace: self.inner.name.clone(),
            sandbox: self.inner.sandbox.clone(),
            noticed_by,
        }
        .into()
    }

    fn destroyed(&self, op: &str) -> Error {
        WorkspaceError::Destroyed {
            op: op.to_owned(),
            workspace: self.inner.name.clone(),
        }
        .into()
    }

    fn opts(&self) -> &KubernetesOptions {
        self.inner.provider.options()
    }

    /// Reads the Sandbox, refusing one of another uid than this handle's.
    async fn read(&self) -> Result<Value> {
        let obj = self
            .inner
            .provider
            .api()
            .get(&sandboxes(self.opts()), &self.inner.sandbox)
            .await?;
        if meta(&obj, "uid") != self.inner.sandbox_uid {
            return Err(WorkspaceError::Replaced {
                workspace: self.inner.name.clone(),
                sandbox: self.inner.sandbox.clone(),
                bound_uid: self.inner.sandbox_uid.clone(),
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
        let mut st = self.inner.state.lock().await;
        let (client, pod_name, pod_uid) = match &*st {
            State::Running {
                client, pod_name, pod, ..
            } => (
                client.clone(),
                pod_name.clone(),
                pod.lock().unwrap_or_else(|e| e.into_inner()).uid.clone(),
            ),
            State::Suspended(_) => return Ok(()),
            State::Destroyed => return Err(self.destroyed("suspend")),
        };
        let epoch = s.epoch.or(self.inner.opts.epoch);
        // Decided before the guest is touched: a superseded holder stops
        // nothing of the holder that superseded it.
        if let Some(e) = epoch {
            object::check_epoch("suspend", &self.inner.name, &self.read().await?, e)?;
        }
        if let Some(grace) = s.quiesce {
            client.quiesce(grace).await?;
        }
        self.flush_before(&client, s.flush).await?;
        let patch = object::mode_patch("Suspended");
        object::fenced_patch(
            self.inner.provider.api(),
            self.opts(),
            "suspend",
            &self.inner.name,
            epoch,
            patch,
        )
        .await?;
        client.close();
        *st = State::Suspended(NoticedBy::Admission);
        drop(st);
        object::wait_pod_gone(
            self.inner.provider.api(),
            self.opts(),
            &self.inner.name,
            &pod_name,
            Some(&pod_uid),
            self.opts().ready_timeout,
        )
        .await
    }

    async fn flush_before(&self, client: &AgentClient, flush: Flush) -> Result<()> {
        let timeout = match flush {
            Flush::Skip => return Ok(()),
            Flush::Default => DEFAULT_FLUSH_TIMEOUT,
            Flush::Within(t) => t,
        };
        let notice = match client.flush(timeout).await {
            Ok(took) => {
                tracing::debug!(workspace = %self.inner.name, ?took, "flushed before suspend");
                return Ok(());
            }
            Err(Error::Unsupported { .. }) => FlushNotice::Unsupported {
                workspace: self.inner.name.clone(),
            },
            Err(e) if unreachable(&e) => FlushNotice::Unreachable {
                workspace: self.inner.name.clone(),
                message: e.to_string(),
            },
            Err(e) => {
                return Err(WorkspaceError::FlushUnconfirmed {
                    workspace: self.inner.name.clone(),
                    message: e.to_string(),
                }
                .into())
            }
        };
        tracing::warn!(workspace = %self.inner.name, ?notice, "suspending without a flush");
        if let Some(cb) = &self.inner.opts.on_flush_notice {
            cb(&notice);
        }
        Ok(())
    }

    /// Resumes a suspended workspace (a running one is done): patch
    /// `Running` when the object is suspended — with
    /// `refresh_pod_template`, writing the template's current pod over the
    /// Sandbox's copy in the same patch — then bind the new pod, its
    /// address and token read afresh.
    pub async fn resume(&self, r: ResumeOptions) -> Result<()> {
        let epoch = r.epoch;
        let mut st = self.inner.state.lock().await;
        match &*st {
            State::Running { .. } => return Ok(()),
            State::Destroyed => return Err(self.destroyed("resume")),
            State::Suspended(_) => {}
        }
        let epoch = epoch.or(self.inner.opts.epoch);
        let obj = self.read().await?;
        if let Some(e) = epoch {
            object::check_epoch("resume", &self.inner.name, &obj, e)?;
        }
        let woke = operating_mode(&obj) == "Suspended";
        let (api, opts) = (self.inner.provider.api(), self.opts());
        let mut bound = object::recorded_revision(&obj);
        if woke {
            // The pod template is rewritten only on this transition: the
            // controller never rewrites a pod that already exists.
            let template = match r.refresh_pod_template {
                true => Some(read_template(&self.inner.provider, &self.inner.opts.template_name()).await?),
                false => None,
            };
            let name = self.inner.opts.template_name();
            let refresh = template.as_ref().map(|(t, v)| (&name, t, v));
            let patch = wake_patch(opts, &self.inner.name, &self.inner.opts.env, refresh, &obj)?;
            object::fenced_patch(api, opts, "resume", &self.inner.name, epoch, patch).await?;
            if let Some((t, _)) = &template {
                let current = object::revision(t);
                bound = Some(current.clone());
                self.set_revision(bound.clone(), Some(current));
            }
        }
        self.set_revision(bound, None);
        let listener = self.inner.opts.on_guest_restart.clone();
        let (name, full) = (self.inner.name.as_str(), self.inner.sandbox.as_str());
        match start(
            &self.inner.provider,
            (name, full),
            Some(&self.inner.sandbox_uid),
            listener,
        )
        .await
        {
            Ok((state, _)) => {
                *st = state;
                Ok(())
            }
            Err(e) => {
                put_back(
                    &self.inner.provider,
                    &self.inner.name,
                    woke,
                    self.inner.opts.on_start_failure,
                    epoch,
                )
                .await;
                Err(e)
            }
        }
    }

    /// Asks the guest who it is now (`health`): an agent of the same pod
    /// answering with another boot id restarted, and `on_guest_restart`
    /// is told. A guest that cannot be reached is explained by a re-read
    /// of the object: suspended by another process
    /// ([`WorkspaceError::Suspended`], noticed by transport, and the handle
    /// holds it so), gone for good ([`WorkspaceError::GuestGone`]), or
    /// replaced ([`WorkspaceError::Replaced`]); else the failure itself.
    pub async fn check_guest(&self) -> Result<WorkspaceIdentity> {
        let (client, pod, boot) = match &*self.inner.state.lock().await {
            State::Running { client, pod, boot, .. } => (client.clone(), pod.clone(), boot.clone()),
            State::Suspended(n) => return Err(self.suspended("check_guest", *n)),
            State::Destroyed => return Err(self.destroyed("check_guest")),
        };
        let info = match client.health().await {
            Ok(info) => info,
            Err(e) => return Err(self.explain("check_guest", e).await),
        };
        let listener = self.inner.opts.on_guest_restart.as_ref();
        guest::seen(&self.inner.name, &pod, &boot, listener, &info.boot_id);
        Ok(self.identity().await)
    }

    /// What a failed call to the guest means, from a re-read of the object.
    async fn explain(&self, op: &str, e: Error) -> Error {
        let obj = match self.read().await {
            Ok(obj) => obj,
            Err(read) => {
                let gone = matches!(
                    read.tier_error::<crate::KubernetesError>(),
                    Some(crate::KubernetesError::Api(ApiError::AlreadyGone { .. }))
                );
                if gone {
                    return WorkspaceError::GuestGone {
                        workspace: self.inner.name.clone(),
                        reason: format!("Sandbox {} no longer exists ({op} failed: {e})", self.inner.sandbox),
                    }
                    .into();
                }
                // Replaced, or the API unreachable: that says more.
                return read;
            }
        };
        if operating_mode(&obj) != "Suspended" {
            return e;
        }
        let mut st = self.inner.state.lock().await;
        if let State::Running { client, .. } = &*st {
            client.close();
            *st = State::Suspended(NoticedBy::Transport);
        }
        self.suspended(op, NoticedBy::Transport)
    }

    /// Re-reads the object: a workspace another process suspended is
    /// recorded as such (later operations refuse, noticed by refresh);
    /// one of another uid is [`WorkspaceError::Replaced`]. Sends no write.
    pub async fn refresh(&self) -> Result<()> {
        let obj = self.read().await?;
        let (template, _) = read_template(&self.inner.provider, &self.inner.opts.template_name()).await?;
        self.set_revision(object::recorded_revision(&obj), Some(object::revision(&template)));
        let mut st = self.inner.state.lock().await;
        if operating_mode(&obj) == "Suspended" {
            if let State::Running { client, .. } = &*st {
                client.close();
                *st = State::Suspended(NoticedBy::Refresh);
            }
        }
        Ok(())
    }

    /// Ends this handle: suspends the workspace (keeping its disk), or,
    /// with `delete_disk`, deletes its Sandbox and with it the disk.
    /// Destroying a destroyed handle is done. With `delete_disk`, a
    /// quiesce or an explicit flush in `s` is refused by name (only its
    /// epoch is read).
    pub async fn destroy(&self, delete_disk: bool, s: SuspendOptions) -> Result<()> {
        if matches!(&*self.inner.state.lock().await, State::Destroyed) {
            return Ok(());
        }
        if !delete_disk {
            self.suspend(s).await?;
        } else {
            // The disk is about to go: a quiesce or a flush asked for by
            // name has nothing to protect, and is refused rather than
            // skipped (the default flush is simply not run).
            let asked = match (s.quiesce, s.flush) {
                (Some(_), _) => Some("quiesce"),
                (None, Flush::Within(_)) => Some("flush"),
                _ => None,
            };
            if let Some(option) = asked {
                return Err(Error::OptionRefused {
                    tier: namzu_core::spec::Tier::Kubernetes,
                    option: option.into(),
                    reason: "destroy with delete_disk deletes the disk; there is nothing to stop or flush for".into(),
                });
            }
            let epoch = s.epoch.or(self.inner.opts.epoch);
            object::fenced_delete(
                self.inner.provider.api(),
                self.opts(),
                "destroy",
                &self.inner.name,
                epoch,
            )
            .await?;
        }
        let mut st = self.inner.state.lock().await;
        if let State::Running { client, .. } = &*st {
            client.close();
        }
        *st = State::Destroyed;
        Ok(())
    }
}

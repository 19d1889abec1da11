//! How a workspace is opened and suspended: the options the handle's
//! verbs and the standalone ones take, and what an open reports.

use std::time::Duration;

use super::error::FlushNoticeCallback;
use super::object::DEFAULT_WORKSPACE_TEMPLATE;

/// What the guest may spend in `syncfs` when a suspend flushes with its
/// default.
pub const DEFAULT_FLUSH_TIMEOUT: Duration = Duration::from_secs(10);

/// How a handle came by its workspace; fixed for the handle's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// This call created the Sandbox: the disk is empty.
    Created,
    /// The object stood Running: the pod predates this handle, and no
    /// terminal of the process that left it survives.
    AdoptedRunning,
    /// The object stood Suspended and this call woke it: the disk is what
    /// the last holder left; the pod is new.
    Resumed,
}

/// What a start that failed may do to the workspace it was starting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StartFailure {
    /// Suspend it again, only when this call woke it (created it, or took
    /// it out of `Suspended`): never take a pod from a holder using it.
    #[default]
    SuspendIfWoken,
    /// Never patch on a failed start.
    Leave,
}

/// Whether (and within what) a suspend asks the guest to flush first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Flush {
    /// Flush, the guest given [`DEFAULT_FLUSH_TIMEOUT`].
    #[default]
    Default,
    /// Flush, the guest given this long.
    Within(Duration),
    /// No flush (the caller flushed, or the disk is about to go).
    Skip,
}

/// How a workspace is opened.
#[derive(Clone, Default)]
pub struct WorkspaceOptions {
    /// The SandboxTemplate to build from ([`DEFAULT_WORKSPACE_TEMPLATE`]
    /// when `None`).
    pub template: Option<String>,
    /// The holder epoch the handle opens and writes under; `None` fences
    /// nothing.
    pub epoch: Option<u64>,
    /// What a failed start may do.
    pub on_start_failure: StartFailure,
    /// Told of a flush a suspend went on without.
    pub on_flush_notice: Option<FlushNoticeCallback>,
    /// Told when the guest behind the handle moves: a pod replaced under
    /// it (the link follows; the disk is re-attached; every process is
    /// gone) or an agent restarted in its pod (found by
    /// `check_guest`). Never for this handle's own suspend and resume.
    pub on_guest_restart: Option<super::guest::GuestRestartCallback>,
    /// On an open that wakes a suspended workspace, write the template's
    /// current pod template over the Sandbox's copy (see
    /// [`ResumeOptions::refresh_pod_template`]); ignored by a create (which
    /// builds from the template as it stands) and by an adopt of a running
    /// workspace.
    pub refresh_pod_template: bool,
    /// The agent's environment (the sandbox's env and agent limits, as
    /// [`WorkspaceOptions::for_spec`] makes it): written by the create
    /// only; an adopted or resumed workspace keeps what it was made with.
    pub env: Vec<(String, String)>,
}

impl std::fmt::Debug for WorkspaceOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkspaceOptions")
            .field("template", &self.template)
            .field("epoch", &self.epoch)
            .field("on_start_failure", &self.on_start_failure)
            .finish_non_exhaustive()
    }
}

impl WorkspaceOptions {
    /// Options carrying `spec`'s environment and agent limits; what a
    /// workspace cannot take from a spec (an image, binds, resources,
    /// egress: the template's and the cluster's) is refused by name, as
    /// for a task sandbox.
    pub fn for_spec(spec: &namzu_core::spec::SandboxSpec) -> namzu_core::Result<Self> {
        crate::provider::refusals(spec)?;
        namzu_core::check::check_spec(namzu_core::spec::Tier::Kubernetes, spec)?;
        Ok(Self {
            env: crate::build::agent_env(spec),
            ..Default::default()
        })
    }

    pub(super) fn template_name(&self) -> String {
        self.template
            .clone()
            .unwrap_or_else(|| DEFAULT_WORKSPACE_TEMPLATE.to_owned())
    }
}

/// What a suspend does first.
#[derive(Debug, Clone, Copy, Default)]
pub struct SuspendOptions {
    /// The epoch this write goes under (the handle's when `None`).
    pub epoch: Option<u64>,
    /// The flush before the patch; on by default.
    pub flush: Flush,
    /// Stop every process in the guest first, with this grace between
    /// SIGTERM and SIGKILL.
    pub quiesce: Option<Duration>,
}

/// What a resume does.
#[derive(Debug, Clone, Copy, Default)]
pub struct ResumeOptions {
    /// The epoch this write goes under (the handle's when `None`).
    pub epoch: Option<u64>,
    /// Write the SandboxTemplate's current pod template onto the workspace
    /// as it wakes, keeping its disk (a new image, limits, env): honoured
    /// only on the transition from `Suspended` (the controller never
    /// rewrites a pod that exists), refused when the template would change
    /// the disk. Off: the pod is built from the Sandbox's stored copy.
    pub refresh_pod_template: bool,
}

//! Persistent workspaces: a named Sandbox with a disk of its own (a PVC
//! from the workspace template's volumeClaimTemplate), suspended when idle
//! (`operatingMode: Suspended`: the controller deletes the pod and keeps
//! the disk) and resumed later with everything on the disk.
//!
//! What this module promises:
//! * **Open by name** ([`KubernetesProvider::workspace`](crate::KubernetesProvider::workspace)): the
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
//!   `delete_disk`, and [`KubernetesProvider::delete_workspace`](crate::KubernetesProvider::delete_workspace). No
//!   failure path deletes anything.
//! * The standalone verbs ([`standalone`]) never dial a guest.

pub mod error;
mod guest;
mod handle;
pub mod object;
mod options;
pub mod standalone;

pub use error::{FlushNotice, FlushNoticeCallback, NoticedBy, WorkspaceError};
pub use guest::{GuestIdentity, GuestRestart, GuestRestartCallback, GuestRestartKind};
pub use handle::{KubernetesWorkspace, WorkspaceIdentity};
pub use object::{
    sandbox_name, DEFAULT_WORKSPACE_TEMPLATE, HOLDER_EPOCH_ANNOTATION, MODE_CHANGED_AT_ANNOTATION,
    POD_TEMPLATE_HASH_ANNOTATION, TEMPLATE_ANNOTATION, WORKSPACE_LABEL, WORKSPACE_NAME_PREFIX,
};
pub use options::{
    Flush, Origin, ResumeOptions, StartFailure, SuspendOptions, WorkspaceOptions, DEFAULT_FLUSH_TIMEOUT,
};
pub use standalone::WorkspaceSummary;

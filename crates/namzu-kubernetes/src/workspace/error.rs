//! [`WorkspaceError`]: what a persistent workspace refuses or fails with,
//! each carrying what a caller acts on. It reaches callers as
//! `KubernetesError::Workspace` inside the tier error.

use std::time::Duration;

/// How a caller came to be told a workspace is suspended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoticedBy {
    /// This handle suspended it (or already knew): nothing was dialed.
    Admission,
    /// A re-read of the object (`refresh`) found it suspended by someone
    /// else while this handle held it.
    Refresh,
    /// A call to the guest failed and the re-read that followed found the
    /// workspace suspended by someone else; the failure said nothing of it.
    Transport,
}

impl std::fmt::Display for NoticedBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Admission => "this handle suspended it; nothing was dialed",
            Self::Refresh => "a re-read found it suspended by another process",
            Self::Transport => "a call to the guest failed and a re-read found it suspended by another process",
        })
    }
}

/// A workspace refused an operation or could not complete one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WorkspaceError {
    /// The name cannot be a workspace's.
    #[error("workspace name {name:?}: {reason}")]
    InvalidName {
        /// The name given.
        name: String,
        /// Why it was refused.
        reason: String,
    },
    /// The object standing under the workspace's name disagrees with the
    /// configuration on a field that decides the boundary or the disk: it
    /// is refused by name, never driven.
    #[error("workspace {workspace}: Sandbox {sandbox} has {field} {actual:?}, the configuration asks for {expected:?}; it is not adopted")]
    Mismatch {
        /// The workspace.
        workspace: String,
        /// The Sandbox standing under its name.
        sandbox: String,
        /// The field: `template`, `runtimeClassName` or `egressProfile`.
        field: String,
        /// What the configuration asks for (`key=value` for a label).
        expected: String,
        /// What the object carries; `None` when nothing.
        actual: Option<String>,
    },
    /// The Sandbox under the workspace's name is another object than the
    /// one this handle was bound to (deleted and made again): never
    /// silently followed.
    #[error("workspace {workspace}: Sandbox {sandbox} is now uid {found_uid}, not uid {bound_uid} this handle was opened on; that workspace and its disk are gone. Open the workspace again")]
    Replaced {
        /// The workspace.
        workspace: String,
        /// The Sandbox's name.
        sandbox: String,
        /// The uid this handle was bound to.
        bound_uid: String,
        /// The uid found standing now.
        found_uid: String,
    },
    /// The workspace is suspended: `resume` it.
    #[error("workspace {workspace}: {op} refused: the workspace is suspended ({noticed_by}); resume it first")]
    Suspended {
        /// The operation refused.
        op: String,
        /// The workspace.
        workspace: String,
        /// The Sandbox's name.
        sandbox: String,
        /// How it was noticed.
        noticed_by: NoticedBy,
    },
    /// The guest is gone for good: the workspace's Sandbox no longer
    /// exists (deleted, by this process or another).
    #[error("workspace {workspace}: its guest is gone for good: {reason}")]
    GuestGone {
        /// The workspace.
        workspace: String,
        /// What was found.
        reason: String,
    },
    /// The workspace was destroyed through this handle.
    #[error("workspace {workspace}: {op} refused: this handle destroyed it")]
    Destroyed {
        /// The operation refused.
        op: String,
        /// The workspace.
        workspace: String,
    },
    /// The suspend patch was accepted but the pod still stood when the
    /// budget ran out; the object stays as the patch left it (the next
    /// suspend patches and waits again).
    #[error("workspace {workspace}: suspended, but pod {pod} still stood after {timeout:?}; its disk may still be written to")]
    SuspendTimeout {
        /// The workspace.
        workspace: String,
        /// The pod waited for.
        pod: String,
        /// The budget the wait was given.
        timeout: Duration,
    },
    /// A lifecycle write carried a holder epoch the workspace has moved
    /// past: another host holds it. Nothing on the cluster changed.
    #[error("workspace {workspace}: {op} refused: it is held at epoch {} (annotation {:?}), above this call's {epoch}; another host holds it", stored_epoch.map_or("unreadable".to_owned(), |e| e.to_string()), stored_annotation.as_deref().unwrap_or(""))]
    Precondition {
        /// The verb refused: `open`, `suspend`, `resume`, `destroy`, `delete`.
        op: String,
        /// The workspace.
        workspace: String,
        /// The Sandbox's name.
        sandbox: String,
        /// The epoch this call carried.
        epoch: u64,
        /// The epoch stored on the Sandbox; `None` when unreadable.
        stored_epoch: Option<u64>,
        /// The annotation as stored, when there is one.
        stored_annotation: Option<String>,
    },
    /// The template (or the standing object) describes no disk this
    /// backend builds a workspace on.
    #[error("workspace {workspace}: {reason}")]
    Disk {
        /// The workspace.
        workspace: String,
        /// What is wrong with the disk.
        reason: String,
    },
    /// The guest answered the flush and could not confirm it: the suspend
    /// sent no patch and the workspace is still running.
    #[error("workspace {workspace}: the guest could not confirm the flush ({message}); no suspend was sent and the workspace is still running")]
    FlushUnconfirmed {
        /// The workspace.
        workspace: String,
        /// The guest's own message.
        message: String,
    },
}

/// What a suspend reports through a callback and goes on past.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FlushNotice {
    /// The guest's agent does not know the flush op (an older image): the
    /// suspend went ahead without one.
    Unsupported {
        /// The workspace.
        workspace: String,
    },
    /// The guest could not be reached (or has fenced itself) to be asked:
    /// the suspend went ahead without a flush; what reached the disk is
    /// what the guest kernel had written back, and what its shutdown did.
    Unreachable {
        /// The workspace.
        workspace: String,
        /// Why it could not be asked.
        message: String,
    },
}

/// Told of a flush the suspend went on without.
pub type FlushNoticeCallback = std::sync::Arc<dyn Fn(&FlushNotice) + Send + Sync>;

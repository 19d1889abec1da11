//! The guest side of an open workspace: its running agent as a
//! [`Sandbox`](namzu_core::handle::Sandbox) backend, what an unconfirmed
//! cancel does to it (nothing: the workspace is kept), and what a holder
//! is told when the guest moves under it — a pod replaced (followed by
//! the link, the disk re-attached, every process gone) or an agent
//! restarted in the same pod (a new boot id).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use namzu_core::client::AgentClient;
use namzu_core::error::Result;
use namzu_core::handle::SandboxBackend;
use namzu_core::spec::Tier;

/// A guest as one event names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestIdentity {
    /// The pod's uid.
    pub pod_uid: String,
    /// The agent's boot id; `None` when it has not answered yet (a
    /// replacement just followed).
    pub boot_id: Option<String>,
}

/// How the guest moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestRestartKind {
    /// The pod was replaced (same Sandbox, a new pod uid): the link
    /// follows it, the disk is attached to it, every process is gone.
    PodReplaced,
    /// The agent restarted inside the same pod (a new boot id): every
    /// process, session and execution of the old one is gone.
    ContainerRestarted,
}

/// What a holder is told when the guest behind its handle moved — never
/// for the holder's own suspend and resume, which it asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestRestart {
    /// The workspace.
    pub workspace: String,
    /// How it moved.
    pub kind: GuestRestartKind,
    /// The guest before.
    pub previous: GuestIdentity,
    /// The guest now.
    pub current: GuestIdentity,
}

/// Told of every [`GuestRestart`], synchronously, from the call that found
/// it; a listener must not block.
pub type GuestRestartCallback = Arc<dyn Fn(&GuestRestart) + Send + Sync>;

/// The boot id a handle last saw its guest answer with.
pub(super) type Boot = Arc<Mutex<Option<String>>>;

/// Suspends (keeping the disk) the workspace a guest belongs to.
pub(super) type DestroyFn = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<()>> + Send>> + Send + Sync>;

/// The live link of a running workspace, as a `Sandbox` backend.
pub(super) struct Guest {
    pub(super) id: String,
    pub(super) client: AgentClient,
    pub(super) destroy: DestroyFn,
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
    /// A workspace's destroy suspends it and keeps its disk (flushed
    /// first, with the handle's epoch); deleting the disk is asked for by
    /// name on the workspace handle.
    async fn destroy(&self) -> Result<()> {
        (self.destroy)().await
    }
}

/// What an unconfirmed cancel does to a workspace: nothing beyond the
/// agent's own fence. A task sandbox is given back (nobody can vouch for
/// what still runs in it); a workspace's disk is what its holder came
/// for, so it is kept, and the way past the fence is said.
pub(super) struct Kept(pub(super) String);

impl namzu_core::client::LinkGuard for Kept {
    fn check(&self, _id: &str) -> Result<()> {
        Ok(())
    }

    fn retire(&self, _id: &str) -> Option<String> {
        Some(format!(
            "workspace-kept: workspace {} and its disk are kept; its agent refuses further work until the pod is replaced: suspend and resume it",
            self.0
        ))
    }
}

/// `opts` with a pod-replaced callback that also tells `listener` (as a
/// [`GuestRestartKind::PodReplaced`] naming both pods) and forgets the boot
/// id, which belonged to the old pod's agent.
pub(super) fn following(
    opts: &crate::KubernetesOptions,
    workspace: &str,
    listener: Option<GuestRestartCallback>,
    boot: &Boot,
) -> crate::KubernetesOptions {
    let mut out = opts.clone();
    let (before, workspace, boot) = (opts.on_pod_replaced.clone(), workspace.to_owned(), boot.clone());
    out.on_pod_replaced = Some(Arc::new(move |id, was, now| {
        if let Some(cb) = &before {
            cb(id, was, now);
        }
        let previous_boot = boot.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(l) = &listener {
            l(&GuestRestart {
                workspace: workspace.clone(),
                kind: GuestRestartKind::PodReplaced,
                previous: GuestIdentity {
                    pod_uid: was.uid.clone(),
                    boot_id: previous_boot,
                },
                current: GuestIdentity {
                    pod_uid: now.uid.clone(),
                    boot_id: None,
                },
            });
        }
    }));
    out
}

/// Records `now` as the boot id of pod `pod_uid`'s agent; the event to
/// tell when it replaces another boot id of the same pod.
pub(super) fn answered(workspace: &str, pod_uid: &str, boot: &Boot, now: &str) -> Option<GuestRestart> {
    let before = boot.lock().unwrap_or_else(|p| p.into_inner()).replace(now.to_owned());
    let before = before.filter(|b| b != now)?;
    Some(GuestRestart {
        workspace: workspace.to_owned(),
        kind: GuestRestartKind::ContainerRestarted,
        previous: GuestIdentity {
            pod_uid: pod_uid.to_owned(),
            boot_id: Some(before),
        },
        current: GuestIdentity {
            pod_uid: pod_uid.to_owned(),
            boot_id: Some(now.to_owned()),
        },
    })
}

/// Records `now` as the boot id the guest of `pod` answered with, and
/// tells `listener` (and the log) when it is a restart of that pod's
/// agent.
pub(super) fn seen(
    workspace: &str,
    pod: &crate::rebind::CurrentPod,
    boot: &Boot,
    listener: Option<&GuestRestartCallback>,
    now: &str,
) {
    let pod_uid = pod.lock().unwrap_or_else(|p| p.into_inner()).uid.clone();
    if let Some(event) = answered(workspace, &pod_uid, boot, now) {
        tracing::warn!(workspace = %workspace, pod = %pod_uid, "the guest's agent restarted: its processes are gone");
        if let Some(l) = listener {
            l(&event);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_boot_id_in_the_same_pod_is_a_container_restart_and_the_first_is_not() {
        let boot: Boot = Arc::default();
        assert_eq!(answered("w", "p1", &boot, "a"), None, "the first answer is no restart");
        assert_eq!(answered("w", "p1", &boot, "a"), None);
        let e = answered("w", "p1", &boot, "b").expect("a restart");
        assert_eq!(e.kind, GuestRestartKind::ContainerRestarted);
        assert_eq!(e.previous.boot_id.as_deref(), Some("a"));
        assert_eq!(e.current.boot_id.as_deref(), Some("b"));
        assert_eq!((e.previous.pod_uid.as_str(), e.current.pod_uid.as_str()), ("p1", "p1"));
        // After a replacement the boot id is forgotten: the next pod's
        // first answer is no container restart.
        *boot.lock().unwrap() = None;
        assert_eq!(answered("w", "p2", &boot, "c"), None);
    }
}

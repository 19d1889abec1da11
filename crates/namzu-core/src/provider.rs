//! [`Provider`]: makes, finds, lists and destroys the sandboxes of one
//! tier. Each tier implements it once; everything done inside a sandbox
//! goes through the [`Sandbox`] handle it returns.

use async_trait::async_trait;

use crate::client::AgentClient;
use crate::error::Result;
use crate::handle::Sandbox;
use crate::spec::{SandboxInfo, SandboxSpec, Tier};

/// Makes, finds, lists and destroys the sandboxes of one tier.
#[async_trait]
pub trait Provider: Send + Sync {
    /// The tier that refused or failed.
    fn tier(&self) -> Tier;
    /// Makes a sandbox; it is ready for operations when this returns.
    async fn create(&self, spec: SandboxSpec) -> Result<Sandbox>;
    /// Reattaches to a sandbox made earlier, possibly by another process.
    async fn connect(&self, id: &str) -> Result<Sandbox>;
    /// The link to sandbox `id`'s agent alone, for a host service that acts
    /// for the sandbox (its egress supervisor) and must not start what
    /// `connect` starts for a caller. Default: `connect`'s link.
    async fn agent_link(&self, id: &str) -> Result<AgentClient> {
        Ok(self.connect(id).await?.agent().clone())
    }
    /// Every sandbox of this tier the provider knows, alive, dead or suspended.
    async fn list(&self) -> Result<Vec<SandboxInfo>>;
    /// Destroys a sandbox by id, whether or not it is still alive.
    async fn destroy(&self, id: &str) -> Result<()>;

    /// Suspends sandbox `id`: nothing of it runs, and what it wrote
    /// (`/workspace` and the tier's writable layer) is kept on disk, with
    /// its id, until [`Provider::resume`] starts it again — from any later
    /// process, a host restart included. A tier that can keep the
    /// sandbox's memory as well (microvm) does, and its processes go on
    /// after the resume; elsewhere they end. A suspended sandbox lists with
    /// `suspended` set; [`Provider::connect`] refuses it
    /// ([`Error::SandboxSuspended`](crate::Error::SandboxSuspended)).
    /// Default: refused, naming the tier.
    async fn suspend(&self, id: &str) -> Result<()> {
        let _ = id;
        Err(crate::Error::cannot_suspend(self.tier(), "suspend"))
    }

    /// Starts suspended sandbox `id` again on its kept disk, with the same
    /// id and spec; its processes start afresh (as after a reboot), or,
    /// where its memory was kept, go on where they stopped.
    /// [`Error::NotSuspended`](crate::Error::NotSuspended) if it is not
    /// suspended. Default: refused, naming the tier.
    async fn resume(&self, id: &str) -> Result<Sandbox> {
        let _ = id;
        Err(crate::Error::cannot_suspend(self.tier(), "resume"))
    }

    /// Saves running sandbox `id` as a snapshot (memory, devices and disk
    /// at one instant); the sandbox runs on. Default: refused, naming the
    /// tier.
    async fn snapshot(&self, id: &str) -> Result<crate::spec::SnapshotInfo> {
        let _ = id;
        Err(crate::Error::cannot_snapshot(self.tier(), "snapshot"))
    }

    /// Starts a new sandbox from `snapshot`: its processes go on from where
    /// the snapshot caught them, on a disk of its own, under a new id and
    /// token (the snapshot's source's token does not open it). Default:
    /// refused, naming the tier.
    async fn fork(&self, snapshot: &str) -> Result<Sandbox> {
        let _ = snapshot;
        Err(crate::Error::cannot_snapshot(self.tier(), "fork"))
    }

    /// The snapshots this provider keeps. Default: none.
    async fn snapshots(&self) -> Result<Vec<crate::spec::SnapshotInfo>> {
        Ok(Vec::new())
    }

    /// Removes `snapshot`;
    /// [`Error::SnapshotInUse`](crate::Error::SnapshotInUse) while forks'
    /// disks overlay it. Default: refused, naming the tier.
    async fn delete_snapshot(&self, snapshot: &str) -> Result<()> {
        let _ = snapshot;
        Err(crate::Error::cannot_snapshot(self.tier(), "delete_snapshot"))
    }

    /// Removes every sandbox whose agent is gone, with its leftovers.
    /// Returns the ids removed.
    async fn gc(&self) -> Result<Vec<String>> {
        self.remove_dead().await
    }

    /// Destroys every listed sandbox that is neither alive nor suspended;
    /// returns their ids.
    async fn remove_dead(&self) -> Result<Vec<String>> {
        let mut removed = Vec::new();
        for s in self.list().await? {
            if !s.alive && !s.suspended {
                self.destroy(&s.id).await?;
                removed.push(s.id);
            }
        }
        Ok(removed)
    }
}

//! [`SandboxBackend`]: the one small trait a tier implements for a live
//! sandbox; the handle builds every operation on it.

use std::any::Any;

use async_trait::async_trait;

use crate::client::AgentClient;
use crate::egress::{Decisions, EgressConfig, EgressPolicy};
use crate::error::Result;
use crate::spec::Tier;

/// What a tier supplies for one live sandbox: who it is, the link to its
/// agent, how to tear it down, and (where the tier has an egress boundary)
/// its network policy. Everything else is the agent's and shared.
#[async_trait]
pub trait SandboxBackend: Any + Send + Sync {
    /// The sandbox's id, unique within its tier.
    fn id(&self) -> &str;
    /// The tier it lives in.
    fn tier(&self) -> Tier;
    /// The link to this sandbox's agent.
    fn agent(&self) -> &AgentClient;

    /// Tears the sandbox down: every process in it is killed and its state
    /// removed. Idempotent.
    async fn destroy(&self) -> Result<()>;

    /// Ends every process, keeping the sandbox's disk for a resume; see
    /// [`Sandbox::suspend`](super::Sandbox::suspend). Default: refused.
    async fn suspend(&self) -> Result<()> {
        Err(crate::Error::cannot_suspend(self.tier(), "suspend"))
    }

    /// Pauses the sandbox in place; see [`Sandbox::pause`](super::Sandbox::pause).
    /// Default: its agent stops every process in it but itself.
    async fn pause(&self) -> Result<crate::types::PauseReport> {
        self.agent().pause().await
    }

    /// Continues what [`Self::pause`] stopped. Default: through its agent.
    async fn resume(&self) -> Result<crate::types::ResumeReport> {
        self.agent().resume().await
    }

    /// Whether the sandbox is paused. Default: its agent says.
    async fn is_paused(&self) -> Result<bool> {
        Ok(self.agent().health().await?.paused)
    }

    /// Whether the sandbox is still there, by a check cheaper than a call
    /// to its agent (its processes, say); `None`: the tier has none.
    fn alive(&self) -> Option<bool> {
        None
    }

    /// Replaces the whole egress policy; see [`Network::set_policy`](super::Network::set_policy).
    /// Default: refused, the tier has no egress boundary.
    async fn set_network_policy(&self, policy: EgressPolicy) -> Result<()> {
        let _ = policy;
        Err(crate::egress::no_boundary(self.tier()))
    }

    /// The egress configuration in force and the number of open
    /// connections; see [`Network::policy`](super::Network::policy). Default: refused.
    async fn network_policy(&self) -> Result<(EgressConfig, usize)> {
        Err(crate::egress::no_boundary(self.tier()))
    }

    /// The egress decisions made for this sandbox so far, by verdict; see
    /// [`Network::decisions`](super::Network::decisions). Default: refused.
    async fn egress_decisions(&self) -> Result<Decisions> {
        Err(crate::egress::no_boundary(self.tier()))
    }
}

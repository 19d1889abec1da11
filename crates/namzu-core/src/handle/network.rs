//! [`Network`]: what may leave a sandbox (its egress policy, changed
//! live), and TCP connections into it.

use tokio::io::DuplexStream;

use super::backend::SandboxBackend;
use crate::egress::{Decisions, EgressConfig, EgressPolicy};
use crate::error::Result;

/// The network of one sandbox; from [`Sandbox::network`](crate::Sandbox::network).
#[derive(Clone, Copy)]
pub struct Network<'a> {
    backend: &'a dyn SandboxBackend,
}

impl<'a> Network<'a> {
    pub(super) fn new(backend: &'a dyn SandboxBackend) -> Self {
        Self { backend }
    }

    /// The egress configuration in force and how many connections are open.
    /// Tiers without an egress boundary return
    /// [`Error::OptionRefused`](crate::Error::OptionRefused).
    pub async fn policy(self) -> Result<(EgressConfig, usize)> {
        self.backend.network_policy().await
    }

    /// How many connections and name queries were allowed, refused,
    /// resolved or failed so far (counted by the tier's egress boundary).
    /// Tiers without one return [`Error::OptionRefused`](crate::Error::OptionRefused).
    pub async fn decisions(self) -> Result<Decisions> {
        self.backend.egress_decisions().await
    }

    /// Replaces the whole egress policy of the running sandbox, atomically:
    /// new connections follow it at once, and open connections to
    /// destinations it refuses are closed before this returns.
    pub async fn set_policy(self, policy: EgressPolicy) -> Result<()> {
        self.backend.set_network_policy(policy).await
    }

    /// A TCP connection to 127.0.0.1:`port` inside the sandbox, carried
    /// over the link (no port is published on the host).
    pub async fn connect(self, port: u16) -> Result<DuplexStream> {
        self.backend.agent().open_tcp_connection(port).await
    }
}

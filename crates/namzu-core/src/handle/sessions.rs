//! [`Sessions`]: named background commands that outlive every connection,
//! their output kept in a bounded ring and read by offset.

use crate::client::AgentClient;
use crate::error::Result;
use crate::types::{SessionChunk, SessionInfo, SessionSignal, SessionSpec};

/// Most bytes one [`Sessions::read`] returns.
pub const DEFAULT_SESSION_READ_BYTES: u32 = 1 << 20;

/// Sessions of one sandbox; from [`Sandbox::sessions`](crate::Sandbox::sessions).
#[derive(Clone, Copy)]
pub struct Sessions<'a> {
    agent: &'a AgentClient,
}

impl<'a> Sessions<'a> {
    pub(super) fn new(agent: &'a AgentClient) -> Self {
        Self { agent }
    }

    /// Starts a command in a new named session and returns at once.
    pub async fn start(self, spec: SessionSpec) -> Result<SessionInfo> {
        self.agent.start_session(spec).await
    }

    /// Output from `from_offset`, up to [`DEFAULT_SESSION_READ_BYTES`];
    /// never waits.
    pub async fn read(self, session_id: &str, from_offset: u64) -> Result<SessionChunk> {
        self.read_max(session_id, from_offset, DEFAULT_SESSION_READ_BYTES).await
    }

    /// [`Self::read`] with a byte budget.
    pub async fn read_max(self, session_id: &str, from_offset: u64, max_bytes: u32) -> Result<SessionChunk> {
        self.agent.read_session(session_id, from_offset, max_bytes).await
    }

    /// Every session the agent holds.
    pub async fn list(self) -> Result<Vec<SessionInfo>> {
        self.agent.list_sessions().await
    }

    /// Signals every process of a session.
    pub async fn kill(self, session_id: &str, signal: SessionSignal) -> Result<SessionInfo> {
        self.agent.kill_session(session_id, signal).await
    }
}

//! [`Terminals`]: ptys inside a sandbox, one-off or persistent (kept by
//! the agent and resumed from an offset after the link drops).

use crate::client::{AgentClient, Terminal};
use crate::error::Result;
use crate::types::TerminalOptions;

/// Terminals of one sandbox; from [`Sandbox::terminals`](crate::Sandbox::terminals).
#[derive(Clone, Copy)]
pub struct Terminals<'a> {
    agent: &'a AgentClient,
}

impl<'a> Terminals<'a> {
    pub(super) fn new(agent: &'a AgentClient) -> Self {
        Self { agent }
    }

    /// Opens a terminal running `opts.command` (a login shell by default).
    pub async fn open(self, opts: TerminalOptions) -> Result<Terminal> {
        self.agent.open_terminal(opts).await
    }

    /// Resumes a persistent terminal from an offset of its output.
    pub async fn attach(self, session_id: &str, from_offset: u64) -> Result<Terminal> {
        self.agent.attach_terminal(session_id, from_offset).await
    }
}

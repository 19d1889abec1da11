//! [`Commands`]: running commands in a sandbox — to completion, streamed,
//! or detachable (outliving the link and this process, reattached by
//! offset).

use crate::client::{AgentClient, CancelOutcome, ExecStream};
use crate::error::Result;
use crate::types::{AttachOptions, ExecOutput, ExecRequest, ExecutionInfo};

/// Commands of one sandbox; from [`Sandbox::commands`](crate::Sandbox::commands).
///
/// An *execution* is one run of a command; its id is its `execution_id`.
/// A *detachable* execution keeps its output in the agent by offset, so any
/// process may [`attach`](Self::attach) to it later and
/// [`cancel`](Self::cancel) it by id.
#[derive(Clone, Copy)]
pub struct Commands<'a> {
    agent: &'a AgentClient,
}

impl<'a> Commands<'a> {
    pub(super) fn new(agent: &'a AgentClient) -> Self {
        Self { agent }
    }

    /// Runs a command to completion and collects its output. A `&str` is a
    /// shell script (`sh -c`); build an [`ExecRequest`] for an argv.
    ///
    /// ```no_run
    /// # async fn demo(sb: namzu_core::Sandbox) -> namzu_core::Result<()> {
    /// let out = sb.commands().run("ls /").await?;
    /// assert!(out.status.success());
    /// # Ok(()) }
    /// ```
    pub async fn run(self, req: impl Into<ExecRequest>) -> Result<ExecOutput> {
        self.agent.exec(req.into()).await
    }

    /// Runs a command and streams its events (stdout and stderr chunks with
    /// their offsets, then the exit).
    pub async fn stream(self, req: impl Into<ExecRequest>) -> Result<ExecStream> {
        self.agent.exec_stream(req.into()).await
    }

    /// Starts a detachable execution (under the request's `execution_id`,
    /// or one the host picks) and streams it; dropping the stream or losing
    /// the link leaves it running. Read the id from
    /// the stream's `execution_id`.
    pub async fn spawn(self, req: impl Into<ExecRequest>) -> Result<ExecStream> {
        let mut req = req.into();
        if req.detachable.is_none() {
            req = req.detachable();
        }
        self.agent.exec_stream(req).await
    }

    /// Reads a detachable execution by id from `opts.from_offset` and
    /// collects its output; never signals it.
    pub async fn attach(self, execution_id: &str, opts: AttachOptions) -> Result<ExecOutput> {
        self.agent.attach_execution(execution_id, opts).await
    }

    /// [`Self::attach`], streamed.
    pub async fn attach_stream(self, execution_id: &str, opts: AttachOptions) -> Result<ExecStream> {
        self.agent.attach_execution_stream(execution_id, opts).await
    }

    /// The executions the agent holds: reserved and running ones, and the
    /// detachable ones it still retains (exited included), sorted by id.
    pub async fn list(self) -> Result<Vec<ExecutionInfo>> {
        self.agent.list_executions().await
    }

    /// Kills a detachable execution's whole process group by id and waits
    /// for the kill to be confirmed. Unconfirmed is
    /// [`Error::ExecutionCancelUnconfirmed`](crate::Error::ExecutionCancelUnconfirmed):
    /// nothing is retired and the cancel may be retried.
    pub async fn cancel(self, execution_id: &str) -> Result<CancelOutcome> {
        self.agent.cancel_execution(execution_id).await
    }
}

//! The executions an agent holds: listed, and cancelled by id.

use super::exec::exit_summary;
use super::link::*;

impl AgentClient {
    /// The executions the agent holds: reserved and running ones, and the
    /// detachable ones it still retains (exited included), by id.
    pub async fn list_executions(&self) -> Result<Vec<ExecutionInfo>> {
        const OP: &str = "list_executions";
        self.require(OP, feat::EXEC_LIST)?;
        let r = self
            .rpc()
            .list_execs(v1::Empty {})
            .await
            .map_err(|s| self.status(OP, s))?
            .into_inner();
        Ok(r.executions
            .into_iter()
            .map(|e| ExecutionInfo {
                state: match (e.state.as_str(), e.exit) {
                    ("reserved", _) => ExecutionState::Reserved,
                    (_, Some(x)) => ExecutionState::Exited(exit_summary(x).status),
                    _ => ExecutionState::Running,
                },
                execution_id: e.execution_id,
                detachable: e.detachable,
                pid: (e.pid != 0).then_some(e.pid),
                output_bytes: e.output_bytes,
            })
            .collect())
    }

    /// Cancels a detachable execution by id, from any process: resolves
    /// once the kill is confirmed. An unconfirmed kill is
    /// [`Error::ExecutionCancelUnconfirmed`] and retires nothing: the
    /// record stays and the cancel may be retried.
    pub async fn cancel_execution(&self, execution_id: &str) -> Result<CancelOutcome> {
        const OP: &str = "cancel_execution";
        self.require(OP, feat::EXEC_CANCEL)?;
        self.cancel_rpc(OP, execution_id)
            .await?
            .ok_or_else(|| Error::ExecutionCancelUnconfirmed {
                execution_id: execution_id.into(),
            })
    }

    /// One Cancel call; `None` when the agent could not confirm the kill.
    pub(super) async fn cancel_rpc(&self, op: &str, execution_id: &str) -> Result<Option<CancelOutcome>> {
        let r = self
            .rpc()
            .cancel(v1::CancelRequest {
                execution_id: execution_id.into(),
            })
            .await
            .map_err(|s| self.status(op, s))?
            .into_inner();
        self.answered_by(&r.boot_id);
        match r.outcome() {
            Outcome::Confirmed => Ok(Some(CancelOutcome::Killed)),
            Outcome::NotStarted => Ok(Some(CancelOutcome::NotStarted)),
            Outcome::AlreadyExited => Ok(Some(CancelOutcome::AlreadyExited)),
            Outcome::Unconfirmed => Ok(None),
            Outcome::Unspecified => Err(Error::Protocol {
                op: op.into(),
                message: "no outcome".into(),
            }),
        }
    }
}

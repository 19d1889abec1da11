//! The executions an agent holds, listed.

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
}

//! The egress call the host's egress service holds, and the splices of the connections it allows.

use super::*;

impl AgentClient {
    /// Opens the `Egress` call the host's egress service holds for the
    /// sandbox's life: verdicts go out through the sender, the agent's asks
    /// come in on the stream. A newer call replaces this one.
    pub async fn egress_channel(&self) -> Result<(mpsc::Sender<v1::EgressVerdict>, tonic::Streaming<v1::EgressAsk>)> {
        const OP: &str = "egress";
        self.require(OP, feat::EGRESS)?;
        let (tx, rx) = mpsc::channel(64);
        let asks = self
            .rpc()
            .egress(ReceiverStream::new(rx))
            .await
            .map_err(|s| self.status(OP, s))?
            .into_inner();
        Ok((tx, asks))
    }

    /// Accepts the agent's connect ask `id`: the host has connected, and
    /// this joins the two ends. Bytes for the sandbox's client go through
    /// the sender (after the `accept` this sends first); the client's bytes
    /// come in on the stream.
    pub async fn egress_splice(
        &self,
        id: u64,
    ) -> Result<(mpsc::Sender<v1::EgressSpliceInput>, tonic::Streaming<v1::TcpOutput>)> {
        const OP: &str = "egress_splice";
        self.require(OP, feat::EGRESS)?;
        let (tx, rx) = mpsc::channel(8);
        let accept = v1::EgressSpliceInput {
            msg: Some(v1::egress_splice_input::Msg::Accept(id)),
        };
        let _ = tx.send(accept).await;
        let from = self
            .rpc()
            .egress_splice(ReceiverStream::new(rx))
            .await
            .map_err(|s| self.status(OP, s))?
            .into_inner();
        Ok((tx, from))
    }
}

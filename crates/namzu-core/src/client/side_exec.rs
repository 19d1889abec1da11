//! Commands on a unix stream of their own (the exec form of the preface),
//! where the link is a local socket and the agent offers it: the same
//! `ExecStart`, the same output messages, framed by
//! [`namzu_proto::side_read`] instead of carried by HTTP/2 and gRPC — one
//! write and one wake-up each way for a short command, where the link
//! spends several on HTTP/2's frames and window updates.
//!
//! The caller sees what the link's `Exec` would give: the same typed errors
//! (a refusal at the call, a later failure as an item) and the same events.
//! Dropping the stream closes the socket, which the agent reads as the
//! call dropped and kills the command's group, as it does for a reset
//! call. A stream that cannot be opened (no such dial, the agent's gate
//! full) falls back to the link; the agent answers every exec preface it
//! reads, and runs nothing before its answer, so falling back never runs a
//! command twice.

use namzu_proto::side_read as frames;
use tokio::net::UnixStream;

use super::link::*;
use super::side_read::{protocol, read_header};

/// A command's output messages, as the link or a stream of its own
/// delivers them; the stream ends after an error.
pub(super) type OutputStream = Pin<Box<dyn Stream<Item = Result<v1::ExecOutput>> + Send>>;

impl AgentClient {
    /// Runs `start` on a stream of its own: its first message and the rest;
    /// `Ok(None)`: run it over the link.
    pub(super) async fn side_exec(&self, start: &v1::ExecStart) -> Result<Option<(v1::ExecOutput, OutputStream)>> {
        const OP: &str = "exec";
        let encoded = prost::Message::encode_to_vec(start);
        let mut sock = match self.open_side_exec(&encoded).await {
            None => return Ok(None),
            Some(Ok(s)) => s,
            Some(Err(e)) => {
                tracing::debug!(error = %e, "command stream unavailable; over the link");
                return Ok(None);
            }
        };
        let max = self.inner.max_message_bytes;
        let first = match next_message(self, &mut sock, max).await? {
            Some(m) => m,
            None => {
                return Err(Error::LinkLost {
                    op: OP.into(),
                    message: "command stream ended before it started".into(),
                })
            }
        };
        let me = self.clone();
        let rest = futures::stream::try_unfold(Some(sock), move |sock| {
            let me = me.clone();
            async move {
                let Some(mut sock) = sock else { return Ok(None) };
                match next_message(&me, &mut sock, max).await? {
                    Some(m) => Ok(Some((m, Some(sock)))),
                    None => Err(Error::LinkLost {
                        op: OP.into(),
                        message: "command stream ended before the exit".into(),
                    }),
                }
            }
        });
        Ok(Some((first, Box::pin(rest))))
    }
}

/// The next output message on `sock`; `Ok(None)`: it closed between
/// frames; `Err`: what an `ERROR` frame says, or the stream broke.
async fn next_message(client: &AgentClient, sock: &mut UnixStream, max: usize) -> Result<Option<v1::ExecOutput>> {
    const OP: &str = "exec";
    let broken = |e: io::Error| Error::LinkLost {
        op: OP.into(),
        message: format!("command stream: {e}"),
    };
    let (tag, len) = match read_header(sock).await {
        Ok(h) => h,
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(broken(e)),
    };
    match tag {
        frames::DATA if len <= max as u64 => {
            let mut body = vec![0u8; len as usize];
            sock.read_exact(&mut body).await.map_err(broken)?;
            let msg = prost::Message::decode(body.as_slice()).map_err(|e| Error::Protocol {
                op: OP.into(),
                message: format!("command stream: bad output message: {e}"),
            })?;
            Ok(Some(msg))
        }
        frames::DATA => Err(Error::Protocol {
            op: OP.into(),
            message: format!("command stream: a {len}-byte message, past max_message_bytes ({max})"),
        }),
        frames::ERROR => Err(client.error_frame(OP, sock, len).await),
        other => Err(protocol(OP, other)),
    }
}

//! Writes on a unix stream of their own (the write form of the preface),
//! where the link is a local socket and the agent offers it: the bytes go
//! framed by [`namzu_proto::side_read`] straight into the agent's
//! temporary file, without HTTP/2 framing, flow control or message
//! encoding. The caller sees what `WriteFile` would give: the same typed
//! errors, the same atomic replace, the old file kept on any failure. A
//! busy agent, or a stream that cannot be opened, means the link, decided
//! before a byte of the data is consumed.

use namzu_proto::side_read::{self as frames, header};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

use super::link::*;
use super::side_read::{protocol, read_header};

/// Bytes per data frame.
pub(super) const FRAME_BYTES: usize = 1 << 20;

impl AgentClient {
    /// Opens a side write of `begin` and waits for the agent's word:
    /// `Ok(None)`: write over the link.
    pub(super) async fn side_write_start(&self, op: &str, begin: &v1::WriteBegin) -> Result<Option<UnixStream>> {
        let encoded = prost::Message::encode_to_vec(begin);
        let mut sock = match self.open_side_write(&encoded).await {
            None => return Ok(None),
            Some(Ok(s)) => s,
            Some(Err(e)) => {
                tracing::debug!(error = %e, "side write unavailable; over the link");
                return Ok(None);
            }
        };
        let (tag, len) = read_header(&mut sock).await.map_err(|e| broken(op, &e))?;
        match tag {
            frames::READY => Ok(Some(sock)),
            frames::BUSY => Ok(None),
            frames::ERROR => Err(self.error_frame(op, &mut sock, len).await),
            other => Err(protocol(op, other)),
        }
    }

    /// Sends one data frame. A failure (the agent stopped reading: it
    /// failed the write and said why) is the agent's answer if there is one.
    pub(super) async fn side_write_data(&self, op: &str, sock: &mut UnixStream, data: &[u8]) -> Result<()> {
        let sent = async {
            sock.write_all(&header(frames::DATA, data.len() as u64)).await?;
            sock.write_all(data).await
        };
        match sent.await {
            Ok(()) => Ok(()),
            Err(e) => Err(self
                .side_write_answer(op, sock)
                .await
                .err()
                .unwrap_or_else(|| broken(op, &e))),
        }
    }

    /// Ends the write at `total` bytes and returns what the agent wrote.
    pub(super) async fn side_write_finish(&self, op: &str, mut sock: UnixStream, total: u64) -> Result<u64> {
        if let Err(e) = sock.write_all(&header(frames::END, total)).await {
            return Err(self
                .side_write_answer(op, &mut sock)
                .await
                .err()
                .unwrap_or_else(|| broken(op, &e)));
        }
        self.side_write_answer(op, &mut sock).await
    }

    /// The agent's answer: bytes written, or its error.
    async fn side_write_answer(&self, op: &str, sock: &mut UnixStream) -> Result<u64> {
        let (tag, len) = read_header(sock).await.map_err(|e| broken(op, &e))?;
        match tag {
            frames::END if len == 12 => {
                let mut body = [0u8; 12];
                sock.read_exact(&mut body).await.map_err(|e| broken(op, &e))?;
                let mut n = [0u8; 8];
                n.copy_from_slice(&body[..8]);
                Ok(u64::from_be_bytes(n))
            }
            frames::ERROR => Err(self.error_frame(op, sock, len).await),
            other => Err(protocol(op, other)),
        }
    }
}

fn broken(op: &str, e: &io::Error) -> Error {
    Error::LinkLost {
        op: op.into(),
        message: format!("write stream: {e}"),
    }
}

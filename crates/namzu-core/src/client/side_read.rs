//! Streamed reads on a unix stream of their own (the read form of the
//! preface), where the link is a local socket and the agent offers it:
//! the file's bytes arrive framed by [`namzu_proto::side_read`], sent by
//! the agent with `sendfile(2)`, without HTTP/2 framing or flow control.
//! The caller sees what the link's `ReadFileStream` would give: the same
//! typed errors (an open failure at the call, a later one as an item), the
//! same chunks' bytes. A busy agent, or a stream that cannot be opened,
//! falls back to the link.

use namzu_proto::side_read::{self as frames, HEADER_LEN};
use tokio::net::UnixStream;

use super::link::*;

/// Bytes read from the stream at a time: one chunk of the [`ByteStream`].
const READ_BYTES: usize = 256 * 1024;

/// Where a side read's stream is.
struct Reading {
    sock: UnixStream,
    /// Bytes left in the current data frame.
    left: u64,
    done: bool,
}

impl AgentClient {
    /// `req` on a stream of its own; `Ok(None)`: ask over the link.
    pub(super) async fn side_read_stream(
        &self,
        op: &'static str,
        req: &v1::ReadFileStreamRequest,
    ) -> Result<Option<ByteStream>> {
        let encoded = prost::Message::encode_to_vec(req);
        let mut sock = match self.open_side_read(&encoded).await {
            None => return Ok(None),
            Some(Ok(s)) => s,
            Some(Err(e)) => {
                tracing::debug!(error = %e, "side read unavailable; over the link");
                return Ok(None);
            }
        };
        let broken = |e: io::Error| Error::LinkLost {
            op: op.into(),
            message: format!("read stream: {e}"),
        };
        // The first frame says whether the read was admitted and opened.
        let (tag, len) = read_header(&mut sock).await.map_err(broken)?;
        let left = match tag {
            frames::BUSY => return Ok(None),
            frames::ERROR => return Err(self.error_frame(op, &mut sock, len).await),
            frames::DATA => len,
            frames::END => 0,
            other => return Err(protocol(op, other)),
        };
        let state = Reading {
            sock,
            left,
            done: tag == frames::END,
        };
        let me = self.clone();
        let s = futures::stream::try_unfold(state, move |mut st| {
            let me = me.clone();
            async move {
                while !st.done && st.left == 0 {
                    let (tag, len) = read_header(&mut st.sock).await.map_err(broken)?;
                    match tag {
                        frames::DATA => st.left = len,
                        frames::END => st.done = true,
                        frames::ERROR => return Err(me.error_frame(op, &mut st.sock, len).await),
                        other => return Err(protocol(op, other)),
                    }
                }
                if st.done {
                    return Ok(None);
                }
                let want = usize::try_from(st.left).unwrap_or(READ_BYTES).min(READ_BYTES);
                let mut buf = bytes::BytesMut::with_capacity(want);
                let n = st.sock.read_buf(&mut buf).await.map_err(broken)?;
                if n == 0 {
                    return Err(broken(io::ErrorKind::UnexpectedEof.into()));
                }
                st.left -= n as u64;
                Ok(Some((buf.freeze(), st)))
            }
        });
        Ok(Some(Box::pin(s)))
    }

    /// The error an [`frames::ERROR`] frame of `len` bytes carries.
    pub(super) async fn error_frame(&self, op: &str, sock: &mut UnixStream, len: u64) -> Error {
        if len > frames::MAX_STATUS_BYTES {
            return protocol(op, frames::ERROR);
        }
        let mut body = vec![0u8; len as usize];
        if let Err(e) = sock.read_exact(&mut body).await {
            return Error::LinkLost {
                op: op.into(),
                message: format!("read stream: {e}"),
            };
        }
        match frames::decode_status(&body) {
            Some((code, message, details)) => self.status(
                op,
                tonic::Status::with_details(tonic::Code::from(code), message, details.into()),
            ),
            None => protocol(op, frames::ERROR),
        }
    }
}

pub(super) async fn read_header(sock: &mut UnixStream) -> io::Result<(u8, u64)> {
    let mut h = [0u8; HEADER_LEN];
    sock.read_exact(&mut h).await?;
    Ok(frames::parse_header(&h))
}

pub(super) fn protocol(op: &str, tag: u8) -> Error {
    Error::Protocol {
        op: op.into(),
        message: format!("side stream: bad frame (tag {tag})"),
    }
}

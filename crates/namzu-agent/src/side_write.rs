//! Writes on a stream of their own (the write form of the preface): the
//! same begin, checks, atomic commit and errors as `WriteFile`, the bytes
//! read straight from the host's unix socket into the temporary file, with
//! no HTTP/2 framing, flow control or message decoding in between. The
//! frames are [`namzu_proto::side_read`]'s; a stream that ends before the
//! host's `END`, or any failure, drops the temporary and leaves the old
//! file. At most `max_side_writes` run at once; past that the host is told
//! to use the link ([`frames::BUSY`]) before it sends a byte.

use std::io::Read;
use std::os::unix::net::UnixStream as StdUnix;
use std::pin::Pin;
use std::sync::Arc;

use namzu_proto::side_read::{self as frames, header, parse_header};
use namzu_proto::v1::agent_error::Kind;
use namzu_proto::v1::WriteBegin;
use tokio::io::AsyncWrite;
use tokio::sync::Semaphore;
use tonic::Status;

use crate::files::PendingWrite;
use crate::op_error::{agent_err, IntoStatus, OpError};
use crate::service::AgentService;
use crate::side_read::{status_body, write_frame};

const OP: &str = "write_file";
/// Bytes read from the socket at a time.
const READ_BYTES: usize = 1 << 20;

/// Why a side write stopped.
enum Stop {
    /// The operation failed: the host gets an `ERROR` frame.
    Op(OpError),
    /// The stream broke: nobody to tell.
    Broken(std::io::Error),
}

/// Serves one side write (its preface answered) on `peer`: a unix socket,
/// or another stream, on which the write is refused.
pub async fn serve(
    service: Arc<AgentService>,
    slots: Arc<Semaphore>,
    peer: Result<tokio::net::UnixStream, Pin<Box<dyn AsyncWrite + Send>>>,
    request: Vec<u8>,
) {
    let Some((mut unix, permit)) = crate::side_read::admit(peer, slots, "write").await else {
        return;
    };
    let begun = async {
        let b: WriteBegin = prost::Message::decode(request.as_slice())
            .map_err(|e| Status::invalid_argument(format!("bad write request: {e}")))?;
        service.begin_side_write(b).await
    };
    let pending = match begun.await {
        Ok(p) => p,
        Err(st) => {
            let _ = write_frame(&mut unix, frames::ERROR, &status_body(&st)).await;
            return;
        }
    };
    if write_frame(&mut unix, frames::READY, &[]).await.is_err() {
        return;
    }
    let sock = match unix.into_std().and_then(|s| s.set_nonblocking(false).map(|()| s)) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "side write: socket unusable");
            return;
        }
    };
    let _ = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let answer = match receive(&sock, pending) {
            Ok((bytes, mode)) => {
                let mut body = bytes.to_be_bytes().to_vec();
                body.extend_from_slice(&mode.to_be_bytes());
                (frames::END, body)
            }
            Err(Stop::Op(e)) => (frames::ERROR, status_body(&e.into_status())),
            Err(Stop::Broken(e)) => {
                tracing::debug!(error = %e, "side write ended early; nothing replaced");
                return;
            }
        };
        use std::io::Write;
        let mut w = &sock;
        let mut bytes = header(answer.0, answer.1.len() as u64).to_vec();
        bytes.extend_from_slice(&answer.1);
        if let Err(e) = w.write_all(&bytes) {
            tracing::debug!(error = %e, "side write: the host left before the answer");
        }
    })
    .await;
}

/// Reads the host's frames into `pending` and commits it at `END`.
fn receive(sock: &StdUnix, mut pending: PendingWrite) -> Result<(u64, u32), Stop> {
    let mut r = sock;
    let mut buf = vec![0u8; READ_BYTES];
    loop {
        let mut h = [0u8; frames::HEADER_LEN];
        r.read_exact(&mut h).map_err(Stop::Broken)?;
        match parse_header(&h) {
            (frames::DATA, len) => {
                let mut left = len;
                while left > 0 {
                    let want = usize::try_from(left).unwrap_or(READ_BYTES).min(READ_BYTES);
                    let n = r.read(&mut buf[..want]).map_err(Stop::Broken)?;
                    if n == 0 {
                        return Err(Stop::Broken(std::io::ErrorKind::UnexpectedEof.into()));
                    }
                    pending.write(&buf[..n]).map_err(Stop::Op)?;
                    left -= n as u64;
                }
            }
            (frames::END, total) => return pending.commit(total).map_err(Stop::Op),
            (tag, _) => {
                let msg = format!("write stream: bad frame (tag {tag})");
                return Err(Stop::Op(agent_err(Kind::Protocol, OP, &msg)));
            }
        }
    }
}
